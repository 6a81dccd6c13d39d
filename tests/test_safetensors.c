/* test_safetensors.c: safetensors round trips (dtypes, shapes, metadata), the
 * exact byte layout of a small file, interoperability with an independent
 * reader and writer in Python (json + struct only), corrupt files (each
 * rejected with a message naming the file), atomic writes, and sharded checkpoints
 * (an index and its shards, each bad index or shard refused naming the culprit). */
#include "safetensors.h"
#include "tap.h"
#include "tmpfiles.h"

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A file image from a JSON header (unpadded) and data bytes. */
static unsigned char *make_file(const char *json, const void *data, size_t dlen, size_t *n) {
    size_t jl = strlen(json);
    unsigned char *b = malloc(8 + jl + dlen);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)jl >> (8 * i));
    memcpy(b + 8, json, jl);
    if (dlen) memcpy(b + 8 + jl, data, dlen);
    *n = 8 + jl + dlen;
    return b;
}

/* Count files in dir whose name contains sub. */
static int count_files(const char *sub) {
    DIR *d = opendir(tmp_dir_);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, sub)) n++;
    if (d) closedir(d);
    return n;
}

static void test_roundtrip(void) {
    float f32[6] = {1.5f, -2.25f, 3.0f, 0.0f, 1e-30f, -7.0f};
    double f64[4] = {3.141592653589793, -1e300, 0.0, 2.0};
    int64_t i64[4] = {INT64_MIN, -1, 0, INT64_MAX};
    int32_t i32[3] = {-5, 7, 2147483647};
    uint8_t u8[5] = {0, 1, 127, 128, 255};
    uint16_t bf16[2] = {0x3f80, 0xc000}, f16[3] = {0x3c00, 0xc000, 0x7bff};
    float scalar = 42.0f;
    int64_t s23[2] = {2, 3}, s4[1] = {4}, s22[2] = {2, 2}, s3[1] = {3}, s5[1] = {5}, s2[1] = {2}, s04[2] = {0, 4};
    dt_st_writer *w = NULL;
    is_int(dt_st_writer_init(&w), DT_OK, "writer init");
    ok(dt_st_writer_add(w, "0.weight", DT_F32, 2, s23, f32) == DT_OK &&
       dt_st_writer_add(w, "f64", DT_F64, 1, s4, f64) == DT_OK &&
       dt_st_writer_add(w, "i64", DT_I64, 2, s22, i64) == DT_OK &&
       dt_st_writer_add(w, "i32", DT_I32, 1, s3, i32) == DT_OK &&
       dt_st_writer_add(w, "u8", DT_U8, 1, s5, u8) == DT_OK &&
       dt_st_writer_add(w, "bf16", DT_BF16, 1, s2, bf16) == DT_OK &&
       dt_st_writer_add(w, "f16", DT_F16, 1, s3, f16) == DT_OK &&
       dt_st_writer_add(w, "scalar", DT_F32, 0, NULL, &scalar) == DT_OK &&
       dt_st_writer_add(w, "empty", DT_F32, 2, s04, NULL) == DT_OK &&
       dt_st_writer_add(w, "name \"quoted\" \xc3\xa9\n", DT_U8, 1, s5, u8) == DT_OK,
       "add 10 tensors of 7 dtypes (a scalar, an empty one, an odd name)");
    is_int(dt_st_writer_add(w, "u8", DT_U8, 1, s5, u8), DT_ERR_INVALID, "a duplicate name is refused");
    is_int(dt_st_writer_add(w, "__metadata__", DT_U8, 1, s5, u8), DT_ERR_INVALID, "__metadata__ is refused");
    is_int(dt_st_writer_add(w, "bad", DT_U8, 9, s5, u8), DT_ERR_INVALID, "9 dimensions are refused");
    ok(dt_st_writer_set_meta(w, "format", "pt") == DT_OK && dt_st_writer_set_meta(w, "checksum", "old") == DT_OK &&
       dt_st_writer_set_meta(w, "checksum", "crc32:1234abcd") == DT_OK &&
       dt_st_writer_set_meta(w, "state", "{\"epoch\": 3, \"step\": 7}\t\\") == DT_OK, "set metadata");
    is_int(dt_st_writer_write(w, tmp_path("rt.safetensors")), DT_OK, "write");
    dt_st_writer_free(w);
    ok(count_files(".tmp.") == 0, "no temporary file left behind");

    dt_st_file *f = NULL;
    is_int(dt_st_open(tmp_path("rt.safetensors"), &f), DT_OK, "read it back");
    if (!f) {
        diag("%s", dt_last_error());
        return;
    }
    is_int(dt_st_count(f), 10, "10 tensors");
    dt_st_tensor t;
    int all = 1;
    struct { const char *name; dt_dtype    dt; int ndim; const void *data; size_t n; } want[] = {
        {"0.weight", DT_F32, 2, f32, sizeof f32}, {"f64", DT_F64, 1, f64, sizeof f64},
        {"i64", DT_I64, 2, i64, sizeof i64},      {"i32", DT_I32, 1, i32, sizeof i32},
        {"u8", DT_U8, 1, u8, sizeof u8},          {"bf16", DT_BF16, 1, bf16, sizeof bf16},
        {"f16", DT_F16, 1, f16, sizeof f16},      {"scalar", DT_F32, 0, &scalar, 4},
        {"empty", DT_F32, 2, NULL, 0},            {"name \"quoted\" \xc3\xa9\n", DT_U8, 1, u8, 5},
    };
    for (size_t i = 0; i < 10; i++) {
        if (dt_st_find(f, want[i].name, &t) != DT_OK || t.dtype != want[i].dt || t.ndim != want[i].ndim ||
            t.nbytes != want[i].n || (want[i].n && memcmp(t.data, want[i].data, want[i].n) != 0)) {
            diag("tensor %s differs", want[i].name);
            all = 0;
        }
        dt_st_tensor u;
        if (dt_st_tensor_at(f, i, &u) != DT_OK || strcmp(u.name, want[i].name) != 0) all = 0;
    }
    ok(all, "every tensor: same dtype, rank, bytes, in the order given");
    dt_st_find(f, "0.weight", &t);
    ok(t.shape[0] == 2 && t.shape[1] == 3 && ((uintptr_t)t.data % 64) == 0, "shape (2, 3), data 64-byte aligned");
    dt_st_find(f, "empty", &t);
    ok(t.shape[0] == 0 && t.shape[1] == 4, "empty tensor keeps its shape (0, 4)");
    is_str(dt_st_meta_get(f, "format"), "pt", "metadata format");
    is_str(dt_st_meta_get(f, "checksum"), "crc32:1234abcd", "metadata replaced by a second set");
    is_str(dt_st_meta_get(f, "state"), "{\"epoch\": 3, \"step\": 7}\t\\", "metadata with escapes");
    ok(dt_st_meta_get(f, "nope") == NULL && dt_st_meta_count(f) == 3, "3 metadata pairs, absent key is NULL");
    is_int(dt_st_find(f, "missing", &t), DT_ERR_INVALID, "a missing tensor");
    like(dt_last_error(), "no tensor named \"missing\"", "  message names it");
    const void *d;
    size_t dl;
    dt_st_data_region(f, &d, &dl);
    is_int(dl, 24 + 32 + 32 + 12 + 5 + 4 + 6 + 4 + 0 + 5, "data region is the tensors back to back");
    dt_st_close(f);
}

static void test_layout(void) {
    float v[2] = {1.0f, -2.0f};
    int64_t s2[1] = {2};
    dt_st_writer *w;
    dt_st_writer_init(&w);
    dt_st_writer_add(w, "w", DT_F32, 1, s2, v);
    dt_st_writer_set_meta(w, "k", "v");
    dt_st_writer_write(w, tmp_path("small.safetensors"));
    dt_st_writer_free(w);
    const char *json = "{\"__metadata__\":{\"k\":\"v\"},\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    size_t jl = strlen(json), padded = (jl + 8 + 7) / 8 * 8 - 8;
    unsigned char want[256];
    memset(want, 0, sizeof want);
    want[0] = (unsigned char)padded; /* 80 fits in the low byte */
    memcpy(want + 8, json, jl);
    memset(want + 8 + jl, ' ', padded - jl);
    const unsigned char data[8] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0};
    memcpy(want + 8 + padded, data, 8);
    size_t n;
    unsigned char *got = tmp_slurp(tmp_path("small.safetensors"), &n);
    is_int(padded, 80, "header of 78 JSON bytes padded to 80");
    ok(got && n == 8 + padded + 8 && memcmp(got, want, n) == 0, "file bytes equal the hand-computed layout");
    free(got);
    /* no tensors, no metadata: "{}" padded */
    dt_st_writer_init(&w);
    char *h;
    size_t hl;
    dt_st_writer_header(w, &h, &hl);
    ok(hl == 16 && h[0] == 8 && memcmp(h + 8, "{}      ", 8) == 0, "an empty file is {} padded to 8");
    dt_st_file *f = NULL;
    is_int(dt_st_open_mem(h, hl, "empty", &f), DT_OK, "  and reads back");
    dt_st_close(f);
    free(h);
    dt_st_writer_free(w);
}

static int have_python(void) { return system("python3 -c 'import json, struct' >/dev/null 2>&1") == 0; }

static void test_python(void) {
    if (!have_python()) {
        skip(6, "python3 not available for the interoperability test");
        return;
    }
    /* Python writes a file by the spec with its own choices: tensors listed in
     * another order than their offsets, no padding, pretty JSON. */
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "timeout 30 python3 - '%s' <<'EOF'\n"
             "import json, struct, sys\n"
             "b = struct.pack('<3f', 1.0, 2.5, -3.0)\n"
             "c = struct.pack('<2q', -9, 1 << 40)\n"
             "hdr = {'b.bias': {'dtype': 'I64', 'shape': [2], 'data_offsets': [12, 28]},\n"
             "       '__metadata__': {'format': 'pt', 'note': 'caf\\u00e9'},\n"
             "       'a.weight': {'dtype': 'F32', 'shape': [1, 3], 'data_offsets': [0, 12]}}\n"
             "h = json.dumps(hdr, indent=1).encode()\n"
             "open(sys.argv[1], 'wb').write(struct.pack('<Q', len(h)) + h + b + c)\n"
             "EOF",
             tmp_path("py.safetensors"));
    is_int(system(cmd), 0, "python3 writes a safetensors file with json + struct");
    dt_st_file *f = NULL;
    is_int(dt_st_open(tmp_path("py.safetensors"), &f), DT_OK, "dtrain reads it");
    if (f) {
        dt_st_tensor a, b;
        int good = dt_st_find(f, "a.weight", &a) == DT_OK && dt_st_find(f, "b.bias", &b) == DT_OK &&
                   a.dtype == DT_F32 && a.ndim == 2 && a.shape[1] == 3 && ((const float *)a.data)[1] == 2.5f &&
                   b.dtype == DT_I64 && ((uintptr_t)b.data % 8) == 0 &&
                   ((const int64_t *)b.data)[1] == ((int64_t)1 << 40);
        ok(good, "  values, dtypes and shapes match (I64 at byte 12 comes back aligned)");
        is_str(dt_st_meta_get(f, "note"), "caf\xc3\xa9", "  \\u00e9 in metadata decodes to UTF-8");
        dt_st_close(f);
    } else {
        diag("%s", dt_last_error());
        skip(2, "file not read");
    }
    /* Python reads what dtrain wrote in test_roundtrip. */
    snprintf(cmd, sizeof cmd,
             "timeout 30 python3 - '%s' <<'EOF'\n"
             "import json, struct, sys\n"
             "raw = open(sys.argv[1], 'rb').read()\n"
             "n = struct.unpack('<Q', raw[:8])[0]\n"
             "assert (8 + n) %% 8 == 0\n"
             "hdr = json.loads(raw[8:8 + n].decode('utf-8'))\n"
             "data = raw[8 + n:]\n"
             "t = hdr['0.weight']\n"
             "assert t['dtype'] == 'F32' and t['shape'] == [2, 3], t\n"
             "b, e = t['data_offsets']\n"
             "assert struct.unpack('<6f', data[b:e])[1] == -2.25\n"
             "t = hdr['i64']; b, e = t['data_offsets']\n"
             "assert struct.unpack('<4q', data[b:e])[0] == -2**63\n"
             "assert hdr['__metadata__']['checksum'] == 'crc32:1234abcd'\n"
             "assert hdr['__metadata__']['state'] == '{\"epoch\": 3, \"step\": 7}\\t\\\\'\n"
             "assert 'name \"quoted\" \\u00e9\\n' in hdr\n"
             "assert hdr['scalar']['shape'] == [] and hdr['empty']['shape'] == [0, 4]\n"
             "ends = sorted(v['data_offsets'] for k, v in hdr.items() if k != '__metadata__')\n"
             "assert ends[0][0] == 0 and ends[-1][1] == len(data)\n"
             "assert all(x[1] == y[0] for x, y in zip(ends, ends[1:]))\n"
             "EOF",
             tmp_path("rt.safetensors"));
    is_int(system(cmd), 0, "python3 (json + struct) reads dtrain's file: header, values, metadata, offsets");
    /* And PyTorch, when installed, gets the same numbers from the raw bytes. */
    /* Debian's python3-torch lives under /usr/bin/python3, which another python3 may shadow. */
    const char *torch_py = system("timeout 60 python3 -c 'import torch' >/dev/null 2>&1") == 0 ? "python3"
                           : system("timeout 60 /usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0
                               ? "/usr/bin/python3" : NULL;
    if (torch_py) {
        snprintf(cmd, sizeof cmd,
                 "timeout 60 %s - '%s' <<'EOF'\n"
                 "import json, struct, sys, torch\n"
                 "raw = open(sys.argv[1], 'rb').read()\n"
                 "n = struct.unpack('<Q', raw[:8])[0]\n"
                 "hdr = json.loads(raw[8:8 + n]); data = bytearray(raw[8 + n:])\n"
                 "b, e = hdr['bf16']['data_offsets']\n"
                 "t = torch.frombuffer(data[b:e], dtype=torch.bfloat16)\n"
                 "assert t.tolist() == [1.0, -2.0], t\n"
                 "b, e = hdr['f16']['data_offsets']\n"
                 "assert torch.frombuffer(data[b:e], dtype=torch.float16).tolist() == [1.0, -2.0, 65504.0]\n"
                 "EOF",
                 torch_py, tmp_path("rt.safetensors"));
        is_int(system(cmd), 0, "PyTorch decodes the BF16 and F16 tensors to the expected values");
    } else {
        skip(1, "PyTorch not installed");
    }
}

/* Open a file image; expect a format error whose message contains sub and the label. */
static void reject(const char *json, const void *data, size_t dlen, const char *sub, const char *what) {
    size_t n;
    unsigned char *b = make_file(json, data, dlen, &n);
    dt_st_file *f = (dt_st_file *)1;
    dt_status s = dt_st_open_mem(b, n, "bad.safetensors", &f);
    ok(s == DT_ERR_FORMAT && f == NULL && strstr(dt_last_error(), sub) &&
       strstr(dt_last_error(), "bad.safetensors"), "%s is rejected: %s", what, dt_last_error());
    free(b);
}

static void test_corrupt(void) {
    size_t n;
    unsigned char *good = tmp_slurp(tmp_path("small.safetensors"), &n);
    dt_st_file *f = NULL;
    /* truncation at many cut points, through the file layer */
    size_t cuts[] = {0, 1, 7, 8, 9, 40, 87, 88, 89, 92, 95};
    int all = 1;
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        tmp_spit(tmp_path("cut.safetensors"), good, cuts[i]);
        f = (dt_st_file *)1;
        dt_status s = dt_st_open(tmp_path("cut.safetensors"), &f);
        if (s != DT_ERR_FORMAT || f != NULL || !strstr(dt_last_error(), "cut.safetensors")) {
            diag("cut at %zu: status %d: %s", cuts[i], s, dt_last_error());
            all = 0;
        }
    }
    ok(all, "truncated at 11 cut points (0 to size-1): each rejected naming the file");
    tmp_spit(tmp_path("cut.safetensors"), good, 12);
    dt_st_open(tmp_path("cut.safetensors"), &f);
    like(dt_last_error(), "larger than the rest of the file", "  e.g. %s", dt_last_error());
    /* every single-byte flip of the header: rejected or still well-formed, never a crash */
    int rejected = 0, accepted = 0, named = 1;
    for (size_t i = 0; i < 88; i++) {
        unsigned char *b = malloc(n);
        memcpy(b, good, n);
        b[i] ^= 0x20;
        dt_st_file *g = NULL;
        if (dt_st_open_mem(b, n, "flip.safetensors", &g) == DT_OK) {
            accepted++;
            dt_st_close(g);
        } else {
            rejected++;
            named &= strstr(dt_last_error(), "flip.safetensors") != NULL;
        }
        free(b);
    }
    ok(rejected >= 75 && named, "88 header byte flips: %d rejected with the file named, %d still valid "
       "(flips inside names/values)", rejected, accepted);
    /* header length larger than the file, and absurd */
    unsigned char *b = malloc(n);
    memcpy(b, good, n);
    b[0] = 0xff;
    ok(dt_st_open_mem(b, n, "big", &f) == DT_ERR_FORMAT && strstr(dt_last_error(), "larger than the rest"),
       "header length larger than the file: %s", dt_last_error());
    b[7] = 0x7f;
    ok(dt_st_open_mem(b, n, "huge", &f) == DT_ERR_FORMAT && strstr(dt_last_error(), "100 MB"),
       "header length 2^63: %s", dt_last_error());
    free(b);
    free(good);

    float d[4] = {1, 2, 3, 4};
    reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", d, 8, "expected '}'", "a missing brace");
    reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},}", d, 8, "expected '\"'", "a trailing comma");
    reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,],\"data_offsets\":[0,8]}}", d, 8, "integer", "a comma in a shape");
    reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[02],\"data_offsets\":[0,8]}}", d, 8, "leading zero", "a leading zero");
    reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", d, 8, "non-negative", "a negative dim");
    reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8.0]}}", d, 8, "fraction", "a float offset");
    reject("{\"a\":{\"dtype\":\"F31\",\"shape\":[2],\"data_offsets\":[0,8]}}", d, 8, "unknown dtype \"F31\"",
           "an unknown dtype");
    reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", d, 8, "lacks \"data_offsets\"", "missing data_offsets");
    reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", d, 8, "unexpected or repeated key",
           "an unknown key");
    reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
           "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", d, 8, "appears twice", "a duplicate name");
    reject("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", NULL, 0, "appears twice", "a duplicate metadata key");
    reject("{\"__metadata__\":{\"k\":1}}", NULL, 0, "must be strings", "a numeric metadata value");
    reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
           "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", d, 12, "overlaps", "overlapping offsets");
    reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", d, 8, "gap", "a gap before a tensor");
    reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", d, 8, "past the 8 bytes",
           "offsets past the data");
    reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", d, 8, "needs 12 bytes",
           "a shape that does not match the byte length");
    reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", d, 8, "end before they begin",
           "reversed offsets");
    reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", d, 8, "cover 4 bytes",
           "trailing data no tensor owns");
    reject("{\"\xc3\x28\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", d, 8, "UTF-8", "invalid UTF-8");
    reject(" {}", NULL, 0, "must start with '{'", "a header not starting with '{'");
    reject("{} x", NULL, 0, "after the closing", "text after the header");
    reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}\"", d, 8, "after the closing",
           "a stray quote after the header");
    reject("{\"a\\q\":{}}", NULL, 0, "bad escape", "a bad escape");
    reject("{\"a\\ud800\":{}}", NULL, 0, "surrogate", "an unpaired surrogate");
    reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", d, 4, "too long",
           "9 dimensions");
    reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[18446744073709551615],\"data_offsets\":[0,8]}}", d, 8, "too large",
           "a dimension over INT64_MAX");
    reject("{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", d, 8, "overflow",
           "a shape whose size overflows");
    /* a valid hand-written one with whitespace and escapes is accepted */
    size_t m;
    unsigned char *ok_img = make_file("{ \"a\\u0041\" : { \"shape\" : [ 2 ] , \"data_offsets\" : [ 0 , 8 ] , "
                                      "\"dtype\" : \"F32\" } }   ", d, 8, &m);
    dt_st_tensor t;
    ok(dt_st_open_mem(ok_img, m, "ws", &f) == DT_OK && dt_st_find(f, "aA", &t) == DT_OK && t.nbytes == 8,
       "whitespace, key order and \\u escapes are accepted");
    dt_st_close(f);
    free(ok_img);
    is_int(dt_st_open(tmp_path("does-not-exist"), &f), DT_ERR_IO, "a missing file is an I/O error");
    like(dt_last_error(), "does-not-exist", "  naming it");
    unlink(tmp_path("cut.safetensors"));
}

static void test_atomic(void) {
    const char *p = tmp_path("atomic.bin");
    is_int(dt_write_atomic(p, "first", 5), DT_OK, "atomic write");
    is_int(dt_write_atomic(p, "second!", 7), DT_OK, "atomic overwrite");
    size_t n;
    unsigned char *b = tmp_slurp(p, &n);
    ok(b && n == 7 && memcmp(b, "second!", 7) == 0, "the file holds the second content");
    free(b);
    dt_afile *f = NULL;
    is_int(dt_afile_open(p, &f), DT_OK, "start a write");
    dt_afile_write(f, "partial", 7);
    is_int(count_files("atomic.bin.tmp."), 1, "  a temporary file beside the target while writing");
    dt_afile_abort(f);
    b = tmp_slurp(p, &n);
    ok(b && n == 7 && memcmp(b, "second!", 7) == 0, "abort leaves the old file untouched");
    free(b);
    is_int(count_files(".tmp."), 0, "  and no temporary file");
    /* writing over another file's memory (dt_write_over) */
    const char *from = tmp_path("over-from.bin"), *to = tmp_path("over-to.bin");
    is_int(dt_write_atomic(from, "a longer old content", 20), DT_OK, "a file to write over");
    struct stat sf, st;
    stat(from, &sf);
    is_int(dt_write_over(to, from, "new", 3), DT_OK, "written over it");
    b = tmp_slurp(to, &n);
    ok(b && n == 3 && memcmp(b, "new", 3) == 0, "  the new content alone, cut to its length");
    free(b);
    ok(stat(to, &st) == 0 && st.st_ino == sf.st_ino && stat(from, &sf) != 0, "  in the old file (its inode), moved");
    is_int(dt_write_over(to, from, "again", 5), DT_OK, "  with nothing to write over: a fresh file");
    b = tmp_slurp(to, &n);
    ok(b && n == 5 && memcmp(b, "again", 5) == 0, "  holding the content");
    free(b);
    is_int(dt_write_atomic(from, "target", 6), DT_OK, "a link's target");
    const char *link = tmp_path("over-link.bin");
    ok(symlink(from, link) == 0, "a link to it");
    is_int(dt_write_over(to, link, "via", 3), DT_OK, "written over the link");
    b = tmp_slurp(from, &n);
    ok(b && n == 6 && memcmp(b, "target", 6) == 0, "  leaves the link's target alone");
    free(b);
    ok(lstat(to, &st) == 0 && S_ISREG(st.st_mode) && (b = tmp_slurp(to, &n)) && n == 3 && !memcmp(b, "via", 3),
       "  and writes a regular file");
    free(b);
    const char *dirfrom = tmp_path("over-dir");
    ok(mkdir(dirfrom, 0755) == 0, "a directory where the file to write over would be");
    is_int(dt_write_over(to, dirfrom, "dir", 3), DT_OK, "written over it");
    ok(stat(dirfrom, &st) == 0 && S_ISDIR(st.st_mode) && lstat(to, &st) == 0 && S_ISREG(st.st_mode),
       "  leaves the directory where it was and writes a regular file");
    rmdir(dirfrom);
    unlink(from), unlink(to), unlink(link);
    is_int(dt_write_atomic("/nonexistent-dir/x.safetensors", "x", 1), DT_ERR_IO, "a missing directory is an I/O error");
    like(dt_last_error(), "/nonexistent-dir/x.safetensors", "  naming the path");
    dt_st_writer *w;
    dt_st_writer_init(&w);
    is_int(dt_st_writer_write(w, "/nonexistent-dir/y.safetensors"), DT_ERR_IO, "writer to a missing directory");
    dt_st_writer_free(w);
    unlink(p);
}

/* A header of n one-float tensors, tensor i named "t<(i * 7919) % n>" (every name
 * once, out of order); with dup, the last tensor takes the first one's name. */
static char *many_names_json(int n, int dup) {
    size_t cap = (size_t)n * 80 + 64, len = 0;
    char *json = malloc(cap);
    len += (size_t)snprintf(json + len, cap - len, "{");
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(json + len, cap - len, "%s\"t%d\":{\"dtype\":\"F32\",\"shape\":[1],"
                                "\"data_offsets\":[%d,%d]}", i ? "," : "", dup && i == n - 1 ? 0 : (i * 7919) % n,
                                4 * i, 4 * i + 4);
    snprintf(json + len, cap - len, "}");
    return json;
}

/* Many names: all found by name, and a repeated one among them is named (the
 * reader sorts its name index once, so this stays fast at any count). */
static void test_many_names(void) {
    enum { N = 40000 };
    float *data = calloc(N, sizeof *data);
    for (int i = 0; i < N; i++) data[i] = (float)i;
    char *json = many_names_json(N, 0);
    size_t n;
    unsigned char *b = make_file(json, data, (size_t)N * sizeof(float), &n);
    dt_st_file *f = NULL;
    is_int(dt_st_open_mem(b, n, "many.safetensors", &f), DT_OK, "a header of %d tensors opens", N);
    int found = f != NULL;
    for (int i = 0; found && i < N; i += 997) {
        dt_st_tensor t;
        char name[32];
        snprintf(name, sizeof name, "t%d", (i * 7919) % N);
        found = dt_st_find(f, name, &t) == DT_OK && ((const float *)t.data)[0] == (float)i;
    }
    ok(found, "tensors are found by name among %d", N);
    dt_st_tensor t;
    ok(f && dt_st_find(f, "t40000", &t) == DT_ERR_INVALID, "an absent name is reported");
    dt_st_close(f);
    free(b);
    free(json);
    json = many_names_json(N, 1);
    b = make_file(json, data, (size_t)N * sizeof(float), &n);
    f = (dt_st_file *)1;
    is_int(dt_st_open_mem(b, n, "many.safetensors", &f), DT_ERR_FORMAT, "a name given twice among %d is refused", N);
    like(dt_last_error(), "tensor \"t0\" appears twice", "the message names it");
    ok(f == NULL, "nothing is returned");
    free(b);
    free(json);
    free(data);
}

/* ---- sharded checkpoints: an index and its shards ----------------------------------- */

static const float ix_a[6] = {1, 2, 3, 4, 5, 6}, ix_b[4] = {-1, -2, -3, -4}, ix_d = 9.5f;
static const int64_t ix_c[2] = {7, -8};

/* A shard file in the temp directory holding the tensors named (of a, b, c, d, e). */
static void write_shard(const char *file, const char *names) {
    static const int64_t s23[2] = {2, 3}, s4[1] = {4}, s2[1] = {2};
    dt_st_writer *w = NULL;
    dt_status s = dt_st_writer_init(&w);
    for (const char *n = names; s == DT_OK && *n; n++) {
        if (*n == 'a' || *n == 'e') s = dt_st_writer_add(w, *n == 'a' ? "a" : "e", DT_F32, 2, s23, ix_a);
        if (*n == 'b') s = dt_st_writer_add(w, "b", DT_F32, 1, s4, ix_b);
        if (*n == 'c') s = dt_st_writer_add(w, "c", DT_I64, 1, s2, ix_c);
        if (*n == 'd') s = dt_st_writer_add(w, "d", DT_F32, 0, NULL, &ix_d);
    }
    if (s == DT_OK) s = dt_st_writer_write(w, tmp_path(file));
    dt_st_writer_free(w);
    ok(s == DT_OK, "write shard %s (%s)", file, names);
}

/* Write json as the index file name and open it. */
static dt_status open_index_text(const char *name, const char *json, dt_st_file **f) {
    tmp_spit(tmp_path(name), json, strlen(json));
    return dt_st_open_index(tmp_path(name), f);
}

/* The index json is refused with want, nothing returned, the message naming the index and sub. */
static void bad_index(const char *json, dt_status want, const char *sub, const char *what) {
    dt_st_file *f = (dt_st_file *)1;
    dt_status s = open_index_text("bad.index.json", json, &f);
    ok(s == want && f == NULL && strstr(dt_last_error(), sub) && strstr(dt_last_error(), "bad.index.json"),
       "%s is refused: %s", what, dt_last_error());
}

#define MAP_GOOD "\"b\": \"s2.safetensors\", \"\\u0061\": \"s1.safetensors\", \"c\": \"s1.safetensors\", " \
                 "\"d\": \"s2.safetensors\""

static void test_index_good(void) {
    dt_st_file *f = NULL;
    dt_st_tensor t;
    is_int(open_index_text("good.index.json", "{\"metadata\": {\"total_size\": 64, \"format\": \"pt\", \"x\": -1.5e+3},\n"
                           " \"weight_map\": {" MAP_GOOD "}}\n", &f), DT_OK, "an index of 2 shards opens");
    if (!f) {
        diag("%s", dt_last_error());
        return;
    }
    is_int((int)dt_st_count(f), 4, "it holds the 4 tensors of both shards");
    const char *order[4] = {"b", "d", "a", "c"};   /* s2 is named first, then s1; each in its header order */
    int in_order = 1;
    for (size_t i = 0; i < 4; i++) in_order &= dt_st_tensor_at(f, i, &t) == DT_OK && !strcmp(t.name, order[i]);
    ok(in_order, "shard by shard in the order the map first names them, each in its header order");
    ok(dt_st_find(f, "a", &t) == DT_OK && t.dtype == DT_F32 && t.ndim == 2 && t.shape[1] == 3 &&
       t.nbytes == sizeof ix_a && !memcmp(t.data, ix_a, sizeof ix_a), "find a: F32 [2, 3], its bytes");
    ok(dt_st_find(f, "b", &t) == DT_OK && t.nbytes == sizeof ix_b && !memcmp(t.data, ix_b, sizeof ix_b),
       "find b (the other shard): its bytes");
    ok(dt_st_find(f, "c", &t) == DT_OK && t.dtype == DT_I64 && !memcmp(t.data, ix_c, sizeof ix_c), "find c: I64");
    ok(dt_st_find(f, "d", &t) == DT_OK && t.ndim == 0 && !memcmp(t.data, &ix_d, sizeof ix_d), "find d: a scalar");
    ok(dt_st_find(f, "e", &t) == DT_ERR_INVALID && strstr(dt_last_error(), "good.index.json"),
       "an absent tensor names the index: %s", dt_last_error());
    is_str(dt_st_meta_get(f, "total_size"), "64", "the index's metadata: a number as its text");
    is_str(dt_st_meta_get(f, "x"), "-1.5e+3", "  with a sign, fraction and exponent");
    is_str(dt_st_meta_get(f, "format"), "pt", "  a string");
    const void *d = (const void *)1;
    size_t dl = 1;
    dt_st_data_region(f, &d, &dl);
    ok(d == NULL && dl == 0, "the union has no data region");
    dt_st_close(f);
    is_int(open_index_text("nometa.index.json", "{\"weight_map\":{" MAP_GOOD "}}", &f), DT_OK,
           "metadata is optional");
    ok(f && dt_st_meta_count(f) == 0, "  and then absent");
    dt_st_close(f);
}

static void test_index_bad_json(void) {
    bad_index("", DT_ERR_FORMAT, "expected '{'", "an empty index");
    bad_index("[]", DT_ERR_FORMAT, "expected '{'", "an array");
    bad_index("{}", DT_ERR_FORMAT, "no \"weight_map\"", "an index without weight_map");
    bad_index("{\"weight_map\": {}}", DT_ERR_FORMAT, "\"weight_map\" is empty", "an empty weight_map");
    bad_index("{\"weight_map\": {" MAP_GOOD "}, \"weight_map\": {" MAP_GOOD "}}", DT_ERR_FORMAT,
              "repeated key \"weight_map\"", "two weight_maps");
    bad_index("{\"weight_map\": {" MAP_GOOD "}, \"extra\": 1}", DT_ERR_FORMAT, "unexpected or repeated key \"extra\"",
              "an unknown key");
    bad_index("{\"weight_map\": {" MAP_GOOD ",}}", DT_ERR_FORMAT, "bad safetensors index at byte", "a trailing comma");
    bad_index("{\"weight_map\": {" MAP_GOOD "}} x", DT_ERR_FORMAT, "after the closing", "text after the index");
    bad_index("{\"weight_map\": {\"a\": 1}}", DT_ERR_FORMAT, "weight_map values must be", "a number for a file");
    bad_index("{\"metadata\": {\"k\": null}, \"weight_map\": {" MAP_GOOD "}}", DT_ERR_FORMAT,
              "metadata values must be strings or numbers", "a null metadata value");
    bad_index("{\"metadata\": {\"k\": 01}, \"weight_map\": {" MAP_GOOD "}}", DT_ERR_FORMAT, "leading zero",
              "a number with a leading zero");
    bad_index("{\"metadata\": {\"k\": 1, \"k\": 2}, \"weight_map\": {" MAP_GOOD "}}", DT_ERR_FORMAT,
              "metadata key \"k\" appears twice", "a metadata key given twice");
    bad_index("{\"weight_map\": {" MAP_GOOD ", \"c\": \"s1.safetensors\"}}", DT_ERR_FORMAT,
              "tensor \"c\" appears twice", "a tensor listed twice");
    bad_index("{\"weight_map\": {\"a\": \"s1.safetensors\xff\"}}", DT_ERR_FORMAT, "not valid UTF-8", "bad UTF-8");
}

static void test_index_bad_shards(void) {
    bad_index("{\"weight_map\": {\"a\": \"sub/s1.safetensors\"}}", DT_ERR_FORMAT,
              "tensor \"a\": shard file name \"sub/s1.safetensors\" is not a plain file name", "a shard in a subdirectory");
    bad_index("{\"weight_map\": {\"a\": \"/tmp/s1.safetensors\"}}", DT_ERR_FORMAT, "\"/tmp/s1.safetensors\" is not",
              "an absolute shard path");
    bad_index("{\"weight_map\": {\"a\": \"..\"}}", DT_ERR_FORMAT, "\"..\" is not a plain file name", "a shard \"..\"");
    bad_index("{\"weight_map\": {\"a\": \"\"}}", DT_ERR_FORMAT, "tensor \"a\": an empty shard file name",
              "an empty shard name");
    bad_index("{\"weight_map\": {" MAP_GOOD ", \"e\": \"nope.safetensors\"}}", DT_ERR_IO,
              "shard \"nope.safetensors\"", "a missing shard");
    tmp_spit(tmp_path("junk.safetensors"), "not safetensors at all", 22);
    bad_index("{\"weight_map\": {" MAP_GOOD ", \"e\": \"junk.safetensors\"}}", DT_ERR_FORMAT,
              "junk.safetensors: header length", "an invalid shard (the reader's message)");
    bad_index("{\"weight_map\": {" MAP_GOOD ", \"zz\": \"s1.safetensors\"}}", DT_ERR_FORMAT,
              "weight_map puts tensor \"zz\" in shard \"s1.safetensors\", which does not hold it",
              "a listed tensor its shard does not hold");
    bad_index("{\"weight_map\": {\"b\": \"s2.safetensors\", \"a\": \"s1.safetensors\", \"d\": \"s2.safetensors\"}}",
              DT_ERR_FORMAT, "shard \"s1.safetensors\" holds tensor \"c\", which weight_map does not list",
              "a tensor of a shard the map does not list");
    bad_index("{\"weight_map\": {\"b\": \"s2.safetensors\", \"a\": \"s1.safetensors\", \"c\": \"s2.safetensors\", "
              "\"d\": \"s2.safetensors\"}}", DT_ERR_FORMAT,
              "tensor \"c\" in shard \"s2.safetensors\", which does not hold it (it is in \"s1.safetensors\")",
              "a tensor listed under another shard");
    write_shard("s3.safetensors", "ae");
    bad_index("{\"weight_map\": {" MAP_GOOD ", \"e\": \"s3.safetensors\"}}", DT_ERR_FORMAT,
              "tensor \"a\" is in two shards, \"s1.safetensors\" and \"s3.safetensors\"", "a tensor in two shards");
    FILE *big = fopen(tmp_path("bad.index.json"), "wb");   /* sparse: 64 MiB + 1 of nothing */
    ok(big && fseek(big, 64 << 20, SEEK_SET) == 0 && fputc(' ', big) != EOF && fclose(big) == 0, "a 64 MiB index");
    dt_st_file *f = (dt_st_file *)1;
    ok(dt_st_open_index(tmp_path("bad.index.json"), &f) == DT_ERR_FORMAT && f == NULL &&
       strstr(dt_last_error(), "64 MiB"), "  is refused before it is read: %s", dt_last_error());
}

static void test_index(void) {
    write_shard("s1.safetensors", "ac");
    write_shard("s2.safetensors", "bd");
    test_index_good();
    test_index_bad_json();
    test_index_bad_shards();
    const char *files[] = {"s1.safetensors", "s2.safetensors", "s3.safetensors", "junk.safetensors", "good.index.json",
                           "nometa.index.json", "bad.index.json"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) unlink(tmp_path(files[i]));
}

int main(void) {
    tmp_init("dt_test_st");
    test_roundtrip();
    test_layout();
    test_python();
    test_corrupt();
    test_atomic();
    test_many_names();
    test_index();
    unlink(tmp_path("rt.safetensors"));
    unlink(tmp_path("small.safetensors"));
    unlink(tmp_path("py.safetensors"));
    rmdir(tmp_dir_);
    return done_testing();
}
