/*
 * safetensors_impl.h: helpers shared by the safetensors writer and reader
 * (not installed).
 */
#ifndef DT_SAFETENSORS_IMPL_H
#define DT_SAFETENSORS_IMPL_H

#include "safetensors.h"
#include "sbuf.h"

/* 1 if s[0..n) is well-formed UTF-8. */
int       dt_utf8_valid_(const unsigned char *s, size_t n);
/* Bytes of a tensor of dtype t and shape; DT_ERR_FORMAT on a negative
 * dimension or overflow. */
dt_status dt_st_tensor_bytes_(dt_dtype t, int ndim, const int64_t *shape, uint64_t *bytes);

/* ---- the strict JSON parser of headers, shared with the index reader -------- */
/* Text [base, end) parsed at p; errors name label and kind ("safetensors header"). */
typedef struct {
    const char *base, *p, *end;
    const char *label;  /* file name for messages */
    const char *kind;   /* what the JSON is, for messages */
} dt_jparse_;

/* DT_ERR_FORMAT: "<label>: bad <kind> at byte N of the JSON: <what>". */
dt_status dt_jerr_(dt_jparse_ *j, const char *what);
/* Skip white space; dt_jpeek_: then 1 if the next character is c. */
void      dt_jws_(dt_jparse_ *j);
int       dt_jpeek_(dt_jparse_ *j, char c);
dt_status dt_jexpect_(dt_jparse_ *j, char c);
/* A JSON string (escapes decoded, no NUL, valid UTF-8) into a new buffer. */
dt_status dt_jstring_(dt_jparse_ *j, char **out);

/* One file presenting the tensors of parts (parts[0]'s first, each in its order) and
 * the metadata meta (2 * nmeta strings: key, value, ...); its errors name label. It
 * takes parts (the array too) and meta whatever happens; a name in two parts is
 * DT_ERR_FORMAT. dt_st_close closes the parts; its data region is empty. */
dt_status dt_st_union_(const char *label, dt_st_file **parts, size_t nparts, char **meta, size_t nmeta,
                       dt_st_file **out);

/* ---- index files (safetensors_index.c) --------------------------------------- */
/* Hugging Face's model.safetensors.index.json, parsed and checked but no shard opened:
 *   {"metadata": {"total_size": 123, ...}, "weight_map": {"tensor": "shard file", ...}}
 * "metadata" is optional, its values strings or numbers (kept as their JSON text);
 * "weight_map" is required and not empty, its values plain file names (no '/', no
 * ".."), its names unique. */
typedef struct {
    char *name, *file;
} dt_st_index_entry_;

typedef struct {
    dt_st_index_entry_        *e;        /* weight_map, in the file's order */
    const dt_st_index_entry_ **by_name;  /* the same entries sorted by name */
    size_t                     n;
    char                     **meta;     /* key, value, ...: "metadata" */
    size_t                     nmeta;
} dt_st_index_;

dt_status dt_st_index_parse_(const char *json, size_t len, const char *label, dt_st_index_ *out);
void      dt_st_index_free_(dt_st_index_ *ix);
/* The weight_map entry of name, or NULL. */
const dt_st_index_entry_ *dt_st_index_find_(const dt_st_index_ *ix, const char *name);

#endif /* DT_SAFETENSORS_IMPL_H */
