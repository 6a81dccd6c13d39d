/*
 * safetensors.c: the safetensors writer (see safetensors.h for the
 * format). The header is written in one pass: metadata first, then the
 * tensors in the order given with back-to-back offsets, padded with spaces so
 * the data starts at a multiple of 8; the file is written atomically.
 */
#include "config.h"

#include "safetensors.h"
#include "safetensors_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- sizes ---------------------------------------------------------------- */

/* Bytes of a tensor; 0 and DT_ERR_FORMAT on overflow. */
dt_status dt_st_tensor_bytes_(dt_dtype t, int ndim, const int64_t *shape, uint64_t *bytes) {
    uint64_t n = dt_dtype_size(t);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return dt_error(DT_ERR_FORMAT, "negative dimension %lld", (long long)shape[i]);
        uint64_t d = (uint64_t)shape[i];
        if (d != 0 && n > UINT64_MAX / 2 / d) return dt_error(DT_ERR_FORMAT, "shape overflows 64 bits");
        n *= d;
    }
    *bytes = n;
    return DT_OK;
}

/* ---- JSON text ------------------------------------------------------------ */

/* A JSON string literal: quotes, backslash and control characters escaped. */
static void sb_json_str(dt_sbuf *b, const char *s) {
    dt_sbuf_put_(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"') dt_sbuf_put_(b, "\\\"", 2);
        else if (c == '\\') dt_sbuf_put_(b, "\\\\", 2);
        else if (c < 0x20) {
            char t[8];
            snprintf(t, sizeof t, "\\u%04x", c);
            dt_sbuf_put_(b, t, 6);
        } else dt_sbuf_put_(b, (const char *)&c, 1);
    }
    dt_sbuf_put_(b, "\"", 1);
}

/* ---- UTF-8 ---------------------------------------------------------------- */

/* 1 if s[0..n) is well-formed UTF-8 (no overlongs, surrogates or > U+10FFFF). */
int dt_utf8_valid_(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t len;
        uint32_t cp;
        if (c < 0x80) { i++; continue; }
        else if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; }
        else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; }
        else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; }
        else return 0;
        if (i + len > n) return 0;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += len;
    }
    return 1;
}

/* ---- writer --------------------------------------------------------------- */

typedef struct {
    char       *name;
    dt_dtype    dtype;
    int         ndim;
    int64_t     shape[DT_ST_MAX_DIMS];
    const void *data;
    uint64_t    nbytes;
} wtensor;

struct dt_st_writer {
    wtensor *t;
    size_t   nt, capt;
    char   **meta;   /* key, value, key, value, ... */
    size_t   nmeta, capmeta;
};

dt_status dt_st_writer_init(dt_st_writer **out) {
    *out = calloc(1, sizeof **out);
    return *out ? DT_OK : dt_error(DT_ERR_NOMEM, "safetensors writer: out of memory");
}

void dt_st_writer_free(dt_st_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->nt; i++) free(w->t[i].name);
    for (size_t i = 0; i < 2 * w->nmeta; i++) free(w->meta[i]);
    free(w->t);
    free(w->meta);
    free(w);
}

size_t dt_st_writer_count(const dt_st_writer *w) { return w->nt; }

const void *dt_st_writer_data(const dt_st_writer *w, size_t i, size_t *bytes) {
    *bytes = (size_t)w->t[i].nbytes;
    return w->t[i].data;
}

dt_status dt_st_writer_add(dt_st_writer *w, const char *name, dt_dtype dtype, int ndim, const int64_t *shape,
                           const void *data) {
    if (!name || !*name) return dt_error(DT_ERR_INVALID, "safetensors: empty tensor name");
    if (strcmp(name, "__metadata__") == 0)
        return dt_error(DT_ERR_INVALID, "safetensors: \"__metadata__\" is reserved, not a tensor name");
    if (!dt_utf8_valid_((const unsigned char *)name, strlen(name)))
        return dt_error(DT_ERR_INVALID, "safetensors: tensor name is not valid UTF-8");
    if (!dt_dtype_traits_of(dtype))
        return dt_error(DT_ERR_INVALID, "safetensors: tensor %s: unknown dtype %d", name, (int)dtype);
    if (ndim < 0 || ndim > DT_ST_MAX_DIMS)
        return dt_error(DT_ERR_INVALID, "safetensors: tensor %s: %d dimensions, at most %d", name, ndim,
                        DT_ST_MAX_DIMS);
    for (size_t i = 0; i < w->nt; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return dt_error(DT_ERR_INVALID, "safetensors: tensor %s added twice", name);
    uint64_t bytes;
    if (dt_st_tensor_bytes_(dtype, ndim, shape, &bytes) != DT_OK)
        return dt_error(DT_ERR_INVALID, "safetensors: tensor %s: bad shape", name);
    if (bytes && !data) return dt_error(DT_ERR_INVALID, "safetensors: tensor %s: no data", name);
    if (w->nt == w->capt) {
        size_t cap = w->capt ? 2 * w->capt : 16;
        wtensor *t = realloc(w->t, cap * sizeof *t);
        if (!t) return dt_error(DT_ERR_NOMEM, "safetensors writer: out of memory");
        w->t = t;
        w->capt = cap;
    }
    wtensor *t = &w->t[w->nt];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    if (!t->name) return dt_error(DT_ERR_NOMEM, "safetensors writer: out of memory");
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->data = data;
    t->nbytes = bytes;
    w->nt++;
    return DT_OK;
}

dt_status dt_st_writer_set_meta(dt_st_writer *w, const char *key, const char *value) {
    if (!key || !value) return dt_error(DT_ERR_INVALID, "safetensors: NULL metadata key or value");
    if (!dt_utf8_valid_((const unsigned char *)key, strlen(key)) ||
        !dt_utf8_valid_((const unsigned char *)value, strlen(value)))
        return dt_error(DT_ERR_INVALID, "safetensors: metadata %s is not valid UTF-8", key);
    char *v = strdup(value);
    if (!v) return dt_error(DT_ERR_NOMEM, "safetensors writer: out of memory");
    for (size_t i = 0; i < w->nmeta; i++)
        if (strcmp(w->meta[2 * i], key) == 0) {
            free(w->meta[2 * i + 1]);
            w->meta[2 * i + 1] = v;
            return DT_OK;
        }
    if (w->nmeta == w->capmeta) {
        size_t cap = w->capmeta ? 2 * w->capmeta : 8;
        char **m = realloc(w->meta, 2 * cap * sizeof *m);
        if (!m) {
            free(v);
            return dt_error(DT_ERR_NOMEM, "safetensors writer: out of memory");
        }
        w->meta = m;
        w->capmeta = cap;
    }
    char *k = strdup(key);
    if (!k) {
        free(v);
        return dt_error(DT_ERR_NOMEM, "safetensors writer: out of memory");
    }
    w->meta[2 * w->nmeta] = k;
    w->meta[2 * w->nmeta + 1] = v;
    w->nmeta++;
    return DT_OK;
}

dt_status dt_st_writer_header(dt_st_writer *w, char **buf, size_t *len) {
    *buf = NULL;
    *len = 0;
    dt_sbuf b = {0};
    dt_sbuf_put_(&b, "\0\0\0\0\0\0\0\0", 8); /* length, filled in below */
    dt_sbuf_str_(&b, "{");
    if (w->nmeta) {
        dt_sbuf_str_(&b, "\"__metadata__\":{");
        for (size_t i = 0; i < w->nmeta; i++) {
            if (i) dt_sbuf_str_(&b, ",");
            sb_json_str(&b, w->meta[2 * i]);
            dt_sbuf_str_(&b, ":");
            sb_json_str(&b, w->meta[2 * i + 1]);
        }
        dt_sbuf_str_(&b, "}");
    }
    uint64_t off = 0;
    for (size_t i = 0; i < w->nt; i++) {
        const wtensor *t = &w->t[i];
        if (i || w->nmeta) dt_sbuf_str_(&b, ",");
        sb_json_str(&b, t->name);
        dt_sbuf_str_(&b, ":{\"dtype\":\"");
        dt_sbuf_str_(&b, dt_dtype_st_name(t->dtype));
        dt_sbuf_str_(&b, "\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            if (d) dt_sbuf_str_(&b, ",");
            dt_sbuf_printf_(&b, "%llu", (unsigned long long)t->shape[d]);
        }
        dt_sbuf_str_(&b, "],\"data_offsets\":[");
        dt_sbuf_printf_(&b, "%llu", (unsigned long long)off);
        dt_sbuf_str_(&b, ",");
        dt_sbuf_printf_(&b, "%llu", (unsigned long long)(off + t->nbytes));
        dt_sbuf_str_(&b, "]}");
        off += t->nbytes;
    }
    dt_sbuf_str_(&b, "}");
    while (b.len % 8) dt_sbuf_str_(&b, " "); /* data starts 8-aligned */
    if (b.oom) {
        dt_sbuf_free_(&b);
        return dt_error(DT_ERR_NOMEM, "safetensors writer: out of memory for the header");
    }
    uint64_t n = b.len - 8;
    for (int i = 0; i < 8; i++) b.p[i] = (char)(unsigned char)(n >> (8 * i));
    *buf = b.p;
    *len = b.len;
    return DT_OK;
}

dt_status dt_st_writer_write(dt_st_writer *w, const char *path) { return dt_st_writer_write_over(w, path, NULL); }

dt_status dt_st_writer_write_over(dt_st_writer *w, const char *path, const char *from) {
    char *hdr;
    size_t hlen;
    DT_TRY(dt_st_writer_header(w, &hdr, &hlen));
    dt_afile *f;
    dt_status s = dt_afile_open_over(path, from, &f);
    if (s != DT_OK) {
        free(hdr);
        return s;
    }
    s = dt_afile_write(f, hdr, hlen);
    free(hdr);
    /* Tensor data is little-endian in the file, as in memory on every host dtrain runs on. */
    for (size_t i = 0; s == DT_OK && i < w->nt; i++)
        if (w->t[i].nbytes) s = dt_afile_write(f, w->t[i].data, (size_t)w->t[i].nbytes);
    if (s != DT_OK) {
        dt_afile_abort(f);
        return s;
    }
    return dt_afile_commit(f);
}

