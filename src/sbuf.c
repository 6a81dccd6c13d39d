/*
 * sbuf.c: the growable buffer of sbuf.h. Capacity doubles, so n appends of
 * small pieces cost O(total) copies.
 */
#include "config.h"

#include "sbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void dt_sbuf_put_(dt_sbuf *b, const void *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void dt_sbuf_str_(dt_sbuf *b, const char *s) { dt_sbuf_put_(b, s, strlen(s)); }

void dt_sbuf_printf_(dt_sbuf *b, const char *fmt, ...) {
    char small[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->oom = 1;
        return;
    }
    if ((size_t)n < sizeof small) {
        dt_sbuf_put_(b, small, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->oom = 1;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    dt_sbuf_put_(b, big, (size_t)n);
    free(big);
}

void dt_sbuf_free_(dt_sbuf *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
    b->oom = 0;
}

void dt_sbuf_json_(dt_sbuf *b, const char *s) {
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') dt_sbuf_printf_(b, "\\%c", c);
        else if (c < 0x20) dt_sbuf_printf_(b, "\\u%04x", c);
        else dt_sbuf_put_(b, s, 1);
    }
}
