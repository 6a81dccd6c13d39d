/* test_data.c: IDX (raw and gzip) and NPY readers, the --data spec, train-set
 * normalisation shared with the test split, the synthetic dataset, corrupt
 * inputs (each rejected with a message naming the file), and the prefetching
 * loader (order, errors from its thread, wait time, custom allocation). */
#include "data.h"
#include "tap.h"
#include "tmpfiles.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

/* Write bytes to dir/name, gzip-compressed when gz. */
static void put(const char *name, const void *data, size_t n, int gz) {
    const char *p = tmp_path(name);
    if (gz) {
        gzFile f = gzopen(p, "wb");
        if (!f || gzwrite(f, data, (unsigned)n) != (int)n || gzclose(f) != Z_OK) {
            fprintf(stderr, "cannot write %s\n", p);
            exit(1);
        }
    } else {
        tmp_spit(p, data, n);
    }
}

/* An IDX file: 00 00 type ndim, big-endian dims, then payload bytes (already big-endian). */
static size_t idx_bytes(unsigned char *out, int type, int ndim, const uint32_t *dims, const void *payload,
                        size_t plen) {
    size_t k = 0;
    out[k++] = 0; out[k++] = 0; out[k++] = (unsigned char)type; out[k++] = (unsigned char)ndim;
    for (int i = 0; i < ndim; i++) {
        out[k++] = (unsigned char)(dims[i] >> 24); out[k++] = (unsigned char)(dims[i] >> 16);
        out[k++] = (unsigned char)(dims[i] >> 8);  out[k++] = (unsigned char)dims[i];
    }
    memcpy(out + k, payload, plen);
    return k + plen;
}

/* An NPY v1 (or v2) file from a header dict and payload. */
static size_t npy_bytes(unsigned char *out, int version, const char *dict, const void *payload, size_t plen) {
    size_t pre = version == 1 ? 10 : 12, dl = strlen(dict);
    size_t hl = dl + 1;
    while ((pre + hl) % 64) hl++;
    memcpy(out, "\x93NUMPY", 6);
    out[6] = (unsigned char)version;
    out[7] = 0;
    if (version == 1) {
        out[8] = (unsigned char)hl; out[9] = (unsigned char)(hl >> 8);
    } else {
        out[8] = (unsigned char)hl; out[9] = (unsigned char)(hl >> 8); out[10] = 0; out[11] = 0;
    }
    memcpy(out + pre, dict, dl);
    memset(out + pre + dl, ' ', hl - dl - 1);
    out[pre + hl - 1] = '\n';
    memcpy(out + pre + hl, payload, plen);
    return pre + hl + plen;
}

/* Train: 6 images 2x3 u8; test: 3 images. Labels 0..2. */
static unsigned char trimg[6 * 6], teimg[3 * 6];
static unsigned char trlab[6] = {0, 1, 2, 0, 1, 2}, telab[3] = {2, 1, 0};

static void write_idx_set(int gz) {
    unsigned char buf[256];
    uint32_t d3[3] = {6, 2, 3}, d1[1] = {6}, t3[3] = {3, 2, 3}, t1[1] = {3};
    for (int i = 0; i < 36; i++) trimg[i] = (unsigned char)(i * 7);
    for (int i = 0; i < 18; i++) teimg[i] = (unsigned char)(255 - i * 5);
    put(gz ? "train-images-idx3-ubyte.gz" : "train-images-idx3-ubyte", buf, idx_bytes(buf, 8, 3, d3, trimg, 36), gz);
    put(gz ? "train-labels-idx1-ubyte.gz" : "train-labels-idx1-ubyte", buf, idx_bytes(buf, 8, 1, d1, trlab, 6), gz);
    put(gz ? "t10k-images-idx3-ubyte.gz" : "t10k-images-idx3-ubyte", buf, idx_bytes(buf, 8, 3, t3, teimg, 18), gz);
    put(gz ? "t10k-labels-idx1-ubyte.gz" : "t10k-labels-idx1-ubyte", buf, idx_bytes(buf, 8, 1, t1, telab, 3), gz);
}

static void rm_idx_set(void) {
    const char *names[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                           "t10k-labels-idx1-ubyte"};
    char gzname[64];
    for (int i = 0; i < 4; i++) {
        unlink(tmp_path(names[i]));
        snprintf(gzname, sizeof gzname, "%s.gz", names[i]);
        unlink(tmp_path(gzname));
    }
}

static void test_idx_dir(int gz) {
    rm_idx_set();
    write_idx_set(gz);
    dt_dataset *tr = NULL, *te = NULL;
    is_int(dt_dataset_open_pair(tmp_dir_, NULL, &tr, &te), DT_OK, "%s IDX directory opens", gz ? "gzip" : "raw");
    if (!tr || !te) {
        diag("%s", dt_last_error());
        return;
    }
    const dt_dataset_info *in = dt_dataset_get_info(tr);
    ok(in->n == 6 && in->ndim == 3 && in->shape[0] == 1 && in->shape[1] == 2 && in->shape[2] == 3 &&
       in->sample_size == 6, "  train is 6 samples of (1, 2, 3)");
    is_int(in->classes, 3, "  3 classes from the labels");
    double m = 0, s = 0;
    for (int i = 0; i < 36; i++) m += trimg[i] / 255.0;
    m /= 36;
    for (int i = 0; i < 36; i++) s += (trimg[i] / 255.0 - m) * (trimg[i] / 255.0 - m);
    s = sqrt(s / 36);
    ok(fabs(in->mean[0] - m) < 1e-6 && fabs(in->std[0] - s) < 1e-6, "  train mean/std %.6f/%.6f", in->mean[0],
       in->std[0]);
    const float *x = dt_dataset_features(tr);
    int good = 1;
    for (int i = 0; i < 36; i++) good &= fabsf(x[i] - ((float)trimg[i] / 255.0f - in->mean[0]) / in->std[0]) < 1e-6f;
    ok(good, "  train features are (x/255 - mean)/std");
    const dt_dataset_info *ti = dt_dataset_get_info(te);
    ok(ti->n == 3 && ti->mean[0] == in->mean[0] && ti->std[0] == in->std[0], "  test uses the train statistics");
    const float *xt = dt_dataset_features(te);
    good = 1;
    for (int i = 0; i < 18; i++) good &= fabsf(xt[i] - ((float)teimg[i] / 255.0f - in->mean[0]) / in->std[0]) < 1e-6f;
    ok(good, "  test features normalised with them");
    ok(dt_dataset_labels(te)[0] == 2 && dt_dataset_labels(te)[2] == 0 && dt_dataset_labels(tr)[4] == 1,
       "  labels read");
    dt_dataset_free(te);
    dt_dataset *te2 = NULL;
    is_int(dt_dataset_open(tmp_dir_, DT_SPLIT_TEST, &te2), DT_OK, "  open the test split alone");
    ok(te2 && memcmp(dt_dataset_features(te2), xt, 0) == 0 && dt_dataset_get_info(te2)->mean[0] == in->mean[0],
       "  alone it still uses the train statistics");
    dt_dataset_free(te2);
    dt_dataset_free(tr);
}

static void expect_fail(const char *spec, dt_status want, const char *sub, const char *what) {
    dt_dataset *ds = (dt_dataset *)1;
    dt_status s = dt_dataset_open(spec, DT_SPLIT_TRAIN, &ds);
    is_int(s, want, "%s is rejected", what);
    like(dt_last_error(), sub, "  message: %s", dt_last_error());
    ok(ds == NULL, "  no dataset returned");
}

static void test_bad_idx(void) {
    unsigned char buf[512];
    uint32_t d3[3] = {6, 2, 3}, d1[1] = {6};
    char spec[1200];
    snprintf(spec, sizeof spec, "%s,%s", tmp_path("bx"), tmp_path("by"));
    put("by", buf, idx_bytes(buf, 8, 1, d1, trlab, 6), 0);

    put("bx", buf, idx_bytes(buf, 8, 3, d3, trimg, 30), 0);
    expect_fail(spec, DT_ERR_FORMAT, "truncated", "a raw IDX file cut short");
    put("bx", buf, idx_bytes(buf, 8, 3, d3, trimg, 30), 1);
    expect_fail(spec, DT_ERR_FORMAT, "truncated", "a gzip IDX file cut short");
    /* A gzip stream whose compressed bytes are cut. */
    size_t n = idx_bytes(buf, 8, 3, d3, trimg, 36);
    put("bx", buf, n, 1);
    size_t gn;
    unsigned char *gzb = tmp_slurp(tmp_path("bx"), &gn);
    if (!gzb || gn < 24) {
        diag("cannot read back the gzip file");
        exit(1);
    }
    put("bx", gzb, gn - 12, 0);
    dt_dataset *ds = NULL;
    dt_status s = dt_dataset_open(spec, DT_SPLIT_TRAIN, &ds);
    ok(s == DT_ERR_FORMAT && strstr(dt_last_error(), tmp_path("bx")), "a gzip stream cut mid-way is rejected: %s",
       dt_last_error());
    /* bytes after the gzip member are refused (raw IDX files with trailing bytes are too) */
    unsigned char *tail = malloc(gn + 5);
    memcpy(tail, gzb, gn);
    memcpy(tail + gn, "junk!", 5);
    put("bx", tail, gn + 5, 0);
    expect_fail(spec, DT_ERR_FORMAT, "5 unexpected bytes after the gzip data", "a gzip file with trailing bytes");
    put("bx", tail, gn + 1, 0);
    expect_fail(spec, DT_ERR_FORMAT, "1 unexpected bytes after the gzip data", "a gzip file with one trailing byte");
    free(tail);
    /* a second gzip member after the first is legal gzip (gzip -c a b): the two parts concatenated */
    {
        size_t half = n / 2;
        put("bpart", buf, half, 1);
        size_t n1, n2;
        unsigned char *m1 = tmp_slurp(tmp_path("bpart"), &n1);
        put("bpart", buf + half, n - half, 1);
        unsigned char *m2 = tmp_slurp(tmp_path("bpart"), &n2);
        unsigned char *both = malloc(n1 + n2);
        memcpy(both, m1, n1);
        memcpy(both + n1, m2, n2);
        put("bx", both, n1 + n2, 0);
        dt_dataset *two = NULL;
        is_int(dt_dataset_open(spec, DT_SPLIT_TRAIN, &two), DT_OK, "a file of two gzip members reads as their concatenation");
        dt_dataset_free(two);
        free(m1); free(m2); free(both);
        unlink(tmp_path("bpart"));
    }
    gzb[gn / 2] ^= 0xff; /* corrupt the deflate data */
    put("bx", gzb, gn, 0);
    s = dt_dataset_open(spec, DT_SPLIT_TRAIN, &ds);
    ok(s == DT_ERR_FORMAT, "corrupted gzip data is rejected: %s", dt_last_error());
    free(gzb);

    unsigned char junk[] = {0x12, 0x34, 0x56, 0x78, 0, 0, 0, 0};
    put("bx", junk, sizeof junk, 0);
    expect_fail(spec, DT_ERR_FORMAT, "not an IDX or NPY file", "a file with a wrong magic");
    n = idx_bytes(buf, 0x42, 3, d3, trimg, 36);
    put("bx", buf, n, 0);
    expect_fail(spec, DT_ERR_FORMAT, "element type 0x42", "an unknown IDX type");
    /* A header claiming 4e9 x 4e9 x 4e9 bytes: refused before allocating. */
    uint32_t huge[3] = {4000000000u, 4000000000u, 4000000000u};
    put("bx", buf, idx_bytes(buf, 8, 3, huge, trimg, 36), 0);
    expect_fail(spec, DT_ERR_FORMAT, "bx", "a raw header claiming 6.4e28 bytes");
    uint32_t big[3] = {60000, 1000, 1000};
    put("bx", buf, idx_bytes(buf, 8, 3, big, trimg, 36), 0);
    expect_fail(spec, DT_ERR_FORMAT, "the file holds", "a raw header claiming 60 GB");
    put("bx", buf, idx_bytes(buf, 8, 3, big, trimg, 36), 1);
    expect_fail(spec, DT_ERR_FORMAT, "impossible", "a gzip header claiming 60 GB");
    /* trailing bytes */
    n = idx_bytes(buf, 8, 3, d3, trimg, 36);
    buf[n++] = 1;
    put("bx", buf, n, 0);
    expect_fail(spec, DT_ERR_FORMAT, "unexpected bytes", "an IDX file with trailing bytes");
    /* counts differ */
    uint32_t d5[3] = {5, 2, 3};
    put("bx", buf, idx_bytes(buf, 8, 3, d5, trimg, 30), 0);
    expect_fail(spec, DT_ERR_FORMAT, "counts must match", "images and labels counts that differ");
    /* label out of range on the test split */
    put("bx", buf, idx_bytes(buf, 8, 3, d3, trimg, 36), 0);
    unsigned char badlab[6] = {0, 1, 2, 0, 1, 7};
    put("ty", buf, idx_bytes(buf, 8, 1, d1, badlab, 6), 0);
    snprintf(spec, sizeof spec, "%s,%s,%s,%s", tmp_path("bx"), tmp_path("by"), tmp_path("bx"), tmp_path("ty"));
    ds = NULL;
    s = dt_dataset_open(spec, DT_SPLIT_TEST, &ds);
    ok(s == DT_ERR_FORMAT && strstr(dt_last_error(), "label 7 of sample 5 out of range [0, 3)"),
       "a test label past the train classes is rejected: %s", dt_last_error());
    /* the explicit pair with a gzip file that has no .gz in its name */
    put("bx", buf, idx_bytes(buf, 8, 3, d3, trimg, 36), 1);
    snprintf(spec, sizeof spec, "%s,%s", tmp_path("bx"), tmp_path("by"));
    s = dt_dataset_open(spec, DT_SPLIT_TRAIN, &ds);
    ok(s == DT_OK && dt_dataset_get_info(ds)->n == 6, "gzip is detected by content, not by name");
    dt_dataset_free(ds);
    s = dt_dataset_open(spec, DT_SPLIT_TEST, &ds);
    ok(s == DT_ERR_INVALID && strstr(dt_last_error(), "no test files"), "test split of an X,Y pair: %s",
       dt_last_error());
    /* other IDX element types: i16 features (big-endian) */
    unsigned char be16[12] = {0, 1, 0xff, 0xfe, 0x01, 0x00, 0, 0, 0, 0, 0, 5};
    uint32_t d2[2] = {6, 1};
    put("bx", buf, idx_bytes(buf, 0x0B, 2, d2, be16, 12), 0);
    s = dt_dataset_open(spec, DT_SPLIT_TRAIN, &ds);
    ok(s == DT_OK && dt_dataset_features(ds)[0] == 1.0f && dt_dataset_features(ds)[1] == -2.0f &&
       dt_dataset_features(ds)[2] == 256.0f && dt_dataset_get_info(ds)->ndim == 1,
       "IDX i16 features (6, 1) are read big-endian and not rescaled");
    dt_dataset_free(ds);

    expect_fail("/nonexistent/dir", DT_ERR_IO, "/nonexistent/dir", "a missing directory");
    expect_fail(tmp_dir_, DT_ERR_IO, "train-images-idx3-ubyte", "a directory without dataset files");
    snprintf(spec, sizeof spec, "%s,%s", tmp_path("missing"), tmp_path("by"));
    expect_fail(spec, DT_ERR_IO, "missing: cannot open", "a missing file of a pair");
    expect_fail("synthetic:10,1,2", DT_ERR_INVALID, "synthetic:N,C,H,W", "a short synthetic spec");
    expect_fail("a,b,c", DT_ERR_INVALID, "2 or 4 files", "three files");
}

static void test_npy(void) {
    unsigned char buf[1024];
    float xf[4 * 3];
    for (int i = 0; i < 12; i++) xf[i] = (float)i * 0.5f - 1.0f;
    int64_t yl[4] = {1, 0, 1, 2};
    put("x.npy", buf, npy_bytes(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 3), }", xf, sizeof xf), 0);
    put("y.npy", buf, npy_bytes(buf, 2, "{'descr': '<i8', 'fortran_order': False, 'shape': (4,), }", yl, sizeof yl), 0);
    char spec[1200];
    snprintf(spec, sizeof spec, "%s,%s", tmp_path("x.npy"), tmp_path("y.npy"));
    dt_dataset *ds = NULL;
    is_int(dt_dataset_open(spec, DT_SPLIT_TRAIN, &ds), DT_OK, "NPY pair (v1 <f4, v2 <i8) opens");
    if (ds) {
        const dt_dataset_info *in = dt_dataset_get_info(ds);
        ok(in->n == 4 && in->ndim == 1 && in->shape[0] == 3 && in->classes == 3, "  4 samples of (3), 3 classes");
        ok(memcmp(dt_dataset_features(ds), xf, sizeof xf) == 0, "  f4 features are kept as stored (no norm)");
        ok(dt_dataset_labels(ds)[3] == 2, "  i8 labels");
        dt_dataset_free(ds);
    }
    /* non-finite features are refused at load, naming the sample and the feature */
    float keep = xf[7];
    xf[7] = NAN;
    put("x.npy", buf, npy_bytes(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 3), }", xf, sizeof xf), 0);
    expect_fail(spec, DT_ERR_FORMAT, "feature 1 of sample 2 is NaN", "f4 features holding a NaN");
    xf[7] = INFINITY;
    put("x.npy", buf, npy_bytes(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 3), }", xf, sizeof xf), 0);
    expect_fail(spec, DT_ERR_FORMAT, "feature 1 of sample 2 is infinite", "f4 features holding an infinity");
    double xd[12] = {0};
    xd[11] = 1e300;   /* finite in f64, infinite in f32 */
    put("x.npy", buf, npy_bytes(buf, 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (4, 3), }", xd, sizeof xd), 0);
    expect_fail(spec, DT_ERR_FORMAT, "feature 2 of sample 3 is infinite (as float32)", "f8 features beyond f32's range");
    xf[7] = keep;
    put("x.npy", buf, npy_bytes(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 3), }", xf, sizeof xf), 0);
    dt_data_opts o;
    dt_data_opts_default(&o);
    o.norm = DT_NORM_TRAIN;
    is_int(dt_dataset_open_opts(spec, DT_SPLIT_TRAIN, &o, &ds), DT_OK, "  with DT_NORM_TRAIN");
    if (ds) {
        double m = 0, v = 0;
        for (int i = 0; i < 12; i++) m += dt_dataset_features(ds)[i];
        m /= 12;
        for (int i = 0; i < 12; i++) v += (dt_dataset_features(ds)[i] - m) * (dt_dataset_features(ds)[i] - m);
        ok(fabs(m) < 1e-6 && fabs(v / 12 - 1) < 1e-5, "  normalised to mean 0, std 1");
        dt_dataset_free(ds);
    }
    o.norm = DT_NORM_GIVEN;
    o.channels = 1;
    o.mean[0] = 1.0f;
    o.std[0] = 2.0f;
    is_int(dt_dataset_open_opts(spec, DT_SPLIT_TRAIN, &o, &ds), DT_OK, "  with given mean/std");
    if (ds) {
        ok(dt_dataset_features(ds)[0] == (xf[0] - 1.0f) / 2.0f, "  (x - 1) / 2");
        dt_dataset_free(ds);
    }
    /* u1 features of v3 with shape (4, 1, 1, 3) and i4 labels (4, 1) */
    unsigned char xu[12] = {0, 255, 0, 255, 0, 255, 0, 255, 0, 255, 0, 255};
    int32_t yi[4] = {0, 1, 0, 1};
    put("x.npy", buf, npy_bytes(buf, 3, "{'descr': '|u1', 'fortran_order': False, 'shape': (4, 1, 1, 3), }", xu, 12), 0);
    put("y.npy", buf, npy_bytes(buf, 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (4, 1), }", yi, 16), 0);
    is_int(dt_dataset_open(spec, DT_SPLIT_TRAIN, &ds), DT_OK, "NPY v3 |u1 (4,1,1,3) + <i4 (4,1)");
    if (ds) {
        const dt_dataset_info *in = dt_dataset_get_info(ds);
        ok(in->ndim == 3 && in->shape[0] == 1 && in->shape[2] == 3, "  (C, H, W) = (1, 1, 3)");
        ok(fabsf(in->mean[0] - 0.5f) < 1e-6f && fabsf(in->std[0] - 0.5f) < 1e-6f &&
           fabsf(dt_dataset_features(ds)[1] - 1.0f) < 1e-6f, "  u8 scaled and normalised (mean 0.5, std 0.5)");
        dt_dataset_free(ds);
    }
    /* the names of the modes; "none" keeps u8 values as stored, "unit" scales them only */
    const char *names[] = {"auto", "unit", "standard", "none"};
    const dt_norm_mode modes[] = {DT_NORM_AUTO, DT_NORM_UNIT, DT_NORM_TRAIN, DT_NORM_RAW};
    for (int i = 0; i < 4; i++)
        ok(dt_data_opts_from_name(names[i], &o) == DT_OK && o.norm == modes[i], "  --normalize %s", names[i]);
    ok(dt_data_opts_from_name("zscore", &o) == DT_ERR_INVALID &&
       strstr(dt_last_error(), "expected auto, standard, unit or none, got 'zscore'"), "  an unknown name lists the valid ones");
    float want_raw[3] = {0.0f, 255.0f, 0.0f}, want_unit[3] = {0.0f, 1.0f, 0.0f};
    for (int raw = 0; raw < 2; raw++) {
        dt_data_opts_from_name(raw ? "none" : "unit", &o);
        is_int(dt_dataset_open_opts(spec, DT_SPLIT_TRAIN, &o, &ds), DT_OK, "  u8 with --normalize %s", raw ? "none" : "unit");
        if (ds) {
            const dt_dataset_info *in = dt_dataset_get_info(ds);
            ok(memcmp(dt_dataset_features(ds), raw ? want_raw : want_unit, sizeof want_raw) == 0 &&
               in->mean[0] == 0.0f && in->std[0] == 1.0f,
               raw ? "  none: u8 values stay 0..255, no statistics" : "  unit: u8 values scaled to 0..1, no statistics");
            dt_dataset_free(ds);
        }
    }
    struct { const char *dict; const char *sub; const char *what; } bad[] = {
        {"{'descr': '<f4', 'fortran_order': True, 'shape': (4, 3), }", "Fortran order", "Fortran order"},
        {"{'descr': '>f4', 'fortran_order': False, 'shape': (4, 3), }", "big-endian", "big-endian"},
        {"{'descr': '<c8', 'fortran_order': False, 'shape': (4, 3), }", "not supported", "complex dtype"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (4, x), }", "bad NPY header", "a bad shape"},
        {"{'descr': '<f4', 'fortran_order': False }", "missing", "a missing shape"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (5, 3), }", "truncated", "more elements than data"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (3, 3), }", "unexpected bytes", "fewer elements than data"},
        {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (4,), }", "structured", "a structured dtype"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (4, 3), 'extra': 1}", "unknown key", "an unknown key"},
        {"['descr']", "expected '{'", "not a dict"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        put("x.npy", buf, npy_bytes(buf, 1, bad[i].dict, xf, sizeof xf), 0);
        expect_fail(spec, DT_ERR_FORMAT, bad[i].sub, bad[i].what);
    }
    /* float labels */
    put("x.npy", buf, npy_bytes(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 3), }", xf, sizeof xf), 0);
    put("y.npy", buf, npy_bytes(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", xf, 16), 0);
    expect_fail(spec, DT_ERR_FORMAT, "floating point", "float labels");
    /* header length beyond the file */
    size_t n = npy_bytes(buf, 2, "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 3), }", xf, sizeof xf);
    buf[10] = 0x7f;
    put("x.npy", buf, n, 0);
    expect_fail(spec, DT_ERR_FORMAT, "x.npy", "an NPY header length beyond the file");
    /* a directory of x_train.npy ... */
    put("x_train.npy", buf, npy_bytes(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 3), }", xf, sizeof xf), 0);
    put("y_train.npy", buf, npy_bytes(buf, 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (4,), }", yl, sizeof yl), 0);
    put("x_test.npy", buf, npy_bytes(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", xf, 24), 0);
    put("y_test.npy", buf, npy_bytes(buf, 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }", yl, 16), 0);
    dt_dataset *te = NULL;
    is_int(dt_dataset_open(tmp_dir_, DT_SPLIT_TEST, &te), DT_OK, "a directory of x_train.npy ... y_test.npy");
    ok(te && dt_dataset_get_info(te)->n == 2 && dt_dataset_get_info(te)->classes == 3, "  test split: 2 samples");
    dt_dataset_free(te);
    const char *rm[] = {"x.npy", "y.npy", "x_train.npy", "y_train.npy", "x_test.npy", "y_test.npy", "bx", "by", "ty"};
    for (size_t i = 0; i < sizeof rm / sizeof rm[0]; i++) unlink(tmp_path(rm[i]));
}

static int n_alloc, n_free;
static void *count_alloc(void *ctx, size_t bytes) {
    (void)ctx;
    n_alloc++;
    return malloc(bytes);
}
static void count_free(void *ctx, void *p) {
    (void)ctx;
    n_free++;
    free(p);
}

static void test_synthetic(void) {
    dt_dataset *tr = NULL, *te = NULL, *tr2 = NULL;
    is_int(dt_dataset_open_pair("synthetic:2000,1,8,8,10,500,7", NULL, &tr, &te), DT_OK, "synthetic spec opens");
    is_int(dt_dataset_open("synthetic:2000,1,8,8,10,500,7", DT_SPLIT_TRAIN, &tr2), DT_OK, "  twice");
    if (!tr || !te || !tr2) return;
    const dt_dataset_info *in = dt_dataset_get_info(tr);
    ok(in->n == 2000 && in->ndim == 3 && in->shape[1] == 8 && in->classes == 10, "  2000 samples of (1,8,8), 10 classes");
    is_int(dt_dataset_get_info(te)->n, 500, "  500 test samples");
    ok(memcmp(dt_dataset_features(tr), dt_dataset_features(tr2), 2000 * 64 * sizeof(float)) == 0 &&
       memcmp(dt_dataset_labels(tr), dt_dataset_labels(tr2), 2000 * sizeof(int32_t)) == 0, "  deterministic");
    ok(memcmp(dt_dataset_features(tr), dt_dataset_features(te), 500 * 64 * sizeof(float)) != 0,
       "  the test split holds other samples");
    /* Learnable: a nearest-class-mean classifier fitted on train scores well on test. */
    static double cm[10][64];
    int cnt[10] = {0};
    memset(cm, 0, sizeof cm);
    for (int i = 0; i < 2000; i++) {
        int y = dt_dataset_labels(tr)[i];
        cnt[y]++;
        for (int j = 0; j < 64; j++) cm[y][j] += dt_dataset_features(tr)[i * 64 + j];
    }
    int every_class = 1;
    for (int k = 0; k < 10; k++) {
        every_class &= cnt[k] > 100;
        for (int j = 0; j < 64; j++) cm[k][j] /= cnt[k] ? cnt[k] : 1;
    }
    ok(every_class, "  every class is represented");
    int right = 0;
    for (int i = 0; i < 500; i++) {
        int best = 0;
        double bd = 1e300;
        for (int k = 0; k < 10; k++) {
            double d = 0;
            for (int j = 0; j < 64; j++) {
                double t = dt_dataset_features(te)[i * 64 + j] - cm[k][j];
                d += t * t;
            }
            if (d < bd) { bd = d; best = k; }
        }
        right += best == dt_dataset_labels(te)[i];
    }
    ok(right > 450, "  learnable: nearest class mean gets %d/500 of the test split", right);
    dt_dataset_free(tr2);
    dt_dataset *api = NULL;
    is_int(dt_dataset_synthetic(16, 3, 4, 4, 5, 1, DT_SPLIT_TRAIN, &api), DT_OK, "dt_dataset_synthetic");
    ok(api && dt_dataset_get_info(api)->shape[0] == 3 && dt_dataset_get_info(api)->classes == 5, "  shape and classes");
    dt_dataset_free(api);

    /* ---- the loader over the synthetic train split ---- */
    dt_loader *l = NULL;
    is_int(dt_loader_init(tr, 32, &l), DT_OK, "loader init");
    float *x;
    int32_t *y;
    size_t n;
    is_int(dt_loader_next(l, &x, &y, &n), DT_ERR_INVALID, "next() with nothing submitted fails, no hang");
    int64_t idx[32];
    static float ref[32 * 64];
    int32_t refy[32];
    int match = 1;
    for (int i = 0; i < 32; i++) idx[i] = (i * 37) % 2000;
    is_int(dt_loader_submit(l, idx, 32), DT_OK, "submit batch 0");
    for (int step = 0; step < 20; step++) {
        int64_t cur[32];
        for (int i = 0; i < 32; i++) cur[i] = (i * 37 + step * 101) % 2000;
        if (dt_loader_next(l, &x, &y, &n) != DT_OK || n != 32) { match = 0; break; }
        if (step + 1 < 20) {
            for (int i = 0; i < 32; i++) idx[i] = (i * 37 + (step + 1) * 101) % 2000;
            if (dt_loader_submit(l, idx, 32) != DT_OK) { match = 0; break; }
        }
        dt_dataset_gather(tr, cur, 32, ref, refy);
        match &= memcmp(x, ref, sizeof ref) == 0 && memcmp(y, refy, sizeof refy) == 0;
    }
    ok(match, "20 prefetched batches equal direct gathers");
    is_int(dt_loader_batches(l), 20, "  20 batches counted");
    ok(dt_loader_wait_seconds(l) >= 0.0 && dt_loader_wait_seconds(l) < 10.0, "  wait time measured (%.6f s)",
       dt_loader_wait_seconds(l));
    is_int(dt_loader_submit(l, idx, 33), DT_ERR_INVALID, "a batch over max_batch is rejected");
    is_int(dt_loader_submit(l, idx, 8), DT_OK, "submit");
    is_int(dt_loader_submit(l, idx, 8), DT_ERR_INVALID, "a second while a batch is held fails (depth 2)");
    dt_loader_release(l);
    is_int(dt_loader_submit(l, idx, 8), DT_OK, "after release() it is accepted");
    is_int(dt_loader_submit(l, idx, 8), DT_ERR_INVALID, "a third with depth 2 fails instead of blocking");
    like(dt_last_error(), "call next()", "  message says what to do");
    is_int(dt_loader_next(l, &x, &y, &n), DT_OK, "next");
    is_int(dt_loader_next(l, &x, &y, &n), DT_OK, "next");
    idx[3] = 2000;
    is_int(dt_loader_submit(l, idx, 8), DT_OK, "submit a batch with a bad index");
    dt_status s = dt_loader_next(l, &x, &y, &n);
    ok(s == DT_ERR_INVALID && strstr(dt_last_error(), "loader thread") &&
       strstr(dt_last_error(), "sample index 2000 out of range [0, 2000)"),
       "the thread's error comes back from next(): %s", dt_last_error());
    idx[3] = 1;
    is_int(dt_loader_submit(l, idx, 8), DT_OK, "the loader keeps working after an error");
    is_int(dt_loader_next(l, &x, &y, &n), DT_OK, "  next");
    dt_loader_free(l);

    /* custom allocation hooks and depth 3 */
    dt_loader_opts lo;
    memset(&lo, 0, sizeof lo);
    lo.depth = 3;
    lo.alloc = count_alloc;
    lo.free = count_free;
    is_int(dt_loader_init_opts(tr, 4, &lo, &l), DT_OK, "loader with depth 3 and allocation hooks");
    is_int(n_alloc, 6, "  x and y buffers of 3 slots come from the hook");
    for (int i = 0; i < 3; i++) ok(dt_loader_submit(l, idx, 4) == DT_OK, "  submit %d ahead", i);
    dt_loader_free(l); /* freed with batches queued: no hang, no leak */
    is_int(n_free, 6, "  and go back through it");
    lo.depth = 1;
    is_int(dt_loader_init_opts(tr, 4, &lo, &l), DT_ERR_INVALID, "depth 1 is rejected");
    dt_dataset_free(tr);
    dt_dataset_free(te);
}

static void test_fashion_mnist(void) {
    const char *fm = "/usr/share/datasets/fashion-mnist";
    if (access(fm, R_OK) != 0) {
        skip(4, "Fashion-MNIST not installed (Debian package dataset-fashion-mnist)");
        return;
    }
    dt_dataset *tr = NULL, *te = NULL;
    is_int(dt_dataset_open_pair(fm, NULL, &tr, &te), DT_OK, "Fashion-MNIST opens");
    if (!tr || !te) {
        diag("%s", dt_last_error());
        return;
    }
    const dt_dataset_info *in = dt_dataset_get_info(tr);
    ok(in->n == 60000 && in->ndim == 3 && in->shape[0] == 1 && in->shape[1] == 28 && in->shape[2] == 28 &&
       in->classes == 10, "  60000 train samples of (1, 28, 28), 10 classes");
    ok(fabsf(in->mean[0] - 0.2860f) < 1e-3f && fabsf(in->std[0] - 0.3530f) < 1e-3f,
       "  train mean/std %.4f/%.4f (the known 0.2860/0.3530)", in->mean[0], in->std[0]);
    is_int(dt_dataset_get_info(te)->n, 10000, "  10000 test samples");
    dt_dataset_free(tr);
    dt_dataset_free(te);
}

int main(void) {
    tmp_init("dt_test_data");
    test_idx_dir(0);
    test_idx_dir(1);
    rm_idx_set();
    test_bad_idx();
    test_npy();
    test_synthetic();
    test_fashion_mnist();
    rmdir(tmp_dir_);
    return done_testing();
}
