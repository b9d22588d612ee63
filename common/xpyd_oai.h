/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_oai.h - OpenAI-shaped error bodies shared by the simulator and the router. */
#ifndef XPYD_OAI_H
#define XPYD_OAI_H

/* The OpenAI/vLLM error type name for an HTTP status ("BadRequestError", "NotFoundError", ...). */
const char *xpyd_oai_error_type(int status);

/* Returns a malloc'ed `{"error":{"message":msg,"type":T,"param":param|null,"code":status}}`; the caller
 * frees it. type NULL means xpyd_oai_error_type(status). Never NULL (aborts on OOM). */
char *xpyd_oai_error_json(int status, const char *type, const char *msg, const char *param);

#endif
