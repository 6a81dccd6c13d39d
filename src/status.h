/*
 * status.h: how every dtrain library call reports failure.
 *
 * Library functions never print and never exit (docs/DESIGN.md rule 5). They return a
 * dt_status and leave one line for dt_last_error() saying what went wrong and,
 * where it applies, which file, flag, rank or collective. The message is
 * thread-local, so a communication thread's error does not clobber the caller's.
 */
#ifndef DT_STATUS_H
#define DT_STATUS_H

#include <stdarg.h>

#include "dt_api.h"

typedef enum {
    DT_OK = 0,
    DT_ERR_INVALID,      /* bad argument, flag or input: the programs exit 2 */
    DT_ERR_IO,           /* a file or system call failed */
    DT_ERR_NOMEM,        /* an allocation failed */
    DT_ERR_FORMAT,       /* a file or message is corrupt, truncated or of the wrong kind */
    DT_ERR_TIMEOUT,      /* a blocking operation passed its deadline */
    DT_ERR_PEER,         /* a peer disconnected, died or broke the protocol */
    DT_ERR_MISMATCH,     /* ranks called different collectives, or disagree on a value */
    DT_ERR_UNSUPPORTED,  /* the backend or build cannot do this */
    DT_ERR_INTERNAL,     /* a bug in dtrain */
    DT_ERR_NONFINITE,    /* a loss or gradient became NaN or infinite (training diverged) */
    DT_ERR_STOPPED,      /* a wait ended because its owner asked it to stop (shutting down) */
} dt_status;

/* The message of the last failure on this thread ("" when none). */
DT_API const char *dt_last_error(void);
/* A short name for a status ("invalid argument", "timeout", ...). */
DT_API const char *dt_status_str(dt_status s);
/* Record a message (printf-style) and return s, so callers write `return dt_error(...)`. */
DT_API dt_status   dt_error(dt_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
DT_API dt_status   dt_verror(dt_status s, const char *fmt, va_list ap);
/* Prepend context to the current message ("loading ckpt/model.safetensors: " + old). */
DT_API dt_status   dt_error_wrap(dt_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Forget the current message. */
DT_API void        dt_error_clear(void);
/* Exit code a program should use for s: 0 ok, 2 bad input, 1 anything else. */
DT_API int         dt_exit_code(dt_status s);

/* Check-and-return: evaluate a dt_status expression and return it on failure. */
#define DT_TRY(expr) do { dt_status dt_try_s_ = (expr); if (dt_try_s_ != DT_OK) return dt_try_s_; } while (0)

#endif /* DT_STATUS_H */
