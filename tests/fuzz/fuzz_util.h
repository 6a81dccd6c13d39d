/*
 * fuzz_util.h: what the fuzz targets that read files from a directory share: a
 * private directory for one input, writing the input (or a part of it) as a file
 * there, and removing the directory with all it holds once the input is done. A
 * directory per input keeps a run from leaving anything in /tmp (libFuzzer ends an
 * interrupted or timed run with _Exit, so no atexit handler would run), and keeps an
 * input from seeing the files of the one before it, so a crash replays alone.
 */
#ifndef DT_FUZZ_UTIL_H
#define DT_FUZZ_UTIL_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A fresh directory /tmp/fuzz-<name>-XXXXXX into dir (n bytes; abort when it cannot be
 * made); fuzz_dir_done removes it. */
static inline void fuzz_dir(char *dir, size_t n, const char *name) {
    snprintf(dir, n, "/tmp/fuzz-%s-XXXXXX", name);
    if (!mkdtemp(dir)) abort();
}

/* rm -r of path: the files and directories a target made, never following a link. */
static inline void fuzz_rm(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        struct dirent *e;
        while (d && (e = readdir(d)) != NULL) {
            char sub[512];
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
            fuzz_rm(sub);
        }
        if (d) closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}

/* Remove dir (made by fuzz_dir) and everything in it; dir is "" afterwards. */
static inline void fuzz_dir_done(char *dir) {
    if (dir[0]) fuzz_rm(dir);
    dir[0] = '\0';
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
