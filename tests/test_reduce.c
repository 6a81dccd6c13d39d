/* test_reduce.c: f16/bf16 conversions (rounding, subnormals, inf, NaN) and the typed
 * elementwise reductions of reduce.c, in place and out of place, against scalar loops. */
#include "reduce.h"
#include "tap.h"

#include <math.h>
#include <stdint.h>

static uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

int main(void) {
    /* ---- f16 ---- */
    is_int(dt_f32_to_f16(1.0f), 0x3c00, "f16(1) = 0x3c00");
    is_int(dt_f32_to_f16(-2.0f), 0xc000, "f16(-2) = 0xc000");
    is_int(dt_f32_to_f16(65504.0f), 0x7bff, "f16 max is exact");
    is_int(dt_f32_to_f16(65520.0f), 0x7c00, "65520 rounds to inf");
    is_int(dt_f32_to_f16(65519.0f), 0x7bff, "65519 rounds down to max");
    is_int(dt_f32_to_f16(INFINITY), 0x7c00, "inf");
    ok((dt_f32_to_f16(NAN) & 0x7c00) == 0x7c00 && (dt_f32_to_f16(NAN) & 0x3ff), "NaN stays NaN");
    is_int(dt_f32_to_f16(5.9604645e-8f), 0x0001, "smallest subnormal");
    is_int(dt_f32_to_f16(2.9802322e-8f), 0x0000, "half the smallest subnormal ties to even (0)");
    is_int(dt_f32_to_f16(8.940697e-8f), 0x0002, "1.5 x smallest subnormal ties to even (2)");
    /* 1 + 2^-11 is halfway between 1 and 1+2^-10: ties to even -> 1 */
    is_int(dt_f32_to_f16(1.0f + 1.0f / 2048), 0x3c00, "tie rounds to even (down)");
    is_int(dt_f32_to_f16(1.0f + 3.0f / 2048), 0x3c02, "tie rounds to even (up)");
    is_int(dt_f32_to_f16(1.0f + 1.0f / 2048 + 1.0f / 65536), 0x3c01, "above the tie rounds up");
    int roundtrip = 1;
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;   /* NaN payloads */
        if (dt_f32_to_f16(dt_f16_to_f32((uint16_t)h)) != h) { roundtrip = 0; diag("f16 0x%04x fails", h); break; }
    }
    ok(roundtrip, "every non-NaN f16 survives f16 -> f32 -> f16");
    ok(dt_f16_to_f32(0x0001) == ldexpf(1, -24), "subnormal f16 decodes");
    ok(dt_f16_to_f32(0xfc00) == -INFINITY, "-inf decodes");

    /* ---- bf16 ---- */
    is_int(dt_f32_to_bf16(1.0f), 0x3f80, "bf16(1) = 0x3f80");
    is_int(dt_f32_to_bf16(1.0f + 1.0f / 256), 0x3f80, "bf16 tie to even (down)");
    is_int(dt_f32_to_bf16(1.0f + 3.0f / 256), 0x3f82, "bf16 tie to even (up)");
    ok(isnan(dt_bf16_to_f32(dt_f32_to_bf16(NAN))), "bf16 NaN stays NaN");
    is_int(dt_f32_to_bf16(3.4e38f), 0x7f80, "bf16 overflow rounds to inf");
    is_int(fbits(dt_bf16_to_f32(0x4049)), 0x40490000u, "bf16 decodes by shifting");

    /* ---- typed ops ---- */
    enum { N = 37 };   /* odd, not a multiple of any vector width */
    float fa[N], fb[N], fd[N];
    int32_t ia[N], ib[N], id[N];
    uint8_t ua[N], ub[N], ud[N];
    double da[N], db[N], dd[N];
    int64_t la[N], lb[N], ld[N];
    for (int i = 0; i < N; i++) {
        fa[i] = (float)(i - 18) * 0.5f; fb[i] = (float)(i % 7) - 3.0f;
        ia[i] = i * 1000 - 17000; ib[i] = 3 - i;
        ua[i] = (uint8_t)(i * 13); ub[i] = (uint8_t)(200 + i);
        da[i] = i * 0.25 - 4; db[i] = 1.0 / (i + 1);
        la[i] = (int64_t)i << 40; lb[i] = -(int64_t)i * 3;
    }
    int good = 1;
    dt_reduce_apply(DT_SUM, DT_F32, fd, fa, fb, N);
    for (int i = 0; i < N; i++) good &= fd[i] == fa[i] + fb[i];
    ok(good, "f32 sum out of place");
    memcpy(fd, fa, sizeof fd);
    dt_reduce_apply(DT_MAX, DT_F32, fd, fd, fb, N);
    good = 1;
    for (int i = 0; i < N; i++) good &= fd[i] == (fa[i] > fb[i] ? fa[i] : fb[i]);
    ok(good, "f32 max in place (dst == a)");
    memcpy(fd, fb, sizeof fd);
    dt_reduce_apply(DT_MIN, DT_F32, fd, fa, fd, N);
    good = 1;
    for (int i = 0; i < N; i++) good &= fd[i] == (fa[i] < fb[i] ? fa[i] : fb[i]);
    ok(good, "f32 min in place (dst == b)");
    dt_reduce_apply(DT_PROD, DT_I32, id, ia, ib, N);
    good = 1;
    for (int i = 0; i < N; i++) good &= id[i] == ia[i] * ib[i];
    ok(good, "i32 prod");
    dt_reduce_apply(DT_AVG, DT_U8, ud, ua, ub, N);
    good = 1;
    for (int i = 0; i < N; i++) good &= ud[i] == (uint8_t)(ua[i] + ub[i]);
    ok(good, "u8 avg combines as a wrapping sum");
    dt_reduce_apply(DT_SUM, DT_F64, dd, da, db, N);
    good = 1;
    for (int i = 0; i < N; i++) good &= dd[i] == da[i] + db[i];
    ok(good, "f64 sum");
    dt_reduce_apply(DT_MIN, DT_I64, ld, la, lb, N);
    good = 1;
    for (int i = 0; i < N; i++) good &= ld[i] == (la[i] < lb[i] ? la[i] : lb[i]);
    ok(good, "i64 min");

    uint16_t ha[3] = { 0x3c00, 0x4000, 0x7bff }, hb[3] = { 0x3c00, 0xc000, 0x7bff }, hd[3];
    dt_reduce_apply(DT_SUM, DT_F16, hd, ha, hb, 3);
    ok(hd[0] == 0x4000 && hd[1] == 0x0000 && hd[2] == 0x7c00, "f16 sum: 1+1=2, 2-2=0, max+max=inf");
    uint16_t ba[2] = { 0x3f80, 0x4040 }, bb[2] = { 0x3b80, 0x4000 }, bd[2];   /* 1 + 2^-8 ties to 1 */
    dt_reduce_apply(DT_SUM, DT_BF16, bd, ba, bb, 2);
    ok(bd[0] == 0x3f80 && bd[1] == 0x40a0, "bf16 sum rounds to nearest-even (1+2^-8 = 1; 3+2 = 5)");
    dt_reduce_apply(DT_PROD, DT_BF16, bd, bd, bb, 2);
    ok(bd[1] == 0x4120, "bf16 prod in place (5*2 = 10)");

    int32_t iv[4] = { 7, -7, 9, 0 };
    dt_reduce_divide(DT_I32, iv, 4, 2);
    ok(iv[0] == 3 && iv[1] == -3 && iv[2] == 4 && iv[3] == 0, "i32 divide truncates toward zero");
    float fv[2] = { 3, -1 };
    dt_reduce_divide(DT_F32, fv, 2, 4);
    ok(fv[0] == 0.75f && fv[1] == -0.25f, "f32 divide");
    uint16_t hv[1] = { 0x4200 };   /* 3 */
    dt_reduce_divide(DT_F16, hv, 1, 2);
    is_int(hv[0], 0x3e00, "f16 divide (3/2 = 1.5)");
    return done_testing();
}
