/* SPDX-License-Identifier: Apache-2.0 */
/* slow_socket_writes.c - an LD_PRELOAD shim for tests: after every write to a socket the calling thread sleeps
 * XPYD_TEST_SOCKET_WRITE_DELAY_US microseconds. What a process does right after it writes then happens that much
 * later, so a test can see whether something the peer may look at next was done before the write or after it.
 * Built by the test that uses it (tests/blackbox/test_router_metrics.py); nothing else loads it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static long delay_us(void)
{
    static long d = -1;
    if (d < 0) {
        const char *s = getenv("XPYD_TEST_SOCKET_WRITE_DELAY_US");
        d = s ? atol(s) : 0;
    }
    return d;
}

static void after(int fd, ssize_t n)
{
    struct stat st;
    if (n <= 0 || delay_us() <= 0 || fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode))
        return;
    struct timespec ts = {delay_us() / 1000000, (delay_us() % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* NAME PARAMS: the libc call (found once with RTLD_NEXT), then the sleep */
#define WRAP(NAME, PARAMS, ARGS)                                                                                     \
    ssize_t NAME PARAMS                                                                                              \
    {                                                                                                                \
        static ssize_t(*real) PARAMS;                                                                                \
        if (!real)                                                                                                   \
            *(void **)&real = dlsym(RTLD_NEXT, #NAME);                                                               \
        ssize_t r = real ARGS;                                                                                       \
        after(fd, r);                                                                                                \
        return r;                                                                                                    \
    }

WRAP(write, (int fd, const void *buf, size_t n), (fd, buf, n))
WRAP(writev, (int fd, const struct iovec *iov, int cnt), (fd, iov, cnt))
WRAP(send, (int fd, const void *buf, size_t n, int flags), (fd, buf, n, flags))
WRAP(sendmsg, (int fd, const struct msghdr *m, int flags), (fd, m, flags))
