/*
 * jsonl.c: the strict reader of one JSON object (see jsonl.h). A recursive descent
 * over RFC 8259's grammar: the depth is bounded, every string escape checked (\u
 * escapes and surrogate pairs become UTF-8), numbers must have JSON's form (no
 * "nan", no leading zeros, no "+"). The members of nested objects are flattened
 * into the path of their keys; arrays are checked and kept as text.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "jsonl.h"
#include "sbuf.h"

#define JSONL_MAX_DEPTH 32

typedef struct {
    const char *p;      /* the next character */
    jsonl_obj  *o;
    dt_sbuf     key;    /* the path of the member being read: "mem_bytes.params" */
    dt_sbuf     val;    /* a string's unescaped text */
    int         depth;
} parser;

static int value(parser *ps, int store);

static void ws(parser *ps) {
    while (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r') ps->p++;
}

static int add_member(parser *ps, jsonl_kind kind, const char *v, size_t n) {
    jsonl_obj *o = ps->o;
    if (ps->key.oom) return -1;
    if (o->n == o->cap) {
        size_t nc = o->cap ? 2 * o->cap : 16;
        jsonl_member *nm = realloc(o->m, nc * sizeof *nm);
        if (!nm) return -1;
        o->m = nm;
        o->cap = nc;
    }
    char *k = strdup(ps->key.p ? ps->key.p : ""), *val = malloc(n + 1);
    if (!k || !val) {
        free(k);
        free(val);
        return -1;
    }
    memcpy(val, v, n);
    val[n] = '\0';
    o->m[o->n++] = (jsonl_member){.key = k, .val = val, .kind = kind};
    return 0;
}

/* ---- strings ------------------------------------------------------------------------ */

static int hex4(const char *s, unsigned *u) {
    *u = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        *u = *u * 16 + (unsigned)d;
    }
    return 0;
}

static void put_utf8(dt_sbuf *b, unsigned cp) {
    char u[4];
    size_t n;
    if (cp < 0x80) u[0] = (char)cp, n = 1;
    else if (cp < 0x800) u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 0x3F)), n = 2;
    else if (cp < 0x10000)
        u[0] = (char)(0xE0 | cp >> 12), u[1] = (char)(0x80 | (cp >> 6 & 0x3F)), u[2] = (char)(0x80 | (cp & 0x3F)), n = 3;
    else
        u[0] = (char)(0xF0 | cp >> 18), u[1] = (char)(0x80 | (cp >> 12 & 0x3F)), u[2] = (char)(0x80 | (cp >> 6 & 0x3F)),
        u[3] = (char)(0x80 | (cp & 0x3F)), n = 4;
    dt_sbuf_put_(b, u, n);
}

/* A \uXXXX escape (after the backslash and 'u'), a surrogate pair taken whole. */
static int escape_u(parser *ps, dt_sbuf *b) {
    unsigned cp, lo;
    if (hex4(ps->p, &cp)) return -1;
    ps->p += 4;
    if (cp >= 0xDC00 && cp <= 0xDFFF) return -1;          /* a low surrogate alone */
    if (cp >= 0xD800 && cp <= 0xDBFF) {
        if (ps->p[0] != '\\' || ps->p[1] != 'u' || hex4(ps->p + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF) return -1;
        ps->p += 6;
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    }
    put_utf8(b, cp);
    return 0;
}

/* A string (at its opening quote) into b, unescaped. */
static int string(parser *ps, dt_sbuf *b) {
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    if (*ps->p != '"') return -1;
    ps->p++;
    b->len = 0;
    dt_sbuf_put_(b, "", 0);
    for (;;) {
        unsigned char c = (unsigned char)*ps->p;
        if (c == '"') break;
        if (c < 0x20) return -1;                          /* the end of the line, or a control character */
        if (c != '\\') {
            dt_sbuf_put_(b, ps->p++, 1);
            continue;
        }
        char e = ps->p[1];
        if (!e) return -1;
        ps->p += 2;
        const char *k = strchr(from, e);
        if (k) dt_sbuf_put_(b, &to[k - from], 1);
        else if (e != 'u' || escape_u(ps, b)) return -1;
    }
    ps->p++;
    return b->oom ? -1 : 0;
}

/* ---- numbers, words, arrays, objects ---------------------------------------------- */

static int digits(parser *ps) {
    const char *s = ps->p;
    while (*ps->p >= '0' && *ps->p <= '9') ps->p++;
    return ps->p > s ? 0 : -1;
}

static int number(parser *ps, int store) {
    const char *s = ps->p;
    if (*ps->p == '-') ps->p++;
    if (*ps->p == '0') ps->p++;
    else if (digits(ps)) return -1;
    if (*ps->p == '.') {
        ps->p++;
        if (digits(ps)) return -1;
    }
    if (*ps->p == 'e' || *ps->p == 'E') {
        ps->p++;
        if (*ps->p == '+' || *ps->p == '-') ps->p++;
        if (digits(ps)) return -1;
    }
    return store ? add_member(ps, JSONL_NUM, s, (size_t)(ps->p - s)) : 0;
}

static int word(parser *ps, int store) {
    static const char *const words[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(words[i]);
        if (strncmp(ps->p, words[i], n)) continue;
        ps->p += n;
        return store ? add_member(ps, JSONL_WORD, words[i], n) : 0;
    }
    return -1;
}

/* An array: its elements are checked, not stored; the array is kept as its text. */
static int array(parser *ps, int store) {
    const char *s = ps->p++;
    ws(ps);
    if (*ps->p != ']') {
        for (;;) {
            if (value(ps, 0)) return -1;
            ws(ps);
            if (*ps->p == ']') break;
            if (*ps->p++ != ',') return -1;
        }
    }
    ps->p++;
    return store ? add_member(ps, JSONL_ARRAY, s, (size_t)(ps->p - s)) : 0;
}

/* One member "key": value of an object; the key path grows by key while it is read. */
static int member(parser *ps, int store) {
    size_t keep = ps->key.len;
    ws(ps);
    if (string(ps, &ps->val)) return -1;
    if (store) {
        if (keep) dt_sbuf_put_(&ps->key, ".", 1);
        dt_sbuf_put_(&ps->key, ps->val.p, ps->val.len);
    }
    ws(ps);
    if (*ps->p++ != ':') return -1;
    int rc = value(ps, store);
    ps->key.len = keep;
    if (ps->key.p) ps->key.p[keep] = '\0';
    return rc;
}

static int object(parser *ps, int store) {
    ps->p++;
    ws(ps);
    if (*ps->p == '}') {
        ps->p++;
        return 0;
    }
    for (;;) {
        if (member(ps, store)) return -1;
        ws(ps);
        if (*ps->p == '}') break;
        if (*ps->p++ != ',') return -1;
    }
    ps->p++;
    return 0;
}

static int value(parser *ps, int store) {
    int rc;
    ws(ps);
    if (++ps->depth > JSONL_MAX_DEPTH) return -1;
    char c = *ps->p;
    if (c == '{') rc = object(ps, store);
    else if (c == '[') rc = array(ps, store);
    else if (c == '"') rc = string(ps, &ps->val) || (store && add_member(ps, JSONL_STR, ps->val.p, ps->val.len)) ? -1 : 0;
    else if (c == '-' || (c >= '0' && c <= '9')) rc = number(ps, store);
    else rc = word(ps, store);
    ps->depth--;
    return rc;
}

/* ---- the object --------------------------------------------------------------------- */

int jsonl_parse(const char *line, jsonl_obj *o) {
    parser ps = {.p = line, .o = o};
    memset(o, 0, sizeof *o);
    ws(&ps);
    int rc = *ps.p == '{' ? value(&ps, 1) : -1;
    if (rc == 0) {
        ws(&ps);
        if (*ps.p) rc = -1;   /* something after the object */
    }
    dt_sbuf_free_(&ps.key);
    dt_sbuf_free_(&ps.val);
    if (rc) jsonl_free(o);
    return rc;
}

void jsonl_free(jsonl_obj *o) {
    for (size_t i = 0; i < o->n; i++) {
        free(o->m[i].key);
        free(o->m[i].val);
    }
    free(o->m);
    memset(o, 0, sizeof *o);
}

const jsonl_member *jsonl_get(const jsonl_obj *o, const char *key) {
    for (size_t i = 0; i < o->n; i++)
        if (!strcmp(o->m[i].key, key)) return &o->m[i];
    return NULL;
}

const char *jsonl_str(const jsonl_obj *o, const char *key) {
    const jsonl_member *m = jsonl_get(o, key);
    return m && m->kind == JSONL_STR ? m->val : NULL;
}

int jsonl_num(const jsonl_obj *o, const char *key, double *v) {
    const jsonl_member *m = jsonl_get(o, key);
    if (!m || m->kind != JSONL_NUM) return 0;
    *v = strtod(m->val, NULL);
    return 1;
}
