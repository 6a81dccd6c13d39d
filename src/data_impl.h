/*
 * data_impl.h: the dataset struct and the token-window internals shared by
 * data.c (specs, arrays, gather) and data_tokens.c (token files) (not installed).
 */
#ifndef DT_DATA_IMPL_H
#define DT_DATA_IMPL_H

#include "data.h"

struct dt_dataset {
    dt_dataset_info      info;
    float               *x;        /* (n, sample_size); NULL for token windows */
    int32_t             *y;        /* (n); NULL for token windows */
    char                 source[1024];
    /* token windows: the mapped file and its tokens (2 bytes each, little-endian) */
    void                *map;
    size_t               map_len;
    const unsigned char *tok;
};

/* Both splits of tokens:DIR (test may be NULL), as data.h describes. */
dt_status dt_tokens_open_pair_(const char *dir, const dt_data_opts *o, dt_dataset **train, dt_dataset **test);
/* Windows idx[0..n) (already range-checked) into x (n, T) and y (n, T). */
void      dt_tokens_gather_(const dt_dataset *ds, const int64_t *idx, size_t n, float *x, int32_t *y);
/* Unmap a token dataset's file (nothing for other datasets). */
void      dt_tokens_unmap_(dt_dataset *ds);

#endif /* DT_DATA_IMPL_H */
