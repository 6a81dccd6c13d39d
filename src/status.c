/*
 * status.c: thread-local error messages behind dt_last_error().
 */
#include "status.h"

#include <stdio.h>
#include <string.h>

#define DT_ERRMSG_MAX 1024
static _Thread_local char errmsg[DT_ERRMSG_MAX];

const char *dt_last_error(void) { return errmsg; }

const char *dt_status_str(dt_status s) {
    switch (s) {
    case DT_OK:              return "ok";
    case DT_ERR_INVALID:     return "invalid argument";
    case DT_ERR_IO:          return "I/O error";
    case DT_ERR_NOMEM:       return "out of memory";
    case DT_ERR_FORMAT:      return "bad format";
    case DT_ERR_TIMEOUT:     return "timeout";
    case DT_ERR_PEER:        return "peer failure";
    case DT_ERR_MISMATCH:    return "mismatch";
    case DT_ERR_UNSUPPORTED: return "unsupported";
    case DT_ERR_INTERNAL:    return "internal error";
    case DT_ERR_NONFINITE:   return "non-finite value";
    case DT_ERR_STOPPED:     return "stopped";
    }
    return "unknown status";
}

dt_status dt_verror(dt_status s, const char *fmt, va_list ap) {
    vsnprintf(errmsg, sizeof errmsg, fmt, ap);
    return s;
}

dt_status dt_error(dt_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    dt_verror(s, fmt, ap);
    va_end(ap);
    return s;
}

dt_status dt_error_wrap(dt_status s, const char *fmt, ...) {
    char old[DT_ERRMSG_MAX], pre[DT_ERRMSG_MAX];
    memcpy(old, errmsg, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    if (snprintf(errmsg, sizeof errmsg, "%s%s", pre, old) >= (int)sizeof errmsg)
        memcpy(errmsg + sizeof errmsg - 4, "...", 4);   /* cut: the reader sees that it was */
    return s;
}

void dt_error_clear(void) { errmsg[0] = '\0'; }

int dt_exit_code(dt_status s) {
    if (s == DT_OK) return 0;
    if (s == DT_ERR_INVALID || s == DT_ERR_FORMAT) return 2;
    return 1;
}
