/*
 * safetensors_index.c: sharded checkpoints, Hugging Face's model.safetensors.index.json.
 *
 * A big model is saved as several safetensors files (the shards) and an index whose
 * "weight_map" names each tensor's shard. The index is parsed with the header's
 * strict JSON rules (safetensors_read.c) and checked on its own first
 * (dt_st_index_parse_, which the fuzzer drives without touching files); then every
 * shard is read with the validating reader, the map and the shards must agree
 * tensor for tensor, and the shards become one dt_st_file (dt_st_union_), so the
 * model loader and everything else read a sharded checkpoint as they read one file.
 */
#define _FILE_OFFSET_BITS 64 /* 64-bit off_t for files over 2 GiB on 32-bit hosts */
#include "config.h"

#include "safetensors.h"
#include "safetensors_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Hugging Face's indexes are a few hundred kB for the largest models; a file far
 * larger is not an index, and is refused before it is read. */
#define MAX_INDEX ((int64_t)64 << 20)

/* ---- parsing -------------------------------------------------------------------- */

typedef struct {
    dt_jparse_    j;
    dt_st_index_ *ix;
    size_t        capmap, capmeta;
} iparse;

/* DT_ERR_FORMAT: "<index>: bad safetensors index: <what>". */
static dt_status ierr(iparse *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static dt_status ierr(iparse *p, const char *fmt, ...) {
    char what[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return dt_error(DT_ERR_FORMAT, "%s: bad safetensors index: %s", p->j.label, what);
}

/* A JSON number (optional '-', digits without a leading zero, fraction, exponent)
 * as its text: "metadata" values may be numbers ("total_size": 123456). */
static dt_status jnumber_text(dt_jparse_ *j, char **out) {
    dt_jws_(j);
    const char *s = j->p, *d;
    if (j->p < j->end && *j->p == '-') j->p++;
    d = j->p;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++;
    if (j->p == d) return dt_jerr_(j, "metadata values must be strings or numbers");
    if (j->p - d > 1 && *d == '0') return dt_jerr_(j, "number with a leading zero");
    for (int part = 0; part < 2; part++) {   /* the fraction, then the exponent */
        if (j->p >= j->end || (part == 0 ? *j->p != '.' : (*j->p != 'e' && *j->p != 'E'))) continue;
        j->p++;
        if (part == 1 && j->p < j->end && (*j->p == '+' || *j->p == '-')) j->p++;
        d = j->p;
        while (j->p < j->end && *j->p >= '0' && *j->p <= '9') j->p++;
        if (j->p == d) return dt_jerr_(j, part == 0 ? "expected digits after '.'" : "expected digits in the exponent");
    }
    if (!(*out = malloc((size_t)(j->p - s) + 1)))
        return dt_error(DT_ERR_NOMEM, "%s: out of memory parsing the %s", j->label, j->kind);
    memcpy(*out, s, (size_t)(j->p - s));
    (*out)[j->p - s] = '\0';
    return DT_OK;
}

/* arr (capacity *cap items of size) with room for item n, doubled when full; NULL when
 * out of memory, arr then unchanged. */
static void *grow(void *arr, size_t n, size_t *cap, size_t size) {
    if (n < *cap) return arr;
    size_t c = *cap ? 2 * *cap : 16;
    void *m = realloc(arr, c * size);
    if (m) *cap = c;
    return m;
}

static dt_status nomem(iparse *p) {
    return dt_error(DT_ERR_NOMEM, "%s: out of memory parsing the safetensors index", p->j.label);
}

/* A shard is a plain file beside the index: no directory part, no "..". */
static dt_status check_file_name(iparse *p, const char *file, const char *name) {
    if (!*file) return ierr(p, "tensor \"%s\": an empty shard file name", name);
    if (strchr(file, '/') || strstr(file, ".."))
        return ierr(p, "tensor \"%s\": shard file name \"%s\" is not a plain file name in the index's "
                    "directory (no '/' or \"..\")", name, file);
    return DT_OK;
}

/* metadata's value (a string or a number, kept as its text), stored with its key */
static dt_status meta_pair(iparse *p, char *k, char **v) {
    dt_jparse_ *j = &p->j;
    DT_TRY(dt_jpeek_(j, '"') ? dt_jstring_(j, v) : jnumber_text(j, v));
    char **m = grow(p->ix->meta, 2 * p->ix->nmeta + 1, &p->capmeta, sizeof *m);
    if (!m) return nomem(p);
    p->ix->meta = m;
    m[2 * p->ix->nmeta] = k;
    m[2 * p->ix->nmeta++ + 1] = *v;
    return DT_OK;
}

/* weight_map's value (a shard's file name), stored with its tensor's name */
static dt_status map_pair(iparse *p, char *k, char **v) {
    dt_jparse_ *j = &p->j;
    if (!dt_jpeek_(j, '"')) return dt_jerr_(j, "weight_map values must be shard file names (strings)");
    DT_TRY(dt_jstring_(j, v));
    DT_TRY(check_file_name(p, *v, k));
    dt_st_index_entry_ *e = grow(p->ix->e, p->ix->n, &p->capmap, sizeof *e);
    if (!e) return nomem(p);
    p->ix->e = e;
    e[p->ix->n].name = k;
    e[p->ix->n++].file = *v;
    return DT_OK;
}

/* {"key": value, ...}, each pair parsed and stored by pair(), which owns the key and
 * the value it sets once it returns DT_OK */
static dt_status parse_object(iparse *p, dt_status (*pair)(iparse *, char *, char **)) {
    dt_jparse_ *j = &p->j;
    DT_TRY(dt_jexpect_(j, '{'));
    if (dt_jpeek_(j, '}')) {
        j->p++;
        return DT_OK;
    }
    while (1) {
        char *k = NULL, *v = NULL;
        DT_TRY(dt_jstring_(j, &k));
        dt_status s = dt_jexpect_(j, ':');
        if (s == DT_OK) s = pair(p, k, &v);
        if (s != DT_OK) {
            free(k);
            free(v);
            return s;
        }
        if (dt_jpeek_(j, ',')) {
            j->p++;
            continue;
        }
        return dt_jexpect_(j, '}');
    }
}

/* One key of the top object and its value. */
static dt_status parse_top_key(iparse *p, int *have_meta, int *have_map) {
    char *k = NULL;
    DT_TRY(dt_jstring_(&p->j, &k));
    dt_status s = dt_jexpect_(&p->j, ':');
    if (s == DT_OK && !strcmp(k, "metadata") && !*have_meta) {
        *have_meta = 1;
        s = parse_object(p, meta_pair);
    } else if (s == DT_OK && !strcmp(k, "weight_map") && !*have_map) {
        *have_map = 1;
        s = parse_object(p, map_pair);
    } else if (s == DT_OK) {
        s = ierr(p, "unexpected or repeated key \"%s\" (an index holds \"metadata\" and \"weight_map\", once each)",
                 k);
    }
    free(k);
    return s;
}

/* The whole text: one object of "metadata" (optional) and "weight_map". */
static dt_status parse_top(iparse *p) {
    dt_jparse_ *j = &p->j;
    if (!dt_utf8_valid_((const unsigned char *)j->base, (size_t)(j->end - j->base)))
        return dt_jerr_(j, "the index is not valid UTF-8");
    int have_meta = 0, have_map = 0;
    DT_TRY(dt_jexpect_(j, '{'));
    if (dt_jpeek_(j, '}')) {
        j->p++;
    } else {
        while (1) {
            DT_TRY(parse_top_key(p, &have_meta, &have_map));
            if (dt_jpeek_(j, ',')) {
                j->p++;
                continue;
            }
            DT_TRY(dt_jexpect_(j, '}'));
            break;
        }
    }
    dt_jws_(j);
    if (j->p != j->end) return dt_jerr_(j, "unexpected text after the closing '}'");
    if (!have_map) return ierr(p, "no \"weight_map\"");
    if (p->ix->n == 0) return ierr(p, "\"weight_map\" is empty");
    return DT_OK;
}

static int cmp_entry_names(const void *a, const void *b) {
    return strcmp((*(const dt_st_index_entry_ *const *)a)->name, (*(const dt_st_index_entry_ *const *)b)->name);
}

static int cmp_meta_keys(const void *a, const void *b) {
    return strcmp(**(char *const *const *)a, **(char *const *const *)b);
}

/* The sorted name index; a tensor or metadata key given twice is an error naming it. */
static dt_status sort_names(iparse *p) {
    dt_st_index_ *ix = p->ix;
    char ***mk = malloc((ix->nmeta ? ix->nmeta : 1) * sizeof *mk);
    ix->by_name = malloc((ix->n ? ix->n : 1) * sizeof *ix->by_name);
    dt_status s = DT_OK;
    if (!mk || !ix->by_name) s = dt_error(DT_ERR_NOMEM, "%s: out of memory", p->j.label);
    for (size_t i = 0; s == DT_OK && i < ix->n; i++) ix->by_name[i] = &ix->e[i];
    for (size_t i = 0; s == DT_OK && i < ix->nmeta; i++) mk[i] = &ix->meta[2 * i];
    if (s == DT_OK) qsort(ix->by_name, ix->n, sizeof *ix->by_name, cmp_entry_names);
    if (s == DT_OK) qsort(mk, ix->nmeta, sizeof *mk, cmp_meta_keys);
    for (size_t i = 1; s == DT_OK && i < ix->n; i++)
        if (!strcmp(ix->by_name[i - 1]->name, ix->by_name[i]->name))
            s = ierr(p, "tensor \"%s\" appears twice in \"weight_map\"", ix->by_name[i]->name);
    for (size_t i = 1; s == DT_OK && i < ix->nmeta; i++)
        if (!strcmp(*mk[i - 1], *mk[i]))
            s = ierr(p, "metadata key \"%s\" appears twice", *mk[i]);
    free(mk);
    return s;
}

void dt_st_index_free_(dt_st_index_ *ix) {
    if (!ix) return;
    for (size_t i = 0; i < ix->n; i++) {
        free(ix->e[i].name);
        free(ix->e[i].file);
    }
    for (size_t i = 0; i < 2 * ix->nmeta; i++) free(ix->meta[i]);
    free(ix->e);
    free(ix->by_name);
    free(ix->meta);
    memset(ix, 0, sizeof *ix);
}

dt_status dt_st_index_parse_(const char *json, size_t len, const char *label, dt_st_index_ *out) {
    memset(out, 0, sizeof *out);
    iparse p = {{json, json, json + len, label, "safetensors index"}, out, 0, 0};
    dt_status s = parse_top(&p);
    if (s == DT_OK) s = sort_names(&p);
    if (s != DT_OK) dt_st_index_free_(out);
    return s;
}

static int cmp_name_key(const void *key, const void *elem) {
    return strcmp((const char *)key, (*(const dt_st_index_entry_ *const *)elem)->name);
}

const dt_st_index_entry_ *dt_st_index_find_(const dt_st_index_ *ix, const char *name) {
    const dt_st_index_entry_ *const *hit =
        ix->by_name ? bsearch(name, ix->by_name, ix->n, sizeof *ix->by_name, cmp_name_key) : NULL;
    return hit ? *hit : NULL;
}

/* ---- the shards ------------------------------------------------------------------ */

/* A shard file and the weight_map entries that name it. */
typedef struct {
    const char                *file;
    const dt_st_index_entry_ **e;      /* its entries, in the map's order */
    size_t                     n;
    size_t                     first;  /* the map position of its first entry */
} shard;

static int cmp_entry_files(const void *a, const void *b) {
    const dt_st_index_entry_ *x = *(const dt_st_index_entry_ *const *)a, *y = *(const dt_st_index_entry_ *const *)b;
    int c = strcmp(x->file, y->file);
    return c ? c : (x < y ? -1 : x > y);
}

static int cmp_shard_first(const void *a, const void *b) {
    const shard *x = a, *y = b;
    return x->first < y->first ? -1 : x->first > y->first;
}

/* The distinct shards of ix in the order the map first names them; their entry lists
 * point into *by_file. Sorting keeps this O(n log n) however many shards there are. */
static dt_status group_shards(const char *index, const dt_st_index_ *ix, const dt_st_index_entry_ ***by_file,
                              shard **out, size_t *nshard) {
    const dt_st_index_entry_ **e = malloc((ix->n ? ix->n : 1) * sizeof *e);
    shard *sh = malloc((ix->n ? ix->n : 1) * sizeof *sh);
    if (!e || !sh) {
        free(e);
        free(sh);
        return dt_error(DT_ERR_NOMEM, "%s: out of memory", index);
    }
    for (size_t i = 0; i < ix->n; i++) e[i] = &ix->e[i];
    qsort(e, ix->n, sizeof *e, cmp_entry_files);
    size_t ns = 0;
    for (size_t i = 0; i < ix->n; i++) {
        if (i == 0 || strcmp(e[i]->file, e[i - 1]->file))
            sh[ns++] = (shard){.file = e[i]->file, .e = &e[i], .first = (size_t)(e[i] - ix->e)};
        sh[ns - 1].n++;
    }
    qsort(sh, ns, sizeof *sh, cmp_shard_first);
    *by_file = e;
    *out = sh;
    *nshard = ns;
    return DT_OK;
}

/* file in the index's directory: "<dir of index>/file", or file when index has no '/'. */
static dt_status shard_path(const char *index, const char *file, char **out) {
    const char *slash = strrchr(index, '/');
    size_t dl = slash ? (size_t)(slash - index) + 1 : 0, fl = strlen(file);
    if (!(*out = malloc(dl + fl + 1))) return dt_error(DT_ERR_NOMEM, "%s: out of memory", index);
    memcpy(*out, index, dl);
    memcpy(*out + dl, file, fl + 1);
    return DT_OK;
}

static void close_parts(dt_st_file **parts, size_t n) {
    for (size_t i = 0; parts && i < n; i++) dt_st_close(parts[i]);
    free(parts);
}

/* Read and validate every shard; the reader's message, after the index and the shard. */
static dt_status open_shards(const char *index, const shard *sh, size_t ns, dt_st_file ***out) {
    dt_st_file **parts = calloc(ns ? ns : 1, sizeof *parts);
    if (!parts) return dt_error(DT_ERR_NOMEM, "%s: out of memory", index);
    dt_status s = DT_OK;
    for (size_t i = 0; s == DT_OK && i < ns; i++) {
        char *path = NULL;
        s = shard_path(index, sh[i].file, &path);
        if (s == DT_OK && (s = dt_st_open(path, &parts[i])) != DT_OK)
            s = dt_error_wrap(s, "%s: shard \"%s\": ", index, sh[i].file);
        free(path);
    }
    if (s != DT_OK) {
        close_parts(parts, ns);
        return s;
    }
    *out = parts;
    return DT_OK;
}

static int holds(const dt_st_file *f, const char *name) {
    dt_st_tensor t;
    return dt_st_find(f, name, &t) == DT_OK;
}

/* Every tensor weight_map puts in a shard is in it. */
static dt_status check_listed(const char *index, const shard *sh, dt_st_file *const *parts, size_t ns) {
    for (size_t i = 0; i < ns; i++)
        for (size_t k = 0; k < sh[i].n; k++) {
            const char *name = sh[i].e[k]->name;
            if (holds(parts[i], name)) continue;
            size_t h = 0;
            while (h < ns && (h == i || !holds(parts[h], name))) h++;
            return dt_error(DT_ERR_FORMAT, "%s: weight_map puts tensor \"%s\" in shard \"%s\", which does not hold "
                            "it%s%s%s", index, name, sh[i].file, h < ns ? " (it is in \"" : "", h < ns ? sh[h].file : "",
                            h < ns ? "\")" : "");
        }
    return DT_OK;
}

/* Every tensor of every shard is in weight_map, under that shard. */
static dt_status check_held(const char *index, const dt_st_index_ *ix, const shard *sh, dt_st_file *const *parts,
                            size_t ns) {
    for (size_t i = 0; i < ns; i++)
        for (size_t k = 0; k < dt_st_count(parts[i]); k++) {
            dt_st_tensor t;
            DT_TRY(dt_st_tensor_at(parts[i], k, &t));
            const dt_st_index_entry_ *e = dt_st_index_find_(ix, t.name);
            if (!e)
                return dt_error(DT_ERR_FORMAT, "%s: shard \"%s\" holds tensor \"%s\", which weight_map does not list",
                                index, sh[i].file, t.name);
            if (strcmp(e->file, sh[i].file))   /* and e->file holds it too: check_listed ran */
                return dt_error(DT_ERR_FORMAT, "%s: tensor \"%s\" is in two shards, \"%s\" and \"%s\" (weight_map "
                                "lists it in \"%s\")", index, t.name, e->file, sh[i].file, e->file);
        }
    return DT_OK;
}

/* Open the shards of a parsed index, check them against it and make them one file;
 * the union takes ix's metadata. */
static dt_status open_checked(const char *index, dt_st_index_ *ix, dt_st_file **out) {
    const dt_st_index_entry_ **by_file = NULL;
    shard *sh = NULL;
    size_t ns = 0;
    dt_st_file **parts = NULL;
    dt_status s = group_shards(index, ix, &by_file, &sh, &ns);
    if (s == DT_OK) s = open_shards(index, sh, ns, &parts);
    if (s == DT_OK) s = check_listed(index, sh, parts, ns);
    if (s == DT_OK) s = check_held(index, ix, sh, parts, ns);
    if (s == DT_OK) {
        s = dt_st_union_(index, parts, ns, ix->meta, ix->nmeta, out);
        parts = NULL;
        ix->meta = NULL;
        ix->nmeta = 0;
    }
    close_parts(parts, ns);
    free(by_file);
    free(sh);
    return s;
}

/* The whole index file, refused over MAX_INDEX before it is read. */
static dt_status read_index(const char *path, char **json, size_t *len) {
    int fd;
    int64_t size;
    *json = NULL;
    DT_TRY(dt_file_open_read(path, &fd, &size));
    dt_status s = DT_OK;
    if (size > MAX_INDEX)
        s = dt_error(DT_ERR_FORMAT, "%s: %lld bytes, over the 64 MiB limit of a safetensors index (not an index?)",
                     path, (long long)size);
    else if (!(*json = malloc(size ? (size_t)size : 1)))
        s = dt_error(DT_ERR_NOMEM, "%s: out of memory for the index", path);
    if (s == DT_OK) s = dt_file_pread(fd, path, *json, (size_t)size, 0);
    close(fd);
    if (s != DT_OK) {
        free(*json);
        *json = NULL;
        return s;
    }
    *len = (size_t)size;
    return DT_OK;
}

dt_status dt_st_open_index(const char *index_path, dt_st_file **out) {
    char *json = NULL;
    size_t len = 0;
    dt_st_index_ ix;
    *out = NULL;
    DT_TRY(read_index(index_path, &json, &len));
    dt_status s = dt_st_index_parse_(json, len, index_path, &ix);
    free(json);
    DT_TRY(s);
    s = open_checked(index_path, &ix, out);
    dt_st_index_free_(&ix);
    return s;
}
