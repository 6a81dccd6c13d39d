/*
 * cpu_gemm_avx512.c: the single-threaded GEMM block of cpu_gemm.c in AVX-512 (F).
 *
 * OpenBLAS picks its kernels by CPU type once, when it loads (an environment may pin
 * an older type: OPENBLAS_CORETYPE=Haswell runs AVX2 kernels, about half the FMA width
 * of an AVX-512 machine), and it packs both panels again at every call, which costs
 * the small products of a transformer (384 x 384 x 128, attention's 64 x 64 x 32) a
 * sixth of their time. This block is the classic scheme in a few lines:
 *
 *   for each KC-deep slice of K:   pack op(B)[slice, 0..N) in NR-wide strips
 *     for each MC-tall slice of M:
 *       for each strip pair:       MR x NR outputs held in 16 registers, one FMA per k
 *
 * A is read in place (the tile broadcasts one element of each of its MR rows per k:
 * MR streams, as many cache lines per k as a packed strip's); only a last strip of
 * fewer than MR rows is copied, padded with zeros.
 *
 * Every output is summed in the same order whatever the shape or position: k rising
 * within a slice (one FMA each, no other rounding), then C += alpha * sum per slice,
 * slices in order. So an output's bits depend on its row of A, its column of B and K
 * only: not on M, N, the block grid or the thread (cpu_gemm.c's rule), and a product
 * split by rows (micro-batches) gives the rows of the whole one.
 *
 * Taken when the CPU has AVX-512 F and the compiler knows it (GCC, Clang on x86-64);
 * otherwise cpu_gemm.c calls OpenBLAS. A device opened with openblas_gemm set
 * (DT_CPU_GEMM=openblas, dt_device_opts_env) calls OpenBLAS anyway (dt_cpu_gemm_own).
 */
#include "cpu.h"

#include <pthread.h>
#include <stdint.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#include "cpu_avx512.h"

#define MR 8            /* rows of a register tile */
#define NR 32           /* columns: two vectors of 16 */
#define KC 512          /* depth of a slice: the B strip (KC x NR, 64 KiB) in L1/L2 */
#define MC 128          /* rows of A per pass over the B strips (MC x KC, 256 KiB, in L2) */
#define NC 1024         /* columns packed at once (KC x NC, 2 MiB) */

static int want = 1, has;   /* dt_cpu_gemm_own's choice; the CPU's AVX-512 F */
static pthread_once_t probed = PTHREAD_ONCE_INIT;

static void probe(void) { has = __builtin_cpu_supports("avx512f"); }

void dt_cpu_gemm_own(int on) { want = on; }

int dt_cpu_has_avx512f(void) {
    pthread_once(&probed, probe);
    return has;
}

int dt_cpu_gemm_own_on(void) { return want && dt_cpu_has_avx512f(); }

/* op(A)[i0 .. i0 + m, k0 .. k0 + kc), m <= MR rows, into one strip dst[k*MR + i],
 * rows past m zero. */
static void pack_a(int transA, const float *A, int lda, int i0, int m, int k0, int kc, float *dst) {
    for (int k = 0; k < kc; k++)
        for (int i = 0; i < MR; i++)
            dst[(size_t)k * MR + i] = i >= m ? 0.0f
                                    : transA ? A[(size_t)(k0 + k) * lda + i0 + i] : A[(size_t)(i0 + i) * lda + k0 + k];
}

/* op(B)[k0 .. k0 + kc, j0 .. j0 + n) into strips of NR columns: strip s holds
 * dst[s*kc*NR + k*NR + j], columns past n zero. B^T's rows are read 16 floats at a
 * time and transposed in registers, 16 x 16 at once. */
__attribute__((target("avx512f")))
static void pack_b(int transB, const float *B, int ldb, int k0, int kc, int j0, int n, float *dst) {
    for (int s = 0; s < n; s += NR, dst += (size_t)kc * NR) {
        int c = n - s < NR ? n - s : NR;
        if (transB) {
            for (int kb = 0; kb < kc; kb += 16) {
                int w = kc - kb < 16 ? kc - kb : 16;
                __mmask16 m = (__mmask16)((1u << w) - 1);
                for (int h = 0; h < NR; h += 16) {
                    __m512 r[16];
#pragma GCC unroll 16
                    for (int j = 0; j < 16; j++)
                        r[j] = h + j < c ? _mm512_maskz_loadu_ps(m, B + (size_t)(j0 + s + h + j) * ldb + k0 + kb)
                                         : _mm512_setzero_ps();
                    dt_cpu_transpose16(r);
                    for (int k = 0; k < w; k++) _mm512_store_ps(dst + (size_t)(kb + k) * NR + h, r[k]);
                }
            }
        } else {   /* rows of 32 in two vectors (memcpy's rep movs costs more than it moves) */
            __mmask16 m0 = c >= 16 ? 0xffff : (__mmask16)((1u << c) - 1);
            __mmask16 m1 = c >= NR ? 0xffff : c <= 16 ? 0 : (__mmask16)((1u << (c - 16)) - 1);
            for (int k = 0; k < kc; k++) {
                const float *src = B + (size_t)(k0 + k) * ldb + j0 + s;
                _mm512_store_ps(dst + (size_t)k * NR, _mm512_maskz_loadu_ps(m0, src));
                _mm512_store_ps(dst + (size_t)k * NR + 16, _mm512_maskz_loadu_ps(m1, src + 16));
            }
        }
    }
}

/* The register tile, written out (arrays of vectors would live on the stack): AV(i) is
 * element (row i, this k) of the A strip, defined by each tile below. */
#define ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define T_FMA(i) { __m512 x = _mm512_set1_ps(AV(i)); c0_##i = _mm512_fmadd_ps(x, b0, c0_##i); c1_##i = _mm512_fmadd_ps(x, b1, c1_##i); }
#define T_LOOP(step_a) \
    ROWS(T_ZERO) \
    for (int k = 0; k < kc; k++, b += NR, step_a) { \
        __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16); \
        ROWS(T_FMA) \
    } \
    __m512 al = _mm512_set1_ps(alpha); \
    __mmask16 k0 = n >= 16 ? 0xffff : (__mmask16)((1u << n) - 1); \
    __mmask16 k1 = n >= NR ? 0xffff : n <= 16 ? 0 : (__mmask16)((1u << (n - 16)) - 1); \
    ROWS(T_STORE)

/* C[0..m, 0..n) (m <= MR, n <= NR, row stride ldc) = alpha * a.b (first: the slice is
 * the first of K and beta is 0) or C + alpha * a.b, b an NR strip of depth kc and a MR
 * rows of depth kc: tile_cols reads row i at depth k from a[k * lda + i] (a packed
 * strip, lda = MR, or op(A) = A^T in place), tile_rows from a[i * lda + k] (A in place:
 * A is never packed but for a last strip of fewer than MR rows). */
#define AV(i) a[i]
__attribute__((target("avx512f")))
static void tile_cols(int kc, const float *a, int lda, const float *b, float *C, int ldc, int m, int n, float alpha,
                      int first) {
    T_LOOP(a += lda)
}
#undef AV
#define AV(i) a[(size_t)(i) * lda]
__attribute__((target("avx512f")))
static void tile_rows(int kc, const float *a, int lda, const float *b, float *C, int ldc, int m, int n, float alpha,
                      int first) {
    T_LOOP(a++)
}
#undef AV

int dt_cpu_gemm_avx512(int transA, int transB, int M, int N, int K, float alpha,
                       const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    if (!want) return 0;
    pthread_once(&probed, probe);
    if (!has || M <= 0 || N <= 0 || K <= 0) return 0;
    int nc = N < NC ? N : NC;
    size_t bsz = (size_t)KC * ((nc + NR - 1) / NR * NR), asz = (size_t)KC * MR;
    float *bp = dt_cpu_scratch(3, bsz + asz + 16), *ap;
    if (!bp) return 0;
    bp = (float *)(((uintptr_t)bp + 63) & ~(uintptr_t)63);
    ap = bp + bsz;
    if (beta != 0.0f && beta != 1.0f)
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] *= beta;
    for (int j0 = 0; j0 < N; j0 += NC) {
        int n = N - j0 < NC ? N - j0 : NC;
        for (int k0 = 0; k0 < K; k0 += KC) {
            int kc = K - k0 < KC ? K - k0 : KC, first = k0 == 0 && beta == 0.0f;
            pack_b(transB, B, ldb, k0, kc, j0, n, bp);
            for (int i0 = 0; i0 < M; i0 += MC) {
                int m = M - i0 < MC ? M - i0 : MC;
                int whole = m / MR * MR;   /* rows read in place; the rest packed */
                if (whole < m) pack_a(transA, A, lda, i0 + whole, m - whole, k0, kc, ap);
                for (int js = 0; js < n; js += NR) {
                    const float *b = bp + (size_t)js * kc;
                    float *c = C + (size_t)i0 * ldc + j0 + js;
                    int w = n - js < NR ? n - js : NR;
                    for (int is = 0; is < whole; is += MR) {
                        if (transA) tile_cols(kc, A + (size_t)k0 * lda + i0 + is, lda, b, c + (size_t)is * ldc, ldc, MR, w, alpha, first);
                        else tile_rows(kc, A + (size_t)(i0 + is) * lda + k0, lda, b, c + (size_t)is * ldc, ldc, MR, w, alpha, first);
                    }
                    if (whole < m) tile_cols(kc, ap, MR, b, c + (size_t)whole * ldc, ldc, m - whole, w, alpha, first);
                }
            }
        }
    }
    return 1;
}

#else

void dt_cpu_gemm_own(int on) { (void)on; }
int  dt_cpu_has_avx512f(void) { return 0; }
int  dt_cpu_gemm_own_on(void) { return 0; }

int dt_cpu_gemm_avx512(int transA, int transB, int M, int N, int K, float alpha,
                       const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    (void)transA, (void)transB, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda;
    (void)B, (void)ldb, (void)beta, (void)C, (void)ldc;
    return 0;
}

#endif
