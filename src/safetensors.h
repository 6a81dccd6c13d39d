/*
 * safetensors.h: safetensors files (the format of Hugging Face's safetensors).
 *
 * Layout: 8 bytes little-endian u64 N, then N bytes of JSON
 *   {"__metadata__": {"key": "value", ...},
 *    "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
 * padded with spaces so the data starts at a multiple of 8, then the data:
 * each tensor's bytes, row-major, little-endian, at [begin, end) relative to
 * the start of the data. dtrain writes tensors in the order given, back to
 * back, so a model.safetensors loads in PyTorch and back.
 *
 * The reader trusts nothing: header length against file size, a strict JSON
 * parser for exactly this subset, known dtypes, dtype size x shape = byte
 * length, offsets in range, contiguous and non-overlapping, no duplicate names
 * or keys, UTF-8 strings. A file failing any check is rejected with one line
 * naming the file and the problem, and nothing of it is returned.
 *
 * Files are written atomically through fileio.h (docs/DESIGN.md rule 4): a crash
 * at any point leaves either the old file or the complete new one.
 */
#ifndef DT_SAFETENSORS_H
#define DT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"  /* dt_dtype: the file's "F32", "BF16", ... are its st_name */
#include "fileio.h" /* dt_afile, dt_write_atomic */
#include "status.h"

#define DT_ST_MAX_DIMS 8

/* A tensor of a file: pointers stay valid until dt_st_close. */
typedef struct {
    const char *name;
    dt_dtype    dtype;
    int         ndim;
    int64_t     shape[DT_ST_MAX_DIMS];
    const void *data;    /* nbytes, aligned for the dtype (64 bytes when the offset allows) */
    size_t      nbytes;
} dt_st_tensor;

typedef struct dt_st_writer dt_st_writer;
typedef struct dt_st_file   dt_st_file;

/* ---- writer --------------------------------------------------------------- */
DT_API dt_status dt_st_writer_init(dt_st_writer **out);
/* Add a tensor; data is NOT copied and must stay valid until write. */
DT_API dt_status dt_st_writer_add(dt_st_writer *w, const char *name, dt_dtype dtype, int ndim, const int64_t *shape,
                                  const void *data);
/* Set (or replace) a metadata string. */
DT_API dt_status dt_st_writer_set_meta(dt_st_writer *w, const char *key, const char *value);
/* Write the file atomically. */
DT_API dt_status dt_st_writer_write(dt_st_writer *w, const char *path);
/* Write it over `from`'s memory where that file exists (fileio.h, dt_afile_open_over:
 * only for a path in a directory that is renamed into place whole). */
DT_API dt_status dt_st_writer_write_over(dt_st_writer *w, const char *path, const char *from);
/* The tensors added so far, in order: the file's data region is their bytes end to end
 * (a checksum over it needs no copy of them). */
DT_API size_t      dt_st_writer_count(const dt_st_writer *w);
DT_API const void *dt_st_writer_data (const dt_st_writer *w, size_t i, size_t *bytes);
/* The header (8-byte length + padded JSON) the writer would emit, for tests. */
DT_API dt_status dt_st_writer_header(dt_st_writer *w, char **buf, size_t *len);
DT_API void      dt_st_writer_free(dt_st_writer *w);

/* ---- reader --------------------------------------------------------------- */
/* Read and validate a file (into memory). */
DT_API dt_status dt_st_open(const char *path, dt_st_file **out);
/* A sharded checkpoint: Hugging Face's index JSON (model.safetensors.index.json, its
 * "weight_map" naming each tensor's shard, a file in the index's directory). Every
 * shard is read and validated, the map and the shards must agree exactly, and the
 * one file returned holds the tensors of all of them (shard by shard, in the order
 * the map first names them) and the index's "metadata"; its data region is empty.
 * Errors name the index and the culprit. */
DT_API dt_status dt_st_open_index(const char *index_path, dt_st_file **out);
/* Validate a file image already in memory (copied); label names it in errors. */
DT_API dt_status dt_st_open_mem(const void *buf, size_t len, const char *label, dt_st_file **out);
DT_API void      dt_st_close(dt_st_file *f);
/* Tensors in header order. */
DT_API size_t    dt_st_count(const dt_st_file *f);
DT_API dt_status dt_st_tensor_at(const dt_st_file *f, size_t i, dt_st_tensor *out);
/* By name; DT_ERR_INVALID naming the file and tensor when absent. */
DT_API dt_status dt_st_find(const dt_st_file *f, const char *name, dt_st_tensor *out);
/* Metadata: the value of key, or NULL; or the i-th pair. */
DT_API const char *dt_st_meta_get(const dt_st_file *f, const char *key);
DT_API size_t    dt_st_meta_count(const dt_st_file *f);
DT_API void      dt_st_meta_at(const dt_st_file *f, size_t i, const char **key, const char **value);
/* The whole data region (after the header), e.g. for a checksum; NULL and 0 for an
 * index's union of shards. */
DT_API void      dt_st_data_region(const dt_st_file *f, const void **data, size_t *len);

#endif /* DT_SAFETENSORS_H */
