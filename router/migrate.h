/* SPDX-License-Identifier: Apache-2.0 */
/* migrate.h - decode migration (migrate.c): a stream whose decode failed mid-stream goes on at another decode. */
#ifndef XPYD_MIGRATE_H
#define XPYD_MIGRATE_H

#include "request_state.h"

/* The decode of r failed after tokens reached the client: may the stream go on elsewhere? */
int req_may_migrate(const struct request *r);
/* It does: counted, logged, the decode released, a continuation sent after the backoff (err: the leg's). */
void req_migrate(struct request *r, int err);

#endif
