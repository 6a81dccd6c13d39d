/*
 * fuzz_st_index.c: libFuzzer target for sharded checkpoints (src/safetensors_index.c):
 * the index JSON's parser and checks (dt_st_index_parse_), then the whole
 * dt_st_open_index over two shards. The input is a little-endian u32 L, L bytes of
 * index JSON, a u32 M, M bytes of a.safetensors and the rest as b.safetensors, the
 * three written into a private directory (one per input, removed after it); an index
 * naming other shards reaches the missing-shard path.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"
#include "safetensors_impl.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);


static uint32_t take_len(const uint8_t **data, size_t *size) {
    if (*size < 4) return 0;
    uint32_t l = (uint32_t)(*data)[0] | (uint32_t)(*data)[1] << 8 | (uint32_t)(*data)[2] << 16 |
                 (uint32_t)(*data)[3] << 24;
    *data += 4;
    *size -= 4;
    return l > *size ? (uint32_t)*size : l;
}

/* What the parser promises of an index it accepts. */
static void check_parsed(const dt_st_index_ *ix) {
    if (ix->n == 0) abort();
    for (size_t i = 0; i < ix->n; i++) {
        const char *file = ix->e[i].file;
        if (dt_st_index_find_(ix, ix->e[i].name) != &ix->e[i]) abort();   /* names are unique */
        if (!*file || strchr(file, '/') || strstr(file, "..")) abort();
    }
}

/* Every tensor of an opened index is found by name; its metadata by key. */
static void walk(const dt_st_file *f) {
    for (size_t i = 0; i < dt_st_count(f); i++) {
        dt_st_tensor t;
        if (dt_st_tensor_at(f, i, &t) != DT_OK || dt_st_find(f, t.name, &t) != DT_OK) abort();
    }
    for (size_t i = 0; i < dt_st_meta_count(f); i++) {
        const char *k, *v;
        dt_st_meta_at(f, i, &k, &v);
        if (!dt_st_meta_get(f, k)) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (4u << 20)) return 0;
    uint32_t l = take_len(&data, &size);
    dt_st_index_ ix;
    if (dt_st_index_parse_((const char *)data, l, "fuzz.index.json", &ix) != DT_OK) return 0;
    check_parsed(&ix);
    dt_st_index_free_(&ix);
    const uint8_t *json = data;
    data += l;
    size -= l;
    uint32_t m = take_len(&data, &size);
    char dir[64], index_path[128];
    fuzz_dir(dir, sizeof dir, "st_index");
    snprintf(index_path, sizeof index_path, "%s/model.safetensors.index.json", dir);
    dt_st_file *f = NULL;
    if (fuzz_put(dir, "model.safetensors.index.json", json, l) && fuzz_put(dir, "a.safetensors", data, m) &&
        fuzz_put(dir, "b.safetensors", data + m, size - m) && dt_st_open_index(index_path, &f) == DT_OK)
        walk(f);
    dt_st_close(f);
    fuzz_dir_done(dir);
    return 0;
}
