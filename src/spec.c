/*
 * spec.c: the model spec language: parsing, presets, shape inference and the
 * summary table (the host-only half of model.h; model.c holds the runtime).
 *
 * Grammar: a layer list separated by whitespace; a layer is NAME or
 * NAME(arg, ...) where args are positional numbers first, then key=value.
 * Spaces inside parentheses are allowed. Every error names the layer by its
 * position and text and says what was expected, in one line.
 */
#include "model.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define SPEC_FILE_MAX (1 << 20)

static const char *kind_names[DT_LAYER_NKINDS] = {
    [DT_LAYER_LINEAR] = "linear", [DT_LAYER_CONV] = "conv",
    [DT_LAYER_MAXPOOL] = "maxpool", [DT_LAYER_AVGPOOL] = "avgpool",
    [DT_LAYER_GAP] = "gap", [DT_LAYER_BN] = "bn", [DT_LAYER_LN] = "ln",
    [DT_LAYER_RELU] = "relu", [DT_LAYER_GELU] = "gelu", [DT_LAYER_TANH] = "tanh",
    [DT_LAYER_DROPOUT] = "dropout", [DT_LAYER_FLATTEN] = "flatten",
};

const char *dt_layer_kind_name(dt_layer_kind k) {
    return (k >= 0 && k < DT_LAYER_NKINDS) ? kind_names[k] : "?";
}

int64_t dt_shape_numel(const dt_shape *s) {
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) n *= s->d[i];
    return n;
}

void dt_shape_str(const dt_shape *s, int with_batch, char *buf, size_t n) {
    size_t off = 0;
    if (n == 0) return;
    buf[0] = '\0';
    off += (size_t)snprintf(buf, n, "(%s", with_batch ? "B" : "");
    for (int i = 0; i < s->ndim && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, "%s%lld", (i || with_batch) ? ", " : "",
                                (long long)s->d[i]);
    if (off < n) snprintf(buf + off, n - off, ")");
}

/* ---- presets ------------------------------------------------------------- */

static const struct { const char *name, *text; } presets[] = {
    { "mlp", "flatten linear(1024) relu linear(1024) relu linear(10)" },
    { "cnn", "conv(32,3,pad=1) bn relu maxpool(2) conv(64,3,pad=1) bn relu maxpool(2) "
             "flatten linear(128) relu linear(10)" },
};

const char *dt_spec_preset(const char *name) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(name, presets[i].name) == 0) return presets[i].text;
    return NULL;
}

/* ---- parsing ------------------------------------------------------------- */

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

#define BADARG(L, what, arg) \
    dt_error(DT_ERR_INVALID, "model spec: layer %d '%s': %s, got '%s'", (L)->index, (L)->text, what, arg)

/* Fill a layer's arguments from the text between the parentheses (args may be
 * NULL for a bare name). Positional order per kind is given in `pos`. */
static dt_status layer_args(dt_layer *L, char *args) {
    static const char *pos_linear[] = { "out", "bias", NULL };
    static const char *pos_conv[] = { "out", "k", "stride", "pad", "bias", NULL };
    static const char *pos_pool[] = { "k", "stride", "pad", NULL };
    static const char *pos_drop[] = { "p", NULL };
    static const char *pos_none[] = { NULL };
    const char **pos = pos_none;
    int required = 0;
    switch (L->kind) {
    case DT_LAYER_LINEAR: pos = pos_linear; required = 1; break;
    case DT_LAYER_CONV: pos = pos_conv; required = 2; break;
    case DT_LAYER_MAXPOOL: case DT_LAYER_AVGPOOL: pos = pos_pool; required = 1; break;
    case DT_LAYER_DROPOUT: pos = pos_drop; break;
    default: break;
    }
    L->bias = 1; L->stride = -1; L->pad = 0; L->out = 0; L->k = 0; L->p = 0.5f;
    int seen[8] = { 0 }, npos = 0, nkw = 0;
    if (args) {
        if (*trim(args) == '\0' && pos[0] == NULL) args = NULL;
        else if (*trim(args) == '\0')
            return dt_error(DT_ERR_INVALID, "model spec: layer %d '%s': empty argument list; "
                            "expected %s(%s, ...)", L->index, L->text, dt_layer_kind_name(L->kind), pos[0]);
        for (char *a = args, *next; a; a = next) {
            next = strchr(a, ',');
            if (next) *next++ = '\0';
            a = trim(a);
            if (*a == '\0')
                return dt_error(DT_ERR_INVALID, "model spec: layer %d '%s': empty argument",
                                L->index, L->text);
            char *eq = strchr(a, '=');
            const char *key;
            char *val;
            int slot = -1;
            if (eq) {
                *eq = '\0';
                key = trim(a);
                val = trim(eq + 1);
                for (int i = 0; pos[i]; i++)
                    if (!strcmp(pos[i], key)) slot = i;
                if (slot < 0) {
                    if (pos[0] == NULL)
                        return dt_error(DT_ERR_INVALID, "model spec: layer %d '%s': %s takes no "
                                        "arguments, got '%s'", L->index, L->text,
                                        dt_layer_kind_name(L->kind), key);
                    char known[96] = "";
                    for (int i = 0; pos[i]; i++) {
                        strncat(known, i ? ", " : "", sizeof known - strlen(known) - 1);
                        strncat(known, pos[i], sizeof known - strlen(known) - 1);
                    }
                    return dt_error(DT_ERR_INVALID, "model spec: layer %d '%s': unknown argument "
                                    "'%s' (expected one of: %s)", L->index, L->text, key, known);
                }
                nkw++;
            } else {
                if (nkw)
                    return dt_error(DT_ERR_INVALID, "model spec: layer %d '%s': positional argument "
                                    "'%s' after key=value arguments", L->index, L->text, a);
                if (pos[npos] == NULL)
                    return dt_error(DT_ERR_INVALID, "model spec: layer %d '%s': too many arguments "
                                    "(%s takes %d)", L->index, L->text, dt_layer_kind_name(L->kind), npos);
                slot = npos++;
                key = pos[slot];
                val = a;
            }
            if (seen[slot])
                return dt_error(DT_ERR_INVALID, "model spec: layer %d '%s': argument '%s' given twice",
                                L->index, L->text, key);
            seen[slot] = 1;
            if (!strcmp(key, "out")) {
                if (parse_int(val, &L->out) || L->out <= 0) return BADARG(L, "'out' expects a positive integer", val);
            } else if (!strcmp(key, "k")) {
                if (parse_int(val, &L->k) || L->k <= 0) return BADARG(L, "kernel size 'k' expects a positive integer", val);
            } else if (!strcmp(key, "stride")) {
                if (parse_int(val, &L->stride) || L->stride <= 0) return BADARG(L, "'stride' expects a positive integer", val);
            } else if (!strcmp(key, "pad")) {
                if (parse_int(val, &L->pad) || L->pad < 0) return BADARG(L, "'pad' expects a non-negative integer", val);
            } else if (!strcmp(key, "bias")) {
                if (parse_bool(val, &L->bias)) return BADARG(L, "'bias' expects 0 or 1", val);
            } else if (!strcmp(key, "p")) {
                if (parse_float(val, &L->p) || !(L->p >= 0.0f && L->p < 1.0f))
                    return BADARG(L, "dropout 'p' expects a number in [0, 1)", val);
            }
        }
    }
    for (int i = 0; i < required; i++)
        if (!seen[i])
            return dt_error(DT_ERR_INVALID, "model spec: layer %d '%s': missing argument '%s'",
                            L->index, L->text, pos[i]);
    if (L->kind == DT_LAYER_CONV && L->stride < 0) L->stride = 1;
    if ((L->kind == DT_LAYER_MAXPOOL || L->kind == DT_LAYER_AVGPOOL) && L->stride < 0) L->stride = L->k;
    if ((L->kind == DT_LAYER_MAXPOOL || L->kind == DT_LAYER_AVGPOOL) && L->pad * 2 > L->k)
        return dt_error(DT_ERR_INVALID, "model spec: layer %d '%s': pad %d must be at most half "
                        "the kernel size %d", L->index, L->text, L->pad, L->k);
    return DT_OK;
}

/* Keep (a prefix of) the layer's text for messages and the summary. */
static void set_text(dt_layer *L, const char *src, size_t len) {
    if (len >= sizeof L->text) len = sizeof L->text - 1;
    memcpy(L->text, src, len);
    L->text[len] = '\0';
}

/* Parse one layer token "name" or "name(args)". */
static dt_status parse_layer(dt_layer *L, const char *tok, size_t len) {
    char buf[256];
    if (len >= sizeof buf)
        return dt_error(DT_ERR_INVALID, "model spec: layer %d '%.40s...': layer text too long",
                        L->index, tok);
    memcpy(buf, tok, len);
    buf[len] = '\0';
    set_text(L, buf, len);
    char *paren = strchr(buf, '(');
    char *args = NULL;
    if (paren) {
        char *close = buf + len - 1;
        if (*close != ')')
            return dt_error(DT_ERR_INVALID, "model spec: layer %d '%s': expected ')' at the end",
                            L->index, L->text);
        *paren = '\0';
        *close = '\0';
        args = paren + 1;
    }
    for (char *c = buf; *c; c++) *c = (char)tolower((unsigned char)*c);
    int kind = -1;
    for (int k = 0; k < DT_LAYER_NKINDS; k++)
        if (!strcmp(buf, kind_names[k])) kind = k;
    if (kind < 0) {
        if (!strcmp(buf, "res"))
            return dt_error(DT_ERR_UNSUPPORTED, "model spec: layer %d '%s': residual blocks are "
                            "not supported yet", L->index, L->text);
        return dt_error(DT_ERR_INVALID, "model spec: layer %d '%s': unknown layer '%s' (expected "
                        "linear, conv, maxpool, avgpool, gap, bn, ln, relu, gelu, tanh, dropout or "
                        "flatten)", L->index, L->text, buf);
    }
    L->kind = (dt_layer_kind)kind;
    return layer_args(L, args);
}

/* Read a spec file: lines, '#' starts a comment. Returns malloc'ed text. */
static dt_status read_spec_file(const char *path, char **text) {
    FILE *f = fopen(path, "r");
    if (!f) return dt_error(DT_ERR_IO, "model spec file %s: %s", path, strerror(errno));
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
    if (preset) {
        text = preset;
    } else if (spec[0] == '@') {
        DT_TRY(read_spec_file(spec + 1, &owned));
        text = owned;
    } else if (!strpbrk(spec, " \t\n(") && stat(spec, &st) == 0 && S_ISREG(st.st_mode)) {
        DT_TRY(read_spec_file(spec, &owned));
        text = owned;
    }
    if (!owned && !(owned = strdup(text))) return dt_error(DT_ERR_NOMEM, "model spec: out of memory");
    text = owned;
    /* blank out comments: '#' to the end of its line */
    for (char *c = owned; *c;) {
        if (*c == '#')
            while (*c && *c != '\n') *c++ = ' ';
        else
            c++;
    }
    /* Split into layer tokens: whitespace outside parentheses separates them. */
    int cap = 16;
    dt_layer *layers = calloc((size_t)cap, sizeof *layers);
    dt_status s = DT_OK;
    if (!layers) { free(owned); return dt_error(DT_ERR_NOMEM, "model spec: out of memory"); }
    int n = 0;
    const char *p = text;
    while (s == DT_OK) {
        while (isspace((unsigned char)*p)) p++;
        if (!*p) break;
        const char *start = p;
        int depth = 0;
        while (*p && (depth > 0 || !isspace((unsigned char)*p))) {
            if (*p == '(') depth++;
            else if (*p == ')') {
                if (--depth < 0) break;
            }
            p++;
        }
        if (n == cap) {
            dt_layer *nl = realloc(layers, (size_t)cap * 2 * sizeof *layers);
            if (!nl) { s = dt_error(DT_ERR_NOMEM, "model spec: out of memory"); break; }
            memset(nl + cap, 0, (size_t)cap * sizeof *nl);
            layers = nl;
            cap *= 2;
        }
        dt_layer *L = &layers[n];
        L->index = n;
        if (depth != 0) {
            set_text(L, start, (size_t)(p - start));
            s = dt_error(DT_ERR_INVALID, "model spec: layer %d '%s': unbalanced parentheses",
                         n, L->text);
            break;
        }
        s = parse_layer(L, start, (size_t)(p - start));
        n++;
    }
    free(owned);
    if (s == DT_OK && n == 0) s = dt_error(DT_ERR_INVALID, "model spec: no layers in '%s'", spec);
    if (s != DT_OK) { free(layers); return s; }
    out->n = n;
    out->layers = layers;
    return DT_OK;
}

void dt_spec_free(dt_spec *s) {
    if (!s) return;
    free(s->layers);
    s->layers = NULL;
    s->n = 0;
}

/* ---- shape inference ----------------------------------------------------- */

static dt_status shape_err(const dt_layer *L, const dt_shape *in, const char *what, const char *hint) {
    char sh[64];
    dt_shape_str(in, 1, sh, sizeof sh);
    return dt_error(DT_ERR_INVALID, "model spec: layer %d '%s': %s, but its input is %s%s",
                    L->index, L->text, what, sh, hint);
}

/* Output size of a window op along one dimension, or <= 0 when it does not fit. */
static int64_t window_out(int64_t in, int k, int stride, int pad) {
    int64_t span = in + 2 * (int64_t)pad - k;
    return span < 0 ? 0 : span / stride + 1;
}

dt_status dt_spec_infer(dt_spec *s, const dt_shape *input) {
    if (input->ndim != 1 && input->ndim != 3)
        return dt_error(DT_ERR_INVALID, "model: input shape must be (C, H, W) or (F), got %d dims",
                        input->ndim);
    for (int i = 0; i < input->ndim; i++)
        if (input->d[i] <= 0)
            return dt_error(DT_ERR_INVALID, "model: input shape has a zero or negative dimension");
    dt_shape cur = *input;
    int64_t total = 0;
    int ntensors = 0;
    size_t nbuf = 0, nrec = 0;
    for (int i = 0; i < s->n; i++) {
        dt_layer *L = &s->layers[i];
        dt_shape o = cur;
        L->in = cur;
        L->nparams = 0;
        L->w_numel = L->b_numel = 0;
        switch (L->kind) {
        case DT_LAYER_LINEAR:
            if (cur.ndim != 1)
                return shape_err(L, &cur, "linear expects a flat (B, features) input", "; add 'flatten' before it");
            o.d[0] = L->out;
            L->w_numel = (size_t)L->out * (size_t)cur.d[0];
            L->b_numel = L->bias ? (size_t)L->out : 0;
            break;
        case DT_LAYER_CONV:
            if (cur.ndim != 3)
                return shape_err(L, &cur, "conv expects a (B, C, H, W) input", "");
            o.d[0] = L->out;
            o.d[1] = window_out(cur.d[1], L->k, L->stride, L->pad);
            o.d[2] = window_out(cur.d[2], L->k, L->stride, L->pad);
            L->w_numel = (size_t)L->out * (size_t)cur.d[0] * (size_t)L->k * (size_t)L->k;
            L->b_numel = L->bias ? (size_t)L->out : 0;
            break;
        case DT_LAYER_MAXPOOL:
        case DT_LAYER_AVGPOOL:
            if (cur.ndim != 3)
                return shape_err(L, &cur, "pooling expects a (B, C, H, W) input", "");
            o.d[1] = window_out(cur.d[1], L->k, L->stride, L->pad);
            o.d[2] = window_out(cur.d[2], L->k, L->stride, L->pad);
            break;
        case DT_LAYER_GAP:
            if (cur.ndim != 3)
                return shape_err(L, &cur, "gap expects a (B, C, H, W) input", "");
            o.ndim = 1;
            break;
        case DT_LAYER_BN:
            L->w_numel = L->b_numel = (size_t)cur.d[0];
            L->rm_off = nbuf;
            L->rv_off = nbuf + (size_t)cur.d[0];
            nbuf += 2 * (size_t)cur.d[0];
            L->rec_off = nrec;
            nrec += 2 * (size_t)cur.d[0] + 2;   /* count: the bits of an int64 */
            break;
        case DT_LAYER_LN:
            L->w_numel = L->b_numel = (size_t)cur.d[cur.ndim - 1];
            break;
        case DT_LAYER_FLATTEN:
            o.ndim = 1;
            o.d[0] = dt_shape_numel(&cur);
            break;
        default:
            break;
        }
        for (int d = 0; d < o.ndim; d++)
            if (o.d[d] <= 0) {
                char sh[64];
                dt_shape_str(&cur, 1, sh, sizeof sh);
                return dt_error(DT_ERR_INVALID, "model spec: layer %d '%s': output would be empty "
                                "for input %s (kernel %d, stride %d, pad %d); use a smaller kernel "
                                "or more padding", L->index, L->text, sh, L->k, L->stride, L->pad);
            }
        L->outs = o;
        L->in_numel = dt_shape_numel(&L->in);
        L->out_numel = dt_shape_numel(&o);
        L->nparams = (L->w_numel ? 1 : 0) + (L->b_numel ? 1 : 0);
        L->first_param = ntensors;
        L->w_off = (size_t)total;
        L->b_off = (size_t)total + L->w_numel;
        total += (int64_t)(L->w_numel + L->b_numel);
        ntensors += L->nparams;
        cur = o;
    }
    s->nparams = total;
    s->ntensors = ntensors;
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
    char sh[64], cnt[32];
    if (n) buf[0] = '\0';
    const char *rule = "========================================================================\n";
    put(buf, n, &off, "%s", rule);
    put(buf, n, &off, "%-5s %-30s %-22s %12s\n", "#", "Layer", "Output Shape", "Param #");
    put(buf, n, &off, "%s", rule);
    dt_shape_str(input, 1, sh, sizeof sh);
    put(buf, n, &off, "%-5s %-30s %-22s %12s\n", "", "input", sh, "--");
    int64_t total = 0;
    for (int i = 0; i < s->n; i++) {
        const dt_layer *L = &s->layers[i];
        int64_t np = (int64_t)(L->w_numel + L->b_numel);
        total += np;
        dt_shape_str(&L->outs, 1, sh, sizeof sh);
        with_commas(np, cnt, sizeof cnt);
        put(buf, n, &off, "%-5d %-30.30s %-22s %12s\n", i, L->text, sh, np ? cnt : "--");
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
