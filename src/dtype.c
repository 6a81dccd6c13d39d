/*
 * dtype.c: the traits table of dt_dtype and the lookups by name (see dtype.h).
 *
 * One row per type with labelled initialisers; the _Static_assert below makes a
 * type added to the enum without its row a compile error, and tests/test_dtype
 * checks that every row is complete and that every name reads back.
 */
#include "config.h"

#include "dtype.h"

#include <stdio.h>
#include <strings.h>

static const dt_dtype_traits traits[] = {
    [DT_F32]  = { .name = "f32",  .size = 4, .st_name = "F32",  .npy = "<f4", .idx = 0x0D, .is_float = 1 },
    [DT_F64]  = { .name = "f64",  .size = 8, .st_name = "F64",  .npy = "<f8", .idx = 0x0E, .is_float = 1 },
    [DT_F16]  = { .name = "f16",  .size = 2, .st_name = "F16",  .npy = "<f2", .is_float = 1 },
    [DT_BF16] = { .name = "bf16", .size = 2, .st_name = "BF16", .is_float = 1 },
    [DT_I32]  = { .name = "i32",  .size = 4, .st_name = "I32",  .npy = "<i4", .idx = 0x0C },
    [DT_I64]  = { .name = "i64",  .size = 8, .st_name = "I64",  .npy = "<i8" },
    [DT_U8]   = { .name = "u8",   .size = 1, .st_name = "U8",   .npy = "|u1", .idx = 0x08 },
    [DT_I8]   = { .name = "i8",   .size = 1, .st_name = "I8",   .npy = "|i1", .idx = 0x09 },
    [DT_I16]  = { .name = "i16",  .size = 2, .st_name = "I16",  .npy = "<i2", .idx = 0x0B },
    [DT_U16]  = { .name = "u16",  .size = 2, .st_name = "U16",  .npy = "<u2" },
    [DT_U32]  = { .name = "u32",  .size = 4, .st_name = "U32",  .npy = "<u4" },
    [DT_U64]  = { .name = "u64",  .size = 8, .st_name = "U64",  .npy = "<u8" },
    [DT_BOOL] = { .name = "bool", .size = 1, .st_name = "BOOL", .npy = "|b1" },
};
_Static_assert(sizeof traits / sizeof traits[0] == DT_DTYPE_COUNT, "one traits row per dt_dtype");

const dt_dtype_traits *dt_dtype_traits_of(dt_dtype t) {
    return (unsigned)t < DT_DTYPE_COUNT ? &traits[t] : NULL;
}

size_t dt_dtype_size(dt_dtype t) { return (unsigned)t < DT_DTYPE_COUNT ? traits[t].size : 0; }
const char *dt_dtype_name(dt_dtype t) { return (unsigned)t < DT_DTYPE_COUNT ? traits[t].name : "?"; }
const char *dt_dtype_st_name(dt_dtype t) { return (unsigned)t < DT_DTYPE_COUNT ? traits[t].st_name : "?"; }

dt_status dt_dtype_parse(const char *s, dt_dtype *out) {
    static const struct { const char *alias; dt_dtype t; } aliases[] = {
        { "float32", DT_F32 }, { "float", DT_F32 }, { "float64", DT_F64 }, { "double", DT_F64 },
        { "float16", DT_F16 }, { "half", DT_F16 }, { "bfloat16", DT_BF16 }, { "int32", DT_I32 },
        { "int", DT_I32 }, { "int64", DT_I64 }, { "uint8", DT_U8 }, { "byte", DT_U8 },
        { "int8", DT_I8 }, { "int16", DT_I16 }, { "uint16", DT_U16 }, { "uint32", DT_U32 }, { "uint64", DT_U64 },
    };
    if (!s) return dt_error(DT_ERR_INVALID, "element type is NULL");
    for (int t = 0; t < DT_DTYPE_COUNT; t++)
        if (strcasecmp(s, traits[t].name) == 0) { *out = (dt_dtype)t; return DT_OK; }
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (strcasecmp(s, aliases[i].alias) == 0) { *out = aliases[i].t; return DT_OK; }
    char list[128] = "";
    size_t k = 0;
    for (int t = 0; t < DT_DTYPE_COUNT && k < sizeof list; t++)
        k += (size_t)snprintf(list + k, sizeof list - k, "%s%s", t ? ", " : "", traits[t].name);
    return dt_error(DT_ERR_INVALID, "unknown element type '%s': expected one of %s", s, list);
}

dt_status dt_dtype_from_st(const char *st_name, dt_dtype *out) {
    for (int t = 0; st_name && t < DT_DTYPE_COUNT; t++)
        if (strcmp(st_name, traits[t].st_name) == 0) { *out = (dt_dtype)t; return DT_OK; }
    return dt_error(DT_ERR_FORMAT, "unknown dtype \"%s\"", st_name ? st_name : "(null)");
}

int dt_dtype_from_npy(const char *code, dt_dtype *out) {
    for (int t = 0; code && t < DT_DTYPE_COUNT; t++)
        if (traits[t].npy && strcmp(code, traits[t].npy + 1) == 0) { *out = (dt_dtype)t; return 1; }
    return 0;
}

int dt_dtype_from_idx(unsigned code, dt_dtype *out) {
    for (int t = 0; code && t < DT_DTYPE_COUNT; t++)
        if (traits[t].idx == code) { *out = (dt_dtype)t; return 1; }
    return 0;
}
