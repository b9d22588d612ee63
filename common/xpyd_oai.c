/* SPDX-License-Identifier: Apache-2.0 */
/* xpyd_oai.c - OpenAI error shape builder. */
#include "xpyd_oai.h"

#include "xpyd_util.h"

#include <cjson/cJSON.h>

const char *xpyd_oai_error_type(int status)
{
    switch (status) {
    case 400: return "BadRequestError";
    case 401: return "AuthenticationError";
    case 403: return "PermissionDeniedError";
    case 404: return "NotFoundError";
    case 408: return "RequestTimeoutError";
    case 409: return "ConflictError";
    case 413: return "RequestTooLargeError";
    case 422: return "UnprocessableEntityError";
    case 429: return "RateLimitError";
    case 502: return "BadGatewayError";
    case 503: return "ServiceUnavailableError";
    case 504: return "GatewayTimeoutError";
    case 508: return "LoopDetectedError";
    default: return status >= 500 ? "InternalServerError" : "BadRequestError";
    }
}

char *xpyd_oai_error_json(int status, const char *type, const char *msg, const char *param)
{
    cJSON *root = XPYD_XALLOC(cJSON_CreateObject());
    cJSON *err = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(err, "message", msg ? msg : "");
    cJSON_AddStringToObject(err, "type", type ? type : xpyd_oai_error_type(status));
    if (param)
        cJSON_AddStringToObject(err, "param", param);
    else
        cJSON_AddNullToObject(err, "param");
    cJSON_AddNumberToObject(err, "code", status);
    char *s = XPYD_XALLOC(cJSON_PrintUnformatted(root));
    cJSON_Delete(root);
    return s;
}
