/*
 * rdzv_file.h: the file of a file:// rendezvous (tcp.c). Rank 0 writes one line,
 *
 *   dtrain-store 2 JOB ADDR PORT NONCE SECRET
 *
 * its job id ("-" when there is none), the address and port its store listens on, a
 * nonce in hex that the store also holds (a stale file or a reused port is told
 * apart by it) and the job secret rank 0 made for the ranks that have none ("-" when
 * it made none). The other ranks read it with dt_rdzv_file_parse, a pure function of
 * the text (fuzzed by tests/fuzz/fuzz_rdzv_file.c); what they do with the fields
 * (waiting, comparing the job, connecting) stays in tcp.c. Not installed.
 */
#ifndef DT_RDZV_FILE_H
#define DT_RDZV_FILE_H

#include <stddef.h>

#include "auth.h"
#include "status.h"

#define DT_RDZV_FILE_VERSION 2
/* printf format of the line: job, addr, port, nonce, secret */
#define DT_RDZV_FILE_LINE    "dtrain-store 2 %s %s %d %llx %s\n"
/* the most a rendezvous file holds (its line is at most about 320 bytes) */
#define DT_RDZV_FILE_MAX     1024

typedef struct {
    char               job[DT_AUTH_MAX_JOB + 1];   /* "-": the job has no id */
    char               addr[64];
    int                port;                       /* 1..65535 */
    unsigned long long nonce;
    char               secret[80];                 /* "-": rank 0 made none */
} dt_rdzv_file;

/* The fields of a rendezvous file's text (n bytes, no terminating zero needed): the
 * words "dtrain-store" and the version, then the five fields, separated by white
 * space, white space only after them. DT_ERR_FORMAT naming the first field that is
 * wrong: another version, a field missing, too long or holding a zero byte, a port
 * outside 1..65535, a nonce that is not 1 to 16 hex digits, anything after the secret.
 * *out is zeroed on an error. */
dt_status dt_rdzv_file_parse(const char *text, size_t n, dt_rdzv_file *out);

#endif /* DT_RDZV_FILE_H */
