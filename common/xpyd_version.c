/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_version.c - the version and the git revision every binary and /status report. */
#include "xpyd_version.h"

#include "xpyd_gitrev.h" /* generated at build time (cmake/gitrev.cmake) */

#include <stdio.h>

const char *xpyd_version(void)
{
    return XPYD_VERSION;
}

const char *xpyd_git_revision(void)
{
    return XPYD_GIT_REV;
}

void xpyd_print_version(const char *prog)
{
    printf("%s %s (git %s)\n", prog, XPYD_VERSION, XPYD_GIT_REV);
}
