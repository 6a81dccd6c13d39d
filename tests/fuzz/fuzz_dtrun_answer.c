/*
 * fuzz_dtrun_answer.c: libFuzzer target for the parser of a program's answer to dtrun's
 * elastic probe (src/tools/dtrun_parse.c): the program is the user's, and may print
 * anything after "dtrain-elastic: ". Whatever the line holds, the parser refuses it or
 * returns 1 to DTRUN_MAX_SIZES world sizes, positive, strictly increasing and at most
 * DTRUN_MAX_RANKS x DTRUN_MAX_NODES, and a resume and a checkpoint directory that end
 * inside their buffers, hold no control character and are copies of the line's own text.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tools/dtrun_parse.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* s (NUL-terminated within n bytes) has no control character and occurs in line */
static int sane(const char *s, size_t n, const char *line) {
    size_t l = strnlen(s, n);
    if (l == n) return 0;
    for (size_t i = 0; i < l; i++) if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) return 0;
    return l == 0 || strstr(line, s) != NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 1 << 12) return 0;
    char *line = malloc(size + 1);   /* exactly the bytes given, and the NUL the parser reads to */
    if (!line) return 0;
    memcpy(line, data, size);
    line[size] = '\0';
    dtrun_exact ex;
    if (dtrun_parse_answer(line, &ex) == 0) {
        if (ex.nsizes < 1 || ex.nsizes > DTRUN_MAX_SIZES) abort();
        for (int i = 0; i < ex.nsizes; i++)
            if (ex.sizes[i] < 1 || ex.sizes[i] > (long)DTRUN_MAX_RANKS * DTRUN_MAX_NODES ||
                (i > 0 && ex.sizes[i] <= ex.sizes[i - 1]))
                abort();
        if (!sane(ex.resume, sizeof ex.resume, line) || !sane(ex.ckpt_dir, sizeof ex.ckpt_dir, line)) abort();
        if (strncmp(line, "sizes=", 6) != 0) abort();
    }
    free(line);
    return 0;
}
