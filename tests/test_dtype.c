/* test_dtype.c: the dtype traits table (every row complete, every name reads back
 * to its type) and the f16/bf16 conversions of dtype.h, bit for bit against the
 * converters they replaced (the CPU and CUDA cast kernels' and the collectives'), on
 * every f16 and bf16 value, every rounding tie and its neighbours, subnormals,
 * infinities, NaNs and a sweep over all f32 exponents; and the CPU cast kernels
 * agreeing with the header on the same values. */
#include "dtype.h"
#include "ops.h"
#include "tap.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the converters dtype.h replaced, kept here as the reference ---------------- */

static uint32_t bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float    flt(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* src/cpu/cpu_vec.c and src/cuda/cuda_elem.cu (the same code on both backends) */
static uint16_t old_kernel_f16(float f) {
    uint32_t u = bits(f), sign = (u >> 16) & 0x8000u;
    u &= 0x7fffffffu;
    if (u >= 0x7f800000u) return (uint16_t)(sign | (u > 0x7f800000u ? 0x7e00u | ((u >> 13) & 0x3ffu) : 0x7c00u));
    if (u >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (u < 0x38800000u) return (uint16_t)(sign | (uint32_t)rintf(flt(u) * 16777216.0f));
    u += 0xc8000fffu + ((u >> 13) & 1u);
    return (uint16_t)(sign | (u >> 13));
}

/* src/comm/reduce.c: the subnormal range rounded by adding a magic 0.5 */
static uint16_t old_comm_f16(float ff) {
    uint32_t f = bits(ff), sign = f & 0x80000000u;
    f ^= sign;
    uint16_t o;
    if (f >= (143u << 23)) {
        o = f > (255u << 23) ? 0x7e00 : 0x7c00;
    } else if (f < (113u << 23)) {
        const uint32_t magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
        o = (uint16_t)(bits(flt(f) + flt(magic)) - magic);
    } else {
        uint32_t odd = (f >> 13) & 1u;
        f += ((uint32_t)(15 - 127) << 23) + 0xfffu + odd;
        o = (uint16_t)(f >> 13);
    }
    return (uint16_t)(o | (sign >> 16));
}

/* both: decoding is exact */
static float old_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) return flt(bits((float)m * (1.0f / 16777216.0f)) | sign);
    if (e == 31) return flt(sign | 0x7f800000u | (m << 13));
    return flt(sign | ((e + 112u) << 23) | (m << 13));
}

/* both: bf16 */
static uint16_t old_bf16(float f) {
    uint32_t u = bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* ---- the traits table ------------------------------------------------------------ */

static void test_traits(void) {
    for (int t = 0; t < DT_DTYPE_COUNT; t++) {
        const dt_dtype_traits *d = dt_dtype_traits_of((dt_dtype)t);
        if (!ok(d != NULL, "dtype %d has a row", t)) continue;
        const char *n = d->name ? d->name : "(no name)";
        ok(d->name && d->name[0], "dtype %d has a name (%s)", t, n);
        ok(d->size == 1 || d->size == 2 || d->size == 4 || d->size == 8, "%s: size %zu", n, d->size);
        ok(d->st_name && d->st_name[0], "%s: a safetensors name (%s)", n, d->st_name ? d->st_name : "none");
        /* NumPy has no bf16; every other type has a descr whose byte-order mark fits
         * its size and whose digits are its size */
        if (t == DT_BF16) {
            ok(d->npy == NULL, "bf16: no NumPy descr");
        } else {
            int good = d->npy && strlen(d->npy) == 3 && d->npy[0] == (d->size == 1 ? '|' : '<') &&
                       (size_t)(d->npy[2] - '0') == d->size;
            ok(good, "%s: NumPy descr %s", n, d->npy ? d->npy : "none");
        }
        is_int(dt_dtype_size((dt_dtype)t), (long long)d->size, "%s: dt_dtype_size agrees", n);
        is_str(dt_dtype_name((dt_dtype)t), d->name, "%s: dt_dtype_name agrees", n);
        is_str(dt_dtype_st_name((dt_dtype)t), d->st_name, "%s: dt_dtype_st_name agrees", n);

        /* round trips of every name */
        dt_dtype back = (dt_dtype)-1;
        ok(dt_dtype_parse(d->name, &back) == DT_OK && back == (dt_dtype)t, "%s: parses back", n);
        back = (dt_dtype)-1;
        ok(dt_dtype_from_st(d->st_name, &back) == DT_OK && back == (dt_dtype)t, "%s: %s reads back", n, d->st_name);
        if (d->npy) {
            back = (dt_dtype)-1;
            ok(dt_dtype_from_npy(d->npy + 1, &back) && back == (dt_dtype)t, "%s: %s reads back", n, d->npy);
        }
        if (d->idx) {
            back = (dt_dtype)-1;
            ok(dt_dtype_from_idx(d->idx, &back) && back == (dt_dtype)t, "%s: IDX 0x%02x reads back", n, d->idx);
        }
        /* no two rows share a name in any of the worlds */
        for (int u = 0; u < t; u++) {
            const dt_dtype_traits *e = dt_dtype_traits_of((dt_dtype)u);
            ok(strcmp(e->name, d->name) && strcmp(e->st_name, d->st_name) &&
               (!e->npy || !d->npy || strcmp(e->npy, d->npy)) && (!d->idx || e->idx != d->idx),
               "%s and %s differ in every name", n, e->name);
        }
    }
    /* what the file formats say */
    is_str(dt_dtype_st_name(DT_BF16), "BF16", "bf16 is BF16 in safetensors");
    is_str(dt_dtype_traits_of(DT_F32)->npy, "<f4", "f32 is <f4 in NumPy");
    is_int(dt_dtype_traits_of(DT_F64)->idx, 0x0E, "f64 is 0x0E in IDX");
    ok(dt_dtype_traits_of(DT_F16)->is_float && dt_dtype_traits_of(DT_BF16)->is_float &&
       !dt_dtype_traits_of(DT_I32)->is_float && !dt_dtype_traits_of(DT_BOOL)->is_float, "is_float");
    /* outside the enum */
    ok(dt_dtype_traits_of(DT_DTYPE_COUNT) == NULL && dt_dtype_size(DT_DTYPE_COUNT) == 0 &&
       strcmp(dt_dtype_name((dt_dtype)-1), "?") == 0 && strcmp(dt_dtype_st_name(DT_DTYPE_COUNT), "?") == 0,
       "no row outside the enum");
    dt_dtype t;
    ok(dt_dtype_parse("Float32", &t) == DT_OK && t == DT_F32, "parse is case-insensitive and knows aliases");
    ok(dt_dtype_parse("half", &t) == DT_OK && t == DT_F16, "half is f16");
    ok(dt_dtype_parse("bfloat16", &t) == DT_OK && t == DT_BF16, "bfloat16 is bf16");
    is_int(dt_dtype_parse("f8", &t), DT_ERR_INVALID, "an unknown name is refused");
    like(dt_last_error(), "expected one of f32, f64, f16, bf16", "... listing the names");
    is_int(dt_dtype_from_st("f32", &t), DT_ERR_FORMAT, "safetensors names are case-sensitive");
    ok(!dt_dtype_from_npy("c8", &t) && !dt_dtype_from_idx(0x0A, &t) && !dt_dtype_from_idx(0, &t),
       "unknown NumPy and IDX codes are refused");
}

/* ---- the conversions ------------------------------------------------------------ */

/* f32 -> f16 and bf16 of one value against the old converters; counts mismatches.
 * The collectives' old f16 dropped a NaN's payload (0x7e00 | sign) where the kernels
 * kept it; dtype.h keeps the kernels' bits, so for NaN only the sign and NaN-ness of
 * the collectives' result must agree. */
static void check_one(float f, long *bad_kernel, long *bad_comm, long *bad_bf16) {
    uint16_t h = dt_f32_to_f16(f);
    if (h != old_kernel_f16(f)) (*bad_kernel)++;
    uint16_t c = old_comm_f16(f);
    if (isnan(f) ? (c != (0x7e00 | (h & 0x8000)) || (h & 0x7c00) != 0x7c00 || !(h & 0x3ff)) : h != c) (*bad_comm)++;
    if (dt_f32_to_bf16(f) != old_bf16(f)) (*bad_bf16)++;
}

static void test_conversions(void) {
    long bk = 0, bc = 0, bb = 0, dec = 0, rt = 0, bdec = 0;
    /* every f16 and bf16 value: decoding, and f16 -> f32 -> f16 */
    for (uint32_t v = 0; v < 65536; v++) {
        float a = dt_f16_to_f32((uint16_t)v), b = old_f16_to_f32((uint16_t)v);
        if (bits(a) != bits(b)) dec++;
        if (dt_f32_to_f16(a) != ((v & 0x7c00) == 0x7c00 && (v & 0x3ff) ? (v | 0x200) : v)) rt++;
        if (bits(dt_bf16_to_f32((uint16_t)v)) != v << 16) bdec++;
        check_one(a, &bk, &bc, &bb);
    }
    is_int(dec, 0, "f16 -> f32: all 65536 values decode as before");
    is_int(rt, 0, "f16 -> f32 -> f16 gives every value back (NaNs quieted)");
    is_int(bdec, 0, "bf16 -> f32: all 65536 values are the top half");
    /* the ties: the midpoint between neighbouring f16 values, and one f32 ulp either
     * side, for every positive and negative f16 value (normal, subnormal, near max) */
    long ties = 0;
    for (uint32_t v = 0; v < 65536; v++) {
        if ((v & 0x7c00) == 0x7c00) continue;
        float lo = dt_f16_to_f32((uint16_t)v);
        uint32_t nx = (v & 0x7fff) == 0x7bff ? 0 : v + 1;
        float hi = nx ? dt_f16_to_f32((uint16_t)nx) : (v & 0x8000 ? -65536.0f : 65536.0f);
        float mid = (float)(((double)lo + (double)hi) / 2.0);   /* exact in f32 */
        for (int d = -2; d <= 2; d++) {
            check_one(flt(bits(mid) + (uint32_t)d), &bk, &bc, &bb);
            ties++;
        }
    }
    /* bf16 ties: f32 values whose low half is 0x8000 (exactly between two bf16), +-1, +-2 */
    for (uint32_t v = 0; v < 65536; v++)
        for (int d = -2; d <= 2; d++) check_one(flt((v << 16 | 0x8000u) + (uint32_t)d), &bk, &bc, &bb);
    /* a sweep over all f32 bit patterns with an odd stride: every exponent, NaNs with
     * many payloads, both signs */
    for (uint64_t u = 0; u < (1ull << 32); u += 4099) check_one(flt((uint32_t)u), &bk, &bc, &bb);
    /* named edge cases */
    const float edge[] = { 0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 65504.0f, 65519.99f, 65520.0f, 65536.0f,
                           1e-8f, 5.9604645e-8f, 2.9802322e-8f, 8.940697e-8f, 6.1035156e-5f, 6.1035152e-5f,
                           3.4028235e38f, 1.1754944e-38f, 1e-45f, flt(0x7fc00001u), flt(0xffbfffffu),
                           flt(0x7f800001u), flt(0x7f802000u) };
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) check_one(edge[i], &bk, &bc, &bb);
    diag("%ld tie neighbourhoods checked", ties);
    is_int(bk, 0, "f32 -> f16: bitwise the cast kernels' old results");
    is_int(bc, 0, "f32 -> f16: bitwise the collectives' old results (NaN: same sign, still NaN)");
    is_int(bb, 0, "f32 -> bf16: bitwise the old results");

    /* the rules the header states */
    is_int(dt_f32_to_f16(65520.0f), 0x7c00, "f16 overflow gives inf");
    is_int(dt_f32_to_f16(-1e6f), 0xfc00, "negative overflow gives -inf");
    is_int(dt_f32_to_f16(flt(0x7fc02000u)), 0x7e01, "NaN keeps its top payload bits, quieted");
    is_int(dt_f32_to_f16(flt(0x7f800001u)) & 0x7e00, 0x7e00, "a signalling NaN with a low payload stays NaN");
    is_int(dt_f32_to_bf16(flt(0xff800001u)), 0xffc0, "bf16: signalling NaN quieted, sign kept");
    is_int(dt_f32_to_bf16(3.4e38f), 0x7f80, "bf16 overflow rounds to inf");
    is_int(dt_f32_to_f16(1.0f + 1.0f / 2048), 0x3c00, "f16 tie to even (down)");
    is_int(dt_f32_to_f16(1.0f + 3.0f / 2048), 0x3c02, "f16 tie to even (up)");
    is_int(dt_f32_to_f16(2.9802322e-8f), 0x0000, "subnormal tie to even (0)");
}

/* The CPU backend's cast kernels are the header's conversions. */
static void test_kernels(void) {
    const dt_ops *ops = dt_ops_cpu();
    enum { N = 65536 * 3 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y), *z = malloc(N * sizeof *z);
    uint16_t *h = malloc(N * sizeof *h), *b = malloc(N * sizeof *b);
    if (!x || !y || !z || !h || !b) { ok(0, "out of memory"); return; }
    for (uint32_t i = 0; i < N; i++) x[i] = flt(i < 65536 ? (i << 16) | 0x8000u : i * 21841u + 7u);
    int good = ops->f32_to_f16(h, x, N) == DT_OK && ops->f32_to_bf16(b, x, N) == DT_OK &&
               ops->f16_to_f32(y, h, N) == DT_OK && ops->bf16_to_f32(z, b, N) == DT_OK;
    ok(good, "the cpu cast kernels run");
    long bad = 0;
    for (uint32_t i = 0; i < N; i++)
        bad += h[i] != dt_f32_to_f16(x[i]) || b[i] != dt_f32_to_bf16(x[i]) ||
               bits(y[i]) != bits(dt_f16_to_f32(h[i])) || bits(z[i]) != bits(dt_bf16_to_f32(b[i]));
    is_int(bad, 0, "cpu casts give the header's bits on %d values", N);
    free(x); free(y); free(z); free(h); free(b);
}

int main(void) {
    test_traits();
    test_conversions();
    test_kernels();
    return done_testing();
}
