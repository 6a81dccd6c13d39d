/*
 * jsonl.h: a strict reader of one JSON object, the unit of a JSON-lines file (the
 * metrics that `dtrain train --metrics` appends). `dtrain report` reads every event
 * of such a file and must tell a line that is JSON from one that is not (a line cut
 * short by a crash, text another program wrote into the file), which the textual
 * field search of tool_util.c cannot; this reader checks the whole grammar (RFC 8259).
 *
 * The object is flattened: a nested object's members are named by their path,
 * "mem_bytes.params"; an array is kept as its JSON text. Every value is held as text:
 * a string unescaped (UTF-8), a number as printed, true, false and null as words.
 */
#ifndef DT_JSONL_H
#define DT_JSONL_H

#include <stddef.h>

typedef enum { JSONL_STR, JSONL_NUM, JSONL_WORD, JSONL_ARRAY } jsonl_kind;

typedef struct {
    char      *key;    /* "step", "mem_bytes.params" */
    char      *val;    /* the value as text (see above) */
    jsonl_kind kind;
} jsonl_member;

typedef struct {
    jsonl_member *m;   /* n members in the order of the line */
    size_t        n, cap;
} jsonl_obj;

/* Parse line (one JSON object, then only white space) into o, which must be empty
 * (zeroed) or freed. Returns 0 when it is one, -1 when it is not JSON, nests deeper
 * than 32 levels or memory runs out (o is then empty). */
int         jsonl_parse(const char *line, jsonl_obj *o);
/* Release o's members; o becomes empty. */
void        jsonl_free(jsonl_obj *o);
/* The member key, or NULL (the first when a key repeats). */
const jsonl_member *jsonl_get(const jsonl_obj *o, const char *key);
/* The string value of key, or NULL when absent or not a string. */
const char *jsonl_str(const jsonl_obj *o, const char *key);
/* 1 and *v when key is a number, else 0. The text of the number is jsonl_get's val. */
int         jsonl_num(const jsonl_obj *o, const char *key, double *v);

#endif /* DT_JSONL_H */
