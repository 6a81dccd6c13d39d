/*
 * fuzz_array.c: libFuzzer target for the IDX and NPY readers, raw and gzip
 * (src/data_read.c). The input becomes the content of an anonymous in-memory
 * file that the reader opens by its /proc path, as it would a data file.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include "data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int fd = memfd_create("fuzz-array", MFD_CLOEXEC);
    if (fd < 0) return 0;
    if (size && write(fd, data, size) != (ssize_t)size) { close(fd); return 0; }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    dt_array a;
    if (dt_array_read(path, &a) == DT_OK) dt_array_free(&a);
    close(fd);
    return 0;
}
