/*
 * fuzz_peak.c: libFuzzer target for the line parser of the MFU peak cache
 * (src/tools/peak.c): a cache file is the user's, and may hold anything. Whatever a line
 * holds, the parser refuses it or returns a positive finite rate, a date of 10
 * characters and a key that lies inside the line.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tools/peak.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 1 << 12) return 0;
    char *line = malloc(size ? size : 1);   /* exactly the bytes given: no terminator to lean on */
    if (!line) return 0;
    memcpy(line, data, size);
    double g = 0;
    char date[11];
    const char *key = NULL;
    size_t klen = 0;
    if (dt_peak_parse_line(line, size, &g, date, &key, &klen)) {
        if (!(g > 0 && isfinite(g)) || strlen(date) != 10) abort();
        if (!key || key < line || key + klen > line + size || klen == 0) abort();
    }
    free(line);
    return 0;
}
