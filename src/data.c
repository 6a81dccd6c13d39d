/*
 * data.c: datasets: the --data spec, conversion of IDX/NPY arrays to float32
 * features and int32 labels, train-set normalisation statistics, the
 * synthetic dataset, and what every kind shares (gather, evaluation indices,
 * fingerprints); token windows are in data_tokens.c.
 *
 * Statistics are computed once from the training split, per channel, in a
 * fixed order (sample, then position) with double accumulation and two passes
 * (mean, then squared deviations), so every process, whatever its rank or
 * thread count, normalises with bit-identical values. The test split always
 * uses the training statistics.
 */
#define _FILE_OFFSET_BITS 64 /* 64-bit off_t for files over 2 GiB on 32-bit hosts */
#include "config.h"

#include "data_impl.h"
#include "hash.h"   /* dt_hash_u64: synthetic samples, evaluation indices, fingerprints */

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void dt_data_opts_default(dt_data_opts *o) {
    memset(o, 0, sizeof *o);
    o->norm = DT_NORM_AUTO;
}

dt_status dt_data_opts_from_name(const char *normalize, dt_data_opts *o) {
    dt_data_opts_default(o);
    if (!normalize || !strcmp(normalize, "auto")) o->norm = DT_NORM_AUTO;
    else if (!strcmp(normalize, "standard")) o->norm = DT_NORM_TRAIN;
    else if (!strcmp(normalize, "unit")) o->norm = DT_NORM_UNIT;
    else if (!strcmp(normalize, "none")) o->norm = DT_NORM_RAW;
    else return dt_error(DT_ERR_INVALID, "normalize: expected auto, standard, unit or none, got '%s'", normalize);
    return DT_OK;
}

const dt_dataset_info *dt_dataset_get_info(const dt_dataset *ds) { return &ds->info; }
const float *dt_dataset_features(const dt_dataset *ds) { return ds->x; }
const int32_t *dt_dataset_labels(const dt_dataset *ds) { return ds->y; }
const char *dt_dataset_source(const dt_dataset *ds) { return ds->source; }

void dt_dataset_free(dt_dataset *ds) {
    if (ds) ds->src->free(ds);
}

dt_status dt_dataset_gather(const dt_dataset *ds, const int64_t *idx, size_t n, float *x, int32_t *y) {
    for (size_t i = 0; i < n; i++) {
        int64_t k = idx[i];
        if (k < 0 || k >= ds->info.n)
            return dt_error(DT_ERR_INVALID, "%s: sample index %lld out of range [0, %lld)", ds->source, (long long)k,
                            (long long)ds->info.n);
    }
    ds->src->gather(ds, idx, n, x, y);
    return DT_OK;
}

dt_status dt_dataset_sample(const dt_dataset *ds, int64_t i, float *x, int32_t *y) {
    return dt_dataset_gather(ds, &i, 1, x, y);
}

dt_status dt_dataset_eval_windows(const dt_dataset *ds, int64_t count, uint64_t seed, int64_t *idx) {
    if (count <= 0) return dt_error(DT_ERR_INVALID, "eval: the number of samples must be positive, got %lld",
                                    (long long)count);
    /* stratum k is [k*n/count, (k+1)*n/count); empty ones (count > n) take their start */
    uint64_t n = (uint64_t)ds->info.n, key = dt_hash_u64(seed, 0xe7a1, 0);
    for (int64_t k = 0; k < count; k++) {
        uint64_t lo = (uint64_t)((unsigned __int128)k * n / (uint64_t)count);
        uint64_t hi = (uint64_t)((unsigned __int128)(k + 1) * n / (uint64_t)count);
        idx[k] = (int64_t)(hi > lo ? lo + dt_hash_below(key, (uint64_t)k, hi - lo) : lo);
    }
    return DT_OK;
}

dt_status dt_dataset_fingerprint(const dt_dataset *ds, uint64_t *out) {
    /* For one label per sample this hashes what the trainer's rank check always
     * hashed, in the same order, so fingerprints of those datasets do not change. */
    const dt_dataset_info *in = &ds->info;
    int64_t head[4] = {in->n, in->sample_size, in->classes, in->channels};
    uint64_t h = dt_xxh64(head, sizeof head, 0);
    h = dt_xxh64(in->mean, sizeof in->mean, h);
    h = dt_xxh64(in->std, sizeof in->std, h);
    size_t row = (size_t)in->sample_size, lw = (size_t)in->label_width;
    float *x = malloc(2 * row * sizeof *x);
    int32_t *y = malloc(2 * lw * sizeof *y);
    int64_t ends[2] = {0, in->n - 1};
    dt_status s = x && y ? dt_dataset_gather(ds, ends, 2, x, y) : dt_error(DT_ERR_NOMEM, "fingerprint: out of memory");
    if (s == DT_OK) {
        h = dt_xxh64(x, row * sizeof *x, h);
        h = dt_xxh64(x + row, row * sizeof *x, h);
        h = dt_xxh64(y, lw * sizeof *y, h);
        *out = dt_xxh64(y + lw, lw * sizeof *y, h);
    }
    free(x);
    free(y);
    return s;
}

/* ---- the spec ------------------------------------------------------------- */

typedef struct {
    int     synthetic;
    int64_t syn_n, syn_ntest;
    int     syn_c, syn_h, syn_w, syn_k;
    uint64_t syn_seed;
    char    files[4][1024]; /* train x, train y, test x, test y ("" when absent) */
} data_spec;

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* DIR/name or DIR/name.gz, whichever exists, into out; 0 if neither. */
static int find_in_dir(const char *dir, const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", dir, name);
    if (file_exists(out)) return 1;
    snprintf(out, cap, "%s/%s.gz", dir, name);
    if (file_exists(out)) return 1;
    out[0] = '\0';
    return 0;
}

static dt_status parse_synthetic(const char *spec, data_spec *sp) {
    const char *p = spec + strlen("synthetic:");
    long long v[7] = {0, 0, 0, 0, 0, -1, 0};
    int n = 0;
    while (n < 7) {
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno) break;
        v[n++] = x;
        p = end;
        if (*p != ',') break;
        p++;
    }
    if (*p != '\0' || n < 5)
        return dt_error(DT_ERR_INVALID, "data: %s: expected synthetic:N,C,H,W,CLASSES[,NTEST[,SEED]] (integers)",
                        spec);
    if (v[0] < 1 || v[0] > ((int64_t)1 << 40) || v[1] < 1 || v[2] < 1 || v[3] < 1 || v[1] > 4096 || v[2] > 65536 ||
        v[3] > 65536 || v[1] * v[2] * v[3] > ((int64_t)1 << 30) || v[4] < 1 || v[4] > (1 << 24) ||
        (n > 5 && (v[5] < 1 || v[5] > ((int64_t)1 << 40))))
        return dt_error(DT_ERR_INVALID,
                        "data: %s: sizes out of range (N, C, H, W, CLASSES and NTEST must be positive)", spec);
    sp->synthetic = 1;
    sp->syn_n = v[0];
    sp->syn_c = (int)v[1];
    sp->syn_h = (int)v[2];
    sp->syn_w = (int)v[3];
    sp->syn_k = (int)v[4];
    sp->syn_ntest = n > 5 ? v[5] : (v[0] / 5 > 0 ? v[0] / 5 : 1);
    sp->syn_seed = (uint64_t)v[6];
    return DT_OK;
}

static dt_status parse_spec(const char *spec, data_spec *sp) {
    memset(sp, 0, sizeof *sp);
    if (!spec || !*spec) return dt_error(DT_ERR_INVALID, "data: empty dataset spec");
    if (strncmp(spec, "synthetic:", 10) == 0) return parse_synthetic(spec, sp);
    if (strchr(spec, ',')) {
        int n = 0;
        const char *p = spec;
        while (1) {
            const char *c = strchr(p, ',');
            size_t len = c ? (size_t)(c - p) : strlen(p);
            if (n == 4 || len == 0 || len >= sizeof sp->files[0])
                return dt_error(DT_ERR_INVALID, "data: %s: expected X,Y or X,Y,XTEST,YTEST (2 or 4 files)", spec);
            memcpy(sp->files[n], p, len);
            sp->files[n][len] = '\0';
            n++;
            if (!c) break;
            p = c + 1;
        }
        if (n != 2 && n != 4)
            return dt_error(DT_ERR_INVALID, "data: %s: expected X,Y or X,Y,XTEST,YTEST (2 or 4 files), got %d", spec,
                            n);
        return DT_OK;
    }
    struct stat st;
    if (stat(spec, &st) != 0)
        return dt_error(DT_ERR_IO, "data: %s: no such directory (expected a directory of IDX or .npy files, "
                        "X,Y file names, synthetic:... or tokens:DIR)", spec);
    if (!S_ISDIR(st.st_mode))
        return dt_error(DT_ERR_INVALID, "data: %s: a single file; give features and labels as X,Y", spec);
    static const char *idx_names[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                       "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
    static const char *npy_names[4] = {"x_train.npy", "y_train.npy", "x_test.npy", "y_test.npy"};
    char tmp[1024];
    if (find_in_dir(spec, idx_names[0], tmp, sizeof tmp)) {
        for (int i = 0; i < 4; i++)
            if (!find_in_dir(spec, idx_names[i], sp->files[i], sizeof sp->files[i]))
                return dt_error(DT_ERR_IO, "data: %s: missing %s/%s[.gz]", spec, spec, idx_names[i]);
        return DT_OK;
    }
    snprintf(tmp, sizeof tmp, "%s/%s", spec, npy_names[0]);
    if (file_exists(tmp)) {
        for (int i = 0; i < 4; i++) {
            snprintf(sp->files[i], sizeof sp->files[i], "%s/%s", spec, npy_names[i]);
            if (!file_exists(sp->files[i]))
                return dt_error(DT_ERR_IO, "data: %s: missing %s", spec, sp->files[i]);
        }
        return DT_OK;
    }
    snprintf(tmp, sizeof tmp, "%s/train.bin", spec);
    if (file_exists(tmp))
        return dt_error(DT_ERR_INVALID, "data: %s holds train.bin: give token files as tokens:%s", spec, spec);
    return dt_error(DT_ERR_IO, "data: %s: expected %s/train-images-idx3-ubyte[.gz] (and the other three IDX files) "
                    "or %s/x_train.npy, y_train.npy, x_test.npy, y_test.npy", spec, spec, spec);
}

/* ---- synthetic data ------------------------------------------------------- */

/* A uniform float in [-1, 1) from a 64-bit hash (24 random bits, exact in f32). */
static inline float unit_sym(uint64_t h) { return (float)(int32_t)((h >> 40) - (1u << 23)) / (float)(1u << 23); }

/* Features (n, c*h*w) as F32 and labels (n) as I32: sample i of split s has
 * label hash(seed, s, i) mod k and features prototype[label] + noise, where the
 * prototype of a class is a fixed random pattern in [-1, 1] and the noise is
 * uniform in [-1, 1): linearly separable on average, noisy per sample. */
static dt_status synth_arrays(int64_t n, int c, int h, int w, int k, uint64_t seed, dt_split split, dt_array *x,
                              dt_array *y) {
    memset(x, 0, sizeof *x);
    memset(y, 0, sizeof *y);
    size_t d = (size_t)c * (size_t)h * (size_t)w;
    if ((uint64_t)n > SIZE_MAX / sizeof(float) / d)
        return dt_error(DT_ERR_INVALID, "synthetic: %lld samples of %zu floats do not fit in memory", (long long)n, d);
    float *xs = malloc((size_t)n * d * sizeof(float));
    int32_t *ys = malloc((size_t)n * sizeof(int32_t));
    if (!xs || !ys) {
        free(xs);
        free(ys);
        return dt_error(DT_ERR_NOMEM, "synthetic: out of memory for %lld samples of %zu floats", (long long)n, d);
    }
    uint64_t label_key = dt_hash_u64(seed, 0x1abe1, (uint64_t)split);
    uint64_t noise_key = dt_hash_u64(seed, 0x0153e, (uint64_t)split);
    uint64_t proto_key = dt_hash_u64(seed, 0x9707e, 0);
    for (int64_t i = 0; i < n; i++) {
        int32_t lab = (int32_t)(dt_hash_u64(label_key, (uint64_t)i, 0) % (uint64_t)k);
        ys[i] = lab;
        float *row = xs + (size_t)i * d;
        for (size_t j = 0; j < d; j++)
            row[j] = unit_sym(dt_hash_u64(proto_key, (uint64_t)lab, j)) +
                     unit_sym(dt_hash_u64(noise_key, (uint64_t)i, j));
    }
    x->type = DT_F32;
    x->ndim = 4;
    x->dims[0] = n; x->dims[1] = c; x->dims[2] = h; x->dims[3] = w;
    x->count = (size_t)n * d;
    x->data = xs;
    y->type = DT_I32;
    y->ndim = 1;
    y->dims[0] = n;
    y->count = (size_t)n;
    y->data = ys;
    return DT_OK;
}

/* ---- arrays to datasets --------------------------------------------------- */

/* NaN or infinity in the features (a float file, or an f64 value beyond f32's
 * range) would only show later as a NaN loss: refuse it here, naming the sample. */
static dt_status finite_features(const float *x, size_t count, int64_t sample_size, const char *path) {
    for (size_t i = 0; i < count; i++)
        if (!isfinite(x[i]))
            return dt_error(DT_ERR_FORMAT, "%s: feature %lld of sample %lld is %s (as float32); the features "
                            "must be finite", path, (long long)((int64_t)i % sample_size),
                            (long long)((int64_t)i / sample_size), isnan(x[i]) ? "NaN" : "infinite");
    return DT_OK;
}

/* Shape checks and conversion of the features to float ([0,1] for u8 unless raw). */
static dt_status features_from_array(dt_array *a, const char *path, int raw, dt_dataset *ds) {
    dt_dataset_info *in = &ds->info;
    in->label_width = 1;
    if (a->ndim < 1 || a->ndim > 4)
        return dt_error(DT_ERR_FORMAT, "%s: features have %d dimensions, expected (N), (N, D), (N, H, W) or "
                        "(N, C, H, W)", path, a->ndim);
    in->n = a->dims[0];
    if (in->n <= 0) return dt_error(DT_ERR_FORMAT, "%s: the feature array holds no samples", path);
    switch (a->ndim) {
    case 1: in->ndim = 1; in->shape[0] = 1; break;
    case 2: in->ndim = 1; in->shape[0] = a->dims[1]; break;
    case 3: in->ndim = 3; in->shape[0] = 1; in->shape[1] = a->dims[1]; in->shape[2] = a->dims[2]; break;
    default: in->ndim = 3; in->shape[0] = a->dims[1]; in->shape[1] = a->dims[2]; in->shape[2] = a->dims[3]; break;
    }
    in->sample_size = 1;
    for (int i = 0; i < in->ndim; i++) in->sample_size *= in->shape[i];
    if (in->sample_size <= 0) return dt_error(DT_ERR_FORMAT, "%s: samples are empty (a zero dimension)", path);
    in->channels = in->ndim == 3 ? (int)in->shape[0] : 1;
    if (a->type == DT_F32) { /* already float: take the buffer over */
        ds->x = a->data;
        a->data = NULL;
        return finite_features(ds->x, a->count, in->sample_size, path);
    }
    float *x = malloc(a->count * sizeof(float));
    if (!x) return dt_error(DT_ERR_NOMEM, "%s: out of memory for %zu features", path, a->count);
    const float u8_scale = raw ? 1.0f : 255.0f;
    for (size_t i = 0; i < a->count; i++) {
        switch (a->type) {
        case DT_U8:  x[i] = (float)((const uint8_t *)a->data)[i] / u8_scale; break;
        case DT_I8:  x[i] = (float)((const int8_t *)a->data)[i]; break;
        case DT_I16: x[i] = (float)((const int16_t *)a->data)[i]; break;
        case DT_I32: x[i] = (float)((const int32_t *)a->data)[i]; break;
        case DT_I64: x[i] = (float)((const int64_t *)a->data)[i]; break;
        case DT_F64: x[i] = (float)((const double *)a->data)[i]; break;
        default: break;   /* f32 is taken over above; the readers hand out no other type */
        }
    }
    ds->x = x;
    return finite_features(x, a->count, in->sample_size, path);
}

/* Integer labels (N) or (N, 1), as many as samples, each in [0, classes)
 * when classes > 0; *max_label is the largest seen. */
static dt_status labels_from_array(dt_array *a, const char *path, const char *xpath, dt_dataset *ds, int classes,
                                   int64_t *max_label) {
    if (dt_dtype_traits_of(a->type)->is_float)
        return dt_error(DT_ERR_FORMAT, "%s: labels are floating point, expected integers (u8, i8, i16, i32, i64)",
                        path);
    if (!(a->ndim == 1 || (a->ndim == 2 && a->dims[1] == 1)))
        return dt_error(DT_ERR_FORMAT, "%s: labels have %d dimensions, expected (N) or (N, 1)", path, a->ndim);
    if (a->dims[0] != ds->info.n)
        return dt_error(DT_ERR_FORMAT, "%s: %lld labels but %s has %lld samples (counts must match)", path,
                        (long long)a->dims[0], xpath, (long long)ds->info.n);
    int32_t *y = malloc((size_t)ds->info.n * sizeof(int32_t));
    if (!y) return dt_error(DT_ERR_NOMEM, "%s: out of memory for labels", path);
    int64_t hi = -1;
    for (size_t i = 0; i < a->count; i++) {
        int64_t v;
        switch (a->type) {
        case DT_U8:  v = ((const uint8_t *)a->data)[i]; break;
        case DT_I8:  v = ((const int8_t *)a->data)[i]; break;
        case DT_I16: v = ((const int16_t *)a->data)[i]; break;
        case DT_I32: v = ((const int32_t *)a->data)[i]; break;
        default:        v = ((const int64_t *)a->data)[i]; break;
        }
        if (v < 0 || v >= (1 << 24) || (classes > 0 && v >= classes)) {
            free(y);
            if (classes > 0)
                return dt_error(DT_ERR_FORMAT, "%s: label %lld of sample %zu out of range [0, %d)", path,
                                (long long)v, i, classes);
            return dt_error(DT_ERR_FORMAT, "%s: label %lld of sample %zu out of range (labels are class indices "
                            "0, 1, ...)", path, (long long)v, i);
        }
        y[i] = (int32_t)v;
        if (v > hi) hi = v;
    }
    ds->y = y;
    *max_label = hi;
    return DT_OK;
}

/* Per-channel mean and (population) std of ds's features, fixed order, double sums. */
static dt_status compute_stats(const dt_dataset *ds, float *mean, float *std) {
    const dt_dataset_info *in = &ds->info;
    int ch = in->channels;
    if (ch > DT_DATA_MAX_CHANNELS)
        return dt_error(DT_ERR_UNSUPPORTED, "%s: %d channels; normalisation supports at most %d", ds->source, ch,
                        DT_DATA_MAX_CHANNELS);
    size_t plane = (size_t)(in->sample_size / ch);
    for (int c = 0; c < ch; c++) {
        double sum = 0.0, sq = 0.0;
        for (int64_t i = 0; i < in->n; i++) {
            const float *p = ds->x + (size_t)i * (size_t)in->sample_size + (size_t)c * plane;
            for (size_t j = 0; j < plane; j++) sum += p[j];
        }
        double cnt = (double)in->n * (double)plane;
        double m = sum / cnt;
        for (int64_t i = 0; i < in->n; i++) {
            const float *p = ds->x + (size_t)i * (size_t)in->sample_size + (size_t)c * plane;
            for (size_t j = 0; j < plane; j++) sq += ((double)p[j] - m) * ((double)p[j] - m);
        }
        double s = sqrt(sq / cnt);
        mean[c] = (float)m;
        std[c] = s > 1e-12 ? (float)s : 1.0f; /* a constant channel is only centred */
    }
    return DT_OK;
}

static void apply_norm(dt_dataset *ds) {
    dt_dataset_info *in = &ds->info;
    size_t plane = (size_t)(in->sample_size / in->channels);
    for (int64_t i = 0; i < in->n; i++)
        for (int c = 0; c < in->channels; c++) {
            float *p = ds->x + (size_t)i * (size_t)in->sample_size + (size_t)c * plane;
            float m = in->mean[c], s = in->std[c];
            for (size_t j = 0; j < plane; j++) p[j] = (p[j] - m) / s;
        }
}

/* Load one split's arrays: from files or the synthetic generator. */
static dt_status load_arrays(const data_spec *sp, dt_split split, dt_array *x, dt_array *y, char *src,
                             size_t srccap) {
    if (sp->synthetic) {
        int64_t n = split == DT_SPLIT_TRAIN ? sp->syn_n : sp->syn_ntest;
        snprintf(src, srccap, "synthetic:%lld,%d,%d,%d,%d (%s)", (long long)n, sp->syn_c, sp->syn_h, sp->syn_w,
                 sp->syn_k, split == DT_SPLIT_TRAIN ? "train" : "test");
        return synth_arrays(n, sp->syn_c, sp->syn_h, sp->syn_w, sp->syn_k, sp->syn_seed, split, x, y);
    }
    const char *xp = sp->files[split == DT_SPLIT_TRAIN ? 0 : 2], *yp = sp->files[split == DT_SPLIT_TRAIN ? 1 : 3];
    if (!xp[0]) return dt_error(DT_ERR_INVALID, "data: no test files given (expected X,Y,XTEST,YTEST)");
    snprintf(src, srccap, "%s", xp);
    DT_TRY(dt_array_read(xp, x));
    dt_status s = dt_array_read(yp, y);
    if (s != DT_OK) dt_array_free(x);
    return s;
}

static const dt_data_source_ synthetic_, files_;   /* the rows of in-memory sources, below */

/* Build the dataset of one split; for the training split (stats == NULL) the
 * statistics and class count are computed and stored for the test split. */
static dt_status build_split(const data_spec *sp, dt_split split, const dt_data_opts *o, const dt_dataset *train,
                             dt_dataset **out) {
    *out = NULL;
    dt_array x, y;
    dt_dataset *ds = calloc(1, sizeof *ds);
    if (!ds) return dt_error(DT_ERR_NOMEM, "out of memory");
    ds->src = sp->synthetic ? &synthetic_ : &files_;
    dt_status s = load_arrays(sp, split, &x, &y, ds->source, sizeof ds->source);
    if (s != DT_OK) {
        free(ds);
        return s;
    }
    const char *ypath = sp->synthetic ? ds->source : sp->files[split == DT_SPLIT_TRAIN ? 1 : 3];
    dt_dtype xtype = x.type;
    int64_t max_label = -1;
    int classes = train ? train->info.classes : o->classes;
    s = features_from_array(&x, ds->source, o->norm == DT_NORM_RAW, ds);
    if (s == DT_OK) s = labels_from_array(&y, ypath, ds->source, ds, classes, &max_label);
    dt_array_free(&x);
    dt_array_free(&y);
    dt_dataset_info *in = &ds->info;
    if (s == DT_OK) {
        in->classes = classes > 0 ? classes : (int)(max_label + 1);
        if (sp->synthetic && classes <= 0) in->classes = sp->syn_k;
        if (train && (in->ndim != train->info.ndim ||
                      memcmp(in->shape, train->info.shape, sizeof in->shape) != 0))
            s = dt_error(DT_ERR_FORMAT, "%s: test samples have another shape than the training samples (%s)",
                         ds->source, train->source);
    }
    int use_stats = o->norm == DT_NORM_TRAIN || (o->norm == DT_NORM_AUTO && xtype == DT_U8);
    for (int c = 0; c < DT_DATA_MAX_CHANNELS; c++) {
        in->mean[c] = 0.0f;
        in->std[c] = 1.0f;
    }
    if (s == DT_OK && o->norm == DT_NORM_GIVEN) {
        if (o->channels != 1 && o->channels != in->channels)
            s = dt_error(DT_ERR_INVALID, "normalisation: %d mean/std values given, the data has %d channels",
                         o->channels, in->channels);
        else if (in->channels > DT_DATA_MAX_CHANNELS)
            s = dt_error(DT_ERR_UNSUPPORTED, "%s: %d channels; normalisation supports at most %d", ds->source,
                         in->channels, DT_DATA_MAX_CHANNELS);
        for (int c = 0; s == DT_OK && c < in->channels; c++) {
            int k = o->channels == 1 ? 0 : c;
            if (!(o->std[k] > 0.0f)) s = dt_error(DT_ERR_INVALID, "normalisation: std of channel %d must be > 0", k);
            in->mean[c] = o->mean[k];
            in->std[c] = o->std[k];
        }
        if (s == DT_OK) apply_norm(ds);
    } else if (s == DT_OK && use_stats) {
        if (train) {
            memcpy(in->mean, train->info.mean, sizeof in->mean);
            memcpy(in->std, train->info.std, sizeof in->std);
        } else {
            s = compute_stats(ds, in->mean, in->std);
        }
        if (s == DT_OK) apply_norm(ds);
    }
    if (s != DT_OK) {
        dt_dataset_free(ds);
        return s;
    }
    *out = ds;
    return DT_OK;
}

/* ---- the sources ---------------------------------------------------------- */

/* Both splits of an in-memory source (a directory, X,Y files or synthetic:). */
static dt_status arrays_open_pair(const char *spec, const dt_data_opts *o, dt_dataset **train, dt_dataset **test) {
    data_spec sp;
    DT_TRY(parse_spec(spec, &sp));
    DT_TRY(build_split(&sp, DT_SPLIT_TRAIN, o, NULL, train));
    if (test) {
        dt_status s = build_split(&sp, DT_SPLIT_TEST, o, *train, test);
        if (s != DT_OK) {
            dt_dataset_free(*train);
            *train = NULL;
            return s;
        }
    }
    return DT_OK;
}

static void arrays_gather(const dt_dataset *ds, const int64_t *idx, size_t n, float *x, int32_t *y) {
    size_t row = (size_t)ds->info.sample_size;
    for (size_t i = 0; i < n; i++) {
        memcpy(x + i * row, ds->x + (size_t)idx[i] * row, row * sizeof(float));
        y[i] = ds->y[idx[i]];
    }
}

static void arrays_free(dt_dataset *ds) {
    free(ds->x);
    free(ds->y);
    free(ds);
}

static const dt_data_source_ synthetic_ = {.prefix = "synthetic:", .open_pair = arrays_open_pair,
                                           .gather = arrays_gather, .free = arrays_free};
static const dt_data_source_ files_ = {.prefix = NULL, .open_pair = arrays_open_pair, .gather = arrays_gather,
                                       .free = arrays_free};
/* by prefix; the last, without one, takes every other spec */
static const dt_data_source_ *const sources[] = {&dt_data_tokens_, &synthetic_, &files_};

static const dt_data_source_ *source_of(const char *spec) {
    size_t n = sizeof sources / sizeof sources[0];
    for (size_t i = 0; i + 1 < n; i++)
        if (spec && !strncmp(spec, sources[i]->prefix, strlen(sources[i]->prefix))) return sources[i];
    return sources[n - 1];
}

int dt_data_windows(const char *spec) { return source_of(spec)->windows; }

dt_status dt_dataset_open_pair(const char *spec, const dt_data_opts *opts, dt_dataset **train, dt_dataset **test) {
    dt_data_opts o;
    if (opts) o = *opts;
    else dt_data_opts_default(&o);
    *train = NULL;
    if (test) *test = NULL;
    return source_of(spec)->open_pair(spec, &o, train, test);
}

dt_status dt_dataset_open_opts(const char *spec, dt_split split, const dt_data_opts *opts, dt_dataset **out) {
    *out = NULL;
    if (split == DT_SPLIT_TRAIN) return dt_dataset_open_pair(spec, opts, out, NULL);
    /* The test split needs the training statistics and class count. */
    dt_dataset *train = NULL;
    dt_status s = dt_dataset_open_pair(spec, opts, &train, out);
    dt_dataset_free(train);
    return s;
}

dt_status dt_dataset_open(const char *spec, dt_split split, dt_dataset **out) {
    return dt_dataset_open_opts(spec, split, NULL, out);
}

dt_status dt_dataset_synthetic(int64_t n, int c, int h, int w, int classes, uint64_t seed, dt_split split,
                               dt_dataset **out) {
    *out = NULL;
    char spec[160];
    snprintf(spec, sizeof spec, "synthetic:%lld,%d,%d,%d,%d,%lld,%llu", (long long)n, c, h, w, classes,
             (long long)n, (unsigned long long)seed);
    data_spec sp;
    DT_TRY(parse_spec(spec, &sp));
    dt_data_opts o;
    dt_data_opts_default(&o);
    o.classes = classes;
    return build_split(&sp, split, &o, NULL, out);
}
