/* SPDX-License-Identifier: Apache-2.0 */
/* micro.h - what the single-file micro-benchmarks share (prefix_lookup.c, kv_lookup.c, chat_turns.c): a seeded
 * xorshift64 (the same numbers every run; a program may set micro_rng first) and the clocks they time with. */
#ifndef XPYD_BENCH_MICRO_H
#define XPYD_BENCH_MICRO_H

#include <stdint.h>
#include <time.h>

static uint64_t micro_rng = 0x9e3779b97f4a7c15ULL;

static inline uint64_t micro_rnd(void)
{
    micro_rng ^= micro_rng << 13;
    micro_rng ^= micro_rng >> 7;
    micro_rng ^= micro_rng << 17;
    return micro_rng;
}

/* wall time, µs (CLOCK_MONOTONIC) */
static inline double micro_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* this thread's CPU time, s */
static inline double micro_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

#endif
