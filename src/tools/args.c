/*
 * args.c: strict command-line value parsing (see args.h).
 */
#include "args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dt_status dt_arg_int(const char *flag, const char *s, int64_t lo, int64_t hi, int suffix, int64_t *out) {
    if (!s || !*s) return dt_error(DT_ERR_INVALID, "%s: expected an integer, got an empty value", flag);
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || errno == ERANGE)
        return dt_error(DT_ERR_INVALID, "%s: expected an integer, got '%s'", flag, s);
    int shift = 0;
    if (suffix && *end) {
        switch (*end) {
        case 'k': case 'K': shift = 10; end++; break;
        case 'm': case 'M': shift = 20; end++; break;
        case 'g': case 'G': shift = 30; end++; break;
        default: break;
        }
        if (shift && (*end == 'B' || *end == 'b')) end++;
    }
    if (*end) return dt_error(DT_ERR_INVALID, "%s: expected an integer%s, got '%s'", flag,
                              suffix ? " (optionally with K, M or G)" : "", s);
    if (shift && (v > (INT64_MAX >> shift) || v < -(INT64_MAX >> shift)))
        return dt_error(DT_ERR_INVALID, "%s: '%s' is too large", flag, s);
    int64_t x = (int64_t)v * ((int64_t)1 << shift);
    if (x < lo || x > hi)
        return dt_error(DT_ERR_INVALID, "%s: expected a value in [%lld, %lld], got '%s'", flag, (long long)lo,
                        (long long)hi, s);
    *out = x;
    return DT_OK;
}

dt_status dt_arg_double(const char *flag, const char *s, double lo, double hi, double *out) {
    if (!s || !*s) return dt_error(DT_ERR_INVALID, "%s: expected a number, got an empty value", flag);
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno == ERANGE || !isfinite(v))
        return dt_error(DT_ERR_INVALID, "%s: expected a number, got '%s'", flag, s);
    if (v < lo || v > hi)
        return dt_error(DT_ERR_INVALID, "%s: expected a value in [%g, %g], got '%s'", flag, lo, hi, s);
    *out = v;
    return DT_OK;
}

int dt_arg_match(const char *flag, int argc, char **argv, int *i, const char **val, dt_status *err) {
    const char *a = argv[*i];
    size_t n = strlen(flag);
    if (strncmp(a, flag, n) != 0) return 0;
    if (a[n] == '=') {
        *val = a + n + 1;
        (*i)++;
        return 1;
    }
    if (a[n] != '\0') return 0;
    if (*i + 1 >= argc) {
        *err = dt_error(DT_ERR_INVALID, "%s: expected a value after it", flag);
        *val = NULL;
        (*i)++;
        return 1;
    }
    *val = argv[*i + 1];
    *i += 2;
    return 1;
}

const char *dt_arg_flag_message(const dt_arg_field *table, const char *msg, char *buf, size_t n) {
    size_t pre = 0;
    if (!strncmp(msg, "rank ", 5)) {   /* "rank R: " from a distributed run */
        size_t d = 5;
        while (msg[d] >= '0' && msg[d] <= '9') d++;
        if (d > 5 && msg[d] == ':' && msg[d + 1] == ' ') pre = d + 2;
    }
    for (const dt_arg_field *f = table; f->field; f++) {
        size_t len = strlen(f->field);
        if (!strncmp(msg + pre, f->field, len) && msg[pre + len] == ':') {
            snprintf(buf, n, "%.*s%s%s", (int)pre, msg, f->flag, msg + pre + len);
            return buf;
        }
    }
    snprintf(buf, n, "%s", msg);
    return buf;
}
