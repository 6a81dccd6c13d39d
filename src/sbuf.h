/*
 * sbuf.h: dt_sbuf, a growable byte buffer kept NUL-terminated (not installed).
 *
 * The safetensors writer builds its JSON header in one, the checkpoint writer
 * and reader build the description their checksums cover in another. Appends
 * never fail on the spot: an allocation failure sets oom, later appends do
 * nothing, and the owner checks oom once at the end, so building code stays a
 * straight list of appends.
 */
#ifndef DT_SBUF_H
#define DT_SBUF_H

#include <stddef.h>

typedef struct {
    char  *p;      /* len bytes, then a NUL (NULL until the first append) */
    size_t len, cap;
    int    oom;    /* an allocation failed: the contents are incomplete */
} dt_sbuf;

/* Append n bytes of s (which may hold NULs). */
void dt_sbuf_put_(dt_sbuf *b, const void *s, size_t n);
/* Append the string s (without its NUL). */
void dt_sbuf_str_(dt_sbuf *b, const char *s);
/* Append printf-formatted text. */
void dt_sbuf_printf_(dt_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Append s as a JSON string's contents: quotes, backslashes and control bytes escaped. */
void dt_sbuf_json_(dt_sbuf *b, const char *s);
/* Release the memory; b becomes empty. */
void dt_sbuf_free_(dt_sbuf *b);

#endif /* DT_SBUF_H */
