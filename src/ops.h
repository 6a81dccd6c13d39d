/*
 * ops.h: the compute interface — one table of kernels per device.
 *
 * Everything that touches tensor data goes through a dt_ops table (docs/DESIGN.md rule 1):
 * the CPU backend (src/cpu/, OpenBLAS + OpenMP) and the CUDA backend (src/cuda/) each
 * fill one. Layers, models, optimizers and DDP are written once against these
 * pointers. Like ggml's backend interface, the table is a struct of function pointers
 * filled with labelled initialisers; here both the struct and the tables are generated
 * from one list of ops (DT_OPS below), so a backend cannot leave an op out.
 * The device registry (dt_ops_get) and the descriptor checks live in src/ops.c.
 *
 * Conventions (every member):
 *   - pointers are device pointers (host memory for "cpu"), float32 unless stated;
 *     integer labels/indices are int32_t; sizes are element counts, never bytes,
 *     except for the memory functions;
 *   - every array is dense and row-major; shapes are given in comments, e.g.
 *     "x is (N, C, H, W)" — the layouts of PyTorch;
 *   - every kernel returns a dt_status; a bad size or NULL pointer gives
 *     DT_ERR_INVALID with a message naming the kernel and the argument;
 *   - scalar results (losses, sums, counts) are written to DEVICE memory, so a GPU
 *     never stalls; read them back with copy_d2h;
 *   - "in place" is allowed only where a comment says so;
 *   - gradient kernels OVERWRITE their outputs (dx, dw, db, ...): the trainer sums
 *     micro-batch gradients in its own fixed tree (docs/DESIGN.md rule 2), so kernels
 *     never accumulate into a gradient behind its back;
 *   - determinism: on a given device, no result depends on the number of threads
 *     (or, on a GPU, the grid size). Every reduction uses a partition fixed by the
 *     shape (per sample, per channel, or fixed-size chunks) combined in a fixed order,
 *     with no atomics. The order may differ between backends: the CUDA backend sums
 *     rows in a warp and columns in row slabs (src/cuda/cuda_impl.h), so those sums
 *     match the CPU's to rounding, not bit for bit.
 *
 * Randomness is counter-based (src/rng.h, Philox4x32-10): a random value is a pure
 * function of (seed, stream, position), so it never depends on the rank, the
 * micro-batch or the thread that computes it.
 */
#ifndef DT_OPS_H
#define DT_OPS_H

#include <stddef.h>
#include <stdint.h>
#include "status.h"
#include "ops_elem.h"

/* Fixed-size chunks of the deterministic sums (sumsq, sumsq_chunks, mse): each chunk is
 * summed in double in a fixed order, and the chunk sums are combined by
 * dt_pairwise_sum. Both backends use this partition, so their sums agree bit for bit. */
#define DT_SUM_CHUNK 4096

/* The pairwise tree over v (n doubles) that combines chunk sums: adjacent pairs, then
 * pairs of pairs, an odd last element carried up; v is overwritten. 0 for n = 0. */
DT_API double dt_pairwise_sum(double *v, size_t n);

/* ---- descriptors for convolution and pooling --------------------------------------- */

/* A 2-d convolution (groups = 1, dilation = 1), as torch.nn.Conv2d.
 *   x is (N, C, H, W), w is (K, C, R, S), bias is (K), y is (N, K, P, Q) with
 *   P = (H + 2*pad_h - R) / stride_h + 1 and Q = (W + 2*pad_w - S) / stride_w + 1.
 * Fill the inputs and call dt_conv2d_desc_init() to check them and set P, Q. */
typedef struct {
    int N, C, H, W;               /* input */
    int K, R, S;                  /* output channels, kernel height and width */
    int stride_h, stride_w;
    int pad_h, pad_w;
    int P, Q;                     /* output height and width (set by dt_conv2d_desc_init) */
} dt_conv2d_desc;

/* A 2-d pooling window (max or average), as torch.nn.MaxPool2d / AvgPool2d
 * (ceil_mode=False; average counts the padding: count_include_pad=True).
 *   x is (N, C, H, W), y is (N, C, P, Q), P = (H + 2*pad_h - kh) / stride_h + 1.
 * PyTorch requires pad <= kernel/2; so do we. */
typedef struct {
    int N, C, H, W;
    int kh, kw;
    int stride_h, stride_w;
    int pad_h, pad_w;
    int P, Q;                     /* set by dt_pool2d_desc_init */
} dt_pool2d_desc;

/* Check a descriptor and compute P, Q; DT_ERR_INVALID names the bad field. */
DT_API dt_status dt_conv2d_desc_init(dt_conv2d_desc *d);
DT_API dt_status dt_pool2d_desc_init(dt_pool2d_desc *d);

/* ---- optimizer hyper-parameters ----------------------------------------------------- */

/* torch.optim.SGD for one step (PyTorch semantics):
 *   g = grad_scale*grad + weight_decay*p
 *   if momentum != 0: buf = first_step ? g : momentum*buf + (1-dampening)*g
 *                     g = nesterov ? g + momentum*buf : buf
 *   p -= lr*g */
typedef struct {
    double lr, momentum, dampening, weight_decay;   /* doubles, as PyTorch's Python floats */
    double grad_scale;            /* multiplies the gradient first (1 = none) */
    int   nesterov;               /* 0 or 1 */
    int   first_step;             /* 1 on the first step: buf = g (buf may hold garbage) */
    const float *gate;            /* NULL, or a device float: 0 there and the step does nothing
                                   * (step_checks' out[2]: decided on the device) */
} dt_sgd_args;

/* torch.optim.AdamW for one step (PyTorch semantics, amsgrad=False):
 *   g = grad_scale*grad;  p *= 1 - lr*weight_decay
 *   m = beta1*m + (1-beta1)*g;  v = beta2*v + (1-beta2)*g*g
 *   p -= lr/(1-beta1^step) * m / (sqrt(v)/sqrt(1-beta2^step) + eps) */
typedef struct {
    double  lr, beta1, beta2, eps, weight_decay;    /* doubles, as PyTorch's Python floats */
    double  grad_scale;           /* multiplies the gradient first (1 = none) */
    int64_t step;                 /* 1 on the first step */
    const float *gate;            /* as dt_sgd_args' */
} dt_adamw_args;

/* AdamW in float, shared by the backends: the scalars rounded once from the doubles
 * (as PyTorch computes them in Python), then the same expression for every element. */
typedef struct { float step_size, bc2_sqrt, decay, b1, b2, omb1, omb2, eps, gs; } dt_adamw_f;

static inline dt_adamw_f dt_adamw_floats(const dt_adamw_args *a) {
    const double bc1 = 1.0 - pow(a->beta1, (double)a->step), bc2 = 1.0 - pow(a->beta2, (double)a->step);
    dt_adamw_f k = { (float)(a->lr / bc1), (float)sqrt(bc2), (float)(1.0 - a->lr * a->weight_decay),
                     (float)a->beta1, (float)a->beta2, (float)(1.0 - a->beta1), (float)(1.0 - a->beta2),
                     (float)a->eps, (float)a->grad_scale };
    return k;
}

static inline DT_HD void dt_adamw_elem(float *p, float *m, float *v, float grad, dt_adamw_f k) {
    float g = k.gs * grad;
    float pi = *p * k.decay;
    float mi = k.b1 * *m + k.omb1 * g;
    float vi = k.b2 * *v + k.omb2 * g * g;
    *m = mi;
    *v = vi;
    *p = pi - k.step_size * (mi / (sqrtf(vi) / k.bc2_sqrt + k.eps));
}

/* Clipping by the global gradient norm, as every path computes it (the host's clipping in
 * optim.c, shard.c and train_pipe.c, both backends' step_checks), for the same bits: the
 * norm from its square (the pairwise sum of the chunk sums) and the loss scale's inverse,
 * and the coefficient the gradient is scaled by where it is below 1 (1 when max_norm <= 0;
 * a NaN norm gives a NaN coefficient, which scales nothing). */
static inline DT_HD float dt_clip_norm(double sq, float unscale) { return sqrtf((float)sq) * unscale; }
static inline DT_HD float dt_clip_coef(float max_norm, float norm) {
    return max_norm > 0.0f ? max_norm / (norm + 1e-6f) : 1.0f;
}

/* The rotation of rotary position embedding's pair (i, i + D/2) at position pos: the
 * angle pos * theta^(-2i/D) and its cosine and sine in double, rounded to float, so both
 * backends get the same tables (Hugging Face computes them in float32, within an ulp or
 * two of these). */
static inline DT_HD void dt_rope_angle(double pos, int i, int D, float theta, float *c, float *s) {
    double a = pos * pow((double)theta, -2.0 * (double)i / (double)D);
    *c = (float)cos(a);
    *s = (float)sin(a);
}

/* ---- the op list ---------------------------------------------------------------------
 * DT_OPS(X) names every compute op once, as X(name, (parameters)); every op returns a
 * dt_status. Everything else is generated from it: the members of dt_ops, the indices
 * DT_OP_<name> and dt_ops_op_name(), the CPU and CUDA tables (a missing kernel is a
 * compile error) and the cases of the op test (tests/ops_cases.h: a missing case is a
 * compile error too). The element-wise activations come from their own list in
 * ops_elem.h, two ops per row. */

/* One activation row of ops_elem.h as its two ops. */
#define DT_OPS_ELEM_PAIR_(X, name, saved, tol) \
    X(name##_forward,  (float *y, const float *x, size_t n)) \
    X(name##_backward, (float *dx, const float *dy, const float *saved, size_t n))

#define DT_OPS(X) \
    /* -- GEMM (row-major, as cblas with CblasRowMajor) -- \
     * C(M,N) = alpha * op(A)(M,K) * op(B)(K,N) + beta * C; op(X) = X or X^T when trans != 0. \
     * A is (M, K) with row stride lda (or (K, M) when transA), B is (K, N) with ldb \
     * (or (N, K) when transB), C is (M, N) with ldc. beta = 0 ignores C's old contents. \
     * The CPU backend cuts C into blocks fixed by (M, N, K) and never splits K, so the \
     * bits do not depend on the thread count. */ \
    X(sgemm, (int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda, \
              const float *B, int ldb, float beta, float *C, int ldc)) \
    \
    /* -- bias -- */ \
    X(bias_add,  (float *y, const float *b, int rows, int cols))     /* y (rows, cols) += b (cols) */ \
    X(bias_relu, (float *y, const float *b, int rows, int cols))     /* y = relu(y + b), fused */ \
    X(bias_grad, (float *db, const float *dy, int rows, int cols))   /* db (cols) = column sums of dy (rows, cols) */ \
    \
    /* -- activations (ops_elem.h): <name>_forward (y, x, n) and <name>_backward (dx, dy, \
     * x or y, n), all arrays (n); in place allowed: y == x, dx == dy -- */ \
    DT_OPS_ELEM(DT_OPS_ELEM_PAIR_, X) \
    \
    /* -- dropout (inverted, as nn.Dropout: kept values are scaled by 1/(1-p)) -- \
     * x, y are (rows, cols); row i is the sample with index sample0 + i (its position in \
     * the epoch's global order), and element j of it is kept iff \
     * dt_rng_dropout_keep(seed, stream, epoch, sample0 + i, j, p). stream tells the \
     * dropout layers of one model apart. The mask is recomputed in backward, not stored. \
     * p in [0, 1); in place allowed. */ \
    X(dropout_forward,  (float *y, const float *x, int rows, int cols, float p, \
                         uint64_t seed, uint32_t stream, uint32_t epoch, uint64_t sample0)) \
    X(dropout_backward, (float *dx, const float *dy, int rows, int cols, float p, \
                         uint64_t seed, uint32_t stream, uint32_t epoch, uint64_t sample0)) \
    \
    /* -- losses -- \
     * Softmax cross-entropy, as nn.CrossEntropyLoss(label_smoothing=ls) with \
     * reduction='sum' divided by `norm` (pass the GLOBAL batch size so micro-batch \
     * losses and gradients add up to the mean over the global batch). \
     *   logits (B, C), labels (B) in [0, C) or < 0 to ignore the row (as ignore_index), \
     *   probs (B, C) receives the softmax (kept for backward; it may be logits itself, \
     *   or NULL for the loss alone: the same bits), loss (1) receives \
     *   sum_rows(-sum_c target_c * log p_c) / norm with target = (1-ls)*onehot + ls/C. \
     * A label >= C gives DT_ERR_INVALID. With every label < 0 it only computes probs. */ \
    X(xent_forward,  (float *loss, float *probs, const float *logits, const int32_t *labels, \
                      int B, int C, float label_smoothing, float norm)) \
    /* dlogits (B, C) = (probs - target) / norm (0 for ignored rows); in place over probs allowed. */ \
    X(xent_backward, (float *dlogits, const float *probs, const int32_t *labels, \
                      int B, int C, float label_smoothing, float norm)) \
    /* Mean squared error: loss (1) = sum_i (pred_i - target_i)^2 / norm. */ \
    X(mse_forward,   (float *loss, const float *pred, const float *target, size_t n, float norm)) \
    /* dpred (n) = 2 * (pred - target) / norm. */ \
    X(mse_backward,  (float *dpred, const float *pred, const float *target, size_t n, float norm)) \
    \
    /* -- convolution (d from dt_conv2d_desc_init) -- \
     * y (N, K, P, Q) = conv(x (N, C, H, W), w (K, C, R, S)) + bias (K); bias may be NULL. \
     * relu != 0 applies relu after the bias (fused). */ \
    X(conv2d_forward,  (const dt_conv2d_desc *d, float *y, const float *x, const float *w, \
                        const float *bias, int relu)) \
    /* Given dy (N, K, P, Q), x and w of the forward: dx (N, C, H, W), dw (K, C, R, S), \
     * dbias (K). Any of dx, dw, dbias may be NULL to skip it (dx for the first layer). \
     * x must still hold what the forward read: a backend may reuse the forward's \
     * columns of the same x and descriptor (CUDA does, until x is freed). */ \
    X(conv2d_backward, (const dt_conv2d_desc *d, float *dx, float *dw, float *dbias, \
                        const float *dy, const float *x, const float *w)) \
    \
    /* -- pooling (d from dt_pool2d_desc_init) -- \
     * y (N, C, P, Q); idx (N, C, P, Q) receives the argmax as a flat index into the \
     * (H, W) plane, as PyTorch's return_indices (first maximum wins; NaN propagates). */ \
    X(maxpool2d_forward,  (const dt_pool2d_desc *d, float *y, int32_t *idx, const float *x)) \
    X(maxpool2d_backward, (const dt_pool2d_desc *d, float *dx, const float *dy, const int32_t *idx)) \
    X(avgpool2d_forward,  (const dt_pool2d_desc *d, float *y, const float *x)) \
    X(avgpool2d_backward, (const dt_pool2d_desc *d, float *dx, const float *dy)) \
    /* y (N, C) = mean of x (N, C, HW) over HW; backward spreads dy / HW. */ \
    X(global_avgpool_forward,  (float *y, const float *x, int N, int C, int HW)) \
    X(global_avgpool_backward, (float *dx, const float *dy, int N, int C, int HW)) \
    \
    /* -- batch normalisation over (N, HW) per channel C; x is (N, C, HW) (HW = 1 for \
     * BatchNorm1d on (N, C)). The statistics are plain sums so the DDP layer can \
     * all-reduce them for synchronised batch norm before finalising. -- \
     * sum (C) = sum of x, sumsq (C) = sum of x^2 (each (n, c) plane in fixed float \
     * lanes, the planes in double in a fixed order, rounded once). */ \
    X(bn_stats,    (float *sum, float *sumsq, const float *x, int N, int C, int HW)) \
    /* From sums over `count` values per channel: mean (C), invstd (C) = 1/sqrt(var + eps) \
     * with the biased var = sumsq/count - mean^2 (clamped at 0). If running_mean is not \
     * NULL, also running = (1-momentum)*running + momentum*stat with the UNBIASED \
     * variance var*count/(count-1), as PyTorch in training mode. */ \
    X(bn_finalize, (float *mean, float *invstd, const float *sum, const float *sumsq, \
                    int C, int64_t count, float eps, \
                    float *running_mean, float *running_var, float momentum)) \
    /* invstd (C) = 1/sqrt(var (C) + eps), for evaluation with the running variance. */ \
    X(bn_invstd,   (float *invstd, const float *var, int C, float eps)) \
    /* y = (x - mean) * invstd * gamma + beta per channel; gamma/beta NULL means 1/0 \
     * (affine=False); relu != 0 applies relu (fused); in place allowed. */ \
    X(bn_apply,    (float *y, const float *x, const float *mean, const float *invstd, \
                    const float *gamma, const float *beta, int N, int C, int HW, int relu)) \
    /* Per-channel sums for backward: sum_dy (C) = sum dy (= dbeta), sum_dy_xhat (C) = \
     * sum dy * (x - mean) * invstd (= dgamma). All-reduce them for sync-BN. */ \
    X(bn_backward_reduce, (float *sum_dy, float *sum_dy_xhat, const float *dy, const float *x, \
                           const float *mean, const float *invstd, int N, int C, int HW)) \
    /* dx = gamma*invstd * (dy - sum_dy/count - xhat * sum_dy_xhat/count) (training mode; \
     * count = the number of values per channel behind the statistics, all ranks for sync-BN). \
     * gamma NULL means 1. */ \
    X(bn_backward_dx, (float *dx, const float *dy, const float *x, const float *mean, \
                       const float *invstd, const float *gamma, const float *sum_dy, \
                       const float *sum_dy_xhat, int N, int C, int HW, int64_t count)) \
    \
    /* -- layer normalisation over the last dim, as nn.LayerNorm(cols) -- \
     * x, y (rows, cols), gamma/beta (cols) (NULL = no affine), mean/rstd (rows) saved. */ \
    X(layernorm_forward,  (float *y, float *mean, float *rstd, const float *x, \
                           const float *gamma, const float *beta, int rows, int cols, float eps)) \
    /* dx (rows, cols); dgamma, dbeta (cols) (NULL to skip; column sums over the rows in a fixed order). */ \
    X(layernorm_backward, (float *dx, float *dgamma, float *dbeta, const float *dy, \
                           const float *x, const float *mean, const float *rstd, \
                           const float *gamma, int rows, int cols)) \
    /* -- RMS normalisation over the last dim, as Llama's RMSNorm(cols): y = x * rstd * w, \
     * rstd = 1 / sqrt(mean(x^2) + eps); x, y (rows, cols), w (cols), rstd (rows) saved. */ \
    X(rmsnorm_forward,  (float *y, float *rstd, const float *x, const float *w, int rows, int cols, float eps)) \
    /* dx (rows, cols) (NULL to skip); dw (cols) (NULL to skip; column sums over the rows \
     * in a fixed order, layer norm's with the mean 0). */ \
    X(rmsnorm_backward, (float *dx, float *dw, const float *dy, const float *x, const float *rstd, \
                         const float *w, int rows, int cols)) \
    /* -- the gated MLP of Llama: h (rows, hid) = silu(g) * u, where gu (rows, 2 hid) holds \
     * g in columns 0..hid-1 and u in hid..2hid-1 of each row (one GEMM's output). */ \
    X(swiglu_forward,  (float *h, const float *gu, int rows, int hid)) \
    /* dgu (rows, 2 hid) from dh (rows, hid) and the forward's gu; dgu may be gu (in place). */ \
    X(swiglu_backward, (float *dgu, const float *dh, const float *gu, int rows, int hid)) \
    \
    /* -- sequences (transformers); ids are floats holding exact integers in [0, V) -- \
     * y (n, C) = W[ids[i]] (W (V, C)), as nn.Embedding. */ \
    X(embedding_forward,  (float *y, const float *ids, const float *W, int n, int C, int V)) \
    /* dW (V, C): row v gets the sum of dy[i] (n, C) over the i with ids[i] == v, in index \
     * order; accumulate 0 overwrites dW first, 1 adds to it (a weight tied to a head whose \
     * backward wrote dW first). */ \
    X(embedding_backward, (float *dW, const float *ids, const float *dy, int n, int C, int V, int accumulate)) \
    /* y (B, T, C) = x + P[t] (the first T rows of the position table P); in place allowed. */ \
    X(pos_forward,  (float *y, const float *x, const float *P, int B, int T, int C)) \
    /* dP (T, C) = sum over b of dy (B, T, C), in b order. */ \
    X(pos_backward, (float *dP, const float *dy, int B, int T, int C)) \
    /* Rotary position embedding, Hugging Face Llama's "rotate_half" layout, in place on \
     * the q and k heads of qkv (B, T, (H + 2K) D) (attention's layout below): in each head, \
     * dimension i < D/2 pairs with i + D/2 and the pair turns by the angle \
     * (pos0 + t) * theta^(-2i/D) (cos and sin in double, rounded to float); v is left \
     * alone. inverse 1 turns by the opposite angle: the backward of the rotation (its \
     * transpose), applied to dqkv. D even. */ \
    X(rope, (float *qkv, int B, int T, int H, int K, int D, float theta, int pos0, int inverse)) \
    /* Causal self-attention with H query heads and K key/value heads (K divides H; query \
     * head h reads key/value head h / (H/K): grouped-query attention, multi-head when \
     * K = H), softmax(q k^T / sqrt(D)) v per (batch, head), position t attending to 0..t. \
     * qkv (B, T, (H + 2K) D) as a fused projection writes it: q in columns 0..HD-1, k in \
     * the next KD, v in the last KD, head h at columns h*D of its block. y (B, T, HD), \
     * head h at columns h*D; lse (B, H, T) the log-sum-exp of each row of scores, kept \
     * for backward. Never forms the T x T matrix: memory grows with T. dtype: DT_F32, or \
     * DT_BF16 / DT_F16 when qkv (and dy in backward) hold values rounded to that type: a \
     * backend may then multiply two such operands on 16-bit units (exact products, f32 \
     * sums: the CPU's arithmetic to the order of the sums; the CPU ignores it). */ \
    X(attn_forward,  (float *y, float *lse, const float *qkv, int B, int T, int H, int K, int D, int dtype)) \
    /* dqkv (B, T, (H + 2K) D) from dy (B, T, HD), recomputing the scores from qkv and lse \
     * (y is the forward's output); a key/value head's gradient sums its query heads in \
     * order. */ \
    X(attn_backward, (float *dqkv, const float *dy, const float *qkv, const float *y, const float *lse, \
                      int B, int T, int H, int K, int D, int dtype)) \
    /* One decoding position t for sampling: y (HD) = attention of the query q (HD) over \
     * the keys and values of positions 0..t in kv (t+1, 2KD), a cache whose row j holds \
     * position j's K key heads, then its K value heads (the k and v of a qkv row): a \
     * cache of the key/value heads only, K/H of a whole qkv row's query width. */ \
    X(attn_decode,   (float *y, const float *q, const float *kv, int t, int H, int K, int D)) \
    \
    /* -- reductions and metrics -- \
     * correct (1) = number of rows whose argmax equals labels (B) (first maximum wins, a \
     * NaN beats any number; ignored labels < 0 never count). */ \
    X(count_correct, (int32_t *correct, const float *logits, const int32_t *labels, int B, int C)) \
    /* out (1) = sum of squares of x (n): double accumulation over fixed 4096-element \
     * chunks combined pairwise, rounded once; bitwise independent of threads. */ \
    X(sumsq, (float *out, const float *x, size_t n)) \
    /* part (ceil(n / DT_SUM_CHUNK) doubles, device) = the sums of squares of x's fixed \
     * chunks, the partials sumsq combines: a caller holding a chunk-aligned slice of a \
     * larger array (a shard) computes its partials, and the pairwise combination of all \
     * of them (dt_pairwise_sum) is the whole array's sumsq before rounding. */ \
    X(sumsq_chunks, (double *part, const float *x, size_t n)) \
    \
    /* -- elementwise vector ops (n elements; in place allowed) -- */ \
    X(fill,  (float *x, float value, size_t n)) \
    X(scale, (float *x, float alpha, size_t n))                    /* x *= alpha */ \
    X(add,   (float *z, const float *x, const float *y, size_t n)) /* z = x + y */ \
    \
    /* -- casts (round to nearest even; NaN stays NaN, overflow to f16 gives inf) -- */ \
    X(f32_to_bf16, (uint16_t *dst, const float *src, size_t n)) \
    X(bf16_to_f32, (float *dst, const uint16_t *src, size_t n)) \
    X(f32_to_f16,  (uint16_t *dst, const float *src, size_t n)) \
    X(f16_to_f32,  (float *dst, const uint16_t *src, size_t n)) \
    \
    /* -- mixed precision (--precision bf16|fp16, src/lowp.h) -- \
     * y (n) = x rounded to `dtype` (DT_BF16 or DT_F16 of dtype.h) and widened back, as \
     * PyTorch's x.to(dtype).float(): the casts above, so nearest even, NaN kept, beyond \
     * f16's range inf. In place allowed. */ \
    X(round_to, (float *y, const float *x, size_t n, int dtype)) \
    /* sgemm's contract for A and B that hold values of `dtype` (DT_BF16 or DT_F16, as \
     * round_to leaves them): their products are exact in f32 and the sums are f32, the \
     * arithmetic of a 16-bit GEMM with f32 accumulation. The CPU runs its sgemm (the same \
     * bits); CUDA converts A and B to 16 bits and runs cublasGemmEx with f32 compute \
     * (tensor cores; cuBLAS's own summation order). */ \
    X(gemm_lp, (int dtype, int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda, \
                const float *B, int ldb, float beta, float *C, int ldc)) \
    /* gemm_lp with B (K x N, not transposed, row stride ldb) held in 16 bits of dtype, as \
     * f32_to_bf16 / f32_to_f16 leave it: the bits of gemm_lp on B widened. A weight \
     * gradient reads a layer input kept in 16 bits so (dt_ops_gemm_lp_reads16: the CPU's \
     * AVX512-BF16 kernel packs the words as they are; elsewhere B is widened into memory \
     * of the call's own and the trainer widens it itself instead). */ \
    X(gemm_lp_b16, (int dtype, int transA, int M, int N, int K, float alpha, const float *A, int lda, \
                    const uint16_t *B, int ldb, float beta, float *C, int ldc)) \
    /* flag (1) = 1 when some x[i] (n) is inf or NaN, else 0: GradScaler's found_inf. */ \
    X(nonfinite, (int32_t *flag, const float *x, size_t n)) \
    /* A step's checks decided on the device, so that the host reads the step's results \
     * once, at its end (src/train.c). out (3 floats): out[0] = the gradient's global \
     * norm, sqrtf((float)dt_pairwise_sum(parts, nch)) x unscale (parts: the chunk sums of \
     * sumsq_chunks, consumed; scratch: nch more doubles; nch = 0: 0); out[1] = the \
     * clipping coefficient max_norm / (out[0] + 1e-6f) (1 when max_norm <= 0); out[2] = \
     * 1 when out[0] and every loss (k) are finite, else 0: the gate of the optimizer's \
     * step (dt_adamw_args). The host's arithmetic (shard.c), so the same bits. */ \
    X(step_checks, (float *out, double *parts, double *scratch, size_t nch, const float *losses, size_t k, \
                    float max_norm, float unscale)) \
    /* x (n) *= checks[1] when checks[1] < 1 (clipping by step_checks' coefficient). */ \
    X(clip_scale, (float *x, const float *checks, size_t n)) \
    \
    /* -- fused optimizer steps over a flat parameter array (n) -- \
     * sgd: buf (n) is the momentum buffer (unused when momentum == 0, may be NULL). */ \
    X(sgd_update,   (float *p, const float *grad, float *buf, size_t n, const dt_sgd_args *a)) \
    /* adamw: m, v (n) are the moment buffers (zero them before step 1). */ \
    X(adamw_update, (float *p, const float *grad, float *m, float *v, size_t n, const dt_adamw_args *a)) \
    \
    /* -- random fill, reproducible whatever the threads: element i is \
     * lo + (hi - lo) * dt_rng_unit(seed, stream, offset + i) (rng.h), so filling a tensor \
     * in pieces gives the same values as filling it at once. -- */ \
    X(rng_uniform, (float *x, size_t n, float lo, float hi, uint64_t seed, uint64_t stream, uint64_t offset)) \
    /* element i = mean + std * sqrt(-2 ln(1 - u)) * cos(2 pi w) with u, w the uniforms at \
     * positions 2(offset + i) and 2(offset + i) + 1 of the stream (Box-Muller). */ \
    X(rng_normal,  (float *x, size_t n, float mean, float std, uint64_t seed, uint64_t stream, uint64_t offset))

/* DT_OPS_DEVICE(X): memory and execution, as X(return type, name, (parameters)). */
#define DT_OPS_DEVICE(X) \
    X(dt_status, alloc,       (void **p, size_t bytes))   /* device memory, 64-byte aligned; bytes=0 gives NULL */ \
    /* the same, every page discarded from the start (see discard): what is used is \
     * populated first; the cpu's pages come on first touch anyway (its alloc) */ \
    X(dt_status, alloc_sparse, (void **p, size_t bytes)) \
    X(void,      free,        (void *p))                  /* NULL is fine */ \
    X(dt_status, zero,        (void *p, size_t bytes))    /* memset 0 */ \
    X(dt_status, copy_h2d,    (void *dst, const void *src, size_t bytes)) \
    /* queued, without waiting: src (pinned host memory, for a GPU to read it unstaged) \
     * must stay unchanged until the next synchronize or copy_d2h returns */ \
    X(dt_status, copy_h2d_async, (void *dst, const void *src, size_t bytes)) \
    X(dt_status, copy_d2h,    (void *dst, const void *src, size_t bytes)) \
    X(dt_status, copy_d2d,    (void *dst, const void *src, size_t bytes)) \
    X(dt_status, host_alloc,  (void **p, size_t bytes))   /* pinned host memory (aligned malloc on cpu) */ \
    X(void,      host_free,   (void *p)) \
    /* the contents of the whole pages inside [p, p + bytes) of an allocation are no longer \
     * needed: the device may take their memory back (populate brings them back, \
     * their contents undefined); for sharded parameters (shard.h) */ \
    X(dt_status, discard,     (void *p, size_t bytes)) \
    /* the whole pages inside [p, p + bytes) stay small pages (page_block > 0): a range \
     * whose resident part changes piece by piece, which the system must not fill to a \
     * whole block behind the caller's back */ \
    X(dt_status, small_pages, (void *p, size_t bytes)) \
    /* the pages that [p, p + bytes) touches are about to be used: a device whose \
     * pages come back on first touch (the cpu) may bring them back at once, in one \
     * call instead of one fault per page; a device without page faults (a GPU, whose \
     * discarded memory is unmapped) must, so a discarded range is populated before \
     * it is read or written again (their contents are undefined) */ \
    X(dt_status, populate,    (void *p, size_t bytes)) \
    X(dt_status, synchronize, (void))                     /* wait for all queued work */ \
    X(dt_status, set_threads, (int n))                    /* compute threads (OpenMP on cpu); n >= 1 */ \
    X(int,       threads,     (void))                     /* the count set_threads set (cpu: at first, the \
                                                           * OpenMP default) */

/* The op indices DT_OP_sgemm, ..., and their count. */
enum {
#define DT_OP_INDEX_(name, params) DT_OP_##name,
    DT_OPS(DT_OP_INDEX_)
#undef DT_OP_INDEX_
    DT_OPS_COUNT
};

/* ---- the table ------------------------------------------------------------------------ */

typedef struct dt_ops dt_ops;

struct dt_ops {
    const char *name;                    /* "cpu", "cuda" */
    int         host_memory;             /* 1: device pointers are host pointers */
    size_t      page_block;              /* an allocation of at least this many bytes (on a
                                          * GPU, any from alloc_sparse) starts on a multiple of
                                          * it, its whole blocks are pages of that size that
                                          * discard gives back whole (the cpu's huge pages, a
                                          * GPU's granules of sparse memory); 0: none */
#define DT_OPS_DEVICE_MEMBER_(ret, name, params) ret (*name) params;
    DT_OPS_DEVICE(DT_OPS_DEVICE_MEMBER_)
#undef DT_OPS_DEVICE_MEMBER_
    /* device memory held now and at most so far, in bytes (as torch.cuda's
     * memory_allocated / max_memory_allocated; either pointer may be NULL), after the
     * peak starts again from the current when reset_peak is 1; the one optional member:
     * NULL when the device does not track it (cpu: the process's resident memory tells
     * instead) */
    void      (*memory)(size_t *current, size_t *peak, int reset_peak);
    /* device time for --trace (trace.h, dt_trace_device), optional too: NULL on a host
     * backend, whose compute the host's clock times. mark queues a timestamp behind the
     * work queued so far and gives its index (0, 1, ...; -1 once DT_OPS_MARKS are
     * queued); marks_read waits for them, gives the seconds from mark 0 to each of the
     * first n (sec may be NULL for n = 0) and forgets them all */
    dt_status (*mark)(int *id);
    dt_status (*marks_read)(double *sec, int n);
#define DT_OPS_MEMBER_(name, params) dt_status (*name) params;
    DT_OPS(DT_OPS_MEMBER_)
#undef DT_OPS_MEMBER_
};

/* A backend's table is `{ .name = ..., .host_memory = ..., DT_OPS_TABLE_INIT(memory, mark,
 * marks_read) }`: the function members as labelled initialisers, in member order (as C++
 * wants them), named by two macros the backend defines first, DT_OPS_DEVFN(name) for the
 * memory and execution functions and DT_OPS_KERNEL(name) for the ops; `memory`, `mark`
 * and `marks_read` are NULL or the optional functions. A function the backend lacks is a
 * compile error. */
#define DT_OPS_MARKS 4096
#define DT_OPS_TABLE_INIT(memory_fn, mark_fn, marks_read_fn) \
    DT_OPS_DEVICE(DT_OPS_INIT_DEVFN_) \
    .memory = memory_fn, \
    .mark = mark_fn, \
    .marks_read = marks_read_fn, \
    DT_OPS(DT_OPS_INIT_KERNEL_)
#define DT_OPS_INIT_DEVFN_(ret, name, params) .name = DT_OPS_DEVFN(name),
#define DT_OPS_INIT_KERNEL_(name, params) .name = DT_OPS_KERNEL(name),

/* The name of op i (0 <= i < DT_OPS_COUNT, "sgemm" for DT_OP_sgemm); NULL out of range. */
DT_API const char *dt_ops_op_name(int i);

/* ---- backends ------------------------------------------------------------------------- */

/* How to open a device. The backend keeps no other settings of its own and reads no
 * environment variable: the program decides (dt_device_opts_env reads the debugging
 * variables for it). Zero is the default of every field. */
typedef struct {
    int      index;       /* which device of the kind: a CUDA ordinal, taken modulo the visible
                           * devices, so a rank can pass its local rank as it is; >= 0 */
    int      allow_tf32;  /* 1: cuBLAS may use TF32 tensor cores for FP32 GEMMs (faster, fewer
                           * mantissa bits); 0: full FP32 (the default) */
    int      sync;        /* 1: synchronise after every kernel and library call, so an error
                           * names the kernel that faulted (slow; for first contact) */
    unsigned max_blocks;  /* > 0: cap on the grid of grid-stride kernels (results must not
                           * depend on it; a test varies it); 0: the backend's own */
    int      cpu_gemm;    /* cpu: the GEMM kernels, DT_CPU_GEMM_* below (0: auto). The choice
                           * holds for the process until the cpu is opened again */
    int      no_vmm;      /* cuda: 1: alloc_sparse is a plain cudaMalloc (page_block 0:
                           * sharding gives nothing back); 0: the driver's virtual memory
                           * management where it has the calls. Allocations keep the kind
                           * they were made with; the choice holds until the next opening */
    long long conv_cache_mb; /* cuda: the convolution's im2col columns kept from forward for
                           * backward, at most this many MiB; < 0: none kept; 0: the
                           * backend's default (the smaller of 1 GiB and a sixteenth of the
                           * device) */
} dt_device_opts;

/* The CPU's GEMM kernels (dt_device_opts.cpu_gemm, DT_CPU_GEMM):
 *   auto        dtrain's AVX-512 kernel for f32 products where the CPU has AVX-512 F
 *               (OpenBLAS elsewhere), its AVX512-BF16 kernel for the bf16 products of
 *               --precision bf16 where the CPU has vdpbf16ps (the f32 kernel elsewhere);
 *   openblas    every product through OpenBLAS;
 *   avx512      the AVX-512 f32 kernel for every product (bf16 ones on their rounded
 *               values); the device does not open without AVX-512 F;
 *   avx512bf16  auto, and the device does not open without AVX512-BF16.
 * Each kernel sums in an order fixed by K, so the bits do not depend on the threads or
 * the world size; they differ between kernels. */
enum { DT_CPU_GEMM_AUTO, DT_CPU_GEMM_OPENBLAS, DT_CPU_GEMM_AVX512, DT_CPU_GEMM_AVX512BF16 };

/* Fill the debugging and tuning fields of *o from the environment: DT_CUDA_SYNC=0|1
 * (sync), DT_CU_MAX_BLOCKS=N (max_blocks, N >= 1), DT_CPU_GEMM=auto|openblas|avx512|
 * avx512bf16 (cpu_gemm; "own" is auto), DT_CUDA_VMM=0|1 (no_vmm: 0 sets it) and DT_CUDA_CONV_CACHE_MB=N
 * (conv_cache_mb, MiB; 0 keeps no columns); the others are left alone. An unset or
 * empty variable changes nothing; a malformed value is DT_ERR_INVALID naming the
 * variable. */
DT_API dt_status dt_device_opts_env(dt_device_opts *o);

/* One line about the device behind `ops` ("device 0: NVIDIA H200 (sm_90, 132 SMs, ...),
 * driver 13.0, runtime 13.0, cuBLAS 13.0.2") into buf; "" for the cpu. */
DT_API dt_status dt_ops_describe(const dt_ops *ops, char *buf, size_t n);
/* The kernel that runs matrix products of dtype (DT_F32, or the DT_BF16 / DT_F16 of
 * gemm_lp) on ops: "avx512-bf16", "avx512" or "openblas" on the cpu (as opened: see
 * DT_CPU_GEMM_*), "cublas" on cuda. */
DT_API const char *dt_ops_gemm_name(const dt_ops *ops, int dtype);
/* 1 when gemm_lp of dtype on ops rounds its operands to dtype itself (nearest even, as
 * round_to, so passing f32 values gives the bits of passing them rounded): the cpu's
 * AVX512-BF16 kernel, which narrows them as it packs them. 0: the caller rounds them. */
DT_API int dt_ops_gemm_lp_rounds(const dt_ops *ops, int dtype);
/* 1 when gemm_lp_b16 of dtype on ops reads its 16-bit B directly, with no widened copy
 * (the CPU's AVX512-BF16 kernel). */
DT_API int dt_ops_gemm_lp_reads16(const dt_ops *ops, int dtype);
/* The device's peak memory (ops memory) starts again from what it holds now; nothing
 * for a device that does not track its memory. */
DT_API void      dt_ops_reset_peak(const dt_ops *ops);

/* The CPU backend (OpenBLAS kept single-threaded + OpenMP over fixed blocks). */
DT_API const dt_ops *dt_ops_cpu(void);

/* The backend named `device` ("cpu", "cuda") opened with `opts` (NULL: index 0, no
 * TF32); NULL with a message for dt_last_error() when the name is unknown, the backend
 * was not built or cannot start. A process has one CUDA device: asking again for
 * another index fails, asking again for the same one returns the same table. */
DT_API const dt_ops *dt_ops_get_ex(const char *device, const dt_device_opts *opts);
/* dt_ops_get_ex(device, NULL). */
DT_API const dt_ops *dt_ops_get(const char *device);

#endif /* DT_OPS_H */
