/*
 * cpu_gemm_bf16.c: the GEMM block of bf16 products on AVX512-BF16 (vdpbf16ps).
 *
 * With --precision bf16 the operands of every matrix product hold bf16 values (lowp.h
 * rounds them). On a CPU with AVX512-BF16 one instruction, vdpbf16ps, multiplies 16
 * pairs of bf16 values per lane and adds both products to an f32 accumulator: twice
 * the multiply-adds of an f32 FMA, on operands of half the bytes. This file is
 * cpu_gemm_avx512.c's scheme with K taken in pairs:
 *
 *   for each KC-deep slice of K:   pack op(A)[0..M, slice] in MR-row strips of pairs
 *     for each NC-wide slice of N: pack op(B)[slice, cols] in NR-wide strips of pairs
 *       for each MC-tall slice of M, each strip and each MR rows:
 *                                  MR x NR outputs in 24 registers, one vdpbf16ps per pair
 *
 * A pair is one 32-bit word: the bf16 of depth k in its low half, of depth k + 1 in its
 * high half (a zero past an odd K). The instruction adds the high product first, then
 * the low one, each product exact in f32 and each sum rounded to nearest even, inputs
 * and results below f32's normal range taken as zero (the Intel SDM's definition; it
 * neither reads nor sets MXCSR). So an output is summed in one order, fixed by K:
 *
 *   acc = 0; for p rising: acc += a[2p+1] b[2p+1]; acc += a[2p] b[2p]   (within a slice)
 *   C = alpha * acc (first slice, beta 0), else C + alpha * acc         (slices in order)
 *
 * whatever M, N, the block grid (cpu_gemm.c) or the thread, as the f32 kernel's rule
 * asks (docs/DESIGN.md rule 2): rows split into micro-batches give the rows of the whole
 * product. tests/test_amp.c holds the kernel to a scalar model of that order bit for bit.
 * The bits differ from the f32 kernel's on the same rounded values (another order and
 * the flush to zero), so the choice is made once per process (dt_cpu_gemm_select) and
 * named on the start line; a run resumed on a CPU without the instruction continues on
 * the f32 kernel, as one resumed on another BLAS would.
 *
 * Operands are narrowed while packed (vcvtne2ps2bf16: nearest even, so values that are
 * already bf16 are kept exactly); A is packed too, unlike the f32 kernel, because a
 * broadcast needs its pair in one word, and in strips of MR rows depth by depth, so a
 * tile reads one stream of A, not MR (gpt2's products 1.52x -> 1.65x f32's rate, the
 * gpt's 1.39x -> 1.43x: bench/gemm_rate -t 2, three alternating rounds, Zen 5).
 */
#include "cpu.h"

#include <pthread.h>
#include <stdint.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#include "cpu_avx512.h"

#define MR 12           /* rows of a register tile */
#define NR 32           /* columns: two vectors of 16 */
#define KC DT_CPU_GEMM_BF16_KC   /* depth of a slice (even: a pair never straddles two) */
#define KP (KC / 2)     /* pairs of a slice: a B strip is KP x NR words, 32 KiB, in L1 */
#define MC 144          /* rows of A per pass over the B strips (MC x KP words, 144 KiB, in L2) */
#define NC 1024         /* columns packed at once (KP x NC words, 1 MiB) */

#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))

int dt_cpu_has_avx512bf16(void) {
    static int has = -1;
    if (has < 0) has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                       __builtin_cpu_supports("avx512bf16");
    return has;
}

/* 16 pairs from 32 floats at lo (depth k) and hi (depth k + 1), lane j = (lo[j], hi[j]):
 * both narrowed in one instruction (lo to words 0..15, hi to 16..31), then interleaved. */
BF16_TARGET static inline __m512i pairs_of(__m512 lo, __m512 hi) {
    const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                           23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(order, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

/* 16 pairs from 32 consecutive floats at depth k .. k + 31 of one row (w of them read,
 * the rest zero): word p = (x[2p], x[2p+1]), narrowed in order. */
BF16_TARGET static inline __m512i pairs_along(const float *x, int w) {
    __mmask16 m0 = w >= 16 ? 0xffff : (__mmask16)((1u << w) - 1);
    __mmask16 m1 = w >= 32 ? 0xffff : w <= 16 ? 0 : (__mmask16)((1u << (w - 16)) - 1);
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(m1, x + 16), _mm512_maskz_loadu_ps(m0, x));
}

/* op(B)[k0 .. k0 + kc, j0 .. j0 + n) into strips of NR columns of pairs: strip s holds
 * dst[s*kp*NR + p*NR + j] (kp = ceil(kc / 2)), columns past n and the depth past kc zero.
 * B16 (not NULL, transB 0): B held as bf16 words, paired as they are. */
BF16_TARGET static void pack_b(int transB, const float *B, const uint16_t *B16, int ldb, int k0, int kc, int j0, int n,
                               uint32_t *dst) {
    int kp = (kc + 1) / 2;
    for (int s = 0; s < n; s += NR, dst += (size_t)kp * NR) {
        int c = n - s < NR ? n - s : NR;
        if (B16) {      /* rows k and k + 1 of 32 words each, interleaved word by word */
            const __m512i lo16 = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                                  39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
            const __m512i hi16 = _mm512_add_epi16(lo16, _mm512_set1_epi16(16));
            __mmask32 mc = c >= 32 ? 0xffffffffu : (__mmask32)((1u << c) - 1);
            for (int p = 0; p < kp; p++) {
                const uint16_t *lo = B16 + (size_t)(k0 + 2 * p) * ldb + j0 + s;
                __m512i l = _mm512_maskz_loadu_epi16(mc, lo);
                __m512i u = 2 * p + 1 < kc ? _mm512_maskz_loadu_epi16(mc, lo + ldb) : _mm512_setzero_si512();
                _mm512_store_si512(dst + (size_t)p * NR, _mm512_permutex2var_epi16(l, lo16, u));
                _mm512_store_si512(dst + (size_t)p * NR + 16, _mm512_permutex2var_epi16(l, hi16, u));
            }
        } else if (transB) {   /* B^T's row j holds column j: pairs along it, 16 columns x 16 pairs transposed */
            for (int pb = 0; pb < kp; pb += 16) {
                int w = kc - 2 * pb < 32 ? kc - 2 * pb : 32, np = kp - pb < 16 ? kp - pb : 16;
                for (int h = 0; h < NR; h += 16) {
                    __m512 r[16];
                    for (int j = 0; j < 16; j++)
                        r[j] = h + j < c ? (__m512)pairs_along(B + (size_t)(j0 + s + h + j) * ldb + k0 + 2 * pb, w)
                                         : _mm512_setzero_ps();
                    dt_cpu_transpose16(r);
                    for (int p = 0; p < np; p++) _mm512_store_ps((float *)dst + (size_t)(pb + p) * NR + h, r[p]);
                }
            }
        } else {        /* rows k and k + 1 side by side */
            __mmask16 m0 = c >= 16 ? 0xffff : (__mmask16)((1u << c) - 1);
            __mmask16 m1 = c >= NR ? 0xffff : c <= 16 ? 0 : (__mmask16)((1u << (c - 16)) - 1);
            for (int p = 0; p < kp; p++) {
                const float *lo = B + (size_t)(k0 + 2 * p) * ldb + j0 + s, *hi = lo + ldb;
                int odd = 2 * p + 1 < kc;
                for (int h = 0; h < NR; h += 16) {
                    __mmask16 m = h ? m1 : m0;
                    __m512 l = _mm512_maskz_loadu_ps(m, lo + h), u = odd ? _mm512_maskz_loadu_ps(m, hi + h) : _mm512_setzero_ps();
                    _mm512_store_si512(dst + (size_t)p * NR + h, pairs_of(l, u));
                }
            }
        }
    }
}

/* op(A)[i0 .. i0 + m, k0 .. k0 + kc) in strips of MR rows, a strip's pairs depth by
 * depth: row g*MR + i's pair p at dst[g*MR*kp + p*MR + i], so the tile broadcasts its MR
 * words of a depth from one run of 48 bytes (rows past m, up to a multiple of MR, zero). */
BF16_TARGET static void pack_a(int transA, const float *A, int lda, int i0, int m, int k0, int kc, uint32_t *dst,
                               int kp) {
    const __mmask16 strip = (__mmask16)((1u << MR) - 1);
    for (int g = 0; g < m; g += MR, dst += (size_t)MR * kp) {
        int rows = m - g < MR ? m - g : MR;
        if (transA) {   /* A^T's rows k and k + 1 hold depth k and k + 1 of the strip's rows side by side */
            __mmask16 mi = (__mmask16)((1u << rows) - 1);
            for (int p = 0; p < kp; p++) {
                const float *lo = A + (size_t)(k0 + 2 * p) * lda + i0 + g;
                __m512 l = _mm512_maskz_loadu_ps(mi, lo);
                __m512 u = 2 * p + 1 < kc ? _mm512_maskz_loadu_ps(mi, lo + lda) : _mm512_setzero_ps();
                _mm512_mask_storeu_epi32(dst + (size_t)p * MR, strip, pairs_of(l, u));
            }
            continue;
        }
        for (int pb = 0; pb < kp; pb += 16) {   /* 16 pairs of each row, transposed to 16 depths of MR rows */
            int w = kc - 2 * pb < 32 ? kc - 2 * pb : 32, np = kp - pb < 16 ? kp - pb : 16;
            __m512 r[16];
            for (int i = 0; i < 16; i++)
                r[i] = i < rows ? (__m512)pairs_along(A + (size_t)(i0 + g + i) * lda + k0 + 2 * pb, w)
                                : _mm512_setzero_ps();
            dt_cpu_transpose16(r);
            for (int p = 0; p < np; p++)
                _mm512_mask_storeu_epi32(dst + (size_t)(pb + p) * MR, strip, (__m512i)r[p]);
        }
    }
}

/* The register tile: an MR strip of pairs a[p*MR + i], an NR strip of pairs b[p*NR + j]. */
#define ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define T_DOT(i) { __m512bh x = (__m512bh)_mm512_set1_epi32((int)a[i]); \
        c0_##i = _mm512_dpbf16_ps(c0_##i, x, b0); c1_##i = _mm512_dpbf16_ps(c1_##i, x, b1); }

/* C[0..m, 0..n) (m <= MR, n <= NR) = alpha * a.b (first) or C + alpha * a.b */
BF16_TARGET static void tile(int kp, const uint32_t *a, const uint32_t *b, float *C, int ldc, int m, int n, float alpha,
                             int first) {
    ROWS(T_ZERO)
    for (int p = 0; p < kp; p++, a += MR, b += NR) {
        __m512bh b0 = (__m512bh)_mm512_load_si512(b), b1 = (__m512bh)_mm512_load_si512(b + 16);
        ROWS(T_DOT)
    }
    __m512 al = _mm512_set1_ps(alpha);
    __mmask16 k0 = n >= 16 ? 0xffff : (__mmask16)((1u << n) - 1);
    __mmask16 k1 = n >= NR ? 0xffff : n <= 16 ? 0 : (__mmask16)((1u << (n - 16)) - 1);
    ROWS(T_STORE)
}

/* dt_cpu_gemm1_bf16 with B as floats or (B16, transB 0) as bf16 words */
static int gemm1(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                 const uint16_t *B16, int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return 1;
    if (K <= 0) {   /* no products: C = beta C, as the f32 block */
        dt_cpu_gemm1(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return 1;
    }
    if (!dt_cpu_has_avx512bf16() || (B16 && transB)) return 0;
    int nc = N < NC ? N : NC, mp = (M + MR - 1) / MR * MR;
    size_t bsz = (size_t)KP * ((nc + NR - 1) / NR * NR), asz = (size_t)KP * mp;
    uint32_t *bp = (uint32_t *)dt_cpu_scratch(3, bsz + asz + 16), *ap;
    if (!bp) return 0;
    bp = (uint32_t *)(((uintptr_t)bp + 63) & ~(uintptr_t)63);
    ap = bp + bsz;
    if (beta != 0.0f && beta != 1.0f)
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] *= beta;
    for (int k0 = 0; k0 < K; k0 += KC) {   /* every output's slices in order, whatever the loops inside */
        int kc = K - k0 < KC ? K - k0 : KC, kp = (kc + 1) / 2, first = k0 == 0 && beta == 0.0f;
        for (int i0 = 0; i0 < M; i0 += MC)   /* A's slice packed once, in MC-row panels */
            pack_a(transA, A, lda, i0, M - i0 < MC ? M - i0 : MC, k0, kc, ap + (size_t)i0 * kp, kp);
        for (int j0 = 0; j0 < N; j0 += NC) {
            int n = N - j0 < NC ? N - j0 : NC;
            pack_b(transB, B, B16, ldb, k0, kc, j0, n, bp);
            for (int i0 = 0; i0 < M; i0 += MC) {
                int m = M - i0 < MC ? M - i0 : MC;
                for (int js = 0; js < n; js += NR) {
                    const uint32_t *b = bp + (size_t)js * kp;
                    int w = n - js < NR ? n - js : NR;
                    for (int is = 0; is < m; is += MR)
                        tile(kp, ap + (size_t)(i0 + is) * kp, b, C + (size_t)(i0 + is) * ldc + j0 + js, ldc,
                             m - is < MR ? m - is : MR, w, alpha, first);
                }
            }
        }
    }
    return 1;
}

#else

int dt_cpu_has_avx512bf16(void) { return 0; }

static int gemm1(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                 const uint16_t *B16, int ldb, float beta, float *C, int ldc) {
    (void)B16;
    if (M > 0 && N > 0 && K > 0) return 0;
    dt_cpu_gemm1(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return 1;
}

#endif

int dt_cpu_gemm1_bf16(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                      const void *B, int ldb, float beta, float *C, int ldc) {
    return gemm1(transA, transB, M, N, K, alpha, A, lda, (const float *)B, NULL, ldb, beta, C, ldc);
}

int dt_cpu_gemm1_bf16_b16(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                          const void *B, int ldb, float beta, float *C, int ldc) {
    /* K = 0 reads no B: C = beta C through the float path, which does not read it either */
    return gemm1(transA, transB, M, N, K, alpha, A, lda, NULL, (const uint16_t *)B, ldb, beta, C, ldc);
}
