/*
 * data.h: datasets in host memory and the prefetching batch loader.
 *
 * A dataset is N samples of float32 features, each of shape (C, H, W) or (D),
 * already normalised, plus label_width int32 labels per sample in [0, classes)
 * (one class label, or the T next tokens of a token window). Sources, given as
 * one spec string (the --data flag):
 *
 *   DIR                     IDX files as Fashion-MNIST/MNIST ship them:
 *                           DIR/train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz],
 *                           t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz];
 *                           or NumPy files DIR/x_train.npy, y_train.npy, x_test.npy, y_test.npy
 *   X,Y[,XTEST,YTEST]       explicit files, each IDX (raw or gzip) or .npy, told apart by
 *                           their content (gzip magic 1f 8b, "\x93NUMPY"), not their name
 *   synthetic:N,C,H,W,K[,NTEST[,SEED]]
 *                           a learnable synthetic set: K class prototypes plus noise,
 *                           from a counter-based hash (deterministic, no files)
 *   tokens:DIR              token windows for language models: DIR/train.bin (train
 *                           split) and DIR/val.bin (test split), see below
 *
 * Token files hold uint16 little-endian token ids, either in llm.c's format (a
 * 1024-byte header of 256 int32: magic 20240520, version 1, token count; then
 * exactly that many tokens) or raw as nanoGPT writes them (no header). They are
 * told apart by the first int32: a file starting with an llm.c magic is read
 * as llm.c's (and refused if it is another llm.c kind or version), any other
 * file as raw. Files are memory-mapped read-only, never copied, and every token
 * is checked once at open. Sample i of a split with window T
 * (dt_data_opts.window, required) is the window starting at token i: features
 * are tokens i..i+T-1 as floats (exact: ids < 2^16), labels are tokens
 * i+1..i+T. So N = tokens - T, shape (T), label_width T, never normalised, and
 * classes is the vocabulary: opts.classes, or one more than the largest token
 * of train.bin and val.bin together (both splits share it). Token datasets
 * have no feature or label arrays: read them with dt_dataset_gather. Replacing
 * a file while it is mapped is safe when done by rename (dtrain prepare-text
 * does); truncating it in place would crash the reader (SIGBUS), as with any
 * mapped file.
 *
 * Normalisation (per channel, the channel being C of (C, H, W), or one channel
 * for (D)): u8 features are scaled to [0, 1], then (x - mean) / std with the
 * mean and std of the TRAINING split, computed once in a fixed order with double
 * accumulation, and the same statistics are applied to the test split. Features
 * of other types are taken as they are unless options ask otherwise; DT_NORM_RAW
 * takes every type as it is (u8 as 0..255).
 *
 * Sizes are 64-bit throughout; a header claiming more data than the file holds
 * is rejected before anything is allocated.
 */
#ifndef DT_DATA_H
#define DT_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "status.h"

typedef enum { DT_SPLIT_TRAIN = 0, DT_SPLIT_TEST = 1 } dt_split;

typedef enum {
    DT_NORM_AUTO = 0, /* "auto": u8 features: [0,1] then train mean/std; others: as stored */
    DT_NORM_UNIT,     /* "unit": u8 scaled to [0,1], nothing else; others as stored */
    DT_NORM_TRAIN,    /* "standard": every type: (x - train mean) / train std (u8 after scaling) */
    DT_NORM_GIVEN,    /* (x - mean[c]) / std[c] with the values given in the options (u8 after scaling) */
    DT_NORM_RAW,      /* "none": every value as stored (u8 stays 0..255) */
} dt_norm_mode;

#define DT_DATA_MAX_CHANNELS 64

typedef struct {
    dt_norm_mode norm;
    int          channels;                   /* DT_NORM_GIVEN: number of mean/std values (1 = all) */
    float        mean[DT_DATA_MAX_CHANNELS];
    float        std[DT_DATA_MAX_CHANNELS];
    int          classes;                    /* > 0: labels must lie in [0, classes); 0: from the train split
                                                (tokens: from both splits) */
    int64_t      window;                     /* tokens: the window length T (> 0, required); others: ignored */
} dt_data_opts;

typedef struct {
    int64_t n;            /* samples */
    int     ndim;         /* dimensions of one sample: 1 (D) or 3 (C, H, W) */
    int64_t shape[3];     /* (C, H, W) or (D) */
    int64_t sample_size;  /* floats per sample: the product of shape */
    int64_t label_width;  /* labels per sample: 1, or T for token windows */
    int     classes;      /* labels lie in [0, classes) */
    int     channels;     /* normalisation channels: C, or 1 for (D) */
    float   mean[DT_DATA_MAX_CHANNELS]; /* statistics applied (0 and 1 when none) */
    float   std[DT_DATA_MAX_CHANNELS];
} dt_dataset_info;

typedef struct dt_dataset dt_dataset;
typedef struct dt_loader  dt_loader;

/* ---- datasets ------------------------------------------------------------ */
/* Default options: DT_NORM_AUTO, classes from the train split. */
DT_API void      dt_data_opts_default(dt_data_opts *o);
/* Default options with the normalisation named "auto", "standard" (DT_NORM_TRAIN),
 * "unit" (DT_NORM_UNIT) or "none" (DT_NORM_RAW); DT_ERR_INVALID naming the field
 * otherwise. */
DT_API dt_status dt_data_opts_from_name(const char *normalize, dt_data_opts *o);
/* Open one split of a spec (see above) with default options. */
DT_API dt_status dt_dataset_open(const char *spec, dt_split split, dt_dataset **out);
/* The same with options (opts may be NULL). The test split reads the training
 * features once to get their statistics. */
DT_API dt_status dt_dataset_open_opts(const char *spec, dt_split split, const dt_data_opts *opts, dt_dataset **out);
/* Both splits, computing the training statistics once (test may be NULL). */
DT_API dt_status dt_dataset_open_pair(const char *spec, const dt_data_opts *opts, dt_dataset **train, dt_dataset **test);
/* 1 when spec's source reads windows whose length and vocabulary come from the model
 * (tokens:DIR): dt_data_opts.window and .classes must then be set from it. */
DT_API int       dt_data_windows(const char *spec);
/* A synthetic dataset: n samples of (c, h, w), `classes` classes; split picks
 * an independent stream of samples over the same class prototypes. */
DT_API dt_status dt_dataset_synthetic(int64_t n, int c, int h, int w, int classes, uint64_t seed, dt_split split,
                                      dt_dataset **out);
DT_API void      dt_dataset_free(dt_dataset *ds);
/* Shape, size, classes and statistics. */
DT_API const dt_dataset_info *dt_dataset_get_info(const dt_dataset *ds);
/* Features (n, sample_size) and labels (n), row-major; NULL for token datasets,
 * whose samples are windows over the mapped file (use dt_dataset_gather). */
DT_API const float   *dt_dataset_features(const dt_dataset *ds);
DT_API const int32_t *dt_dataset_labels(const dt_dataset *ds);
/* What the dataset was read from ("DIR/train-images-idx3-ubyte.gz", "synthetic:..."). */
DT_API const char    *dt_dataset_source(const dt_dataset *ds);
/* Copy samples idx[0..n) into x (n, sample_size) and y (n, label_width); checks every index. */
DT_API dt_status dt_dataset_gather(const dt_dataset *ds, const int64_t *idx, size_t n, float *x, int32_t *y);
/* One sample: x (sample_size), y (label_width). */
DT_API dt_status dt_dataset_sample(const dt_dataset *ds, int64_t i, float *x, int32_t *y);
/* `count` sample indices for evaluation, the same on every rank and world size:
 * one drawn from (seed, k) in each of `count` equal strata of [0, n), ascending,
 * so they spread over the whole split (distinct when count <= n). */
DT_API dt_status dt_dataset_eval_windows(const dt_dataset *ds, int64_t count, uint64_t seed, int64_t *idx);
/* A fingerprint of a split for cross-rank checks: sizes, classes, statistics
 * and the first and last samples (features and labels), read through gather. */
DT_API dt_status dt_dataset_fingerprint(const dt_dataset *ds, uint64_t *out);

/* ---- token files ---------------------------------------------------------- */
/* Byte-level tokens from text: the bytes of files[0..nfiles), concatenated in
 * the order given, one token per byte (vocabulary 256), cut at
 * (int64_t)(total * train_fraction) into out_dir/train.bin and out_dir/val.bin
 * in llm.c's format. Each file is written atomically; out_dir is created if
 * missing. DT_ERR_INVALID for bad input (no bytes, an input that is missing or
 * not a regular file, an out_dir that cannot be made or written), DT_ERR_IO
 * when writing fails. *n_train and *n_val get the token counts. */
DT_API dt_status dt_tokens_from_bytes(const char *out_dir, const char *const *files, size_t nfiles,
                                      double train_fraction, int64_t *n_train, int64_t *n_val);

/* ---- raw readers (also for tools and tests) ------------------------------ */
/* An array read from an IDX or NPY file. Its element type is one of the
 * dtypes these readers accept: u8, i8, i16, i32, i64, f32, f64. */
typedef struct {
    dt_dtype     type;
    int          ndim;
    int64_t      dims[8];
    size_t       count;  /* elements */
    void        *data;   /* count elements of type, native byte order; free() it */
} dt_array;

/* Read an IDX file (raw or gzip) or a .npy file (v1/v2/v3, little-endian, C order),
 * telling them apart by content. */
DT_API dt_status dt_array_read(const char *path, dt_array *out);
DT_API void      dt_array_free(dt_array *a);

/* ---- prefetching loader -------------------------------------------------- */
/* Host buffer allocation hooks, so the trainer can hand in pinned memory from
 * the compute layer; NULL uses aligned malloc. */
typedef struct {
    int      depth;              /* buffers in flight, >= 2 (default 2: double buffering) */
    double   timeout_s;          /* next() gives up after this long (default 600) */
    void  *(*alloc)(void *ctx, size_t bytes);
    void   (*free)(void *ctx, void *p);
    void    *alloc_ctx;
} dt_loader_opts;

/* A loader over ds for batches of up to max_batch samples (opts may be NULL). */
DT_API dt_status dt_loader_init(const dt_dataset *ds, size_t max_batch, dt_loader **out);
DT_API dt_status dt_loader_init_opts(const dt_dataset *ds, size_t max_batch, const dt_loader_opts *opts,
                                     dt_loader **out);
/* Queue a batch: the indices are copied; the background thread gathers it.
 * Fails (without blocking) when `depth` batches are already queued or held. */
DT_API dt_status dt_loader_submit(dt_loader *l, const int64_t *idx, size_t n);
/* The oldest queued batch: x is (n, sample_size), y is (n, label_width). Waits for it, and
 * releases the batch returned by the previous call. Errors of the gathering
 * thread come back here with their message. */
DT_API dt_status dt_loader_next(dt_loader *l, float **x, int32_t **y, size_t *n);
/* Release the batch returned by next() early (e.g. once copied to the device). */
DT_API void      dt_loader_release(dt_loader *l);
/* Seconds next() spent waiting for the thread so far, and batches delivered. */
DT_API double    dt_loader_wait_seconds(const dt_loader *l);
DT_API int64_t   dt_loader_batches(const dt_loader *l);
DT_API void      dt_loader_reset_wait(dt_loader *l);
/* Stop the thread and free the buffers. */
DT_API void      dt_loader_free(dt_loader *l);

#endif /* DT_DATA_H */
