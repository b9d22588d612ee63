/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_version.h - version and build revision. */
#ifndef XPYD_VERSION_H
#define XPYD_VERSION_H

/* The project version, e.g. "0.1.0". */
const char *xpyd_version(void);
/* The git revision the binary was built from ("<12 hex>[-dirty]", or "unknown"). */
const char *xpyd_git_revision(void);
/* Prints "<prog> <version> (git <revision>)" and a newline to stdout (the --version answer). */
void xpyd_print_version(const char *prog);

#endif
