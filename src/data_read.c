/*
 * data_read.c: readers for the array files datasets come in: IDX (the MNIST
 * format, raw or gzip-compressed) and NumPy .npy (v1, v2, v3).
 *
 * Both are read through one small file layer that detects gzip by its magic
 * bytes (1f 8b), never by the file name, so "images.gz" that is not compressed
 * and "images" that is both work. A corrupt header must not make us allocate
 * gigabytes: the payload a header claims is checked against the file size
 * (exactly for raw files, against the largest deflate ratio for gzip) before
 * any allocation, and gzip payloads are read into a buffer that grows only as
 * data actually arrives.
 */
#define _FILE_OFFSET_BITS 64 /* 64-bit off_t for files over 2 GiB on 32-bit hosts */
#include "config.h"

#include "data.h"
#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* Arrays larger than this are refused whatever the file says (1 TiB). */
#define MAX_PAYLOAD ((uint64_t)1 << 40)
/* deflate cannot compress better than about 1032:1. */
#define GZIP_MAX_RATIO 1040

/* ---- file layer: raw or gzip ---------------------------------------------- */

/* gzip is inflated here with zlib's inflate rather than gzread, because gzread
 * silently ignores bytes after the last gzip member: a member must end at the end
 * of the file or be followed by another member (concatenated gzip is legal). */
#define GZ_CHUNK (1u << 17)

typedef struct {
    const char *path;
    FILE       *fp;        /* raw file, or NULL */
    int         gzfd;      /* gzip: the compressed file, or -1 */
    z_stream    z;         /* gzip: the inflate state (its input is `in`) */
    unsigned char *in;     /* gzip: GZ_CHUNK bytes of compressed input */
    int         in_eof;    /* gzip: the compressed file is read to its end */
    int         z_done;    /* gzip: the last member ended at the end of the file */
    int64_t     zpos;      /* gzip: compressed bytes read from the file */
    int64_t     file_size; /* bytes on disk */
    int64_t     pos;       /* uncompressed bytes consumed so far */
} rfile;

static dt_status rf_open(rfile *f, const char *path) {
    memset(f, 0, sizeof *f);
    f->path = path;
    f->gzfd = -1;
    int fd;
    DT_TRY(dt_file_open_read(path, &fd, &f->file_size));
    unsigned char magic[2] = {0, 0};
    ssize_t got = pread(fd, magic, 2, 0);
    if (got < 0) {
        dt_status s = dt_error(DT_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
        close(fd);
        return s;
    }
    if (got == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
        f->in = malloc(GZ_CHUNK);
        if (!f->in || inflateInit2(&f->z, 15 + 16) != Z_OK) {   /* 15 + 16: a gzip wrapper */
            free(f->in);
            f->in = NULL;
            close(fd);
            return dt_error(DT_ERR_NOMEM, "%s: cannot start gzip decompression", path);
        }
        f->gzfd = fd;
    } else {
        f->fp = fdopen(fd, "rb");
        if (!f->fp) {
            dt_status s = dt_error(DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
            close(fd);
            return s;
        }
    }
    return DT_OK;
}

static void rf_close(rfile *f) {
    if (f->fp) fclose(f->fp);
    if (f->gzfd >= 0) {
        inflateEnd(&f->z);
        close(f->gzfd);
    }
    free(f->in);
    f->fp = NULL;
    f->gzfd = -1;
    f->in = NULL;
}

/* Make at least `need` compressed bytes available (fewer only at the end of the file). */
static dt_status gz_fill(rfile *f, uInt need) {
    while (f->z.avail_in < need && !f->in_eof) {
        if (f->z.avail_in) memmove(f->in, f->z.next_in, f->z.avail_in);
        f->z.next_in = f->in;
        ssize_t r = read(f->gzfd, f->in + f->z.avail_in, GZ_CHUNK - f->z.avail_in);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return dt_error(DT_ERR_IO, "%s: read failed: %s", f->path, strerror(errno));
        if (r == 0) f->in_eof = 1;
        f->z.avail_in += (uInt)r;
        f->zpos += r;
    }
    return DT_OK;
}

/* Inflate up to n bytes into p; *got is what arrived (0 only at the end). */
static dt_status gz_read_some(rfile *f, unsigned char *p, size_t n, size_t *got) {
    *got = 0;
    while (*got < n && !f->z_done) {
        DT_TRY(gz_fill(f, 1));
        size_t want = n - *got;
        f->z.next_out = p + *got;
        f->z.avail_out = want > (1u << 30) ? (1u << 30) : (uInt)want;
        uInt before = f->z.avail_out;
        int r = inflate(&f->z, Z_NO_FLUSH);
        *got += before - f->z.avail_out;
        if (r == Z_STREAM_END) {
            /* a member ended: the file ends here, or another member starts */
            DT_TRY(gz_fill(f, 2));
            if (f->z.avail_in == 0) { f->z_done = 1; break; }
            if (f->z.avail_in >= 2 && f->z.next_in[0] == 0x1f && f->z.next_in[1] == 0x8b) {
                inflateReset(&f->z);
                continue;
            }
            int64_t at = f->zpos - (int64_t)f->z.avail_in;
            return dt_error(DT_ERR_FORMAT, "%s: %lld unexpected bytes after the gzip data (from compressed offset %lld)",
                            f->path, (long long)(f->file_size - at), (long long)at);
        }
        if (r == Z_BUF_ERROR && f->z.avail_in == 0 && f->in_eof)
            return dt_error(DT_ERR_FORMAT, "%s: corrupt gzip data at uncompressed offset %lld: the file ends "
                            "inside the compressed stream (truncated?)", f->path, (long long)(f->pos + (int64_t)*got));
        if (r != Z_OK && r != Z_BUF_ERROR)
            return dt_error(r == Z_MEM_ERROR ? DT_ERR_NOMEM : DT_ERR_FORMAT,
                            "%s: corrupt gzip data at uncompressed offset %lld: %s", f->path,
                            (long long)(f->pos + (int64_t)*got), f->z.msg ? f->z.msg : "inflate failed");
    }
    return DT_OK;
}

/* Read up to n bytes; *got is what arrived. Errors are I/O or corrupt gzip. */
static dt_status rf_read_some(rfile *f, void *buf, size_t n, size_t *got) {
    *got = 0;
    unsigned char *p = buf;
    if (f->gzfd >= 0) {
        DT_TRY(gz_read_some(f, p, n, got));
    } else {
        while (*got < n) {
            size_t r = fread(p + *got, 1, n - *got, f->fp);
            if (r == 0) {
                if (ferror(f->fp)) return dt_error(DT_ERR_IO, "%s: read failed: %s", f->path, strerror(errno));
                break;
            }
            *got += r;
        }
    }
    f->pos += (int64_t)*got;
    return DT_OK;
}

/* Read exactly n bytes of `what`, or fail naming the file, offset and shortfall. */
static dt_status rf_read(rfile *f, void *buf, size_t n, const char *what) {
    int64_t at = f->pos;
    size_t got;
    DT_TRY(rf_read_some(f, buf, n, &got));
    if (got != n)
        return dt_error(DT_ERR_FORMAT, "%s: truncated: expected %zu bytes of %s at offset %lld, found %zu", f->path,
                        n, what, (long long)at, got);
    return DT_OK;
}

/* May the rest of the file hold `bytes` of payload? Checked before allocating. */
static dt_status rf_check_payload(rfile *f, uint64_t bytes, const char *what) {
    if (bytes > MAX_PAYLOAD)
        return dt_error(DT_ERR_FORMAT, "%s: header claims %llu bytes of %s, more than the 1 TiB limit", f->path,
                        (unsigned long long)bytes, what);
    if (f->fp) {
        uint64_t left = f->file_size > f->pos ? (uint64_t)(f->file_size - f->pos) : 0;
        if (bytes > left)
            return dt_error(DT_ERR_FORMAT, "%s: truncated: header claims %llu bytes of %s, the file holds %llu",
                            f->path, (unsigned long long)bytes, what, (unsigned long long)left);
        if (bytes < left)
            return dt_error(DT_ERR_FORMAT, "%s: %llu unexpected bytes after the %llu bytes of %s the header claims",
                            f->path, (unsigned long long)(left - bytes), (unsigned long long)bytes, what);
    } else if (bytes > (uint64_t)f->file_size * GZIP_MAX_RATIO + 4096) {
        return dt_error(DT_ERR_FORMAT, "%s: header claims %llu bytes of %s, impossible for %lld compressed bytes",
                        f->path, (unsigned long long)bytes, what, (long long)f->file_size);
    }
    return DT_OK;
}

/* Read the `bytes` bytes of payload into a new buffer that grows as data comes
 * (a lying gzip header cannot make us allocate what is not there), then make
 * sure nothing follows. */
static dt_status rf_read_payload(rfile *f, size_t bytes, const char *what, void **out) {
    *out = NULL;
    size_t cap = bytes < ((size_t)64 << 20) ? bytes : ((size_t)64 << 20);
    unsigned char *buf = malloc(cap ? cap : 1);
    if (!buf) return dt_error(DT_ERR_NOMEM, "%s: out of memory for %zu bytes of %s", f->path, cap, what);
    size_t have = 0;
    int64_t start = f->pos;
    while (have < bytes) {
        if (have == cap) {
            size_t ncap = cap * 2 < bytes ? cap * 2 : bytes;
            unsigned char *nb = realloc(buf, ncap);
            if (!nb) {
                free(buf);
                return dt_error(DT_ERR_NOMEM, "%s: out of memory for %zu bytes of %s", f->path, ncap, what);
            }
            buf = nb;
            cap = ncap;
        }
        size_t got;
        dt_status s = rf_read_some(f, buf + have, cap - have, &got);
        if (s != DT_OK) {
            free(buf);
            return s;
        }
        if (got == 0) {
            free(buf);
            return dt_error(DT_ERR_FORMAT, "%s: truncated: expected %zu bytes of %s from offset %lld, found %zu",
                            f->path, bytes, what, (long long)start, have);
        }
        have += got;
    }
    unsigned char extra;
    size_t got;
    dt_status s = rf_read_some(f, &extra, 1, &got);
    if (s == DT_OK && got != 0)
        s = dt_error(DT_ERR_FORMAT, "%s: unexpected data after the %zu bytes of %s the header claims", f->path, bytes,
                     what);
    if (s != DT_OK) {
        free(buf);
        return s;
    }
    *out = buf;
    return DT_OK;
}

/* ---- arrays --------------------------------------------------------------- */

/* The element types the readers hand out: data.c converts each of these to
 * float features or int32 labels. */
static int readable(dt_dtype t) {
    return t == DT_U8 || t == DT_I8 || t == DT_I16 || t == DT_I32 || t == DT_I64 || t == DT_F32 || t == DT_F64;
}

void dt_array_free(dt_array *a) {
    if (!a) return;
    free(a->data);
    memset(a, 0, sizeof *a);
}

/* Element count of dims (checked for overflow) and the payload size. */
static dt_status array_size(const char *path, dt_array *a, uint64_t *bytes) {
    uint64_t count = 1;
    for (int i = 0; i < a->ndim; i++) {
        uint64_t d = (uint64_t)a->dims[i];
        if (d != 0 && count > MAX_PAYLOAD / d)
            return dt_error(DT_ERR_FORMAT, "%s: dimensions overflow (dimension %d is %llu)", path, i,
                            (unsigned long long)d);
        count *= d;
    }
    a->count = (size_t)count;
    *bytes = count * dt_dtype_size(a->type);
    return DT_OK;
}

/* Reverse the bytes of each element when the file's byte order is not ours. */
static void to_native(void *data, size_t count, size_t esize, int file_big_endian) {
    const int host_big = __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__;
    if (esize == 1 || file_big_endian == host_big) return;
    unsigned char *p = data;
    for (size_t i = 0; i < count; i++, p += esize)
        for (size_t a = 0, b = esize - 1; a < b; a++, b--) {
            unsigned char t = p[a];
            p[a] = p[b];
            p[b] = t;
        }
}

/* IDX: 00 00 TYPE NDIM, NDIM big-endian u32 dimensions, big-endian data. */
static dt_status read_idx(rfile *f, const unsigned char magic[4], dt_array *a) {
    dt_dtype t;
    if (!dt_dtype_from_idx(magic[2], &t) || !readable(t))
        return dt_error(DT_ERR_FORMAT,
                        "%s: IDX element type 0x%02x unknown (expected 08 u8, 09 i8, 0B i16, 0C i32, 0D f32, 0E f64)",
                        f->path, magic[2]);
    if (magic[3] < 1 || magic[3] > 8)
        return dt_error(DT_ERR_FORMAT, "%s: IDX header has %d dimensions, expected 1 to 8", f->path, magic[3]);
    a->type = t;
    a->ndim = magic[3];
    unsigned char dims[32];
    DT_TRY(rf_read(f, dims, (size_t)a->ndim * 4, "IDX dimensions"));
    for (int i = 0; i < a->ndim; i++)
        a->dims[i] = (int64_t)(((uint32_t)dims[4 * i] << 24) | ((uint32_t)dims[4 * i + 1] << 16) |
                               ((uint32_t)dims[4 * i + 2] << 8) | dims[4 * i + 3]);
    uint64_t bytes;
    DT_TRY(array_size(f->path, a, &bytes));
    DT_TRY(rf_check_payload(f, bytes, "IDX data"));
    DT_TRY(rf_read_payload(f, (size_t)bytes, "IDX data", &a->data));
    to_native(a->data, a->count, dt_dtype_size(t), 1);
    return DT_OK;
}

/* ---- NPY header: a Python dict literal ------------------------------------ */

typedef struct {
    const char *p, *end;
} cursor;

static void skip_ws(cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

static int eat(cursor *c, char ch) {
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 1;
    }
    return 0;
}

/* A quoted Python string (no escapes in what numpy writes) into buf. */
static int parse_pystr(cursor *c, char *buf, size_t cap) {
    skip_ws(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) return 0;
    char q = *c->p++;
    size_t n = 0;
    while (c->p < c->end && *c->p != q) {
        if (*c->p == '\\' || n + 1 >= cap) return 0;
        buf[n++] = *c->p++;
    }
    if (c->p >= c->end) return 0;
    c->p++;
    buf[n] = '\0';
    return 1;
}

static int starts(cursor *c, const char *w) {
    skip_ws(c);
    size_t n = strlen(w);
    if ((size_t)(c->end - c->p) >= n && memcmp(c->p, w, n) == 0) {
        c->p += n;
        return 1;
    }
    return 0;
}

static dt_status npy_bad(const char *path, const char *what) {
    return dt_error(DT_ERR_FORMAT, "%s: bad NPY header: %s", path, what);
}

static dt_status parse_npy_header(const char *path, const char *text, size_t len, dt_array *a, int *big_endian) {
    cursor c = {text, text + len};
    char descr[64] = "";
    int have_descr = 0, have_order = 0, have_shape = 0, fortran = 0;
    if (!eat(&c, '{')) return npy_bad(path, "expected '{'");
    while (!eat(&c, '}')) {
        char key[32];
        if (!parse_pystr(&c, key, sizeof key)) return npy_bad(path, "expected a quoted key");
        if (!eat(&c, ':')) return npy_bad(path, "expected ':' after a key");
        if (strcmp(key, "descr") == 0) {
            skip_ws(&c);
            if (c.p < c.end && *c.p == '[')
                return dt_error(DT_ERR_FORMAT, "%s: structured NPY dtypes are not supported, expected a plain array",
                                path);
            if (!parse_pystr(&c, descr, sizeof descr)) return npy_bad(path, "'descr' is not a string");
            have_descr = 1;
        } else if (strcmp(key, "fortran_order") == 0) {
            if (starts(&c, "True")) fortran = 1;
            else if (starts(&c, "False")) fortran = 0;
            else return npy_bad(path, "'fortran_order' is not True or False");
            have_order = 1;
        } else if (strcmp(key, "shape") == 0) {
            if (!eat(&c, '(')) return npy_bad(path, "'shape' is not a tuple");
            a->ndim = 0;
            while (!eat(&c, ')')) {
                skip_ws(&c);
                int64_t v = 0;
                int digits = 0;
                while (c.p < c.end && *c.p >= '0' && *c.p <= '9') {
                    if (v > (INT64_MAX - 9) / 10) return npy_bad(path, "a dimension is too large");
                    v = v * 10 + (*c.p++ - '0');
                    digits++;
                }
                if (!digits) return npy_bad(path, "'shape' holds something other than non-negative integers");
                if (c.p < c.end && *c.p == 'L') c.p++;
                if (a->ndim == 8) return npy_bad(path, "more than 8 dimensions");
                a->dims[a->ndim++] = v;
                if (!eat(&c, ',')) {
                    if (!eat(&c, ')')) return npy_bad(path, "expected ',' or ')' in 'shape'");
                    break;
                }
            }
            have_shape = 1;
        } else {
            return dt_error(DT_ERR_FORMAT, "%s: bad NPY header: unknown key '%s'", path, key);
        }
        if (!eat(&c, ',')) {
            if (!eat(&c, '}')) return npy_bad(path, "expected ',' or '}'");
            break;
        }
    }
    skip_ws(&c);
    if (c.p != c.end) return npy_bad(path, "text after the closing '}'");
    if (!have_descr || !have_order || !have_shape)
        return npy_bad(path, "missing one of 'descr', 'fortran_order', 'shape'");
    if (fortran)
        return dt_error(DT_ERR_FORMAT,
                        "%s: NPY array is in Fortran order; save it in C order (numpy.ascontiguousarray)", path);
    if (descr[0] == '>' && strcmp(descr + 1, "u1") != 0 && strcmp(descr + 1, "i1") != 0)
        return dt_error(DT_ERR_FORMAT, "%s: NPY array is big-endian ('%s'); save it as little-endian ('<%s')", path,
                        descr, descr + 1);
    const char *t = (descr[0] == '<' || descr[0] == '|' || descr[0] == '=' || descr[0] == '>') ? descr + 1 : descr;
    *big_endian = 0;
    if (!dt_dtype_from_npy(t, &a->type) || !readable(a->type))
        return dt_error(DT_ERR_FORMAT, "%s: NPY dtype '%s' is not supported (expected <f4, <f8, |u1, |i1, <i2, <i4, <i8)",
                        path, descr);
    return DT_OK;
}

static dt_status read_npy(rfile *f, const unsigned char head[4], dt_array *a) {
    unsigned char rest[6];
    DT_TRY(rf_read(f, rest, 4, "NPY preamble"));
    /* head+rest = "\x93NUMPY" major minor */
    if (memcmp(head, "\x93NUM", 4) != 0 || rest[0] != 'P' || rest[1] != 'Y')
        return dt_error(DT_ERR_FORMAT, "%s: not an NPY file (bad magic)", f->path);
    int major = rest[2];
    size_t hlen;
    if (major == 1) {
        unsigned char l[2];
        DT_TRY(rf_read(f, l, 2, "NPY header length"));
        hlen = (size_t)l[0] | ((size_t)l[1] << 8);
    } else if (major == 2 || major == 3) {
        unsigned char l[4];
        DT_TRY(rf_read(f, l, 4, "NPY header length"));
        hlen = (size_t)l[0] | ((size_t)l[1] << 8) | ((size_t)l[2] << 16) | ((size_t)l[3] << 24);
    } else {
        return dt_error(DT_ERR_FORMAT, "%s: NPY version %d.%d unsupported (expected 1, 2 or 3)", f->path, major,
                        rest[3]);
    }
    if (hlen > (1u << 20))
        return dt_error(DT_ERR_FORMAT, "%s: NPY header length %zu is implausible (over 1 MiB)", f->path, hlen);
    if (f->fp && (int64_t)hlen > f->file_size - f->pos)
        return dt_error(DT_ERR_FORMAT, "%s: truncated: NPY header length %zu exceeds the file", f->path, hlen);
    char *text = malloc(hlen + 1);
    if (!text) return dt_error(DT_ERR_NOMEM, "%s: out of memory for the NPY header", f->path);
    dt_status s = rf_read(f, text, hlen, "NPY header");
    int big = 0;
    if (s == DT_OK) {
        text[hlen] = '\0';
        s = parse_npy_header(f->path, text, hlen, a, &big);
    }
    free(text);
    DT_TRY(s);
    uint64_t bytes;
    DT_TRY(array_size(f->path, a, &bytes));
    DT_TRY(rf_check_payload(f, bytes, "NPY data"));
    DT_TRY(rf_read_payload(f, (size_t)bytes, "NPY data", &a->data));
    to_native(a->data, a->count, dt_dtype_size(a->type), big);
    return DT_OK;
}

dt_status dt_array_read(const char *path, dt_array *out) {
    memset(out, 0, sizeof *out);
    rfile f;
    DT_TRY(rf_open(&f, path));
    unsigned char head[4];
    size_t got = 0;
    dt_status s = rf_read_some(&f, head, 4, &got);
    if (s == DT_OK && got < 4)
        s = dt_error(DT_ERR_FORMAT, "%s: too short (%zu bytes) for an IDX or NPY file", path, got);
    if (s == DT_OK) {
        if (head[0] == 0x93 && head[1] == 'N')
            s = read_npy(&f, head, out);
        else if (head[0] == 0 && head[1] == 0)
            s = read_idx(&f, head, out);
        else
            s = dt_error(DT_ERR_FORMAT,
                         "%s: not an IDX or NPY file: starts with %02x %02x %02x %02x, expected 00 00 TYPE NDIM "
                         "(IDX) or 93 'NUMPY' (NPY), optionally gzip-compressed",
                         path, head[0], head[1], head[2], head[3]);
    }
    rf_close(&f);
    if (s != DT_OK) dt_array_free(out);
    return s;
}
