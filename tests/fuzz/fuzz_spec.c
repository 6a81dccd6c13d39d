/*
 * fuzz_spec.c: libFuzzer target for the model spec parser, shape inference and
 * the summary (src/spec.c, the layer rows' argument schemas and infer).
 *
 * The input is a spec text. A text the parser would read as a file name (one
 * word, or "@...") is prefixed with "relu " so every input is parsed as a layer
 * list and no file is opened; a text starting "gpt(" goes to the gpt presets'
 * argument parser as it is. Shapes include token ids (T) and sequences (T, C).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0;
    char *text = malloc(size + 6);
    if (!text) return 0;
    memcpy(text, "relu ", 5);
    memcpy(text + 5, data, size);
    text[size + 5] = '\0';
    /* the gpt presets' argument parser: such a text is a preset, never a file name */
    const char *spec = !strncmp(text + 5, "gpt(", 4) ? text + 5 : text;
    /* images, features, token ids (T) and sequences (T, C) */
    static const dt_shape shapes[] = { { 3, { 1, 28, 28 } }, { 1, { 7 } }, { 3, { 3, 5, 4 } }, { 1, { 5 } },
                                       { 2, { 5, 8 } } };
    dt_spec s;
    if (dt_spec_parse(spec, &s) == DT_OK) {
        const dt_shape *in = &shapes[size % 5];
        if (dt_spec_infer(&s, in) == DT_OK) {
            char buf[256];
            size_t need = dt_spec_summary(&s, in, buf, sizeof buf);
            (void)need;
        }
        dt_spec_free(&s);
    }
    free(text);
    return 0;
}
