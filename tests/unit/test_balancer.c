/* SPDX-License-Identifier: Apache-2.0 */
/* test_balancer.c - balancer properties: least-outstanding-tokens picks the least loaded eligible rank,
 * ties rotate, max_model_len filters, and after every release every load is exactly zero, also under
 * concurrent pick/release from several threads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "xb.h"
#include "xb_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static struct xb_pool *pool_of(int policy, int n, const int *weights, const int *tps, const long *mml)
{
    struct xb_pool *p = xb_pool_new(policy, 42);
    for (int i = 0; i < n; i++) {
        struct xb_instance_cfg c = {tps ? tps[i] : 1, weights ? weights[i] : 1, mml ? mml[i] : 0, 0, 0};
        assert_int_equal(xb_pool_add(p, &c), i);
    }
    return p;
}

static uint64_t rng = 88172645463325252ULL;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Random churn on p (n instances): two picks in three, else a release of a random live request; check()
 * judges every pick against the instances as they were just before it; everything is released at the end. */
typedef void (*pick_check)(const struct xb_inst *before, int n, int idx);
static void churn(struct xb_pool *p, int n, int64_t max_tok, pick_check check)
{
    struct {
        int idx;
        int64_t tok;
    } live[2048];
    int nlive = 0;
    for (int step = 0; step < 20000; step++) {
        if (nlive < 2048 && (nlive == 0 || rnd() % 3 != 0)) {
            struct xb_inst before[8];
            memcpy(before, p->inst, (size_t)n * sizeof before[0]);
            int64_t tok = (int64_t)(rnd() % (uint64_t)max_tok) + 1;
            int idx = xb_pick(p, 0, tok, NULL, 0);
            assert_true(idx >= 0 && idx < n);
            check(before, n, idx);
            live[nlive].idx = idx;
            live[nlive++].tok = tok;
        } else {
            int k = (int)(rnd() % (uint64_t)nlive);
            xb_release(p, live[k].idx, live[k].tok);
            live[k] = live[--nlive];
        }
    }
    while (nlive > 0) {
        nlive--;
        xb_release(p, live[nlive].idx, live[nlive].tok);
    }
}

static void less_loaded_check(const struct xb_inst *before, int n, int idx)
{
    for (int i = 0; i < n; i++)
        assert_false(xb_less_loaded(&before[i], &before[idx]));
}

/* After each pick: no eligible instance has a lower normalised load than the picked one had. */
static void test_lot_property(void **st)
{
    int weights[6] = {1, 2, 1, 3, 1, 1}, tps[6] = {1, 1, 2, 1, 1, 4};
    struct xb_pool *p = pool_of(XB_POLICY_LOT, 6, weights, tps, NULL);
    churn(p, 6, 5000, less_loaded_check);
    for (int i = 0; i < 6; i++) {
        assert_int_equal(p->inst[i].outstanding, 0);
        assert_int_equal(p->inst[i].inflight, 0);
    }
    xb_pool_free(p);
}

/* load_pick / cap_pick <= load_i / cap_i for every i, as exact rationals by cross-multiplication, with the
 * capacity computed here (weight x tp), not by the balancer's own comparison. */
static void rational_check(const struct xb_inst *before, int n, int idx)
{
    __int128 cap_pick = (__int128)before[idx].cfg.weight * before[idx].cfg.tp;
    for (int i = 0; i < n; i++) {
        __int128 cap_i = (__int128)before[i].cfg.weight * before[i].cfg.tp;
        assert_true((__int128)before[idx].outstanding * cap_i <= (__int128)before[i].outstanding * cap_pick);
    }
}

/* An oracle independent of the balancer's own comparison: the pick has the least outstanding tokens per unit
 * of capacity (weight x tp), compared as exact rationals; ranks of different weight and tp, random charges and
 * releases. */
static void test_lot_oracle_capacity(void **st)
{
    int weights[5] = {1, 4, 2, 1, 3}, tps[5] = {1, 1, 2, 8, 1};
    struct xb_pool *p = pool_of(XB_POLICY_LOT, 5, weights, tps, NULL);
    churn(p, 5, 3000, rational_check);
    xb_pool_free(p);
    /* equal requests on an empty pool of weights 4 and 1: four go to the big rank for each one on the small */
    int w2[2] = {4, 1};
    p = pool_of(XB_POLICY_LOT, 2, w2, NULL, NULL);
    int count[2] = {0, 0};
    for (int i = 0; i < 50; i++)
        count[xb_pick(p, 0, 100, NULL, 0)]++;
    assert_int_equal(count[0], 40);
    assert_int_equal(count[1], 10);
    xb_pool_free(p);
}

/* Idle ranks fill in turn instead of piling onto the first one. */
static void test_tie_rotation(void **st)
{
    struct xb_pool *p = pool_of(XB_POLICY_LOT, 8, NULL, NULL, NULL);
    int seen[8] = {0};
    for (int i = 0; i < 8; i++) {
        int idx = xb_pick(p, 0, 100, NULL, 0);
        assert_int_equal(seen[idx], 0);
        seen[idx] = 1;
    }
    /* all equally loaded again: the next 8 picks again cover all 8 */
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < 8; i++)
        seen[xb_pick(p, 0, 100, NULL, 0)]++;
    for (int i = 0; i < 8; i++)
        assert_int_equal(seen[i], 1);
    xb_pool_free(p);
}

/* One long decode on rank A: the next request goes elsewhere; all busy: the least loaded. */
static void test_least_loaded_wins(void **st)
{
    struct xb_pool *p = pool_of(XB_POLICY_LOT, 3, NULL, NULL, NULL);
    int a = xb_pick(p, 0, 10000, NULL, 0);
    int b = xb_pick(p, 0, 10, NULL, 0);
    int c = xb_pick(p, 0, 500, NULL, 0);
    assert_true(a != b && b != c && a != c);
    assert_int_equal(xb_pick(p, 0, 1, NULL, 0), b);
    xb_pool_free(p);
}

static void test_max_model_len_and_health(void **st)
{
    long mml[3] = {1000, 4000, 0};
    struct xb_pool *p = pool_of(XB_POLICY_LOT, 3, NULL, NULL, mml);
    for (int i = 0; i < 20; i++) {
        int idx = xb_pick(p, 3000, 1, NULL, 0);
        assert_true(idx == 1 || idx == 2);
    }
    xb_set_healthy(p, 2, 0);
    assert_int_equal(xb_pick(p, 5000, 1, NULL, 0), -E2BIG); /* healthy ones exist, none large enough */
    int ex[1] = {1};
    assert_int_equal(xb_pick(p, 3000, 1, ex, 1), -E2BIG);
    xb_set_healthy(p, 0, 0);
    xb_set_healthy(p, 1, 0);
    assert_int_equal(xb_pick(p, 10, 1, NULL, 0), -ENOENT);
    xb_pool_free(p);
}

/* An engine-reported max_model_len (xb_set_learned_max_model_len) filters like a configured one for exact
 * counts, never for estimates; a configured one wins over it; xb_max_model_len reports the effective one. */
static void test_learned_max_model_len(void **st)
{
    long mml[2] = {0, 8000};
    struct xb_pool *p = pool_of(XB_POLICY_LOT, 2, NULL, NULL, mml);
    assert_int_equal(xb_max_model_len(p), 0); /* instance 0's unknown: no limit known for the pool */
    xb_set_learned_max_model_len(p, 0, 1000);
    xb_set_learned_max_model_len(p, 1, 2000); /* configured 8000 wins */
    assert_int_equal(xb_max_model_len(p), 8000);
    struct xb_instance_stats s;
    assert_int_equal(xb_stats(p, 0, &s), 0);
    assert_true(s.max_model_len == 0 && s.learned_max_model_len == 1000);
    for (int i = 0; i < 10; i++) { /* exact: 3000 only fits instance 1 (its configured 8000, not its 2000) */
        struct xb_query q = {.need_len = 3000, .tokens = 1};
        assert_int_equal(xb_pick_q(p, &q), 1);
        xb_release(p, 1, 1);
    }
    struct xb_query big = {.need_len = 9000, .tokens = 1};
    assert_int_equal(xb_pick_q(p, &big), -E2BIG);
    int seen[2] = {0, 0};
    for (int i = 0; i < 10; i++) { /* estimated: instance 0's learned 1000 does not refuse it */
        struct xb_query q = {.need_len = 3000, .tokens = 1, .estimated = 1};
        int idx = xb_pick_q(p, &q);
        assert_true(idx == 0 || idx == 1);
        seen[idx]++;
        xb_release(p, idx, 1);
    }
    assert_true(seen[0] > 0);
    struct xb_query est = {.need_len = 9000, .tokens = 1, .estimated = 1}; /* over the configured 8000 */
    assert_int_equal(xb_pick_q(p, &est), 0);
    xb_release(p, 0, 1);
    xb_pool_free(p);
}

/* An unready instance (its engine not yet described) is never picked by any policy, whatever its load, and
 * health changes do not make it ready; made ready it is picked again. */
static void test_unready_never_picked(void **st)
{
    int pols[4] = {XB_POLICY_LOT, XB_POLICY_P2C, XB_POLICY_RR, XB_POLICY_RANDOM};
    for (int k = 0; k < 4; k++) {
        struct xb_pool *p = pool_of(pols[k], 3, NULL, NULL, NULL);
        xb_set_ready(p, 0, 0);
        xb_set_healthy(p, 0, 1);
        struct xb_instance_stats s;
        assert_int_equal(xb_stats(p, 0, &s), 0);
        assert_false(s.ready);
        xb_adjust(p, 1, 1000000); /* 0 is by far the least loaded */
        for (int i = 0; i < 200; i++) {
            int idx = xb_pick(p, 0, 1, NULL, 0);
            assert_true(idx == 1 || idx == 2);
            xb_release(p, idx, 1);
        }
        xb_set_ready(p, 1, 0);
        xb_set_ready(p, 2, 0);
        assert_int_equal(xb_pick(p, 0, 1, NULL, 0), -ENOENT);
        xb_set_ready(p, 0, 1);
        assert_int_equal(xb_pick(p, 0, 1, NULL, 0), 0);
        xb_release(p, 0, 1);
        xb_pool_free(p);
    }
}

static void test_other_policies_release_to_zero(void **st)
{
    int pols[3] = {XB_POLICY_P2C, XB_POLICY_RR, XB_POLICY_RANDOM};
    for (int k = 0; k < 3; k++) {
        struct xb_pool *p = pool_of(pols[k], 5, NULL, NULL, NULL);
        int counts[5] = {0};
        for (int i = 0; i < 1000; i++) {
            int idx = xb_pick(p, 0, 7, NULL, 0);
            assert_true(idx >= 0 && idx < 5);
            counts[idx]++;
            xb_release(p, idx, 7);
        }
        for (int i = 0; i < 5; i++) {
            assert_true(counts[i] > 0);
            assert_int_equal(p->inst[i].outstanding, 0);
        }
        if (pols[k] == XB_POLICY_RR)
            for (int i = 0; i < 5; i++)
                assert_int_equal(counts[i], 200);
        xb_pool_free(p);
    }
}

/* A rank at its max_inflight is passed over while another has room, whatever its token load. */
static void test_max_inflight_soft_cap(void **st)
{
    struct xb_pool *p = xb_pool_new(XB_POLICY_LOT, 1);
    for (int i = 0; i < 2; i++) {
        struct xb_instance_cfg c = {1, 1, 0, 2, 0};
        xb_pool_add(p, &c);
    }
    int a = xb_pick(p, 0, 1, NULL, 0), b = xb_pick(p, 0, 1, NULL, 0); /* one each (rotation) */
    assert_true(a != b);
    xb_release(p, b, 1);
    assert_int_equal(xb_pick(p, 0, 100000, NULL, 0), b); /* lot: b was idle; now it carries a huge load */
    assert_int_equal(xb_pick(p, 0, 1, NULL, 0), a);      /* lot: a is lighter; a is now full (2/2) */
    assert_int_equal(xb_pick(p, 0, 1, NULL, 0), b);      /* a full: b, despite its 100000 tokens */
    int any = xb_pick(p, 0, 1, NULL, 0);        /* all full: the policy picks among all */
    assert_true(any == a || any == b);
    xb_pool_free(p);
}

/* "failing": the last reported attempt failed, with passive ejection off too (a decode failing with a prefill's KV
 * takes it as unreachable when that prefill's last attempt failed) */
static void test_failing(void **st)
{
    struct xb_pool *p = pool_of(XB_POLICY_RR, 2, NULL, NULL, NULL);
    xb_set_ejection(p, 0, 50, 200);
    struct xb_instance_stats s;
    xb_stats(p, 0, &s);
    assert_false(s.failing);
    xb_report(p, 0, 0);
    xb_stats(p, 0, &s);
    assert_true(s.failing && !s.ejected);
    xb_stats(p, 1, &s);
    assert_false(s.failing);
    xb_report(p, 0, 1);
    xb_stats(p, 0, &s);
    assert_false(s.failing);
    /* decodes that failed with its KV: one decode, however often, does not make it failing; a second one does */
    assert_false(xb_report_kv_lost(p, 0, 3));
    assert_false(xb_report_kv_lost(p, 0, 3));
    xb_stats(p, 0, &s);
    assert_false(s.failing);
    assert_true(xb_report_kv_lost(p, 0, 5));
    xb_stats(p, 0, &s);
    assert_true(s.failing && !s.ejected);
    xb_report(p, 0, 1); /* its next success: both forgotten */
    assert_false(xb_report_kv_lost(p, 0, 5));
    xb_stats(p, 0, &s);
    assert_false(s.failing);
    assert_false(xb_report_kv_lost(p, 0, -1)); /* no decode: nothing */
    assert_false(xb_report_kv_lost(p, 7, 1));  /* no such instance */
    xb_pool_free(p);
}

/* Failures for want of another instance's output (a decode lacking a prefill's KV): consecutive ones lacking the
 * same source, which nobody used in between, count once toward ejection (the source's crash); a use in between
 * (another decode took its KV: the decode, not the source, fails), another source or a failure of its own counts. */
static void test_ejection_by_source(void **st)
{
    struct xb_pool *p = pool_of(XB_POLICY_RR, 4, NULL, NULL, NULL), *src = pool_of(XB_POLICY_RR, 4, NULL, NULL, NULL);
    xb_set_ejection(p, 3, 50, 200);
    for (int i = 0; i < 5; i++) /* a prefill's crash: however many of its KV pulls fail, the decode stays */
        assert_int_equal(xb_report_from(p, 0, 0, 2, xb_uses(src, 2)), 0);
    struct xb_instance_stats s;
    xb_stats(p, 0, &s);
    assert_true(s.failing && !s.ejected);
    assert_int_equal(xb_report_from(p, 0, 0, 1, xb_uses(src, 1)), 0);  /* a second source: two */
    assert_int_equal(xb_report_from(p, 0, 0, -1, 0), 50);               /* its own failure: three, out */
    xb_stats(p, 0, &s);
    assert_true(s.ejected && s.ejections == 1);
    /* the source works for others: each failure with it counts */
    assert_int_equal(xb_uses(src, 0), 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(xb_report_from(p, 1, 0, 0, xb_uses(src, 0)), 0);
        xb_report_used(src, 0); /* another decode used prefill 0's KV */
    }
    assert_int_equal(xb_uses(src, 0), 2);
    assert_int_equal(xb_report_from(p, 1, 0, 0, xb_uses(src, 0)), 50);
    /* a success ends the streak and its source: the same source counts again after it */
    assert_int_equal(xb_report_from(p, 2, 0, 3, 0), 0);
    xb_report_from(p, 2, 1, -1, 0);
    assert_int_equal(xb_report_from(p, 2, 0, 3, 0), 0);
    assert_int_equal(xb_report_from(p, 2, 0, 3, 0), 0);
    xb_stats(p, 2, &s);
    assert_false(s.ejected);
    xb_report_used(src, 9); /* no such instance: nothing */
    assert_int_equal(xb_uses(src, 9), 0);
    xb_pool_free(p);
    xb_pool_free(src);
}

/* Passive ejection: out after N consecutive failures, at most half the pool, back after the ejection time. */
/* 1 when instance want is picked within n picks (each released at once) */
static int picked_within(struct xb_pool *p, int want, int n)
{
    int seen = 0;
    for (int i = 0; i < n; i++) {
        int idx = xb_pick(p, 0, 1, NULL, 0);
        seen |= idx == want;
        xb_release(p, idx, 1);
    }
    return seen;
}

static void test_passive_ejection(void **st)
{
    struct xb_pool *p = pool_of(XB_POLICY_RR, 4, NULL, NULL, NULL);
    xb_set_ejection(p, 3, 50, 200);
    assert_int_equal(xb_report(p, 0, 0), 0);
    assert_int_equal(xb_report(p, 0, 0), 0);
    xb_report(p, 0, 1); /* a success resets the streak */
    assert_int_equal(xb_report(p, 0, 0), 0);
    assert_int_equal(xb_report(p, 0, 0), 0);
    assert_int_equal(xb_report(p, 0, 0), 50); /* third in a row: out for 50 ms */
    for (int i = 0; i < 30; i++) {
        int idx = xb_pick(p, 0, 1, NULL, 0);
        assert_true(idx != 0);
        xb_release(p, idx, 1);
    }
    for (int i = 0; i < 3; i++)
        xb_report(p, 1, 0); /* a second one: now half of the pool is out */
    for (int i = 0; i < 3; i++)
        assert_int_equal(xb_report(p, 2, 0), 0); /* a third would be more than half: kept */
    struct xb_instance_stats s;
    xb_stats(p, 0, &s);
    assert_true(s.ejected && s.ejections == 1);
    struct timespec ts = {0, 60 * 1000000};
    nanosleep(&ts, NULL); /* the ejection expires (50 ms) */
    assert_true(picked_within(p, 0, 8));
    for (int i = 0; i < 3; i++)
        xb_report(p, 0, 0);
    xb_stats(p, 0, &s);
    assert_true(s.ejected && s.ejections == 2); /* failed again without a success: the next one lasts 100 ms */
    xb_pool_free(p);
}

/* An engine seen starting again (xb_unejected): out of its ejection at once, its streak and backoff forgotten. */
static void test_unejected(void **st)
{
    struct xb_pool *p = pool_of(XB_POLICY_RR, 4, NULL, NULL, NULL);
    xb_set_ejection(p, 2, 60000, 600000);
    assert_int_equal(xb_unejected(p, 0), 0); /* not ejected: nothing to end */
    xb_report(p, 0, 0);
    assert_int_equal(xb_report(p, 0, 0), 60000);
    struct xb_instance_stats s;
    xb_stats(p, 0, &s);
    assert_true(s.ejected);
    assert_int_equal(xb_unejected(p, 0), 1);
    xb_stats(p, 0, &s);
    assert_false(s.ejected);
    assert_int_equal(s.ejections, 1); /* (the total stays) */
    assert_true(picked_within(p, 0, 8));
    xb_report(p, 1, 0); /* a streak ended too: one more failure does not eject */
    assert_int_equal(xb_unejected(p, 1), 0);
    assert_int_equal(xb_report(p, 1, 0), 0);
    assert_int_equal(xb_report(p, 0, 0), 0);
    assert_int_equal(xb_report(p, 0, 0), 60000); /* and the next ejection is the first length again, not doubled */
    assert_int_equal(xb_unejected(p, -1) + xb_unejected(p, 4), 0);
    xb_pool_free(p);
}

static void *hammer(void *arg)
{
    struct xb_pool *p = arg;
    uint64_t x = (uint64_t)(uintptr_t)&x;
    for (int i = 0; i < 50000; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        int64_t tok = (int64_t)(x >> 40) % 1000 + 1;
        int idx = xb_pick(p, 0, tok, NULL, 0);
        xb_adjust(p, idx, -1);
        xb_release(p, idx, tok - 1);
    }
    return NULL;
}

/* Router replicas: the others' published load steers lot and cache picks, counts against
 * max_inflight, and stays apart from this router's own accounting (releases never touch it). */
static void test_remote_load(void **st)
{
    (void)st;
    int policies[] = {XB_POLICY_LOT, XB_POLICY_CACHE}; /* p2c may draw the same rank twice */
    for (size_t k = 0; k < sizeof policies / sizeof policies[0]; k++) {
        struct xb_pool *p = pool_of(policies[k], 2, NULL, NULL, NULL);
        xb_set_remote(p, 0, 5000, 3);
        for (int i = 0; i < 20; i++) { /* rank 1 until its own load passes the remote 5000 on rank 0 */
            assert_int_equal(xb_pick(p, 0, 200, NULL, 0), 1);
        }
        struct xb_instance_stats s0, s1;
        assert_int_equal(xb_stats(p, 0, &s0), 0);
        assert_int_equal(s0.remote, 5000);
        assert_int_equal(s0.remote_inflight, 3);
        assert_int_equal(s0.outstanding, 0);
        for (int i = 0; i < 20; i++)
            xb_release(p, 1, 200);
        assert_int_equal(xb_stats(p, 1, &s1), 0);
        assert_int_equal(s1.outstanding, 0);
        assert_int_equal(s1.inflight, 0);
        assert_int_equal(xb_stats(p, 0, &s0), 0);
        assert_int_equal(s0.remote, 5000); /* only the replica's next publication changes it */
        xb_set_remote(p, 0, 0, 0);
        xb_set_remote(p, 1, 1, 0);
        assert_int_equal(xb_pick(p, 0, 1, NULL, 0), 0);
        xb_release(p, 0, 1);
        xb_pool_free(p);
    }
    /* max_inflight counts every router's requests: a rank the others fill is passed over */
    struct xb_pool *p = xb_pool_new(XB_POLICY_LOT, 1);
    struct xb_instance_cfg c = {1, 1, 0, 4, 0};
    assert_int_equal(xb_pool_add(p, &c), 0);
    assert_int_equal(xb_pool_add(p, &c), 1);
    xb_set_remote(p, 1, 0, 4);
    for (int i = 0; i < 4; i++)
        assert_int_equal(xb_pick(p, 0, 0, NULL, 0), 0);
    xb_set_hard_cap(p, 1);
    assert_int_equal(xb_pick(p, 0, 0, NULL, 0), -EBUSY);
    assert_int_equal(xb_saturated(p), 1);
    for (int i = 0; i < 4; i++)
        xb_release(p, 0, 0);
    xb_set_remote(p, 1, -7, -1); /* nonsense from a peer is clamped */
    struct xb_instance_stats s;
    assert_int_equal(xb_stats(p, 1, &s), 0);
    assert_int_equal(s.remote, 0);
    assert_int_equal(s.remote_inflight, 0);
    xb_pool_free(p);
}

static void test_thread_safety(void **st)
{
    struct xb_pool *p = pool_of(XB_POLICY_LOT, 4, NULL, NULL, NULL);
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, hammer, p);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    int64_t inflight, outstanding;
    xb_totals(p, &inflight, &outstanding);
    assert_int_equal(inflight, 0);
    assert_int_equal(outstanding, 0);
    uint64_t sel = 0;
    for (int i = 0; i < 4; i++)
        sel += p->inst[i].selected;
    assert_int_equal(sel, 200000);
    xb_pool_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lot_property),          cmocka_unit_test(test_lot_oracle_capacity),
        cmocka_unit_test(test_tie_rotation),
        cmocka_unit_test(test_least_loaded_wins),     cmocka_unit_test(test_max_model_len_and_health),
        cmocka_unit_test(test_learned_max_model_len),
        cmocka_unit_test(test_other_policies_release_to_zero), cmocka_unit_test(test_thread_safety),
        cmocka_unit_test(test_unready_never_picked), cmocka_unit_test(test_remote_load),
        cmocka_unit_test(test_max_inflight_soft_cap), cmocka_unit_test(test_passive_ejection), cmocka_unit_test(test_failing),
        cmocka_unit_test(test_unejected),
        cmocka_unit_test(test_ejection_by_source),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
