/* SPDX-License-Identifier: Apache-2.0 */
/* fake_verbs.h - controls of the fake libibverbs used by the RDMA transport tests (see fake_verbs.c). */
#ifndef XPYD_FAKE_VERBS_H
#define XPYD_FAKE_VERBS_H

#include <infiniband/verbs.h>

struct fake_verbs_counts {
    int qps, mrs, cqs, pds, contexts;
    int posts_before_rts; /* ibv_post_send calls on a QP that was not in RTS */
};

/* fail != 0: every work request on that device (or to a QP on it) completes with IBV_WC_RETRY_EXC_ERR. */
void fake_verbs_fail_device(const char *name, int fail);
/* The active MTU of a device's port for contexts opened from now on (default 4096). */
void fake_verbs_set_port_mtu(const char *name, enum ibv_mtu mtu);
/* The largest path MTU of any QP at RTR or beyond. */
enum ibv_mtu fake_verbs_max_path_mtu(void);
/* Objects alive right now (leak checks) and misuse counters. */
void fake_verbs_live(struct fake_verbs_counts *c);

#endif
