/*
 * data_impl.h: the dataset struct and the data sources' rows, shared by data.c
 * (the table, specs, arrays in memory) and data_tokens.c (token files); not installed.
 */
#ifndef DT_DATA_IMPL_H
#define DT_DATA_IMPL_H

#include "data.h"

/* A form of --data: the prefix that names it in a spec (NULL: the default form, a
 * directory or X,Y files), whether its samples are windows whose length and vocabulary
 * come from the model, and how it opens both splits, reads samples and frees a
 * dataset. data.c holds the table; a source in a file of its own exports its row. */
typedef struct dt_data_source_ {
    const char *prefix;      /* "tokens:", "synthetic:", NULL */
    int         windows;     /* 1: dt_data_opts.window and .classes come from the model */
    /* both splits of spec (as given, prefix and all); test may be NULL */
    dt_status (*open_pair)(const char *rest, const dt_data_opts *o, dt_dataset **train, dt_dataset **test);
    /* samples idx[0..n) (already range-checked) into x (n, sample_size) and y (n, label_width) */
    void      (*gather)(const dt_dataset *ds, const int64_t *idx, size_t n, float *x, int32_t *y);
    void      (*free)(dt_dataset *ds);
} dt_data_source_;

extern const dt_data_source_ dt_data_tokens_;   /* data_tokens.c */

struct dt_dataset {
    const dt_data_source_ *src;
    dt_dataset_info      info;
    float               *x;        /* (n, sample_size); NULL for token windows */
    int32_t             *y;        /* (n); NULL for token windows */
    char                 source[1024];
    /* token windows: the mapped file and its tokens (2 bytes each, little-endian) */
    void                *map;
    size_t               map_len;
    const unsigned char *tok;
};


#endif /* DT_DATA_IMPL_H */
