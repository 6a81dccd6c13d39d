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

dt_status dt_arg_set(const dt_opt_row *r, const char *v, void *base) {
    char *p = (char *)base + r->off;
    int64_t iv = 0;
    switch (r->type) {
    case DT_OPT_STR: *(const char **)p = v; return DT_OK;
    case DT_OPT_ON: *(int *)p = 1; return DT_OK;
    case DT_OPT_OFF: *(int *)p = 0; return DT_OK;
    case DT_OPT_F64: return dt_arg_double(r->flag, v, r->lo, r->hi, (double *)p);
    case DT_OPT_PAIR: {
        char buf[128];
        const char *comma = v ? strchr(v, ',') : NULL;
        if (!comma || strlen(v) >= sizeof buf)
            return dt_error(DT_ERR_INVALID, "%s: expected %s (for example %s), got '%s'", r->flag, r->arg,
                            r->example, v ? v : "");
        snprintf(buf, sizeof buf, "%.*s", (int)(comma - v), v);
        double a, b;
        DT_TRY(dt_arg_double(r->flag, buf, r->lo, r->hi, &a));
        DT_TRY(dt_arg_double(r->flag, comma + 1, r->lo, r->hi, &b));
        *(double *)p = a;
        *(double *)((char *)base + r->off2) = b;
        return DT_OK;
    }
    case DT_OPT_INT: case DT_OPT_I64: case DT_OPT_U64: case DT_OPT_SIZE: break;
    }
    DT_TRY(dt_arg_int(r->flag, v, (int64_t)r->lo, r->hi >= 9.2e18 ? INT64_MAX : (int64_t)r->hi,
                      r->type == DT_OPT_SIZE, &iv));
    if (r->type == DT_OPT_INT) *(int *)p = (int)iv;
    else if (r->type == DT_OPT_I64) *(int64_t *)p = iv;
    else if (r->type == DT_OPT_U64) *(uint64_t *)p = (uint64_t)iv;
    else *(size_t *)p = (size_t)iv;
    return DT_OK;
}

const dt_opt_row *dt_arg_find_row(const dt_opt_row *rows, int n, const char *a) {
    for (int k = 0; k < n; k++)
        if (!strcmp(a, rows[k].flag)) return &rows[k];
    return NULL;
}

const dt_opt_row *dt_arg_match_row(const dt_opt_row *rows, int n, int argc, char **argv, int *i, void *base,
                                   dt_status *err) {
    for (int k = 0; k < n; k++) {
        const dt_opt_row *r = &rows[k];
        const char *v = NULL;
        if (r->type == DT_OPT_ON || r->type == DT_OPT_OFF) {
            if (strcmp(argv[*i], r->flag) != 0) continue;
            (*i)++;
        } else if (!dt_arg_match(r->flag, argc, argv, i, &v, err)) {
            continue;
        } else if (*err != DT_OK) {
            return r;
        }
        *err = dt_arg_set(r, v, base);
        return r;
    }
    return NULL;
}

void dt_arg_help_row(FILE *f, const dt_opt_row *r) {
    char left[128];
    int len = snprintf(left, sizeof left, "  %s%s%s", r->flag, r->arg ? " " : "", r->arg ? r->arg : "");
    const char *shown = r->shown ? r->shown : r->type == DT_OPT_ON || r->type == DT_OPT_OFF ? "" : r->def;
    const char *h = r->help;
    fprintf(f, "%s%*s", left, len <= 22 ? 24 - len : 2, "");
    for (;;) {
        size_t line = strcspn(h, "\n");
        fwrite(h, 1, line, f);
        if (!h[line]) break;
        fprintf(f, "\n%24s", "");
        h += line + 1;
    }
    if (shown && *shown) fprintf(f, "%s[%s]", *r->help ? "  " : "", shown);
    fputc('\n', f);
}

const char *dt_arg_flag_message(const dt_opt_row *rows, int nrows, const char *msg, char *buf, size_t n) {
    size_t pre = 0;
    if (!strncmp(msg, "rank ", 5)) {   /* "rank R: " from a distributed run */
        size_t d = 5;
        while (msg[d] >= '0' && msg[d] <= '9') d++;
        if (d > 5 && msg[d] == ':' && msg[d + 1] == ' ') pre = d + 2;
    }
    for (int k = 0; k < nrows; k++) {
        const char *names[2] = {rows[k].field, rows[k].field2};
        for (int j = 0; j < 2 && names[j]; j++) {
            size_t len = strlen(names[j]);
            if (!strncmp(msg + pre, names[j], len) && msg[pre + len] == ':') {
                snprintf(buf, n, "%.*s%s%s", (int)pre, msg, rows[k].flag, msg + pre + len);
                return buf;
            }
        }
    }
    snprintf(buf, n, "%s", msg);
    return buf;
}
