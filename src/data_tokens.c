/*
 * data_tokens.c: token files for language models: reading llm.c's and
 * nanoGPT's uint16 token files into window datasets (tokens:DIR), and writing
 * byte-level token files from text (dtrain prepare-text).
 *
 * A token file is mapped read-only and never copied: a split of a GPT-2-sized
 * corpus is gigabytes, and every rank of a node then shares the page cache.
 * Every token is still read once at open, to find the largest (the vocabulary
 * when none is given) and to refuse an out-of-range one there, naming its
 * index, rather than as an out-of-bounds embedding row in the middle of a run.
 *
 * Tokens are read byte by byte as little-endian, so the files mean the same on
 * any host; compilers turn the two loads into one on little-endian machines.
 */
#define _FILE_OFFSET_BITS 64 /* 64-bit off_t for files over 2 GiB on 32-bit hosts */
#include "config.h"

#include "data_impl.h"
#include "fileio.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* llm.c's token files (dev/data/data_common.py): 256 int32, then uint16 tokens. */
#define LLMC_HEADER_BYTES 1024
#define LLMC_MAGIC        20240520
#define LLMC_VERSION      1

/* Other llm.c files: refused by name instead of being read as raw tokens. Their
 * first two uint16 would be ids above 55000, beyond GPT-2's vocabulary, so no
 * real raw GPT-2 or byte-level file starts like one. */
static const struct {
    int32_t     magic;
    const char *what;
} llmc_others[] = {
    {20240801, "llm.c's uint32 token format (Llama 3); only uint16 tokens (magic 20240520, version 1) are read"},
    {20240326, "an llm.c model checkpoint, not a token file"},
    {20240328, "an llm.c tokenizer file, not a token file"},
};

static int32_t rd_le32(const unsigned char *p) {
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

static void wr_le32(unsigned char *p, int32_t v) {
    uint32_t u = (uint32_t)v;
    p[0] = (unsigned char)u;
    p[1] = (unsigned char)(u >> 8);
    p[2] = (unsigned char)(u >> 16);
    p[3] = (unsigned char)(u >> 24);
}

static inline unsigned tok_at(const unsigned char *t, int64_t i) {
    return (unsigned)t[2 * i] | (unsigned)t[2 * i + 1] << 8;
}

/* ---- reading ---------------------------------------------------------------- */

/* One mapped token file. */
typedef struct {
    const char          *path;
    void                *map;   /* the whole file, or NULL (empty file, or handed to a dataset) */
    size_t               len;
    const unsigned char *tok;   /* n tokens */
    int64_t              n;
    unsigned             max;   /* the largest token (0 when none) */
} tokmap;

static void tokmap_close(tokmap *m) {
    if (m->map) munmap(m->map, m->len);
    m->map = NULL;
}

/* Where the tokens of the file mapped at b (size bytes) are, from its first int32. */
static dt_status tokmap_layout(tokmap *m, const unsigned char *b, int64_t size) {
    int32_t magic = size >= 4 ? rd_le32(b) : 0;
    if (magic == LLMC_MAGIC) {
        if (size < LLMC_HEADER_BYTES)
            return dt_error(DT_ERR_FORMAT, "%s: starts with llm.c's magic %d but holds %lld bytes, fewer than its "
                            "%d-byte header", m->path, LLMC_MAGIC, (long long)size, LLMC_HEADER_BYTES);
        int32_t version = rd_le32(b + 4), count = rd_le32(b + 8);
        if (version != LLMC_VERSION)
            return dt_error(DT_ERR_FORMAT, "%s: llm.c token file of version %d, expected %d (uint16 tokens)", m->path,
                            version, LLMC_VERSION);
        if (count < 0)
            return dt_error(DT_ERR_FORMAT, "%s: the llm.c header claims %d tokens", m->path, count);
        int64_t have = size - LLMC_HEADER_BYTES, want = 2 * (int64_t)count;
        if (want > have)
            return dt_error(DT_ERR_FORMAT, "%s: truncated: the llm.c header claims %d tokens (%lld bytes), the file "
                            "holds %lld bytes after its header", m->path, count, (long long)want, (long long)have);
        /* as the IDX and NPY readers: bytes past what the header claims are refused, not ignored */
        if (want < have)
            return dt_error(DT_ERR_FORMAT, "%s: %lld unexpected bytes after the %d tokens the llm.c header claims",
                            m->path, (long long)(have - want), count);
        m->tok = b + LLMC_HEADER_BYTES;
        m->n = count;
        return DT_OK;
    }
    for (size_t k = 0; k < sizeof llmc_others / sizeof llmc_others[0]; k++)
        if (magic == llmc_others[k].magic)
            return dt_error(DT_ERR_FORMAT, "%s: %s (magic %d)", m->path, llmc_others[k].what, magic);
    if (size % 2)
        return dt_error(DT_ERR_FORMAT, "%s: %lld bytes, an odd length: a raw token file (no llm.c header) holds "
                        "2-byte tokens", m->path, (long long)size);
    m->tok = b;
    m->n = size / 2;
    return DT_OK;
}

/* Map path and check its layout; m->max is the largest token. */
static dt_status tokmap_open(const char *path, tokmap *m) {
    memset(m, 0, sizeof *m);
    m->path = path;
    int fd;
    int64_t size;
    DT_TRY(dt_file_open_read(path, &fd, &size));
    if ((uint64_t)size > SIZE_MAX) {
        close(fd);
        return dt_error(DT_ERR_UNSUPPORTED, "%s: %lld bytes, too large to map on this host", path, (long long)size);
    }
    static const unsigned char empty[1];
    const unsigned char *b = empty;
    if (size > 0) {
        void *p = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            dt_status s = dt_error(DT_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
            close(fd);
            return s;
        }
        m->map = p;
        m->len = (size_t)size;
        b = p;
    }
    close(fd);   /* the mapping holds the file */
    dt_status s = tokmap_layout(m, b, size);
    if (s != DT_OK) {
        tokmap_close(m);
        return s;
    }
    unsigned hi = 0;
    for (int64_t i = 0; i < m->n; i++) {
        unsigned t = tok_at(m->tok, i);
        hi = t > hi ? t : hi;
    }
    m->max = hi;
    return DT_OK;
}

/* Every token below vocab, or an error naming the first that is not. */
static dt_status tokmap_check_vocab(const tokmap *m, int vocab) {
    if ((int64_t)m->max < vocab) return DT_OK;
    for (int64_t i = 0; i < m->n; i++)
        if ((int64_t)tok_at(m->tok, i) >= vocab)
            return dt_error(DT_ERR_FORMAT, "%s: token %u at index %lld is outside the vocabulary [0, %d)", m->path,
                            tok_at(m->tok, i), (long long)i, vocab);
    return dt_error(DT_ERR_INTERNAL, "%s: largest token %u not found again", m->path, m->max);
}

static void tokens_free(dt_dataset *ds) {
    if (!ds) return;
    if (ds->map) munmap(ds->map, ds->map_len);
    free(ds);
}

static dt_status tokens_open_pair(const char *spec, const dt_data_opts *o, dt_dataset **train, dt_dataset **test);
static void      tokens_gather(const dt_dataset *ds, const int64_t *idx, size_t n, float *x, int32_t *y);

/* The window dataset over m (which hands its mapping over). */
static dt_status tokmap_dataset(tokmap *m, int64_t T, int vocab, dt_dataset **out) {
    *out = NULL;
    if (m->n <= T)
        return dt_error(DT_ERR_INVALID, "%s: %lld tokens, too few for one window of %lld and its next-token labels "
                        "(at least %lld needed)", m->path, (long long)m->n, (long long)T, (long long)T + 1);
    dt_dataset *ds = calloc(1, sizeof *ds);
    if (!ds) return dt_error(DT_ERR_NOMEM, "%s: out of memory", m->path);
    snprintf(ds->source, sizeof ds->source, "%s", m->path);
    ds->src = &dt_data_tokens_;
    ds->map = m->map;
    ds->map_len = m->len;
    ds->tok = m->tok;
    m->map = NULL;
    dt_dataset_info *in = &ds->info;
    in->n = m->n - T;
    in->ndim = 1;
    in->shape[0] = T;
    in->sample_size = T;
    in->label_width = T;
    in->classes = vocab;
    in->channels = 1;
    for (int c = 0; c < DT_DATA_MAX_CHANNELS; c++) {
        in->mean[c] = 0.0f;
        in->std[c] = 1.0f;
    }
    *out = ds;
    return DT_OK;
}

static dt_status tokens_open_pair(const char *spec, const dt_data_opts *o, dt_dataset **train, dt_dataset **test) {
    const char *dir = spec + strlen("tokens:");
    if (o->window <= 0)
        return dt_error(DT_ERR_INVALID, "data: tokens:%s needs a window length > 0 (the model's block size), got %lld",
                        dir, (long long)o->window);
    if (o->norm == DT_NORM_TRAIN || o->norm == DT_NORM_GIVEN)
        return dt_error(DT_ERR_INVALID, "normalize: token windows are never normalised (use auto)");
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return dt_error(DT_ERR_IO, "data: tokens:%s: no such directory (expected %s/train.bin and %s/val.bin)", dir,
                        dir, dir);
    char tpath[1024], vpath[1024];
    if ((size_t)snprintf(tpath, sizeof tpath, "%s/train.bin", dir) >= sizeof tpath ||
        (size_t)snprintf(vpath, sizeof vpath, "%s/val.bin", dir) >= sizeof vpath)
        return dt_error(DT_ERR_INVALID, "data: tokens:%s: the directory name is too long", dir);
    tokmap tr, va;
    memset(&va, 0, sizeof va);
    va.path = vpath;
    /* val.bin is read even for the training split alone when the vocabulary comes from the data */
    int use_val = test != NULL || o->classes <= 0;
    dt_status s = tokmap_open(tpath, &tr);
    if (s != DT_OK) return s;
    if (use_val) s = tokmap_open(vpath, &va);
    int vocab = o->classes > 0 ? o->classes : (int)(tr.max > va.max ? tr.max : va.max) + 1;
    if (s == DT_OK) s = tokmap_check_vocab(&tr, vocab);
    if (s == DT_OK && use_val) s = tokmap_check_vocab(&va, vocab);
    if (s == DT_OK) s = tokmap_dataset(&tr, o->window, vocab, train);
    if (s == DT_OK && test) s = tokmap_dataset(&va, o->window, vocab, test);
    tokmap_close(&tr);
    tokmap_close(&va);
    if (s != DT_OK) {
        tokens_free(*train);
        *train = NULL;
    }
    return s;
}

static void tokens_gather(const dt_dataset *ds, const int64_t *idx, size_t n, float *x, int32_t *y) {
    size_t T = (size_t)ds->info.sample_size;
    for (size_t i = 0; i < n; i++) {
        const unsigned char *w = ds->tok + 2 * (size_t)idx[i];
        float *xr = x + i * T;
        int32_t *yr = y + i * T;
        for (size_t j = 0; j < T; j++) {
            xr[j] = (float)tok_at(w, (int64_t)j);
            yr[j] = (int32_t)tok_at(w, (int64_t)j + 1);
        }
    }
}

const dt_data_source_ dt_data_tokens_ = {.prefix = "tokens:", .windows = 1, .open_pair = tokens_open_pair,
                                         .gather = tokens_gather, .free = tokens_free};

/* ---- writing ---------------------------------------------------------------- */

/* mkdir -p: dir and its missing parents; bad input when impossible. */
static dt_status make_dirs(const char *dir) {
    char p[4096];
    if ((size_t)snprintf(p, sizeof p, "%s", dir) >= sizeof p)
        return dt_error(DT_ERR_INVALID, "%s: the directory name is too long", dir);
    for (char *c = p + 1;; c++) {
        if (*c != '/' && *c != '\0') continue;
        char keep = *c;
        *c = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            return dt_error(DT_ERR_INVALID, "%s: cannot create directory %s: %s", dir, p, strerror(errno));
        *c = keep;
        if (!keep) break;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return dt_error(DT_ERR_INVALID, "%s: not a directory", dir);
    return DT_OK;
}

/* Open path for an atomic write and put llm.c's header for count tokens. */
static dt_status open_token_file(const char *path, int64_t count, dt_afile **out) {
    if (count > INT32_MAX)
        return dt_error(DT_ERR_INVALID, "%s: %lld tokens, more than llm.c's header can count (%d)", path,
                        (long long)count, INT32_MAX);
    dt_status s = dt_afile_open(path, out);
    if (s != DT_OK) return dt_error_wrap(DT_ERR_INVALID, "cannot write the output: ");
    unsigned char head[LLMC_HEADER_BYTES];
    memset(head, 0, sizeof head);
    wr_le32(head, LLMC_MAGIC);
    wr_le32(head + 4, LLMC_VERSION);
    wr_le32(head + 8, (int32_t)count);
    s = dt_afile_write(*out, head, sizeof head);
    if (s != DT_OK) {
        dt_afile_abort(*out);
        *out = NULL;
    }
    return s;
}

#define TEXT_CHUNK 65536

/* Append the bytes of path (expected `size` of them) as tokens, the first
 * (cut - *pos) of the stream to ft and the rest to fv. */
static dt_status copy_as_tokens(const char *path, int64_t size, int64_t cut, int64_t *pos, dt_afile *ft,
                                dt_afile *fv, unsigned char *in, unsigned char *out) {
    int fd;
    int64_t ignored;
    dt_status s = dt_file_open_read(path, &fd, &ignored);
    if (s != DT_OK) return dt_error_wrap(DT_ERR_INVALID, "input: ");
    int64_t got = 0;
    while (s == DT_OK) {
        ssize_t r = read(fd, in, TEXT_CHUNK);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            s = dt_error(DT_ERR_IO, "%s: read failed: %s", path, strerror(errno));
            break;
        }
        if (r == 0) break;
        for (ssize_t k = 0; k < r; k++) {
            out[2 * k] = in[k];
            out[2 * k + 1] = 0;
        }
        /* k bytes of this chunk still belong to train.bin */
        int64_t k = cut - *pos;
        k = k < 0 ? 0 : (k > r ? r : k);
        if (k > 0) s = dt_afile_write(ft, out, 2 * (size_t)k);
        if (s == DT_OK && k < r) s = dt_afile_write(fv, out + 2 * k, 2 * (size_t)(r - k));
        *pos += r;
        got += r;
    }
    close(fd);
    if (s == DT_OK && got != size)
        s = dt_error(DT_ERR_IO, "%s: changed while being read (%lld bytes, %lld when it was opened)", path,
                     (long long)got, (long long)size);
    return s;
}

dt_status dt_tokens_from_bytes(const char *out_dir, const char *const *files, size_t nfiles, double train_fraction,
                               int64_t *n_train, int64_t *n_val) {
    *n_train = *n_val = 0;
    if (!out_dir || !*out_dir) return dt_error(DT_ERR_INVALID, "prepare-text: no output directory given");
    if (nfiles == 0) return dt_error(DT_ERR_INVALID, "prepare-text: no input files given");
    if (!(train_fraction >= 0.0 && train_fraction <= 1.0))
        return dt_error(DT_ERR_INVALID, "prepare-text: train fraction %g outside [0, 1]", train_fraction);
    /* Every input is checked before anything is written. */
    int64_t *sizes = calloc(nfiles, sizeof *sizes), total = 0;
    if (!sizes) return dt_error(DT_ERR_NOMEM, "prepare-text: out of memory");
    dt_status s = DT_OK;
    for (size_t i = 0; s == DT_OK && i < nfiles; i++) {
        int fd;
        if ((s = dt_file_open_read(files[i], &fd, &sizes[i])) != DT_OK) {
            s = dt_error_wrap(DT_ERR_INVALID, "input: ");
            break;
        }
        close(fd);
        total += sizes[i];
    }
    if (s == DT_OK && total == 0) s = dt_error(DT_ERR_INVALID, "prepare-text: the input files hold no bytes");
    /* the cut of make_bytes_bin.py: int(len * 0.9), a double product truncated */
    int64_t cut = (int64_t)((double)total * train_fraction);
    if (cut > total) cut = total;
    if (s == DT_OK) s = make_dirs(out_dir);
    char tpath[4096], vpath[4096];
    if (s == DT_OK && ((size_t)snprintf(tpath, sizeof tpath, "%s/train.bin", out_dir) >= sizeof tpath ||
                       (size_t)snprintf(vpath, sizeof vpath, "%s/val.bin", out_dir) >= sizeof vpath))
        s = dt_error(DT_ERR_INVALID, "%s: the directory name is too long", out_dir);
    dt_afile *ft = NULL, *fv = NULL;
    if (s == DT_OK) s = open_token_file(tpath, cut, &ft);
    if (s == DT_OK) s = open_token_file(vpath, total - cut, &fv);
    unsigned char *in = malloc(TEXT_CHUNK), *out = malloc(2 * TEXT_CHUNK);
    if (s == DT_OK && (!in || !out)) s = dt_error(DT_ERR_NOMEM, "prepare-text: out of memory");
    int64_t pos = 0;
    for (size_t i = 0; s == DT_OK && i < nfiles; i++) s = copy_as_tokens(files[i], sizes[i], cut, &pos, ft, fv, in, out);
    free(in);
    free(out);
    free(sizes);
    /* both files are complete before either replaces an older one */
    if (s == DT_OK) {
        s = dt_afile_commit(ft);
        ft = NULL;
    }
    if (s == DT_OK) {
        s = dt_afile_commit(fv);
        fv = NULL;
    }
    dt_afile_abort(ft);
    dt_afile_abort(fv);
    if (s != DT_OK) return s;
    *n_train = cut;
    *n_val = total - cut;
    return DT_OK;
}
