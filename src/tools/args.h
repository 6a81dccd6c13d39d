/*
 * args.h: strict command-line value parsing shared by dtrain's programs.
 *
 * Every parser names the flag and the expected form in its error, so a program
 * prints one clear line and exits 2 (docs/DESIGN.md rule 5): "--lr: expected a
 * number, got '0.1x'". The library names option fields instead ("lr: expected a
 * positive learning rate"); dt_arg_flag_message turns such a message into one
 * that names the flag.
 */
#ifndef DT_ARGS_H
#define DT_ARGS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "options.h"
#include "status.h"

/* An integer in [lo, hi]; accepts K/M/G suffixes (powers of 1024) when suffix != 0. */
dt_status dt_arg_int(const char *flag, const char *s, int64_t lo, int64_t hi, int suffix, int64_t *out);
/* A finite number in [lo, hi]. */
dt_status dt_arg_double(const char *flag, const char *s, double lo, double hi, double *out);
/* The value of "--flag VALUE" or "--flag=VALUE" at argv[*i]; advances *i past it.
 * Returns 1 when argv[*i] is this flag (then *val is set, or an error when the
 * value is missing), 0 when it is another argument. */
int dt_arg_match(const char *flag, int argc, char **argv, int *i, const char **val, dt_status *err);

/* ---- option rows (options.h) ---------------------------------------------------------- */

/* Set row r's field in base from a flag's value v (NULL for a switch), checked against
 * the row's type and range; the error names the flag. */
dt_status dt_arg_set(const dt_opt_row *r, const char *v, void *base);
/* When argv[*i] is the flag of one of rows[0..n) ("--flag VALUE", "--flag=VALUE" or a
 * switch), set its field in base, advance *i past it and return the row (*err set on a
 * bad value); NULL when it is none of them. */
const dt_opt_row *dt_arg_match_row(const dt_opt_row *rows, int n, int argc, char **argv, int *i, void *base,
                                   dt_status *err);
/* The row whose flag is a (a switch: no value follows it), or NULL. */
const dt_opt_row *dt_arg_find_row(const dt_opt_row *rows, int n, const char *a);
/* --help's lines of row r: "  --flag ARG" and its help, the default in brackets. */
void dt_arg_help_row(FILE *f, const dt_opt_row *r);

/* msg into buf (size n) with the option field it opens with, as "field:" after an
 * optional "rank R: ", replaced by that field's flag from rows[0..nrows): "rank 1:
 * micro_batches: ..." becomes "rank 1: --micro-batches: ...". Any other message is
 * copied as it is. Returns buf. */
const char *dt_arg_flag_message(const dt_opt_row *rows, int nrows, const char *msg, char *buf, size_t n);

#endif /* DT_ARGS_H */
