/* SPDX-License-Identifier: Apache-2.0 */
/* migrate.h - decode migration (migrate.c): a stream whose decode failed mid-stream goes on at another decode. */
#ifndef XPYD_MIGRATE_H
#define XPYD_MIGRATE_H

/* Installs migration in the request core (request.h's req_set_migration): a decode that fails after tokens
 * reached the client is counted, logged, released, and a continuation goes to another decode after the
 * backoff, when decide.c's rules allow. */
void rt_migration_install(void);

#endif
