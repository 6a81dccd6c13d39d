/*
 * cpu_gemm.c: row-major SGEMM over OpenBLAS, parallel and thread-count independent.
 *
 * OpenBLAS's own threading splits the work by thread count, and its sgemm returns
 * different bits with 1 and 2 threads on training shapes (measured with 0.3.21), so
 * OpenBLAS runs single-threaded here (cpu_ops.c) and we parallelise ourselves: C is
 * cut into a grid of output blocks whose sizes depend on (M, N, K) only, never on
 * the thread count; each block is one single-threaded cblas_sgemm over the FULL K
 * (K is never split: that would change the summation order), and OpenMP spreads the
 * blocks over the threads. Whichever thread computes a block, its bits are the same.
 *
 * A block is computed by dtrain's own AVX-512 kernel where the CPU has AVX-512 F
 * (cpu_gemm_avx512.c: it sums every output in an order that depends on K only), by
 * OpenBLAS otherwise. Blocks are about 512 x 512 outputs, and a product gets at least
 * 2 (cut down to 64-wide blocks if need be): every block is one call that packs its panels
 * of A and B again, so on one thread the fewer the blocks the better (the gpt's
 * 384 x 384 x 128 product costs ~10% more as four 192 x 192 blocks than as two
 * 192 x 384 ones, and the default gpt on 2 processes runs ~10% faster), while two
 * near-equal blocks still share evenly between two threads. The count grows with
 * the output (2048 x 2048: 16 blocks), not with the thread count. On one thread the
 * own kernel takes the whole product in one call instead (dt_cpu_sgemm): its bits do
 * not depend on the blocks.
 */
#include "cpu.h"

#include <cblas.h>
#include "dtype.h"
#include <string.h>

#define GEMM_TILE 512                    /* target block edge */
#define GEMM_MIN_TILE 64                 /* smallest block edge when splitting further */
#define GEMM_MIN_BLOCKS 2                /* aim for at least this many blocks */
#define GEMM_SERIAL_WORK (1LL << 21)     /* below this many multiply-adds: one block */

void dt_cpu_gemm1(int transA, int transB, int M, int N, int K, float alpha,
                  const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    if (M == 0 || N == 0) return;
    if (K == 0) {   /* C = beta*C; BLAS implementations disagree on K = 0 */
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
        return;
    }
    if (dt_cpu_gemm_avx512(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) return;
    if (beta == 0.0f) {
        /* OpenBLAS clears C for beta = 0 in a pass of its own (sgemm_beta, 6% of the
         * default gpt's time on one thread) that memset does several times faster; its
         * kernel adds to C either way, so beta = 1 over zeros gives the same bits
         * (checked with cmp on the mlp, cnn and gpt weights). The gpt's 384 x 384 x 128
         * product: 5-9% faster; training on one thread, medians of interleaved runs:
         * cnn +12%, gpt +4%, mlp +5%. */
        for (int i = 0; i < M; i++) memset(C + (size_t)i * ldc, 0, (size_t)N * sizeof *C);
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans,
                M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static dt_status gemm_check(const char *fn, int transA, int transB, int M, int N, int K,
                            const float *A, int lda, const void *B, int ldb, const float *C, int ldc) {
    if (M < 0 || N < 0 || K < 0)
        return dt_error(DT_ERR_INVALID, "cpu %s: negative size M=%d N=%d K=%d", fn, M, N, K);
    int acols = transA ? M : K, bcols = transB ? K : N;
    if (lda < (acols > 1 ? acols : 1) || ldb < (bcols > 1 ? bcols : 1) || ldc < (N > 1 ? N : 1))
        return dt_error(DT_ERR_INVALID, "cpu %s: leading dimension too small (lda=%d ldb=%d ldc=%d for M=%d N=%d K=%d, transA=%d transB=%d)",
                        fn, lda, ldb, ldc, M, N, K, transA, transB);
    if ((M > 0 && N > 0 && !C) || (M > 0 && N > 0 && K > 0 && (!A || !B)))
        return dt_error(DT_ERR_INVALID, "cpu %s: NULL matrix pointer", fn);
    return DT_OK;
}

/* Split `n` into pieces of about `tile`, rounded up to 16 (one AVX-512 vector). */
static int gemm_piece(int n, int tile) {
    int parts = (n + tile - 1) / tile;
    if (parts < 1) parts = 1;
    int piece = (n + parts - 1) / parts;
    piece = (piece + 15) & ~15;
    return piece > 0 ? piece : 1;
}

/* The block grid of an M x N output: tiles of about GEMM_TILE, halved along the longer
 * side (down to GEMM_MIN_TILE) until there are GEMM_MIN_BLOCKS blocks, so a 256x128
 * output still gives two threads work. A function of the shape only. */
static void gemm_grid(int M, int N, int K, int *mb, int *nb) {
    *mb = M;
    *nb = N;
    if ((long long)M * N * (K > 0 ? K : 1) < GEMM_SERIAL_WORK) return;
    int tm = GEMM_TILE, tn = GEMM_TILE;
    for (;;) {
        *mb = gemm_piece(M, tm);
        *nb = gemm_piece(N, tn);
        long long blocks = (long long)((M + *mb - 1) / *mb) * ((N + *nb - 1) / *nb);
        if (blocks >= GEMM_MIN_BLOCKS) return;
        if (*mb >= *nb && tm > GEMM_MIN_TILE && M > GEMM_MIN_TILE) tm /= 2;
        else if (tn > GEMM_MIN_TILE && N > GEMM_MIN_TILE) tn /= 2;
        else if (tm > GEMM_MIN_TILE && M > GEMM_MIN_TILE) tm /= 2;
        else return;
    }
}

/* The block grid of one product, each block a call of `block` (dt_cpu_gemm1 or
 * dt_cpu_gemm1_bf16) on one thread. */
dt_status dt_cpu_gemm_blocks(const char *fn, dt_cpu_gemm_block block, int b16, int transA, int transB, int M, int N,
                             int K, float alpha, const float *A, int lda, const void *B, int ldb, float beta, float *C,
                             int ldc) {
    DT_TRY(gemm_check(fn, transA, transB, M, N, K, A, lda, B, ldb, C, ldc));
    if (M == 0 || N == 0) return DT_OK;
    int mb, nb;
    gemm_grid(M, N, K, &mb, &nb);
    int rb = (M + mb - 1) / mb, cb = (N + nb - 1) / nb, nblocks = rb * cb, failed = 0;
    int nt = dt_cpu_threads();
    if (nt > nblocks) nt = nblocks;
    #pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1) reduction(| : failed)
    for (int blk = 0; blk < nblocks; blk++) {
        int bi = blk / cb, bj = blk % cb;
        int i0 = bi * mb, j0 = bj * nb;
        int m = M - i0 < mb ? M - i0 : mb, n = N - j0 < nb ? N - j0 : nb;
        const float *a = transA ? A + i0 : A + (size_t)i0 * lda;
        const char *b = (const char *)B + (transB ? (size_t)j0 * ldb : (size_t)j0) * (b16 ? 2 : 4);
        failed |= !block(transA, transB, m, n, K, alpha, a, lda, b, ldb, beta, C + (size_t)i0 * ldc + j0, ldc);
    }
    if (failed) return dt_error(DT_ERR_NOMEM, "cpu %s: out of memory for the packed panels of a %d x %d x %d product",
                                fn, M, N, K);
    return DT_OK;
}

static int gemm1_f32(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda, const void *B,
                     int ldb, float beta, float *C, int ldc) {
    dt_cpu_gemm1(transA, transB, M, N, K, alpha, A, lda, (const float *)B, ldb, beta, C, ldc);
    return 1;
}

dt_status dt_cpu_sgemm(int transA, int transB, int M, int N, int K, float alpha,
                       const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    if (dt_cpu_threads() == 1 && dt_cpu_gemm_own_on()) {
        /* One thread: the whole product in one call of the own kernel, whose bits do not
         * depend on the grid (cpu_gemm_avx512.c), so each slice of B is packed once, not
         * once per block of rows: the default gpt on 2 processes x 1 thread 2-4 % faster.
         * OpenBLAS keeps the grid (its bits may follow the block's shape). */
        DT_TRY(gemm_check("sgemm", transA, transB, M, N, K, A, lda, B, ldb, C, ldc));
        dt_cpu_gemm1(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return DT_OK;
    }
    return dt_cpu_gemm_blocks("sgemm", gemm1_f32, 0, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* ---- the kernel choice (DT_CPU_GEMM, ops.h dt_device_opts.cpu_gemm) ---- */

static int choice = DT_CPU_GEMM_AUTO;   /* what the last opening chose */

dt_status dt_cpu_gemm_select(int c) {
    if (c == DT_CPU_GEMM_AVX512 && !dt_cpu_has_avx512f())
        return dt_error(DT_ERR_UNSUPPORTED, "DT_CPU_GEMM=avx512: this CPU (or this build's compiler) has no AVX-512 F; "
                        "auto or openblas run here");
    if (c == DT_CPU_GEMM_AVX512BF16 && !dt_cpu_has_avx512bf16())
        return dt_error(DT_ERR_UNSUPPORTED, "DT_CPU_GEMM=avx512bf16: this CPU (or this build's compiler) has no "
                        "AVX512-BF16 (vdpbf16ps); auto, avx512 or openblas run here");
    dt_cpu_gemm_own(c != DT_CPU_GEMM_OPENBLAS);
    choice = c;
    return DT_OK;
}

int dt_cpu_gemm_bf16_on(void) {
    return (choice == DT_CPU_GEMM_AUTO || choice == DT_CPU_GEMM_AVX512BF16) && dt_cpu_has_avx512bf16();
}

const char *dt_cpu_gemm_name(int dtype) {
    if (dtype == DT_BF16 && dt_cpu_gemm_bf16_on()) return "avx512-bf16";
    return dt_cpu_gemm_own_on() ? "avx512" : "openblas";
}
