/*
 * args.h: strict command-line value parsing shared by dtrain's programs.
 *
 * Every parser names the flag and the expected form in its error, so a program
 * prints one clear line and exits 2 (DESIGN.md rule 5): "--lr: expected a
 * number, got '0.1x'".
 */
#ifndef DT_ARGS_H
#define DT_ARGS_H

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

#endif /* DT_ARGS_H */
