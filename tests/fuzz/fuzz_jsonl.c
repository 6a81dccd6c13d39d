/*
 * fuzz_jsonl.c: libFuzzer target for the JSON-lines reader of dtrain report
 * (src/tools/jsonl.c): the input is one line; whatever it holds, the reader returns
 * an object or refuses it, and every member it returns is a NUL-terminated key and
 * value that the typed getters read without fault.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tools/jsonl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 1 << 16) return 0;
    char *line = malloc(size + 1);
    if (!line) return 0;
    memcpy(line, data, size);
    line[size] = '\0';
    jsonl_obj o = {0};
    if (jsonl_parse(line, &o) == 0) {
        for (size_t i = 0; i < o.n; i++) {
            double v;
            if (strlen(o.m[i].key) > size || strlen(o.m[i].val) > size + 1) abort();   /* never longer than the line */
            (void)jsonl_num(&o, o.m[i].key, &v);
            (void)jsonl_str(&o, o.m[i].key);
        }
        (void)jsonl_get(&o, "event");
    }
    jsonl_free(&o);
    free(line);
    return 0;
}
