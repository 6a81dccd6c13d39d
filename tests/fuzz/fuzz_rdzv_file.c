/*
 * fuzz_rdzv_file.c: libFuzzer target for the file of a file:// rendezvous
 * (dt_rdzv_file_parse, src/comm/rdzv_file.h): the input is the file's bytes, read by
 * the parser as they are (no terminating zero). A file it accepts must give fields as
 * promised (words without white space or zero bytes, within their sizes, a port in
 * 1..65535), and the line rank 0 would write from them must read back to the same
 * fields; a file it refuses leaves a message and empty fields.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdzv_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* s is one word: 1 to max bytes, no white space. */
static void check_word(const char *s, size_t max) {
    size_t n = strlen(s);
    if (n < 1 || n > max || strpbrk(s, " \t\n\v\f\r")) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > DT_RDZV_FILE_MAX) return 0;   /* tcp.c refuses a longer file before parsing */
    dt_rdzv_file f, g;
    dt_error_clear();
    if (dt_rdzv_file_parse((const char *)data, size, &f) != DT_OK) {
        if (!dt_last_error()[0] || f.job[0] || f.addr[0] || f.secret[0] || f.port || f.nonce) abort();
        return 0;
    }
    check_word(f.job, DT_AUTH_MAX_JOB);
    check_word(f.addr, sizeof f.addr - 1);
    check_word(f.secret, sizeof f.secret - 1);
    if (f.port < 1 || f.port > 65535) abort();
    char line[DT_RDZV_FILE_MAX];
    int n = snprintf(line, sizeof line, DT_RDZV_FILE_LINE, f.job, f.addr, f.port, f.nonce, f.secret);
    if (n < 0 || (size_t)n >= sizeof line) abort();
    if (dt_rdzv_file_parse(line, (size_t)n, &g) != DT_OK || strcmp(f.job, g.job) || strcmp(f.addr, g.addr) ||
        f.port != g.port || f.nonce != g.nonce || strcmp(f.secret, g.secret))
        abort();
    return 0;
}
