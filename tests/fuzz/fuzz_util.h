/*
 * fuzz_util.h: what the fuzz targets that read files from a directory share: a
 * private directory made once, and writing the input (or a part of it) as a file there.
 */
#ifndef DT_FUZZ_UTIL_H
#define DT_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* dir[64] made once as /tmp/fuzz-<name>-XXXXXX (abort when it cannot be). */
static inline void fuzz_dir(char *dir, size_t n, const char *name) {
    if (dir[0]) return;
    snprintf(dir, n, "/tmp/fuzz-%s-XXXXXX", name);
    if (!mkdtemp(dir)) abort();
}

/* Write size bytes as dir/name; 0 when that failed. */
static inline int fuzz_put(const char *dir, const char *name, const uint8_t *data, size_t size) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    int good = fwrite(data, 1, size, f) == size;
    return fclose(f) == 0 && good;
}

#endif /* DT_FUZZ_UTIL_H */
