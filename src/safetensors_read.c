/*
 * safetensors_read.c: reading and validating safetensors files.
 *
 * The header parser is a strict recursive-descent JSON parser for exactly the
 * shape safetensors uses (an object of objects, strings, arrays of unsigned
 * integers); anything else, including JSON that is valid but not of that
 * shape, is a format error with the byte offset where it went wrong. The
 * layout is then checked as a whole (sizes, contiguity, coverage) before the
 * file is handed out.
 */
#define _FILE_OFFSET_BITS 64 /* 64-bit off_t for files over 2 GiB on 32-bit hosts */
#include "config.h"

#include "safetensors.h"
#include "safetensors_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The reference implementation refuses headers over 100 MB; so do we. */
#define MAX_HEADER ((uint64_t)100 << 20)

/* ---- JSON parsing of the header --------------------------------------------
 * The helpers are shared with the index reader (safetensors_index.c), which parses
 * an index file's JSON with the same rules; safetensors_impl.h declares them. */

dt_status dt_jerr_(dt_jparse_ *j, const char *what) {
    return dt_error(DT_ERR_FORMAT, "%s: bad %s at byte %lld of the JSON: %s", j->label, j->kind,
                    (long long)(j->p - j->base), what);
}

void dt_jws_(dt_jparse_ *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

int dt_jpeek_(dt_jparse_ *j, char c) {
    dt_jws_(j);
    return j->p < j->end && *j->p == c;
}

dt_status dt_jexpect_(dt_jparse_ *j, char c) {
    dt_jws_(j);
    if (j->p >= j->end || *j->p != c) {
        char msg[32];
        snprintf(msg, sizeof msg, "expected '%c'", c);
        return dt_jerr_(j, msg);
    }
    j->p++;
    return DT_OK;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int read_hex4(dt_jparse_ *j, uint32_t *v) {
    if (j->end - j->p < 4) return 0;
    *v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(j->p[i]);
        if (h < 0) return 0;
        *v = (*v << 4) | (uint32_t)h;
    }
    j->p += 4;
    return 1;
}

/* A JSON string into a new NUL-terminated UTF-8 buffer. */
dt_status dt_jstring_(dt_jparse_ *j, char **out) {
    *out = NULL;
    DT_TRY(dt_jexpect_(j, '"'));
    dt_sbuf b = {0};
    dt_sbuf_put_(&b, "", 0);
    while (1) {
        if (j->p >= j->end) {
            free(b.p);
            return dt_jerr_(j, "unterminated string");
        }
        unsigned char c = (unsigned char)*j->p;
        if (c == '"') break;
        if (c < 0x20) {
            free(b.p);
            return dt_jerr_(j, "control character in a string");
        }
        if (c != '\\') {
            dt_sbuf_put_(&b, j->p, 1);
            j->p++;
            continue;
        }
        j->p++;
        if (j->p >= j->end) break;
        char e = *j->p++;
        const char *simple = NULL;
        switch (e) {
        case '"': simple = "\""; break;
        case '\\': simple = "\\"; break;
        case '/': simple = "/"; break;
        case 'b': simple = "\b"; break;
        case 'f': simple = "\f"; break;
        case 'n': simple = "\n"; break;
        case 'r': simple = "\r"; break;
        case 't': simple = "\t"; break;
        case 'u': break;
        default:
            free(b.p);
            return dt_jerr_(j, "bad escape in a string");
        }
        if (simple) {
            dt_sbuf_put_(&b, simple, 1);
            continue;
        }
        uint32_t cp;
        if (!read_hex4(j, &cp)) {
            free(b.p);
            return dt_jerr_(j, "bad \\u escape");
        }
        if (cp >= 0xD800 && cp <= 0xDBFF) { /* a surrogate pair */
            uint32_t lo;
            if (j->end - j->p < 2 || j->p[0] != '\\' || j->p[1] != 'u' || (j->p += 2, !read_hex4(j, &lo)) ||
                lo < 0xDC00 || lo > 0xDFFF) {
                free(b.p);
                return dt_jerr_(j, "unpaired surrogate in a \\u escape");
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            free(b.p);
            return dt_jerr_(j, "unpaired surrogate in a \\u escape");
        }
        if (cp == 0) {
            free(b.p);
            return dt_jerr_(j, "NUL character in a string");
        }
        char u[4];
        size_t n;
        if (cp < 0x80) { u[0] = (char)cp; n = 1; }
        else if (cp < 0x800) { u[0] = (char)(0xC0 | (cp >> 6)); u[1] = (char)(0x80 | (cp & 0x3F)); n = 2; }
        else if (cp < 0x10000) {
            u[0] = (char)(0xE0 | (cp >> 12)); u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
            u[2] = (char)(0x80 | (cp & 0x3F)); n = 3;
        } else {
            u[0] = (char)(0xF0 | (cp >> 18)); u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
            u[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); u[3] = (char)(0x80 | (cp & 0x3F)); n = 4;
        }
        dt_sbuf_put_(&b, u, n);
    }
    j->p++; /* closing quote */
    if (b.oom) {
        free(b.p);
        return dt_error(DT_ERR_NOMEM, "%s: out of memory parsing the %s", j->label, j->kind);
    }
    if (!dt_utf8_valid_((const unsigned char *)b.p, b.len)) {
        free(b.p);
        return dt_jerr_(j, "string is not valid UTF-8");
    }
    *out = b.p;
    return DT_OK;
}

/* A non-negative JSON integer (no sign, fraction or exponent; no leading zeros). */
static dt_status juint(dt_jparse_ *j, uint64_t *out) {
    dt_jws_(j);
    const char *s = j->p;
    uint64_t v = 0;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
        unsigned d = (unsigned)(*j->p - '0');
        if (v > (UINT64_MAX - d) / 10) return dt_jerr_(j, "integer too large");
        v = v * 10 + d;
        j->p++;
    }
    if (j->p == s) return dt_jerr_(j, "expected a non-negative integer");
    if (j->p - s > 1 && *s == '0') return dt_jerr_(j, "integer with a leading zero");
    if (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E'))
        return dt_jerr_(j, "expected an integer, found a fraction or exponent");
    *out = v;
    return DT_OK;
}

/* [u, u, ...] with at most max elements. */
static dt_status juint_array(dt_jparse_ *j, uint64_t *vals, int max, int *n) {
    *n = 0;
    DT_TRY(dt_jexpect_(j, '['));
    if (dt_jpeek_(j, ']')) {
        j->p++;
        return DT_OK;
    }
    while (1) {
        if (*n == max) return dt_jerr_(j, "array too long");
        DT_TRY(juint(j, &vals[(*n)++]));
        dt_jws_(j);
        if (dt_jpeek_(j, ',')) {
            j->p++;
            continue;
        }
        return dt_jexpect_(j, ']');
    }
}

/* ---- reader --------------------------------------------------------------- */

typedef struct {
    char       *name;
    dt_dtype    dtype;
    int         ndim;
    int64_t     shape[DT_ST_MAX_DIMS];
    uint64_t    begin, end;   /* in base's data region */
    const unsigned char *base;
    void       *aligned;  /* a copy when begin is not a multiple of the element size */
} rtensor;

struct dt_st_file {
    char     label[512];
    rtensor *t;
    size_t   nt, capt;
    char   **meta;       /* key, value, ... */
    size_t   nmeta, capmeta;
    unsigned char *data; /* the data region, 64-byte aligned */
    size_t   data_len;
    /* name indices sorted with strcmp, built once after parsing: duplicates are
     * neighbours and lookups are binary searches, so a header of n names costs
     * O(n log n), not O(n^2) */
    const rtensor **t_by_name;
    char  *const  **meta_by_key;   /* pointers at the key slots of meta */
    /* a union of files (dt_st_union_): their tensors are listed in t, their names,
     * copies and data stay theirs, and data is NULL */
    dt_st_file **parts;
    size_t       nparts;
};

void dt_st_close(dt_st_file *f) {
    if (!f) return;
    for (size_t i = 0; i < f->nt && !f->parts; i++) {
        free(f->t[i].name);
        free(f->t[i].aligned);
    }
    for (size_t i = 0; i < f->nparts; i++) dt_st_close(f->parts[i]);
    free(f->parts);
    for (size_t i = 0; i < 2 * f->nmeta; i++) free(f->meta[i]);
    free(f->t);
    free(f->meta);
    free(f->t_by_name);
    free(f->meta_by_key);
    free(f->data);
    free(f);
}

static dt_status parse_metadata(dt_jparse_ *j, dt_st_file *f) {
    DT_TRY(dt_jexpect_(j, '{'));
    if (dt_jpeek_(j, '}')) {
        j->p++;
        return DT_OK;
    }
    while (1) {
        char *k = NULL, *v = NULL;
        DT_TRY(dt_jstring_(j, &k));
        dt_status s = dt_jexpect_(j, ':');
        if (s == DT_OK && !dt_jpeek_(j, '"')) s = dt_jerr_(j, "metadata values must be strings");
        if (s == DT_OK) s = dt_jstring_(j, &v);
        if (s == DT_OK && f->nmeta == f->capmeta) {
            size_t cap = f->capmeta ? 2 * f->capmeta : 8;
            char **m = realloc(f->meta, 2 * cap * sizeof *m);
            if (!m) s = dt_error(DT_ERR_NOMEM, "%s: out of memory", f->label);
            else {
                f->meta = m;
                f->capmeta = cap;
            }
        }
        if (s != DT_OK) {
            free(k);
            free(v);
            return s;
        }
        f->meta[2 * f->nmeta] = k;
        f->meta[2 * f->nmeta + 1] = v;
        f->nmeta++;
        if (dt_jpeek_(j, ',')) {
            j->p++;
            continue;
        }
        return dt_jexpect_(j, '}');
    }
}

/* {"dtype": ..., "shape": [...], "data_offsets": [b, e]} in any key order. */
static dt_status parse_tensor(dt_jparse_ *j, dt_st_file *f, rtensor *t) {
    int have_dtype = 0, have_shape = 0, have_off = 0;
    DT_TRY(dt_jexpect_(j, '{'));
    if (dt_jpeek_(j, '}')) return dt_jerr_(j, "empty tensor entry");
    while (1) {
        char *k = NULL;
        DT_TRY(dt_jstring_(j, &k));
        dt_status s = dt_jexpect_(j, ':');
        if (s == DT_OK && strcmp(k, "dtype") == 0 && !have_dtype) {
            char *v = NULL;
            s = dt_jstring_(j, &v);
            if (s == DT_OK && dt_dtype_from_st(v, &t->dtype) != DT_OK)
                s = dt_error(DT_ERR_FORMAT, "%s: tensor \"%s\": unknown dtype \"%s\"", f->label, t->name, v);
            free(v);
            have_dtype = 1;
        } else if (s == DT_OK && strcmp(k, "shape") == 0 && !have_shape) {
            uint64_t dims[DT_ST_MAX_DIMS];
            s = juint_array(j, dims, DT_ST_MAX_DIMS, &t->ndim);
            for (int i = 0; s == DT_OK && i < t->ndim; i++) {
                if (dims[i] > (uint64_t)INT64_MAX) s = dt_jerr_(j, "dimension too large");
                t->shape[i] = (int64_t)dims[i];
            }
            have_shape = 1;
        } else if (s == DT_OK && strcmp(k, "data_offsets") == 0 && !have_off) {
            uint64_t o[2] = {0, 0};
            int n;
            s = juint_array(j, o, 2, &n);
            if (s == DT_OK && n != 2) s = dt_jerr_(j, "data_offsets must hold two integers");
            t->begin = o[0];
            t->end = o[1];
            have_off = 1;
        } else if (s == DT_OK) {
            s = dt_error(DT_ERR_FORMAT, "%s: tensor \"%s\": unexpected or repeated key \"%s\"", f->label, t->name, k);
        }
        free(k);
        DT_TRY(s);
        if (dt_jpeek_(j, ',')) {
            j->p++;
            continue;
        }
        DT_TRY(dt_jexpect_(j, '}'));
        break;
    }
    if (!have_dtype || !have_shape || !have_off)
        return dt_error(DT_ERR_FORMAT, "%s: tensor \"%s\" lacks %s", f->label, t->name,
                        !have_dtype ? "\"dtype\"" : !have_shape ? "\"shape\"" : "\"data_offsets\"");
    return DT_OK;
}

static dt_status parse_header(dt_st_file *f, const char *json, size_t len) {
    dt_jparse_ j = {json, json, json + len, f->label, "safetensors header"};
    if (len == 0 || json[0] != '{') return dt_jerr_(&j, "the header must start with '{'");
    if (!dt_utf8_valid_((const unsigned char *)json, len)) return dt_jerr_(&j, "the header is not valid UTF-8");
    DT_TRY(dt_jexpect_(&j, '{'));
    int have_meta = 0;
    if (!dt_jpeek_(&j, '}')) {
        while (1) {
            char *k = NULL;
            DT_TRY(dt_jstring_(&j, &k));
            dt_status s = dt_jexpect_(&j, ':');
            if (s == DT_OK && strcmp(k, "__metadata__") == 0) {
                if (have_meta) s = dt_error(DT_ERR_FORMAT, "%s: bad safetensors header: two __metadata__", f->label);
                else s = parse_metadata(&j, f);
                have_meta = 1;
                free(k);
            } else if (s == DT_OK) {
                if (s == DT_OK && f->nt == f->capt) {
                    size_t cap = f->capt ? 2 * f->capt : 16;
                    rtensor *t = realloc(f->t, cap * sizeof *t);
                    if (!t) s = dt_error(DT_ERR_NOMEM, "%s: out of memory", f->label);
                    else {
                        f->t = t;
                        f->capt = cap;
                    }
                }
                if (s == DT_OK) {
                    rtensor *t = &f->t[f->nt++];
                    memset(t, 0, sizeof *t);
                    t->name = k;
                    k = NULL;
                    s = parse_tensor(&j, f, t);
                }
                free(k);
            } else {
                free(k);
            }
            DT_TRY(s);
            if (dt_jpeek_(&j, ',')) {
                j.p++;
                continue;
            }
            DT_TRY(dt_jexpect_(&j, '}'));
            break;
        }
    } else {
        j.p++;
    }
    dt_jws_(&j);
    if (j.p != j.end) return dt_jerr_(&j, "unexpected text after the closing '}' (only space padding may follow)");
    return DT_OK;
}

static int cmp_tensor_names(const void *a, const void *b) {
    return strcmp((*(const rtensor *const *)a)->name, (*(const rtensor *const *)b)->name);
}

static int cmp_meta_keys(const void *a, const void *b) {
    return strcmp(**(char *const *const *)a, **(char *const *const *)b);
}

/* Sort the name indices; a name given twice is an error naming it. */
static dt_status index_names(dt_st_file *f) {
    f->t_by_name = malloc((f->nt ? f->nt : 1) * sizeof *f->t_by_name);
    f->meta_by_key = malloc((f->nmeta ? f->nmeta : 1) * sizeof *f->meta_by_key);
    if (!f->t_by_name || !f->meta_by_key) return dt_error(DT_ERR_NOMEM, "%s: out of memory", f->label);
    for (size_t i = 0; i < f->nt; i++) f->t_by_name[i] = &f->t[i];
    for (size_t i = 0; i < f->nmeta; i++) f->meta_by_key[i] = &f->meta[2 * i];
    qsort(f->t_by_name, f->nt, sizeof *f->t_by_name, cmp_tensor_names);
    qsort(f->meta_by_key, f->nmeta, sizeof *f->meta_by_key, cmp_meta_keys);
    for (size_t i = 1; i < f->nt; i++)
        if (strcmp(f->t_by_name[i - 1]->name, f->t_by_name[i]->name) == 0)
            return dt_error(DT_ERR_FORMAT, "%s: bad safetensors header: tensor \"%s\" appears twice", f->label,
                            f->t_by_name[i]->name);
    for (size_t i = 1; i < f->nmeta; i++)
        if (strcmp(*f->meta_by_key[i - 1], *f->meta_by_key[i]) == 0)
            return dt_error(DT_ERR_FORMAT, "%s: bad safetensors header: metadata key \"%s\" appears twice",
                            f->label, *f->meta_by_key[i]);
    return DT_OK;
}

static int cmp_offsets(const void *a, const void *b) {
    const rtensor *x = *(rtensor *const *)a, *y = *(rtensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Offsets in range, sized right, contiguous from 0 to the end of the data. */
static dt_status check_layout(dt_st_file *f) {
    for (size_t i = 0; i < f->nt; i++) {
        rtensor *t = &f->t[i];
        uint64_t bytes;
        if (dt_st_tensor_bytes_(t->dtype, t->ndim, t->shape, &bytes) != DT_OK)
            return dt_error(DT_ERR_FORMAT, "%s: tensor \"%s\": shape overflows", f->label, t->name);
        if (t->end < t->begin)
            return dt_error(DT_ERR_FORMAT, "%s: tensor \"%s\": data_offsets [%llu, %llu] end before they begin",
                            f->label, t->name, (unsigned long long)t->begin, (unsigned long long)t->end);
        if (t->end > f->data_len)
            return dt_error(DT_ERR_FORMAT,
                            "%s: tensor \"%s\": data_offsets end at %llu, past the %zu bytes of data (truncated?)",
                            f->label, t->name, (unsigned long long)t->end, f->data_len);
        if (t->end - t->begin != bytes) {
            char shp[200] = "";
            size_t k = 0;
            for (int d = 0; d < t->ndim && k < sizeof shp - 24; d++)
                k += (size_t)snprintf(shp + k, sizeof shp - k, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
            return dt_error(DT_ERR_FORMAT, "%s: tensor \"%s\": %s of shape [%s] needs %llu bytes, data_offsets give %llu",
                            f->label, t->name, dt_dtype_st_name(t->dtype), shp, (unsigned long long)bytes,
                            (unsigned long long)(t->end - t->begin));
        }
    }
    rtensor **order = malloc((f->nt ? f->nt : 1) * sizeof *order);
    if (!order) return dt_error(DT_ERR_NOMEM, "%s: out of memory", f->label);
    for (size_t i = 0; i < f->nt; i++) order[i] = &f->t[i];
    qsort(order, f->nt, sizeof *order, cmp_offsets);
    uint64_t at = 0;
    dt_status s = DT_OK;
    for (size_t i = 0; i < f->nt && s == DT_OK; i++) {
        if (order[i]->begin < at)
            s = dt_error(DT_ERR_FORMAT, "%s: tensor \"%s\" overlaps the tensor before it (begins at %llu, previous "
                         "ends at %llu)", f->label, order[i]->name, (unsigned long long)order[i]->begin,
                         (unsigned long long)at);
        else if (order[i]->begin > at)
            s = dt_error(DT_ERR_FORMAT, "%s: a gap of %llu bytes before tensor \"%s\" (offsets must be contiguous)",
                         f->label, (unsigned long long)(order[i]->begin - at), order[i]->name);
        at = order[i]->end;
    }
    free(order);
    DT_TRY(s);
    if (at != f->data_len)
        return dt_error(DT_ERR_FORMAT, "%s: the tensors cover %llu bytes but the file holds %zu bytes of data",
                        f->label, (unsigned long long)at, f->data_len);
    return DT_OK;
}

/* Validate header bytes [8, 8+n) already read; data_len bytes follow in the file. */
static dt_status st_begin(const char *label, uint64_t file_len, const unsigned char len8[8], dt_st_file **out,
                          uint64_t *hlen) {
    *out = NULL;
    if (file_len < 8)
        return dt_error(DT_ERR_FORMAT, "%s: %llu bytes, too short for a safetensors file (8-byte header length)",
                        label, (unsigned long long)file_len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | len8[i];
    if (n > MAX_HEADER)
        return dt_error(DT_ERR_FORMAT, "%s: header length %llu is over the 100 MB limit (corrupt or not safetensors)",
                        label, (unsigned long long)n);
    if (n > file_len - 8)
        return dt_error(DT_ERR_FORMAT, "%s: header length %llu is larger than the rest of the file (%llu bytes): "
                        "truncated or not safetensors", label, (unsigned long long)n,
                        (unsigned long long)(file_len - 8));
    if (n < 2) return dt_error(DT_ERR_FORMAT, "%s: header length %llu is too small", label, (unsigned long long)n);
    dt_st_file *f = calloc(1, sizeof *f);
    if (!f) return dt_error(DT_ERR_NOMEM, "%s: out of memory", label);
    snprintf(f->label, sizeof f->label, "%s", label);
    f->data_len = (size_t)(file_len - 8 - n);
    if (posix_memalign((void **)&f->data, 64, f->data_len ? f->data_len : 64) != 0) {
        dt_status s = dt_error(DT_ERR_NOMEM, "%s: out of memory for %zu bytes of tensor data", label, f->data_len);
        free(f);
        return s;
    }
    *hlen = n;
    *out = f;
    return DT_OK;
}

static dt_status st_finish(dt_st_file *f, const char *json, size_t n) {
    DT_TRY(parse_header(f, json, n));
    DT_TRY(index_names(f));
    DT_TRY(check_layout(f));
    /* Other writers may place a tensor at an offset its element type cannot be
     * loaded from directly (e.g. I64 at byte 12): give those an aligned copy. */
    for (size_t i = 0; i < f->nt; i++) {
        rtensor *t = &f->t[i];
        size_t bytes = (size_t)(t->end - t->begin);
        t->base = f->data;
        if (bytes == 0 || t->begin % dt_dtype_size(t->dtype) == 0) continue;
        if (posix_memalign(&t->aligned, 64, bytes) != 0) {
            t->aligned = NULL;
            return dt_error(DT_ERR_NOMEM, "%s: out of memory", f->label);
        }
        memcpy(t->aligned, f->data + t->begin, bytes);
    }
    return DT_OK;
}

dt_status dt_st_open_mem(const void *buf, size_t len, const char *label, dt_st_file **out) {
    const unsigned char *b = buf;
    dt_st_file *f;
    uint64_t n;
    *out = NULL;
    if (len < 8) return st_begin(label, len, b, &f, &n);
    DT_TRY(st_begin(label, len, b, &f, &n));
    memcpy(f->data, b + 8 + n, f->data_len);
    dt_status s = st_finish(f, (const char *)b + 8, (size_t)n);
    if (s != DT_OK) {
        dt_st_close(f);
        return s;
    }
    *out = f;
    return DT_OK;
}

dt_status dt_st_open(const char *path, dt_st_file **out) {
    *out = NULL;
    int fd;
    int64_t size;
    DT_TRY(dt_file_open_read(path, &fd, &size));
    unsigned char len8[8] = {0};
    dt_status s = size >= 8 ? dt_file_pread(fd, path, len8, 8, 0) : DT_OK;
    dt_st_file *f = NULL;
    uint64_t n = 0;
    char *json = NULL;
    if (s == DT_OK) s = st_begin(path, (uint64_t)size, len8, &f, &n);
    if (s == DT_OK) {
        json = malloc((size_t)n);
        if (!json) s = dt_error(DT_ERR_NOMEM, "%s: out of memory for the header", path);
    }
    if (s == DT_OK) s = dt_file_pread(fd, path, json, (size_t)n, 8);
    if (s == DT_OK) s = dt_file_pread(fd, path, f->data, f->data_len, (int64_t)(8 + n));
    close(fd);
    if (s == DT_OK) s = st_finish(f, json, (size_t)n);
    free(json);
    if (s != DT_OK) {
        dt_st_close(f);
        return s;
    }
    *out = f;
    return DT_OK;
}

/* ---- a union of files (an index's shards) ------------------------------------ */

dt_status dt_st_union_(const char *label, dt_st_file **parts, size_t nparts, char **meta, size_t nmeta,
                       dt_st_file **out) {
    *out = NULL;
    size_t nt = 0;
    for (size_t i = 0; i < nparts; i++) nt += parts[i]->nt;
    dt_st_file *f = calloc(1, sizeof *f);
    rtensor *t = malloc((nt ? nt : 1) * sizeof *t);
    if (!f || !t) {
        free(f);
        free(t);
        for (size_t i = 0; i < nparts; i++) dt_st_close(parts[i]);
        free(parts);
        for (size_t i = 0; i < 2 * nmeta; i++) free(meta[i]);
        free(meta);
        return dt_error(DT_ERR_NOMEM, "%s: out of memory", label);
    }
    snprintf(f->label, sizeof f->label, "%s", label);
    f->parts = parts;
    f->nparts = nparts;
    f->meta = meta;
    f->nmeta = f->capmeta = nmeta;
    f->t = t;
    f->capt = nt;
    for (size_t i = 0; i < nparts; i++)
        for (size_t k = 0; k < parts[i]->nt; k++) f->t[f->nt++] = parts[i]->t[k];
    dt_status s = index_names(f);
    if (s != DT_OK) {
        dt_st_close(f);
        return s;
    }
    *out = f;
    return DT_OK;
}

size_t dt_st_count(const dt_st_file *f) { return f->nt; }

dt_status dt_st_tensor_at(const dt_st_file *f, size_t i, dt_st_tensor *out) {
    if (i >= f->nt) return dt_error(DT_ERR_INVALID, "%s: tensor %zu of %zu", f->label, i, f->nt);
    const rtensor *t = &f->t[i];
    memset(out, 0, sizeof *out);
    out->name = t->name;
    out->dtype = t->dtype;
    out->ndim = t->ndim;
    for (int d = 0; d < t->ndim; d++) out->shape[d] = t->shape[d];
    out->data = t->aligned ? t->aligned : t->base + t->begin;
    out->nbytes = (size_t)(t->end - t->begin);
    return DT_OK;
}

static int cmp_name_key(const void *key, const void *elem) {
    return strcmp((const char *)key, (*(const rtensor *const *)elem)->name);
}

static int cmp_meta_key(const void *key, const void *elem) {
    return strcmp((const char *)key, **(char *const *const *)elem);
}

dt_status dt_st_find(const dt_st_file *f, const char *name, dt_st_tensor *out) {
    const rtensor *const *hit = f->t_by_name ? bsearch(name, f->t_by_name, f->nt, sizeof *f->t_by_name, cmp_name_key)
                                             : NULL;
    if (hit) return dt_st_tensor_at(f, (size_t)(*hit - f->t), out);
    return dt_error(DT_ERR_INVALID, "%s: no tensor named \"%s\"", f->label, name);
}

const char *dt_st_meta_get(const dt_st_file *f, const char *key) {
    char *const *const *hit = f->meta_by_key ? bsearch(key, f->meta_by_key, f->nmeta, sizeof *f->meta_by_key,
                                                       cmp_meta_key) : NULL;
    return hit ? (*hit)[1] : NULL;
}

size_t dt_st_meta_count(const dt_st_file *f) { return f->nmeta; }

void dt_st_meta_at(const dt_st_file *f, size_t i, const char **key, const char **value) {
    *key = i < f->nmeta ? f->meta[2 * i] : NULL;
    *value = i < f->nmeta ? f->meta[2 * i + 1] : NULL;
}

void dt_st_data_region(const dt_st_file *f, const void **data, size_t *len) {
    *data = f->data;
    *len = f->data_len;
}

