/*
 * spec.c: the model spec language: parsing, presets, shape inference and the
 * summary table (the host-only half of model.h; model.c holds the runtime).
 *
 * Grammar: a layer list separated by whitespace; a layer is NAME or
 * NAME(arg, ...) where args are positional numbers first, then key=value, as
 * the kind's row lists them; a container is seq(list) or residual(list). An
 * element may be labelled, label:element, to get PyTorch's attribute name
 * instead of its position ("_:" adds no name: the container's layers are named
 * as its parent's attributes).
 * Spaces inside parentheses are allowed. Every error names the layer by its
 * module path ("3.1") and text and says what was expected, in one line.
 */
#include "model.h"
#include "fileio.h"
#include "layers.h"
#include "sbuf.h"

#include <ctype.h>
#include <math.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define SPEC_FILE_MAX (1 << 20)

/* ---- presets ------------------------------------------------------------- */

static const struct { const char *name, *text; } presets[] = {
    { "mlp", "flatten linear(1024) relu linear(1024) relu linear(10)" },
    { "cnn", "conv(32,3,pad=1) bn relu maxpool(2) conv(64,3,pad=1) bn relu maxpool(2) "
             "flatten linear(128) relu linear(10)" },
    /* a small residual CNN for 28x28 inputs: a stem, a block at 32 channels on
     * 14x14, a strided downsample, a block at 64 channels on 7x7, then global
     * average pooling (README: the equivalent PyTorch module) */
    { "resnet", "conv(32,3,pad=1,bias=0) bn relu maxpool(2) "
                "residual(conv(32,3,pad=1,bias=0) bn relu conv(32,3,pad=1,bias=0) bn) relu "
                "conv(64,3,stride=2,pad=1,bias=0) bn relu "
                "residual(conv(64,3,pad=1,bias=0) bn relu conv(64,3,pad=1,bias=0) bn) relu "
                "gap linear(10)" },
};

/* ---- the GPT presets ----------------------------------------------------------
 * gpt(layers=L, heads=H, dim=C, block=T, vocab=V, dropout=p) is nanoGPT's model with
 * PyTorch's names (transformer.wte, transformer.h.<i>.attn.c_attn, ..., lm_head tied
 * to wte) and GPT-2's initialisation (normal(0, 0.02), residual projections
 * 0.02/sqrt(2L), biases zero); gpt2 is the 124M GPT-2 with llm.c's padded vocabulary.
 * Dropout p > 0 adds nanoGPT's embedding and residual dropout (attention weights are
 * not dropped). */

static char *trim(char *s);

/* One key=value argument of a preset: integer in [lo, hi], a probability in [lo, 1), or
 * a number in [lo, hi]. */
enum { ARG_INT, ARG_PROB, ARG_NUM };
typedef struct { const char *name; double *v; double lo, hi; int kind; } gpt_arg;

/* "a, b, c" (sep ", ") or "a, b or c" into buf */
static void arg_names(const gpt_arg *a, size_t n, int with_or, char *buf, size_t cap) {
    size_t off = 0;
    buf[0] = '\0';
    for (size_t k = 0; k < n && off < cap; k++)
        off += (size_t)snprintf(buf + off, cap - off, "%s%s", k == 0 ? "" : with_or && k == n - 1 ? " or " : ", ",
                                a[k].name);
}

/* Read "key=value, ..." (rest, its closing parenthesis included; "" for none) of preset
 * spec into args. The arguments are read as long as they are (a fixed buffer would cut
 * "vocab=2560" short), and a number must be finite before any comparison or conversion
 * (strtod reads "nan" and "inf"; NaN passes every range test, and converting it to an
 * integer is undefined). */
static dt_status preset_args(const char *spec, const char *rest, gpt_arg *args, size_t nargs) {
    char list[160];
    char *buf = strdup(rest);
    if (!buf) return dt_error(DT_ERR_NOMEM, "model spec: out of memory");
    if (*buf) buf[strlen(buf) - 1] = '\0';   /* the closing parenthesis */
    dt_status st = DT_OK;
    for (char *a = *buf ? buf : NULL, *next; a && st == DT_OK; a = next) {
        next = strchr(a, ',');
        if (next) *next++ = '\0';
        char *eq = strchr(a, '=');
        if (!eq) {
            arg_names(args, nargs, 0, list, sizeof list);
            st = dt_error(DT_ERR_INVALID, "model spec: %s: expected key=value arguments (%s), got '%s'", spec, list,
                          trim(a));
            break;
        }
        *eq = '\0';
        char *key = trim(a), *val = trim(eq + 1), *end;
        size_t k = 0;
        while (k < nargs && strcmp(args[k].name, key)) k++;
        if (k == nargs) {
            arg_names(args, nargs, 1, list, sizeof list);
            st = dt_error(DT_ERR_INVALID, "model spec: %s: unknown argument '%s' (expected %s)", spec, key, list);
            break;
        }
        errno = 0;
        double v = strtod(val, &end);
        if (end == val || *end || errno || !isfinite(v) || v < args[k].lo || v > args[k].hi ||
            (args[k].kind == ARG_INT && v != floor(v)) || (args[k].kind == ARG_PROB && v >= 1)) {
            if (args[k].kind == ARG_INT)
                st = dt_error(DT_ERR_INVALID, "model spec: %s: '%s' expects a whole number from %.0f to %.0f, got "
                              "'%s'", spec, key, args[k].lo, args[k].hi, val);
            else if (args[k].kind == ARG_PROB)
                st = dt_error(DT_ERR_INVALID, "model spec: %s: '%s' expects a probability in [0, 1), got '%s'", spec,
                              key, val);
            else
                st = dt_error(DT_ERR_INVALID, "model spec: %s: '%s' expects a number in [%g, %g], got '%s'", spec, key,
                              args[k].lo, args[k].hi, val);
            break;
        }
        *args[k].v = v;
    }
    free(buf);
    return st;
}

/* 1 when spec names a GPT preset (*text then holds its layer list, or NULL after an
 * error in *st); 0 when it does not. */
static int gpt_preset(const char *spec, char **text, dt_status *st) {
    double L = 4, H = 4, C = 128, T = 64, V = 256, p = 0;
    *text = NULL;
    *st = DT_OK;
    const char *rest;
    if (!strcmp(spec, "gpt2")) { L = 12; H = 12; C = 768; T = 1024; V = 50304; rest = ""; }
    else if (!strcmp(spec, "gpt")) rest = "";
    else if (!strncmp(spec, "gpt(", 4) && spec[strlen(spec) - 1] == ')') rest = spec + 4;
    else return 0;
    gpt_arg args[] = { { "layers", &L, 1, 1000, ARG_INT }, { "heads", &H, 1, 1024, ARG_INT },
                       { "dim", &C, 1, 1 << 20, ARG_INT }, { "block", &T, 1, 1 << 24, ARG_INT },
                       { "vocab", &V, 1, 1 << 24, ARG_INT }, { "dropout", &p, 0, 1, ARG_PROB } };
    if ((*st = preset_args(spec, rest, args, sizeof args / sizeof args[0])) != DT_OK) return 1;
    if ((long long)C % (long long)H) {
        *st = dt_error(DT_ERR_INVALID, "model spec: %s: %g heads do not divide the width %g", spec, H, C);
        return 1;
    }
    /* dropout as the user gave it: %.17g gives the double back exactly */
    char drop[48] = "";
    if (p > 0) snprintf(drop, sizeof drop, " dropout(%.17g)", p);
    double proj = 0.02 / sqrt(2.0 * L);
    dt_sbuf out = { 0 };
    dt_sbuf_printf_(&out, "transformer:seq(wte:embed(%.0f,%.0f,std=0.02) wpe:pos(%.0f,std=0.02)%s h:seq(", V, C, T,
                    drop);
    for (int i = 0; i < (int)L; i++)
        dt_sbuf_printf_(&out, "%s%d:seq(_:residual(ln_1:ln attn:attn(%.0f,std=0.02,proj_std=%.9g)%s) "
                        "_:residual(ln_2:ln mlp:seq(c_fc:linear(%.0f,std=0.02) gelu c_proj:linear(%.0f,std=%.9g))%s))",
                        i ? " " : "", i, H, proj, drop, 4 * C, C, proj, drop);
    dt_sbuf_str_(&out, ") ln_f:ln) lm_head:unembed");
    if (out.oom) {
        dt_sbuf_free_(&out);
        *st = dt_error(DT_ERR_NOMEM, "model spec: out of memory");
        return 1;
    }
    *text = out.p;
    return 1;
}

/* ---- the Llama presets -----------------------------------------------------------
 * llama(layers=L, heads=H, kv_heads=K, dim=C, hidden=F, block=T, vocab=V, theta, eps) is
 * Hugging Face's LlamaForCausalLM with its names (model.embed_tokens, model.layers.<i>.
 * input_layernorm, .self_attn.{q,k,v,o}_proj, .post_attention_layernorm,
 * .mlp.{gate,up,down}_proj, model.norm, an untied lm_head): RMSNorm, rotary positions
 * (base theta) in grouped-query attention with K key/value heads, a SwiGLU MLP of F
 * hidden units, no biases, every matrix normal(0, 0.02). tie=1 ties the head to the
 * embedding (tie_word_embeddings: the file may hold lm_head.weight or leave it out);
 * dropout=P adds nanoGPT's dropout after the embedding and after each attention and MLP
 * (Hugging Face's Llama has none; 0, the default, is its model). The named shapes are
 * for planning: smollm-135m (SmolLM-135M's shape) and llama-1b (Llama 3.2 1B's), both at
 * block 2048 and with their tied heads, as published. */

static const struct { const char *name; double L, H, K, C, F, T, V, theta; } llama_shapes[] = {
    { "smollm-135m", 30, 9, 3, 576, 1536, 2048, 49152, 10000 },
    { "llama-1b", 16, 32, 8, 2048, 8192, 2048, 128256, 500000 },
};

static int llama_preset(const char *spec, char **text, dt_status *st) {
    double L = 4, H = 4, K = 2, C = 128, F = 352, T = 64, V = 256, theta = 10000, eps = 1e-5, tie = 0, p = 0;
    *text = NULL;
    *st = DT_OK;
    const char *rest = NULL;
    for (size_t i = 0; i < sizeof llama_shapes / sizeof llama_shapes[0]; i++)
        if (!strcmp(spec, llama_shapes[i].name)) {
            L = llama_shapes[i].L; H = llama_shapes[i].H; K = llama_shapes[i].K; C = llama_shapes[i].C;
            F = llama_shapes[i].F; T = llama_shapes[i].T; V = llama_shapes[i].V; theta = llama_shapes[i].theta;
            tie = 1;
            rest = "";
        }
    if (rest) {}
    else if (!strcmp(spec, "llama")) rest = "";
    else if (!strncmp(spec, "llama(", 6) && spec[strlen(spec) - 1] == ')') rest = spec + 6;
    else return 0;
    gpt_arg args[] = { { "layers", &L, 1, 1000, ARG_INT }, { "heads", &H, 1, 1024, ARG_INT },
                       { "kv_heads", &K, 1, 1024, ARG_INT }, { "dim", &C, 1, 1 << 20, ARG_INT },
                       { "hidden", &F, 1, 1 << 24, ARG_INT }, { "block", &T, 1, 1 << 24, ARG_INT },
                       { "vocab", &V, 1, 1 << 24, ARG_INT }, { "theta", &theta, 2, 1e12, ARG_NUM },
                       { "eps", &eps, 0, 1, ARG_NUM }, { "tie", &tie, 0, 1, ARG_INT },
                       { "dropout", &p, 0, 1, ARG_PROB } };
    if ((*st = preset_args(spec, rest, args, sizeof args / sizeof args[0])) != DT_OK) return 1;
    long long h = (long long)H, k = (long long)K, c = (long long)C;
    if (c % h)
        *st = dt_error(DT_ERR_INVALID, "model spec: %s: 'heads' %lld does not divide 'dim' %lld", spec, h, c);
    else if (h % k)
        *st = dt_error(DT_ERR_INVALID, "model spec: %s: 'kv_heads' %lld does not divide 'heads' %lld", spec, k, h);
    else if ((c / h) % 2)
        *st = dt_error(DT_ERR_INVALID, "model spec: %s: rotary positions pair the dimensions of a head, but the head "
                       "width 'dim' / 'heads' = %lld / %lld = %lld is odd", spec, c, h, c / h);
    if (*st != DT_OK) return 1;
    char drop[48] = "";   /* as the user gave it: %.17g gives the double back exactly */
    if (p > 0) snprintf(drop, sizeof drop, " dropout(%.17g)", p);
    dt_sbuf out = { 0 };
    dt_sbuf_printf_(&out, "model:seq(embed_tokens:embed(%.0f,%.0f,std=0.02)%s layers:seq(", V, C, drop);
    for (int i = 0; i < (int)L; i++)
        dt_sbuf_printf_(&out, "%s%d:seq(_:residual(input_layernorm:rmsnorm(eps=%.9g) self_attn:attn(%.0f,std=0.02,"
                        "proj_std=0.02,kv_heads=%.0f,rope=%.9g,bias=0,block=%.0f)%s) "
                        "_:residual(post_attention_layernorm:rmsnorm(eps=%.9g) mlp:swiglu(%.0f,std=0.02)%s))",
                        i ? " " : "", i, eps, H, K, theta, T, drop, eps, F, drop);
    if (tie) dt_sbuf_printf_(&out, ") norm:rmsnorm(eps=%.9g)) lm_head:unembed", eps);
    else dt_sbuf_printf_(&out, ") norm:rmsnorm(eps=%.9g)) lm_head:linear(%.0f,bias=0,std=0.02)", eps, V);
    if (out.oom) {
        dt_sbuf_free_(&out);
        *st = dt_error(DT_ERR_NOMEM, "model spec: out of memory");
        return 1;
    }
    *text = out.p;
    return 1;
}

const char *dt_spec_preset(const char *name) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(name, presets[i].name) == 0) return presets[i].text;
    return NULL;
}

/* ---- parsing ------------------------------------------------------------- */

#define MAX_DEPTH DT_LAYER_MAX_DEPTH

/* Parse an integer argument; returns 0 on success. */
static int parse_int(const char *s, int *v) {
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (end == s || *end != '\0' || errno || x < -1000000000L || x > 1000000000L) return -1;
    *v = (int)x;
    return 0;
}

static int parse_bool(const char *s, int *v) {
    if (!strcmp(s, "1") || !strcmp(s, "true") || !strcmp(s, "True")) { *v = 1; return 0; }
    if (!strcmp(s, "0") || !strcmp(s, "false") || !strcmp(s, "False")) { *v = 0; return 0; }
    return -1;
}

static int parse_float(const char *s, float *v) {
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    if (end == s || *end != '\0' || errno) return -1;
    *v = (float)x;
    return 0;
}

/* Trim spaces in place. */
static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
    return s;
}

static dt_status spec_error(const dt_layer *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static dt_status spec_error(const dt_layer *L, const char *fmt, ...) {
    /* sized to the message: it quotes the user's text */
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *what = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!what) return dt_error(DT_ERR_NOMEM, "model spec: layer %s '%s': out of memory for a message", L->name, L->text);
    va_start(ap, fmt);
    vsnprintf(what, (size_t)n + 1, fmt, ap);
    va_end(ap);
    dt_status s = dt_error(DT_ERR_INVALID, "model spec: layer %s '%s': %s", L->name, L->text, what);
    free(what);
    return s;
}

/* Store one argument value (text val) into the layer's own struct per its schema entry. */
static dt_status arg_store(dt_layer *L, const dt_arg_def *a, const char *val) {
    char *field = (char *)L->self + a->offset;
    double v;
    int iv = 0;
    float fv = 0.0f;
    if (a->type == DT_ARG_FLOAT) {
        if (parse_float(val, &fv)) return spec_error(L, "%s, got '%s'", a->expect, val);
        v = fv;
    } else {
        if ((a->type == DT_ARG_BOOL ? parse_bool(val, &iv) : parse_int(val, &iv)))
            return spec_error(L, "%s, got '%s'", a->expect, val);
        v = iv;
    }
    if (!(v >= a->lo && (a->hi_open ? v < a->hi : v <= a->hi)))
        return spec_error(L, "%s, got '%s'", a->expect, val);
    if (a->type == DT_ARG_FLOAT) memcpy(field, &fv, sizeof fv);
    else memcpy(field, &iv, sizeof iv);
    return DT_OK;
}

/* Fill a layer's own struct from the text between the parentheses (args NULL
 * for a bare name), reading the row's argument schema. */
static dt_status layer_args(dt_layer *L, char *args) {
    const dt_layer_def *d = L->def;
    const dt_arg_def *schema = d->args;
    int nargs = 0;
    while (schema && schema[nargs].name) nargs++;
    for (int i = 0; i < nargs; i++) {           /* defaults */
        char *field = (char *)L->self + schema[i].offset;
        if (schema[i].type == DT_ARG_FLOAT) { float f = (float)schema[i].def; memcpy(field, &f, sizeof f); }
        else { int v = (int)schema[i].def; memcpy(field, &v, sizeof v); }
    }
    int seen[16] = { 0 }, npos = 0, nkw = 0;
    if (args && *trim(args) == '\0') {
        if (nargs == 0) args = NULL;
        else return spec_error(L, "empty argument list; expected %s", d->help);
    }
    for (char *a = args, *next; a; a = next) {
        next = strchr(a, ',');
        if (next) *next++ = '\0';
        a = trim(a);
        if (*a == '\0') return spec_error(L, "empty argument");
        char *eq = strchr(a, '=');
        char *val;
        int slot = -1;
        if (eq) {
            *eq = '\0';
            char *key = trim(a);
            val = trim(eq + 1);
            for (int i = 0; i < nargs; i++)
                if (!strcmp(schema[i].name, key)) slot = i;
            if (slot < 0) {
                if (nargs == 0) return spec_error(L, "%s takes no arguments, got '%s'", d->name, key);
                char known[96] = "";
                for (int i = 0; i < nargs; i++) {
                    strncat(known, i ? ", " : "", sizeof known - strlen(known) - 1);
                    strncat(known, schema[i].name, sizeof known - strlen(known) - 1);
                }
                return spec_error(L, "unknown argument '%s' (expected one of: %s)", key, known);
            }
            nkw++;
        } else {
            if (nkw) return spec_error(L, "positional argument '%s' after key=value arguments", a);
            if (npos == nargs) return spec_error(L, "too many arguments (%s takes %d)", d->name, nargs);
            slot = npos++;
            val = a;
        }
        if (seen[slot]) return spec_error(L, "argument '%s' given twice", schema[slot].name);
        seen[slot] = 1;
        DT_TRY(arg_store(L, &schema[slot], val));
    }
    for (int i = 0; i < nargs && schema[i].required; i++)
        if (!seen[i]) return spec_error(L, "missing argument '%s'", schema[i].name);
    return d->check ? d->check(L) : DT_OK;
}

/* Keep the layer's text for messages and the summary; a text longer than the field
 * keeps its start and ends in "...", so a message never shows a cut text as whole. */
static void set_text(dt_layer *L, const char *src, size_t len) {
    if (len >= sizeof L->text) {
        memcpy(L->text, src, sizeof L->text - 4);
        memcpy(L->text + sizeof L->text - 4, "...", 4);
        return;
    }
    memcpy(L->text, src, len);
    L->text[len] = '\0';
}

/* The flat layer list being built, in execution order. */
typedef struct {
    dt_layer *v;
    int       n, cap;
    int      *partner;      /* index of the other end of a residual block, else -1 */
} layer_vec;

static dt_status vec_push(layer_vec *lv, const dt_layer_def *def, int kind, const char *name, int depth,
                          dt_layer **out) {
    if (lv->n == lv->cap) {
        int cap = lv->cap ? 2 * lv->cap : 16;
        dt_layer *nv = realloc(lv->v, (size_t)cap * sizeof *nv);
        if (nv) lv->v = nv;
        int *np = realloc(lv->partner, (size_t)cap * sizeof *np);
        if (np) lv->partner = np;
        if (!nv || !np) return dt_error(DT_ERR_NOMEM, "model spec: out of memory");
        lv->cap = cap;
    }
    dt_layer *L = &lv->v[lv->n];
    memset(L, 0, sizeof *L);
    lv->partner[lv->n] = -1;
    L->def = def;
    L->kind = (dt_layer_kind)kind;
    L->index = lv->n++;
    L->depth = depth;
    snprintf(L->name, sizeof L->name, "%s", name);
    if (def->self_size && !(L->self = calloc(1, def->self_size)))
        return dt_error(DT_ERR_NOMEM, "model spec: out of memory");
    *out = L;
    return DT_OK;
}

static dt_status parse_list(layer_vec *lv, char *text, const char *prefix, int depth, const char *where);

/* Parse one token "name", "name(args)" or "container(layers...)" at module path `name`. */
static dt_status parse_token(layer_vec *lv, char *tok, const char *name, int depth) {
    size_t len = strlen(tok);
    dt_layer tmp;   /* for messages before the layer exists */
    memset(&tmp, 0, sizeof tmp);
    snprintf(tmp.name, sizeof tmp.name, "%s", name);
    set_text(&tmp, tok, len);
    char *paren = strchr(tok, '(');
    char *args = NULL;
    if (paren) {
        if (tok[len - 1] != ')') return spec_error(&tmp, "expected ')' at the end");
        *paren = '\0';
        tok[len - 1] = '\0';
        args = paren + 1;
    }
    for (char *c = tok; *c; c++) *c = (char)tolower((unsigned char)*c);
    if (!strcmp(tok, "seq")) {    /* a nested nn.Sequential: names only, no layer of its own */
        if (depth >= MAX_DEPTH) return spec_error(&tmp, "containers nested deeper than %d", MAX_DEPTH);
        return parse_list(lv, args ? args : (char *)"", name, depth + 1, tmp.text);
    }
    int kind = dt_layer_kind_find(tok);
    if (kind < 0)
        return spec_error(&tmp, "unknown layer '%s' (expected %s or seq)", tok, dt_layer_kind_list());
    const dt_layer_def *def = dt_layer_def_of((dt_layer_kind)kind);
    dt_layer *L;
    DT_TRY(vec_push(lv, def, kind, name, depth, &L));
    set_text(L, tmp.text, strlen(tmp.text));
    if (!(def->flags & DT_LDEF_CONTAINER)) return layer_args(L, args);
    /* a container row opens a block; its closer row ends it */
    if (depth >= MAX_DEPTH) return spec_error(&tmp, "containers nested deeper than %d", MAX_DEPTH);
    int open = L->index;
    DT_TRY(parse_list(lv, args ? args : (char *)"", name, depth + 1, tmp.text));
    int close_kind = -1;
    for (int k = 0; k < DT_LAYER_NKINDS; k++)
        if (dt_layer_def_of((dt_layer_kind)k) == def->closer) close_kind = k;
    if (close_kind < 0) return dt_error(DT_ERR_INTERNAL, "layer row '%s' has no closer", def->name);
    DT_TRY(vec_push(lv, def->closer, close_kind, name, depth, &L));
    set_text(L, tmp.text, strlen(tmp.text));
    lv->partner[open] = L->index;
    lv->partner[L->index] = open;
    return DT_OK;
}

/* Parse a whitespace-separated layer list; element i is named "<prefix>.<i>"
 * (just "<i>" at the top). where: the container's text for messages. */
static dt_status parse_list(layer_vec *lv, char *text, const char *prefix, int depth, const char *where) {
    int pos = 0;
    char *p = text;
    for (;;) {
        while (isspace((unsigned char)*p)) p++;
        if (!*p) break;
        char *start = p;
        int depth_p = 0;
        while (*p && (depth_p > 0 || !isspace((unsigned char)*p))) {
            if (*p == '(') depth_p++;
            else if (*p == ')' && --depth_p < 0) break;
            p++;
        }
        /* "label:element" names the element as PyTorch names a module attribute
         * ("ln_1:ln" is <prefix>.ln_1); the label "_" adds no name at all (a block whose
         * layers are named as the container's own attributes). Else it is its position. */
        char name[sizeof ((dt_layer *)0)->name], label[40] = "";
        char *q = start;
        while (isalnum((unsigned char)*q) || *q == '_') q++;
        if (*q == ':' && q > start && q < p) {
            if ((size_t)(q - start) >= sizeof label) {
                dt_layer tmp;
                memset(&tmp, 0, sizeof tmp);
                snprintf(tmp.name, sizeof tmp.name, "%s", prefix);
                set_text(&tmp, start, (size_t)(p - start));
                return spec_error(&tmp, "a label longer than %zu characters", sizeof label - 1);
            }
            memcpy(label, start, (size_t)(q - start));
            label[q - start] = '\0';
            start = q + 1;
        }
        const char *comp = label[0] ? label : NULL;
        char num[16];
        snprintf(num, sizeof num, "%d", pos);
        if (!comp) comp = num;
        /* the module path names the layer's tensors: refuse one that does not fit, never cut it */
        int k;
        if (strcmp(comp, "_") == 0) k = snprintf(name, sizeof name, "%s", prefix);
        else if (prefix[0]) k = snprintf(name, sizeof name, "%s.%s", prefix, comp);
        else k = snprintf(name, sizeof name, "%s", comp);
        if (k < 0 || (size_t)k >= sizeof name) {
            dt_layer tmp;
            memset(&tmp, 0, sizeof tmp);
            snprintf(tmp.name, sizeof tmp.name, "%s", prefix[0] ? prefix : "(top)");
            set_text(&tmp, start, (size_t)(p - start));
            return spec_error(&tmp, "its module path %s%s%s is longer than %zu characters", prefix,
                              prefix[0] ? "." : "", comp, sizeof name - 1);
        }
        int end_of_text = (*p == '\0');
        char saved = *p;
        *p = '\0';
        if (depth_p != 0) {
            dt_layer tmp;
            memset(&tmp, 0, sizeof tmp);
            snprintf(tmp.name, sizeof tmp.name, "%s", name);
            set_text(&tmp, start, strlen(start));
            return spec_error(&tmp, "unbalanced parentheses");
        }
        DT_TRY(parse_token(lv, start, name, depth));
        pos++;
        if (end_of_text) break;
        *p = saved;
        p++;
    }
    if (pos == 0) {
        if (depth == 0) return dt_error(DT_ERR_INVALID, "model spec: no layers in '%s'", where);
        return dt_error(DT_ERR_INVALID, "model spec: layer %s '%s': empty layer list", prefix, where);
    }
    return DT_OK;
}

/* Read a spec file: lines, '#' starts a comment. Returns malloc'ed text. */
static dt_status read_spec_file(const char *path, char **text) {
    /* a spec file that cannot be opened (missing, or not a regular file) is a bad
     * --model (input), not a failing device */
    FILE *f;
    if (dt_file_fopen_read(path, &f) != DT_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", dt_last_error());   /* dt_error rewrites that buffer */
        return dt_error(DT_ERR_INVALID, "model spec file %s", why);
    }
    char *buf = malloc(SPEC_FILE_MAX + 1);
    if (!buf) { fclose(f); return dt_error(DT_ERR_NOMEM, "model spec file %s: out of memory", path); }
    size_t n = fread(buf, 1, SPEC_FILE_MAX + 1, f);
    int err = ferror(f);
    fclose(f);
    if (err) { free(buf); return dt_error(DT_ERR_IO, "model spec file %s: read failed", path); }
    if (n > SPEC_FILE_MAX) {
        free(buf);
        return dt_error(DT_ERR_INVALID, "model spec file %s: larger than %d bytes", path, SPEC_FILE_MAX);
    }
    buf[n] = '\0';
    *text = buf;
    return DT_OK;
}

dt_status dt_spec_parse(const char *spec, dt_spec *out) {
    memset(out, 0, sizeof *out);
    if (!spec) return dt_error(DT_ERR_INVALID, "model spec: empty");
    const char *text = spec;
    char *owned = NULL;
    const char *preset = dt_spec_preset(spec);
    struct stat st;
    dt_status gs;
    if (preset) {
        text = preset;
    } else if (gpt_preset(spec, &owned, &gs)) {
        if (gs != DT_OK) return gs;
        text = owned;
    } else if (llama_preset(spec, &owned, &gs)) {
        if (gs != DT_OK) return gs;
        text = owned;
    } else if (spec[0] == '@') {
        DT_TRY(read_spec_file(spec + 1, &owned));
        text = owned;
    } else if (!strpbrk(spec, " \t\n(") && stat(spec, &st) == 0 && S_ISREG(st.st_mode)) {
        DT_TRY(read_spec_file(spec, &owned));
        text = owned;
    }
    if (!owned && !(owned = strdup(text))) return dt_error(DT_ERR_NOMEM, "model spec: out of memory");
    /* blank out comments: '#' to the end of its line */
    for (char *c = owned; *c;) {
        if (*c == '#')
            while (*c && *c != '\n') *c++ = ' ';
        else
            c++;
    }
    layer_vec lv = { 0 };
    dt_status s = parse_list(&lv, owned, "", 0, spec);
    free(owned);
    out->n = lv.n;
    out->layers = lv.v;
    if (s == DT_OK)
        for (int i = 0; i < lv.n; i++)
            lv.v[i].partner = lv.partner[i] >= 0 ? &lv.v[lv.partner[i]] : NULL;
    free(lv.partner);
    if (s != DT_OK) dt_spec_free(out);
    return s;
}

void dt_spec_free(dt_spec *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) free(s->layers[i].self);
    free(s->layers);
    s->layers = NULL;
    s->n = 0;
}

/* ---- token models ------------------------------------------------------- */

dt_status dt_spec_token_dims(const char *model, int64_t *window, int *vocab) {
    dt_spec sp;
    DT_TRY(dt_spec_parse(model, &sp));
    int64_t block = 0;
    int v = 0;
    for (int i = 0; i < sp.n; i++) {
        /* the window: learned positions' table, or an attention's block (rotary positions) */
        if (sp.layers[i].kind == DT_LAYER_POS && !block) block = (int64_t)dt_layer_arg(&sp.layers[i], "block");
        if (sp.layers[i].kind == DT_LAYER_ATTN && !block) block = (int64_t)dt_layer_arg(&sp.layers[i], "block");
        if (sp.layers[i].kind == DT_LAYER_EMBED && !v) v = (int)dt_layer_arg(&sp.layers[i], "vocab");
    }
    dt_spec_free(&sp);
    if (!block || !v)
        return dt_error(DT_ERR_INVALID, "model: token data needs a token model with an embedding and learned positions "
                        "(embed(vocab, dim) ... pos(block)) or an attention with a block (attn(..., block=T)), "
                        "as the gpt and llama presets; "
                        "'%s' has %s", model, !v ? "no embed layer" : "no pos layer nor attn with a block");
    *window = block;
    *vocab = v;
    return DT_OK;
}

/* ---- shape inference ----------------------------------------------------- */

dt_status dt_spec_infer(dt_spec *s, const dt_shape *input) {
    if (input->ndim < 1 || input->ndim > 3)
        return dt_error(DT_ERR_INVALID, "model: input shape must be (C, H, W), (T, C) or (F), got %d dims",
                        input->ndim);
    for (int i = 0; i < input->ndim; i++)
        if (input->d[i] <= 0)
            return dt_error(DT_ERR_INVALID, "model: input shape has a zero or negative dimension");
    if (dt_shape_numel(input) > DT_LAYER_MAX_NUMEL)
        return dt_error(DT_ERR_INVALID, "model: input shape has more than %lld elements per sample",
                        (long long)DT_LAYER_MAX_NUMEL);
    dt_shape cur = *input;
    int64_t total = 0;
    int ntensors = 0;
    size_t nbuf = 0, nrec = 0;
    for (int i = 0; i < s->n; i++) {
        dt_layer *L = &s->layers[i];
        dt_shape o = cur;
        L->in = cur;
        L->ntensors = L->nparams = 0;
        L->nrecord = 0;
        DT_TRY(L->def->infer(L, &o));
        for (int d = 0; d < o.ndim; d++)
            if (o.d[d] <= 0) return spec_error(L, "output would be empty");
        if (dt_shape_numel(&o) > DT_LAYER_MAX_NUMEL) {
            char sh[96];
            dt_shape_str(&o, 1, sh, sizeof sh);
            return spec_error(L, "its output %s would have more than %lld elements per sample", sh,
                            (long long)DT_LAYER_MAX_NUMEL);
        }
        L->outs = o;
        L->in_numel = dt_shape_numel(&L->in);
        L->out_numel = dt_shape_numel(&o);
        L->first_param = ntensors;
        for (int t = 0; t < L->ntensors; t++) {
            dt_layer_tensor *T = &L->t[t];
            if (T->role == DT_TENSOR_PARAM && total > INT64_C(1) << 52)   /* each tensor is < 2^31 */
                return spec_error(L, "the model would have more than 2^52 parameters");
            if (T->role == DT_TENSOR_PARAM) { T->offset = (size_t)total; total += T->numel; }
            else if (T->role == DT_TENSOR_BUFFER) { T->offset = nbuf; nbuf += (size_t)T->numel; }
            else if (T->role == DT_TENSOR_TIED) T->offset = T->tie->offset;   /* declared earlier */
        }
        ntensors += L->nparams;
        L->rec_off = nrec;
        nrec += L->nrecord;
        cur = o;
    }
    s->nparams = total;
    s->ntensors = ntensors;
    s->nbuffers = nbuf;
    s->nrecord = nrec;
    return DT_OK;
}

/* ---- summary ------------------------------------------------------------- */

/* Append printf-style text at *off (tracking the full length even past n). */
static void put(char *buf, size_t n, size_t *off, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void put(char *buf, size_t n, size_t *off, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(*off < n ? buf + *off : NULL, *off < n ? n - *off : 0, fmt, ap);
    va_end(ap);
    if (k > 0) *off += (size_t)k;
}

/* "1,863,690" */
static void with_commas(int64_t v, char *out, size_t n) {
    char raw[32];
    snprintf(raw, sizeof raw, "%lld", (long long)v);
    size_t len = strlen(raw), j = 0;
    for (size_t i = 0; i < len && j + 1 < n; i++) {
        if (i && (len - i) % 3 == 0 && j + 2 < n) out[j++] = ',';
        out[j++] = raw[i];
    }
    out[j] = '\0';
}

size_t dt_spec_summary(const dt_spec *s, const dt_shape *input, char *buf, size_t n) {
    size_t off = 0;
    char sh[64], cnt[32], label[96];
    if (n) buf[0] = '\0';
    const char *rule = "==========================================================================\n";
    int w = 8;   /* the Name column fits the longest module path */
    for (int i = 0; i < s->n; i++) if ((int)strlen(s->layers[i].name) > w) w = (int)strlen(s->layers[i].name);
    put(buf, n, &off, "%s", rule);
    put(buf, n, &off, "%-*s %-32s %-20s %11s\n", w, "Name", "Layer", "Output Shape", "Param #");
    put(buf, n, &off, "%s", rule);
    dt_shape_str(input, 1, sh, sizeof sh);
    put(buf, n, &off, "%-*s %-32s %-20s %11s\n", w, "", "input", sh, "--");
    int64_t total = 0;
    for (int i = 0; i < s->n; i++) {
        const dt_layer *L = &s->layers[i];
        int64_t np = 0;
        for (int t = 0; t < L->ntensors; t++)
            if (L->t[t].role == DT_TENSOR_PARAM) np += L->t[t].numel;
        total += np;
        dt_shape_str(&L->outs, 1, sh, sizeof sh);
        with_commas(np, cnt, sizeof cnt);
        /* a block's opening row shows its kind, its closing row the skip addition */
        const char *what = (L->def->flags & DT_LDEF_CONTAINER) ? L->def->name
                         : (L->def->flags & DT_LDEF_INTERNAL) ? "+ x" : L->text;
        /* indented by depth (at most MAX_DEPTH levels), cut where the column cuts it anyway */
        int indent = L->depth < 0 ? 0 : L->depth > MAX_DEPTH ? MAX_DEPTH : L->depth;
        snprintf(label, sizeof label, "%*s%.40s", 2 * indent, "", what);
        put(buf, n, &off, "%-*s %-32.32s %-20s %11s\n", w, L->name, label, sh, np ? cnt : "--");
    }
    put(buf, n, &off, "%s", rule);
    with_commas(total, cnt, sizeof cnt);
    put(buf, n, &off, "Total params: %s\n", cnt);
    put(buf, n, &off, "Trainable params: %s\n", cnt);
    put(buf, n, &off, "Non-trainable params: 0\n");
    put(buf, n, &off, "Params size (MB): %.2f\n", (double)total * 4.0 / 1e6);
    put(buf, n, &off, "%s", rule);
    return off;
}
