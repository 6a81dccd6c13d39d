/*
 * tmpfiles.h: a private temporary directory for a test and small file helpers.
 *
 *   tmp_init("prefix")       create /tmp/prefix.XXXXXX (skip_all if impossible)
 *   tmp_path("name")         "<dir>/name" (four rotating buffers)
 *   tmp_slurp(path, &n)      the whole file, malloc'd (NULL if unreadable)
 *   tmp_spit(path, buf, n)   write a file or exit(1)
 */
#ifndef DT_TMPFILES_H
#define DT_TMPFILES_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"

static char tmp_dir_[256];

static inline void tmp_init(const char *prefix) {
    snprintf(tmp_dir_, sizeof tmp_dir_, "/tmp/%s.XXXXXX", prefix);
    if (!mkdtemp(tmp_dir_)) skip_all("cannot create a temporary directory");
}

static inline const char *tmp_path(const char *name) {
    static char buf[4][512];
    static int k = 0;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmp_dir_, name);
    return buf[k];
}

static inline unsigned char *tmp_slurp(const char *path, size_t *n) {
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char *b = NULL;
    long len = -1;
    if (fseek(f, 0, SEEK_END) == 0) len = ftell(f);
    if (len >= 0 && fseek(f, 0, SEEK_SET) == 0 && (b = malloc((size_t)len + 1)) != NULL)
        *n = fread(b, 1, (size_t)len, f);
    fclose(f);
    return b;
}

static inline void tmp_spit(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
}

#endif /* DT_TMPFILES_H */
