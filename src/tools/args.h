/*
 * args.h: strict command-line value parsing shared by dtrain's programs.
 *
 * Every parser names the flag and the expected form in its error, so a program
 * prints one clear line and exits 2 (DESIGN.md rule 5): "--lr: expected a
 * number, got '0.1x'". The library names option fields instead ("lr: expected a
 * positive learning rate"); dt_arg_flag_message turns such a message into one
 * that names the flag.
 */
#ifndef DT_ARGS_H
#define DT_ARGS_H

#include <stddef.h>
#include <stdint.h>
#include "status.h"

/* An integer in [lo, hi]; accepts K/M/G suffixes (powers of 1024) when suffix != 0. */
dt_status dt_arg_int(const char *flag, const char *s, int64_t lo, int64_t hi, int suffix, int64_t *out);
/* A finite number in [lo, hi]. */
dt_status dt_arg_double(const char *flag, const char *s, double lo, double hi, double *out);
/* The value of "--flag VALUE" or "--flag=VALUE" at argv[*i]; advances *i past it.
 * Returns 1 when argv[*i] is this flag (then *val is set, or an error when the
 * value is missing), 0 when it is another argument. */
int dt_arg_match(const char *flag, int argc, char **argv, int *i, const char **val, dt_status *err);

/* An option field of a library struct and the flag that sets it. */
typedef struct {
    const char *field;   /* "micro_batches" */
    const char *flag;    /* "--micro-batches" */
} dt_arg_field;

/* msg into buf (size n) with the option field it opens with, as "field:" after an
 * optional "rank R: ", replaced by that field's flag from table (ended by a row of
 * NULLs): "rank 1: micro_batches: ..." becomes "rank 1: --micro-batches: ...".
 * Any other message is copied as it is. Returns buf. */
const char *dt_arg_flag_message(const dt_arg_field *table, const char *msg, char *buf, size_t n);

#endif /* DT_ARGS_H */
