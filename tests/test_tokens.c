/* test_tokens.c: token windows (--data tokens:DIR): llm.c's and nanoGPT's raw
 * uint16 files read identically, windows and next-token labels, the vocabulary,
 * gather, the loader with label_width labels, bad files (each refused naming
 * the file), evaluation indices, fingerprints, and byte-level token files
 * written by dt_tokens_from_bytes. */
#include "data.h"
#include "hash.h"
#include "tap.h"
#include "tmpfiles.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NTOK 200
#define T 8

static void le32(unsigned char *p, int32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)((uint32_t)v >> (8 * i));
}

/* dir/name: llm.c's header (magic, version, count) when magic != 0, then the
 * tokens little-endian, then `extra` zero bytes. */
static void put_tokens(const char *dir, const char *name, int32_t magic, int32_t version, int32_t count,
                       const uint16_t *t, size_t n, size_t extra) {
    size_t head = magic ? 1024 : 0, len = head + 2 * n + extra;
    unsigned char *b = calloc(len + 1, 1);
    if (!b) exit(1);
    if (magic) {
        le32(b, magic);
        le32(b + 4, version);
        le32(b + 8, count);
    }
    for (size_t i = 0; i < n; i++) {
        b[head + 2 * i] = (unsigned char)t[i];
        b[head + 2 * i + 1] = (unsigned char)(t[i] >> 8);
    }
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    tmp_spit(path, b, len);
    free(b);
}

static void put_llmc(const char *dir, const char *name, const uint16_t *t, size_t n) {
    put_tokens(dir, name, 20240520, 1, (int32_t)n, t, n, 0);
}

static void put_raw(const char *dir, const char *name, const uint16_t *t, size_t n) {
    put_tokens(dir, name, 0, 0, 0, t, n, 0);
}

static const char *mkdir_tmp(const char *name) {
    const char *d = tmp_path(name);
    mkdir(d, 0700);
    return d;
}

static dt_status open_tokens(const char *dir, int64_t window, int classes, dt_dataset **tr, dt_dataset **te) {
    char spec[700];
    snprintf(spec, sizeof spec, "tokens:%s", dir);
    dt_data_opts o;
    dt_data_opts_default(&o);
    o.window = window;
    o.classes = classes;
    return dt_dataset_open_pair(spec, &o, tr, te);
}

static uint16_t trt[NTOK], vat[NTOK / 2];

/* ---- reading ---------------------------------------------------------------- */

static void test_formats(void) {
    for (int i = 0; i < NTOK; i++) trt[i] = (uint16_t)((i * 37 + 5) % 300);
    for (int i = 0; i < NTOK / 2; i++) vat[i] = (uint16_t)((i * 11 + 2) % 280);
    trt[17] = 299;
    const char *a = mkdir_tmp("llmc"), *b = mkdir_tmp("raw");
    put_llmc(a, "train.bin", trt, NTOK);
    put_llmc(a, "val.bin", vat, NTOK / 2);
    put_raw(b, "train.bin", trt, NTOK);
    put_raw(b, "val.bin", vat, NTOK / 2);

    dt_dataset *tr = NULL, *te = NULL, *tr2 = NULL, *te2 = NULL;
    is_int(open_tokens(a, T, 0, &tr, &te), DT_OK, "llm.c token files open");
    is_int(open_tokens(b, T, 0, &tr2, &te2), DT_OK, "raw (nanoGPT) token files open");
    if (!tr || !te || !tr2 || !te2) {
        diag("%s", dt_last_error());
        exit(1);
    }
    const dt_dataset_info *in = dt_dataset_get_info(tr);
    ok(in->n == NTOK - T && in->ndim == 1 && in->shape[0] == T && in->sample_size == T && in->label_width == T,
       "  train: %d windows of %d tokens, %d labels each", NTOK - T, T, T);
    ok(in->channels == 1 && in->mean[0] == 0.0f && in->std[0] == 1.0f, "  never normalised (mean 0, std 1)");
    is_int(in->classes, 300, "  vocabulary: the largest token + 1");
    is_int(dt_dataset_get_info(te)->n, NTOK / 2 - T, "  val: its own windows");
    is_int(dt_dataset_get_info(te)->classes, 300, "  val shares the vocabulary");
    ok(dt_dataset_features(tr) == NULL && dt_dataset_labels(tr) == NULL, "  no feature or label arrays (virtual)");
    ok(memcmp(dt_dataset_get_info(tr2), in, sizeof *in) == 0 &&
       memcmp(dt_dataset_get_info(te2), dt_dataset_get_info(te), sizeof *in) == 0, "  raw files: the same info");

    /* every window of both formats */
    int64_t n = in->n, *idx = malloc((size_t)n * sizeof *idx);
    float *x = malloc((size_t)n * T * sizeof *x), *x2 = malloc((size_t)n * T * sizeof *x2);
    int32_t *y = malloc((size_t)n * T * sizeof *y), *y2 = malloc((size_t)n * T * sizeof *y2);
    if (!idx || !x || !x2 || !y || !y2) exit(1);
    for (int64_t i = 0; i < n; i++) idx[i] = n - 1 - i;
    is_int(dt_dataset_gather(tr, idx, (size_t)n, x, y), DT_OK, "gather every window (llm.c)");
    is_int(dt_dataset_gather(tr2, idx, (size_t)n, x2, y2), DT_OK, "gather every window (raw)");
    ok(memcmp(x, x2, (size_t)n * T * sizeof *x) == 0 && memcmp(y, y2, (size_t)n * T * sizeof *y) == 0,
       "  both formats give the same windows and labels");
    int right = 1;
    for (int64_t i = 0; i < n; i++)
        for (int j = 0; j < T; j++) {
            int64_t w = idx[i];
            right &= x[i * T + j] == (float)trt[w + j] && y[i * T + j] == (int32_t)trt[w + j + 1];
        }
    ok(right, "  window i: features tokens i..i+T-1, labels tokens i+1..i+T");
    is_int(y[T - 1], trt[NTOK - 1], "  the last window's last label is the last token");
    float xs[T];
    int32_t ys[T];
    is_int(dt_dataset_sample(tr, 17, xs, ys), DT_OK, "dt_dataset_sample");
    ok(memcmp(xs, x + (n - 1 - 17) * T, sizeof xs) == 0 && memcmp(ys, y + (n - 1 - 17) * T, sizeof ys) == 0,
       "  equals the gathered window");
    ok(xs[0] == 299.0f && ys[0] == trt[18], "  window 17 starts with token 299");
    int64_t bad = n;
    is_int(dt_dataset_gather(tr, &bad, 1, x, y), DT_ERR_INVALID, "window index n is refused");
    like(dt_last_error(), "out of range", "  message: %s", dt_last_error());

    /* the loader: label buffers of n * label_width */
    dt_loader *l = NULL;
    is_int(dt_loader_init(tr, 16, &l), DT_OK, "a loader over token windows");
    int64_t b16[16];
    for (int i = 0; i < 16; i++) b16[i] = (i * 13) % n;
    float *lx;
    int32_t *ly;
    size_t ln;
    dt_status s = dt_loader_submit(l, b16, 16);
    if (s == DT_OK) s = dt_loader_next(l, &lx, &ly, &ln);
    is_int(s, DT_OK, "  a batch of 16 windows");
    dt_dataset_gather(tr, b16, 16, x, y);
    ok(s == DT_OK && ln == 16 && memcmp(lx, x, 16 * T * sizeof *x) == 0 && memcmp(ly, y, 16 * T * sizeof *y) == 0,
       "  x (16, T) and y (16, T) equal the gathered windows");
    dt_loader_free(l);

    /* fingerprints: the same for both formats, another for other tokens */
    uint64_t f1 = 0, f2 = 0, f3 = 0;
    is_int(dt_dataset_fingerprint(tr, &f1), DT_OK, "fingerprint");
    dt_dataset_fingerprint(tr2, &f2);
    ok(f1 == f2, "  llm.c and raw files of the same tokens: the same fingerprint");
    dt_dataset_free(tr2);
    dt_dataset_free(te2);
    trt[NTOK - 1] ^= 1;
    put_raw(b, "train.bin", trt, NTOK);
    trt[NTOK - 1] ^= 1;
    is_int(open_tokens(b, T, 0, &tr2, NULL), DT_OK, "  the training split alone");
    dt_dataset_fingerprint(tr2, &f3);
    ok(f3 != f1, "  another last token: another fingerprint");
    dt_dataset_free(tr2);

    /* evaluation indices */
    int64_t e1[10], e2[10], e3[10];
    is_int(dt_dataset_eval_windows(te, 10, 5, e1), DT_OK, "eval windows: 10 of %lld", (long long)(NTOK / 2 - T));
    dt_dataset_eval_windows(te, 10, 5, e2);
    dt_dataset_eval_windows(te, 10, 6, e3);
    int inc = 1;
    for (int k = 0; k < 10; k++) inc &= e1[k] >= 0 && e1[k] < NTOK / 2 - T && (k == 0 || e1[k] > e1[k - 1]);
    ok(inc, "  distinct, ascending, in range");
    int strata = 1;
    for (int k = 0; k < 10; k++) strata &= e1[k] >= k * (NTOK / 2 - T) / 10 && e1[k] < (k + 1) * (NTOK / 2 - T) / 10;
    ok(strata, "  one in each tenth of the split");
    ok(memcmp(e1, e2, sizeof e1) == 0 && memcmp(e1, e3, sizeof e1) != 0, "  fixed by the seed, another seed another set");
    int64_t many[300];
    is_int(dt_dataset_eval_windows(te, 300, 5, many), DT_OK, "300 eval windows of %d", NTOK / 2 - T);
    int inr = 1;
    for (int k = 0; k < 300; k++) inr &= many[k] >= 0 && many[k] < NTOK / 2 - T;
    ok(inr, "  all in range");
    is_int(dt_dataset_eval_windows(te, 0, 5, many), DT_ERR_INVALID, "  count 0 is refused");

    /* the test split alone, the given vocabulary */
    dt_dataset *t3 = NULL;
    char spec[700];
    snprintf(spec, sizeof spec, "tokens:%s", a);
    dt_data_opts o;
    dt_data_opts_default(&o);
    o.window = 4;
    o.classes = 50304;
    is_int(dt_dataset_open_opts(spec, DT_SPLIT_TEST, &o, &t3), DT_OK, "the test split alone, window 4, vocab 50304");
    ok(t3 && dt_dataset_get_info(t3)->n == NTOK / 2 - 4 && dt_dataset_get_info(t3)->classes == 50304,
       "  %d windows, the given vocabulary", NTOK / 2 - 4);
    like(t3 ? dt_dataset_source(t3) : "", "val.bin", "  read from val.bin");
    dt_dataset_free(t3);
    /* a val token above every train token sets the vocabulary */
    vat[3] = 4000;
    put_raw(b, "val.bin", vat, NTOK / 2);
    vat[3] = (uint16_t)((3 * 11 + 2) % 280);
    is_int(open_tokens(b, T, 0, &tr2, NULL), DT_OK, "a val token of 4000");
    is_int(tr2 ? dt_dataset_get_info(tr2)->classes : 0, 4001, "  the vocabulary spans both splits, also for train alone");
    dt_dataset_free(tr2);
    put_raw(b, "val.bin", vat, NTOK / 2);

    /* synthetic data: one label per sample, and the fingerprint the trainer computed before */
    dt_dataset *syn = NULL;
    dt_dataset_synthetic(50, 1, 2, 3, 4, 9, DT_SPLIT_TRAIN, &syn);
    const dt_dataset_info *si = dt_dataset_get_info(syn);
    is_int(si->label_width, 1, "other datasets: label_width 1");
    int64_t head[4] = {si->n, si->sample_size, si->classes, si->channels};
    uint64_t h = dt_xxh64(head, sizeof head, 0);
    h = dt_xxh64(si->mean, sizeof si->mean, h);
    h = dt_xxh64(si->std, sizeof si->std, h);
    const float *sx = dt_dataset_features(syn);
    const int32_t *sy = dt_dataset_labels(syn);
    h = dt_xxh64(sx, 6 * sizeof *sx, h);
    h = dt_xxh64(sx + 49 * 6, 6 * sizeof *sx, h);
    h = dt_xxh64(sy, sizeof *sy, h);
    h = dt_xxh64(sy + 49, sizeof *sy, h);
    uint64_t fs = 0;
    dt_dataset_fingerprint(syn, &fs);
    ok(fs == h, "  their fingerprint is the one the trainer's rank check computed from the arrays");
    dt_dataset_free(syn);

    free(idx);
    free(x);
    free(x2);
    free(y);
    free(y2);
    dt_dataset_free(tr);
    dt_dataset_free(te);
}

/* ---- bad files ---------------------------------------------------------------- */

static void expect_bad(const char *dir, int64_t window, int classes, dt_status want, const char *file,
                       const char *sub, const char *what) {
    dt_dataset *tr = (dt_dataset *)1, *te = (dt_dataset *)1;
    dt_status s = open_tokens(dir, window, classes, &tr, &te);
    is_int(s, want, "%s is refused", what);
    like(dt_last_error(), sub, "  message: %s", dt_last_error());
    if (file) {
        char path[700];
        snprintf(path, sizeof path, "%s/%s", dir, file);
        like(dt_last_error(), path, "  names %s", file);
    }
    ok(tr == NULL && te == NULL, "  no dataset returned");
}

static void test_bad(void) {
    const char *d = mkdir_tmp("bad");
    uint16_t t[64];
    for (int i = 0; i < 64; i++) t[i] = (uint16_t)(i * 3);
    put_llmc(d, "val.bin", t, 64);

    put_tokens(d, "train.bin", 20240520, 2, 64, t, 64, 0);
    expect_bad(d, T, 0, DT_ERR_FORMAT, "train.bin", "version 2, expected 1", "an llm.c header of version 2");
    put_tokens(d, "train.bin", 20240801, 7, 64, t, 64, 0);
    expect_bad(d, T, 0, DT_ERR_FORMAT, "train.bin", "uint32 token format", "llm.c's uint32 (Llama 3) magic");
    put_tokens(d, "train.bin", 20240326, 1, 64, t, 64, 0);
    expect_bad(d, T, 0, DT_ERR_FORMAT, "train.bin", "model checkpoint", "an llm.c model file");
    put_tokens(d, "train.bin", 20240520, 1, 65, t, 64, 0);
    expect_bad(d, T, 0, DT_ERR_FORMAT, "train.bin", "claims 65 tokens", "a token count larger than the file holds");
    put_tokens(d, "train.bin", 20240520, 1, -3, t, 64, 0);
    expect_bad(d, T, 0, DT_ERR_FORMAT, "train.bin", "claims -3 tokens", "a negative token count");
    put_tokens(d, "train.bin", 20240520, 1, 64, t, 64, 2);
    expect_bad(d, T, 0, DT_ERR_FORMAT, "train.bin", "2 unexpected bytes after the 64 tokens",
               "trailing bytes after the counted tokens");
    put_tokens(d, "train.bin", 20240520, 1, 64, t, 64, 1);
    expect_bad(d, T, 0, DT_ERR_FORMAT, "train.bin", "1 unexpected bytes", "one trailing byte");
    unsigned char shorthead[12];
    le32(shorthead, 20240520);
    le32(shorthead + 4, 1);
    le32(shorthead + 8, 0);
    char path[700];
    snprintf(path, sizeof path, "%s/train.bin", d);
    tmp_spit(path, shorthead, sizeof shorthead);
    expect_bad(d, T, 0, DT_ERR_FORMAT, "train.bin", "fewer than its 1024-byte header", "llm.c's magic in a short file");
    put_tokens(d, "train.bin", 0, 0, 0, t, 64, 1);
    expect_bad(d, T, 0, DT_ERR_FORMAT, "train.bin", "odd length", "a raw file of odd length");
    t[41] = 300;
    put_raw(d, "train.bin", t, 64);
    expect_bad(d, T, 256, DT_ERR_FORMAT, "train.bin", "token 300 at index 41 is outside the vocabulary [0, 256)",
               "a raw token >= the vocabulary");
    put_llmc(d, "train.bin", t, 64);
    expect_bad(d, T, 256, DT_ERR_FORMAT, "train.bin", "token 300 at index 41", "an llm.c token >= the vocabulary");
    t[41] = 41 * 3;
    put_llmc(d, "train.bin", t, 64);
    t[60] = 999;
    put_llmc(d, "val.bin", t, 64);
    expect_bad(d, T, 256, DT_ERR_FORMAT, "val.bin", "token 999 at index 60", "a val token >= the vocabulary");
    t[60] = 180;
    put_llmc(d, "val.bin", t, 64);
    put_llmc(d, "train.bin", t, T);
    expect_bad(d, T, 0, DT_ERR_INVALID, "train.bin", "8 tokens, too few for one window of 8",
               "a file of T tokens (no window with its labels)");
    put_llmc(d, "train.bin", t, 0);
    expect_bad(d, T, 0, DT_ERR_INVALID, "train.bin", "0 tokens", "an llm.c file of no tokens");
    tmp_spit(path, "", 0);
    expect_bad(d, T, 0, DT_ERR_INVALID, "train.bin", "0 tokens", "an empty file");
    put_llmc(d, "train.bin", t, T + 1);
    dt_dataset *tr = NULL, *te = NULL;
    is_int(open_tokens(d, T, 0, &tr, &te), DT_OK, "T + 1 tokens: one window");
    is_int(tr ? dt_dataset_get_info(tr)->n : 0, 1, "  n = 1");
    dt_dataset_free(tr);
    dt_dataset_free(te);
    put_llmc(d, "train.bin", t, 64);
    expect_bad(d, 64, 0, DT_ERR_INVALID, "train.bin", "too few for one window of 64", "a window as long as the file");
    expect_bad(d, 0, 0, DT_ERR_INVALID, NULL, "needs a window length > 0", "window 0");

    char vpath[700];
    snprintf(vpath, sizeof vpath, "%s/val.bin", d);
    unlink(vpath);
    expect_bad(d, T, 0, DT_ERR_IO, "val.bin", "cannot open", "a missing val.bin");
    if (mkfifo(vpath, 0600) == 0) {
        expect_bad(d, T, 0, DT_ERR_IO, "val.bin", "not a regular file", "a FIFO as val.bin (no hang)");
        unlink(vpath);
    } else {
        skip(4, "cannot make a FIFO");
    }
    mkdir(vpath, 0700);
    expect_bad(d, T, 0, DT_ERR_IO, "val.bin", "a directory", "a directory as val.bin");
    rmdir(vpath);
    put_llmc(d, "val.bin", t, 64);
    expect_bad(tmp_path("nodir"), T, 0, DT_ERR_IO, NULL, "no such directory", "a missing directory");

    dt_dataset *ds = (dt_dataset *)1;
    char spec[700];
    snprintf(spec, sizeof spec, "tokens:%s", d);
    is_int(dt_dataset_open(spec, DT_SPLIT_TRAIN, &ds), DT_ERR_INVALID, "tokens: without options (no window)");
    like(dt_last_error(), "window", "  message: %s", dt_last_error());
    ok(ds == NULL, "  no dataset returned");
    dt_data_opts o;
    dt_data_opts_from_name("standard", &o);
    o.window = T;
    is_int(dt_dataset_open_opts(spec, DT_SPLIT_TRAIN, &o, &ds), DT_ERR_INVALID, "--normalize standard with tokens");
    like(dt_last_error(), "never normalised", "  message: %s", dt_last_error());
    is_int(dt_dataset_open(d, DT_SPLIT_TRAIN, &ds), DT_ERR_INVALID, "the directory without tokens:");
    like(dt_last_error(), "give token files as tokens:", "  message: %s", dt_last_error());

    unlink(path);
    unlink(vpath);
    rmdir(d);
}

/* ---- writing ------------------------------------------------------------------ */

static void test_from_bytes(void) {
    char f1[600], f2[600];   /* tmp_path's buffers rotate: keep copies */
    snprintf(f1, sizeof f1, "%s", tmp_path("text1"));
    snprintf(f2, sizeof f2, "%s", tmp_path("text2"));
    const char a[] = "hello, world\n", b[] = "\xff\x00\x80zz";
    tmp_spit(f1, a, sizeof a - 1);
    tmp_spit(f2, b, sizeof b - 1);
    const char *files[2] = {f1, f2};
    char out[600];
    snprintf(out, sizeof out, "%s/deep/er", tmp_path("made"));
    int64_t nt = -1, nv = -1;
    is_int(dt_tokens_from_bytes(out, files, 2, 0.5, &nt, &nv), DT_OK, "byte tokens of two files, half for training");
    int64_t total = (int64_t)(sizeof a - 1 + sizeof b - 1);
    ok(nt == total / 2 && nv == total - total / 2, "  %lld + %lld tokens", (long long)nt, (long long)nv);
    dt_dataset *tr = NULL, *te = NULL;
    is_int(open_tokens(out, 2, 0, &tr, &te), DT_OK, "  they open as tokens:");
    is_int(tr ? dt_dataset_get_info(tr)->classes : 0, 256, "  vocabulary 256 (the byte 0xff is in)");
    /* the concatenation comes back: windows of 2 over train, then val */
    unsigned char cat[64];
    memcpy(cat, a, sizeof a - 1);
    memcpy(cat + sizeof a - 1, b, sizeof b - 1);
    int back = tr && te;
    for (int64_t i = 0; back && i < nt - 2; i++) {
        float x[2];
        int32_t y[2];
        dt_dataset_sample(tr, i, x, y);
        back &= x[0] == cat[i] && x[1] == cat[i + 1] && y[1] == cat[i + 2];
    }
    for (int64_t i = 0; back && i < nv - 2; i++) {
        float x[2];
        int32_t y[2];
        dt_dataset_sample(te, i, x, y);
        back &= x[0] == cat[nt + i] && y[1] == cat[nt + i + 2];
    }
    ok(back, "  train then val tokens are the input bytes in order");
    dt_dataset_free(tr);
    dt_dataset_free(te);
    is_int(dt_tokens_from_bytes(out, files, 0, 0.9, &nt, &nv), DT_ERR_INVALID, "no input files");
    const char *missing[1] = {tmp_path("missing")};
    is_int(dt_tokens_from_bytes(out, missing, 1, 0.9, &nt, &nv), DT_ERR_INVALID, "a missing input");
    like(dt_last_error(), "missing: cannot open", "  message: %s", dt_last_error());
    char inside[700];
    snprintf(inside, sizeof inside, "%s/sub", f1);
    is_int(dt_tokens_from_bytes(inside, files, 2, 0.9, &nt, &nv), DT_ERR_INVALID, "an output directory under a file");
    like(dt_last_error(), "cannot create directory", "  message: %s", dt_last_error());

    char p[700];
    snprintf(p, sizeof p, "%s/train.bin", out);
    unlink(p);
    snprintf(p, sizeof p, "%s/val.bin", out);
    unlink(p);
    rmdir(out);
    snprintf(p, sizeof p, "%s/deep", tmp_path("made"));
    rmdir(p);
    rmdir(tmp_path("made"));
    unlink(f1);
    unlink(f2);
}

static void rm_dir_files(const char *name) {
    char p[700];
    snprintf(p, sizeof p, "%s/train.bin", tmp_path(name));
    unlink(p);
    snprintf(p, sizeof p, "%s/val.bin", tmp_path(name));
    unlink(p);
    rmdir(tmp_path(name));
}

int main(void) {
    tmp_init("dt_test_tokens");
    test_formats();
    test_bad();
    test_from_bytes();
    rm_dir_files("llmc");
    rm_dir_files("raw");
    rmdir(tmp_dir_);
    return done_testing();
}
