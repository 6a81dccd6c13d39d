/*
 * options.h: the train options (dt_train_opts, train.h) as one table of rows.
 *
 * A row says everything about one option: the C field and the flag that sets it,
 * its type and default, the range a flag's value must fall in, its help, and where
 * it matters beyond training (a checkpoint records it and a resume must match it;
 * `dtrain plan` takes it; `dtrain check` sets it itself). From the rows come the
 * defaults (dt_train_opts_default), the `dtrain train` parser and --help, the map
 * that turns a library message naming a field into one naming the flag, the
 * switches `dtrain check` knows, the checkpoint's recorded settings and the
 * resume's comparison of them. Adding a flag is one row plus the code that uses
 * the field; tests/test_options.c walks every row.
 *
 * The programs add rows of their own (--threads, --save, ...) with the same type
 * over their own struct; the library knows nothing of those.
 */
#ifndef DT_OPTIONS_H
#define DT_OPTIONS_H

#include <stddef.h>
#include "dt_api.h"

typedef enum {
    DT_OPT_STR,    /* const char *: the text as given (checked where it is used) */
    DT_OPT_INT,    /* int */
    DT_OPT_I64,    /* int64_t */
    DT_OPT_U64,    /* uint64_t */
    DT_OPT_SIZE,   /* size_t, bytes: a count with an optional K, M or G (powers of 1024) */
    DT_OPT_F64,    /* double */
    DT_OPT_PAIR,   /* two doubles "A,B": the field at off and the one at off2 */
    DT_OPT_ON,     /* int, a switch: the flag sets it to 1 */
    DT_OPT_OFF,    /* int, a switch: the flag sets it to 0 ("--no-eval") */
} dt_opt_type;

/* where a row matters (dt_opt_row.where) */
enum {
    DT_OPT_RECORD   = 1u << 0,  /* a checkpoint records it as text; a resume must match it */
    DT_OPT_PLAN     = 1u << 1,  /* `dtrain plan` takes the flag */
    DT_OPT_CHECK    = 1u << 2,  /* `dtrain check` sets it itself (or both its runs start fresh): a
                                 * user's value is dropped */
    DT_OPT_PER_WORLD = 1u << 3, /* any value but the default makes the computation depend on the
                                 * world size: `dtrain check` refuses it */
    DT_OPT_HIDDEN   = 1u << 4,  /* not in --help */
    DT_OPT_LAYOUT   = 1u << 5,  /* where the work runs, not what it computes (--pipeline): `dtrain
                                 * check` gives it to the N-process run only */
};

/* the groups of --help, in order */
typedef enum {
    DT_OPT_SEC_MODEL, DT_OPT_SEC_SCHEDULE, DT_OPT_SEC_OPTIM, DT_OPT_SEC_RUN, DT_OPT_SEC_CKPT, DT_OPT_SEC_DIST,
    DT_OPT_NSEC
} dt_opt_section;

typedef struct {
    const char *field;    /* "micro_batches": the C field, and the name library errors open with */
    const char *field2;   /* DT_OPT_PAIR: the second field's name ("beta2") */
    const char *flag;     /* "--micro-batches" */
    const char *arg;      /* the value's placeholder in --help ("S"); NULL for a switch */
    dt_opt_type type;
    size_t      off, off2;  /* the field's offset in the options struct (off2: DT_OPT_PAIR's second) */
    const char *def;      /* the default as text ("0.05"); NULL: a NULL pointer or zero */
    double      lo, hi;   /* a number's range as a flag's value */
    unsigned    where;    /* DT_OPT_RECORD, ... */
    dt_opt_section sec;
    const char *help;     /* --help's text: lines separated by '\n', the default appended */
    const char *shown;    /* the default as --help shows it when def would mislead ("" : none) */
    const char *example;  /* another valid value (tests/test_options.c sets it, records it, and
                           * resumes with the default) */
} dt_opt_row;

/* The rows of dt_train_opts (*n receives their count), in --help's order. */
DT_API const dt_opt_row *dt_train_options(int *n);
/* The row of a field ("max_steps") or of a flag ("--steps"); NULL when there is none. */
DT_API const dt_opt_row *dt_train_option_field(const char *field);
DT_API const dt_opt_row *dt_train_option_flag(const char *flag);
/* A section's heading in --help ("Optimizer") and the lines that follow it ("" : none). */
DT_API const char       *dt_opt_section_name (dt_opt_section sec);
DT_API const char       *dt_opt_section_intro(dt_opt_section sec);

/* The default of one row written into base (a struct the row describes). */
DT_API void dt_opt_set_default(const dt_opt_row *r, void *base);
/* The value of one row in base as text, as a checkpoint records it: numbers "%.9g" or
 * "%lld" in buf, a switch "0" or "1"; returns buf, or for a text row the option's own
 * string ("" for NULL). */
DT_API const char *dt_opt_text(const dt_opt_row *r, const void *base, char *buf, size_t n);

#endif /* DT_OPTIONS_H */
