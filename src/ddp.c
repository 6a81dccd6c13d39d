/*
 * ddp.c: distributed data parallelism for one model (see ddp.h).
 *
 * Gradient slices arrive from the model's grad_ready hook in reverse layer
 * order, so the finished part of the flat gradient array is always a suffix
 * [ready_lo, n). Buckets are contiguous ranges of whole parameter tensors cut
 * from the end; a bucket is launched (async all-reduce on the communicator's
 * worker thread) once ready_lo has passed its start.
 *
 * Local micro-batches are summed in a binary-counter tree (tree_push). Its level-0 slot,
 * the pending leaf of an even micro-batch, is the gradient array itself where it can be
 * (in place, the default): an even micro-batch's backward writes its leaf there and an
 * odd one's backward writes into a scratch the size of the largest layer (the model's
 * gradient views), which the hook adds in. The additions are those of the copied tree,
 * in the same order; the tree keeps one gradient-sized array less (none for k = 2).
 * Layers whose gradient another layer writes too (a tied weight: the embedding and the
 * head that reads it) keep the copied slot, in a compact array of their own.
 */
#include "ddp.h"
#include "clock.h"
#include "hash.h"   /* dt_xxh64 */
#include "mem.h"
#include "testing.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DT_MIB ((size_t)1 << 20)

typedef struct {
    size_t   lo, hi;    /* float range [lo, hi) of the flat gradient array */
    dt_work *work;      /* in flight, or NULL */
    int      launched;
} bucket;

struct dt_ddp {
    dt_model     *model;
    const dt_ops *ops;
    dt_comm      *comm;
    int           world, rank;
    dt_ddp_opts   o;
    int64_t       k;          /* local micro-batches per step */
    int64_t       micro;      /* current local micro-batch */
    size_t        n;          /* floats in the gradient array */
    size_t        rlo, rhi;   /* the range whose gradients backward makes (opts' range; [0, n)) */
    int           ntensors;
    size_t       *t_off, *t_len;   /* per parameter tensor: offset and length in floats */
    /* binary-counter tree of partial sums (k > 1): acc[l] holds a finished
     * subtree of 2^l micro-batches for every slice pushed so far, acc[l][0] the
     * gradient at rlo. In place (see above) acc[0] is not allocated: level 0 is the
     * gradient array, or for a copied layer acc0c + c0off[its first tensor] */
    int           levels;
    float       **acc;
    int           inplace;
    size_t       *c0off;      /* per tensor: its place in acc0c, SIZE_MAX: in place */
    float        *acc0c;      /* the copied layers' level 0 */
    float        *leaf;       /* an odd micro-batch's leaf of one layer (views) */
    int          *vlayer;     /* the layers that write odd leaves into it, and */
    size_t       *vfirst;     /* the offset of each one's first parameter */
    int           nv;
    /* buckets, bucket 0 at the end of the array */
    int           nb;
    bucket       *b;
    size_t        ready_lo;
    dt_status     hook_status;
    dt_ddp_final_fn final;
    void         *final_ctx;
    /* When the device's memory is not host memory and the backend takes host
     * buffers (tcp, mpi with a GPU), collectives go through a host copy. */
    int           stage;
    float        *host;       /* n floats of pinned host memory (stage) */
    void         *kept;       /* stage: pinned host memory of the per-step calls (synchronised
                               * batch norm's sums, the batch-norm records), grown, never freed
                               * until the end: freeing pinned memory synchronises the device */
    size_t        kept_bytes;
    uint16_t     *g16;        /* --grad-dtype bf16, W > 1: the gradient in bf16 for the wire (n) */
};

void dt_ddp_opts_default(dt_ddp_opts *o) {
    o->bucket_bytes = 25 * DT_MIB;
    o->first_bucket_bytes = 1 * DT_MIB;
    o->overlap = 1;
    o->sync_bn = 0;
    o->local_only = 0;
    o->sharded_params = 0;
    o->grad_dtype = DT_F32;
    o->range_lo = o->range_hi = 0;
    o->in_place = 1;
}

/* --grad-dtype bf16: every node of the summation tree is rounded to bf16, the leaves
 * (micro-batch gradients) and each local addition as the all-reduce rounds each of its
 * own (reduce.h: bf16 added in f32, rounded back), so the tree and its roundings are the
 * same for every world size. */
static dt_status grad_round(dt_ddp *d, float *p, size_t lo, size_t len) {
    return d->o.grad_dtype == DT_BF16 ? d->ops->round_to(p + lo, p + lo, len, DT_BF16) : DT_OK;
}

/* ---- the accumulation tree over slices -------------------------------------------- */

/* 1 when k is a power of two above 1: the last leaf closes the whole tree. */
static int whole_tree(int64_t k) { return k > 1 && (k & (k - 1)) == 0; }

/* Where level l of the tree keeps the slice at lo whose first tensor is `first`. */
static float *acc_at(const dt_ddp *d, int l, int first, size_t lo) {
    if (l == 0 && d->inplace)
        return d->c0off[first] == SIZE_MAX ? dt_model_grads(d->model) + lo : d->acc0c + d->c0off[first];
    return d->acc[l] + (lo - d->rlo);
}

/* Add leaf i (the current micro-batch; its values at `leaf`) of slice [lo, lo+len), first
 * tensor `first`, into the tree; fin is where the slice's sum ends.
 * Leaf i closes T subtrees, T = the trailing ones of i: the new subtree is
 * acc[T-1] + (... + (acc[0] + leaf)), built in the free slot acc[T]; when it is the whole
 * tree (the last leaf of a power-of-two k) it is built in fin, the same additions in
 * the same order, and the tree needs no slot for it. */
static dt_status tree_push(dt_ddp *d, int64_t i, int first, const float *leaf, float *fin, size_t lo, size_t len) {
    const dt_ops *ops = d->ops;
    float *a0 = acc_at(d, 0, first, lo);
    if ((i & 1) == 0) return a0 == leaf ? DT_OK : ops->copy_d2d(a0, leaf, len * sizeof(float));
    int T = 0;
    while ((i >> T) & 1) T++;
    float *out = whole_tree(d->k) && i == d->k - 1 ? fin : acc_at(d, T, first, lo);
    DT_TRY(ops->add(out, a0, leaf, len));
    DT_TRY(grad_round(d, out, 0, len));
    for (int l = 1; l < T; l++) {
        DT_TRY(ops->add(out, acc_at(d, l, first, lo), out, len));
        DT_TRY(grad_round(d, out, 0, len));
    }
    return DT_OK;
}

/* After all k leaves: the sum of the finished subtrees (largest first) into fin. When
 * level 0 is fin itself (in place, k odd) the sum runs in the leaf scratch, free then
 * (the last leaf is even), and its last addition lands in fin. */
static dt_status tree_finish(dt_ddp *d, int first, float *fin, size_t lo, size_t len) {
    float *a0 = acc_at(d, 0, first, lo), *run = (d->k & 1) && a0 == fin ? d->leaf : fin;
    int started = 0;
    for (int l = d->levels - 1; l >= 0; l--) {
        if (!((d->k >> l) & 1)) continue;
        float *acc = acc_at(d, l, first, lo), *out = l == 0 ? fin : run;
        if (!started) DT_TRY(d->ops->copy_d2d(out, acc, len * sizeof(float)));
        else DT_TRY(d->ops->add(out, run, acc, len));
        if (started) DT_TRY(grad_round(d, out, 0, len));
        started = 1;
    }
    return DT_OK;
}

/* The tree's levels for k leaves (0 for k = 1): a finished subtree of 2^l leaves per
 * level, l below k's bit length. */
static int tree_levels(int64_t k) {
    if (k <= 1) return 0;
    int levels = 0;
    while ((k >> levels) != 0) levels++;
    return levels;
}

int dt_ddp_tree_arrays(int64_t k) { return tree_levels(k) - whole_tree(k); }

/* The parameters of a layer, [*a, *b) of the flat array; 0 when it has none. */
static int layer_extent(const dt_layer *L, size_t *a, size_t *b) {
    *a = SIZE_MAX, *b = 0;
    for (int t = 0; t < L->ntensors; t++) {
        const dt_layer_tensor *T = &L->t[t];
        if (T->role != DT_TENSOR_PARAM || T->numel == 0) continue;
        if (T->offset < *a) *a = T->offset;
        if (T->offset + (size_t)T->numel > *b) *b = T->offset + (size_t)T->numel;
    }
    return *b > *a;
}

/* The offsets that a tied name of the layers points at (*count of them; free the array;
 * *count -1: out of memory). */
static size_t *tied_offsets(const dt_layer *layers, int n, int *count) {
    size_t *at = NULL;
    int c = 0;
    for (int i = 0; i < n; i++)
        for (int t = 0; t < layers[i].ntensors; t++) {
            if (layers[i].t[t].role != DT_TENSOR_TIED) continue;
            size_t *x = realloc(at, (size_t)(c + 1) * sizeof *at);
            if (!x) {
                free(at);
                *count = -1;
                return NULL;
            }
            at = x;
            at[c++] = layers[i].t[t].offset;
        }
    *count = c;
    return at;
}

/* Layer L's backward writes the gradients of its own parameters only (no tied name of
 * another's, none of its parameters at one of the tied offsets): its odd leaves may go
 * to the scratch. */
static int layer_own_grads(const dt_layer *L, const size_t *tied, int ntied) {
    for (int t = 0; t < L->ntensors; t++) {
        if (L->t[t].role == DT_TENSOR_TIED) return 0;
        for (int j = 0; L->t[t].role == DT_TENSOR_PARAM && j < ntied; j++)
            if (L->t[t].offset == tied[j]) return 0;
    }
    return 1;
}

/* The layers with parameters starting in [lo, hi), in place: *copied floats of those that
 * keep the copied first level, *most of the largest other one (its odd leaves' scratch).
 * With d (its rlo, rhi), each layer's place is recorded: the views' layers and offsets,
 * the copied ones' places in acc0c. -1: out of memory. */
static int tree_layers(const dt_layer *layers, int n, size_t lo, size_t hi, dt_ddp *d, size_t *copied, size_t *most) {
    int ntied = 0;
    size_t *tied = tied_offsets(layers, n, &ntied), a, b;
    if (ntied < 0) return -1;
    *copied = *most = 0;
    for (int i = 0; i < n; i++) {
        const dt_layer *L = &layers[i];
        if (!layer_extent(L, &a, &b) || a < lo || a >= hi) continue;
        if (layer_own_grads(L, tied, ntied)) {
            if (b - a > *most) *most = b - a;
            if (d) d->vlayer[d->nv] = i, d->vfirst[d->nv++] = a;
            continue;
        }
        for (int j = 0; d && j < L->nparams; j++) d->c0off[L->first_param + j] = *copied + (d->t_off[L->first_param + j] - a);
        *copied += b - a;
    }
    free(tied);
    return 0;
}

size_t dt_ddp_tree_floats(const dt_layer *layers, int n, int64_t k, size_t lo, size_t hi, int in_place) {
    size_t arrays = (size_t)dt_ddp_tree_arrays(k), copied, most;
    if (!arrays || !in_place || tree_layers(layers, n, lo, hi, NULL, &copied, &most) < 0)
        return arrays * (hi - lo);   /* (out of memory: DDP's init fails the same way) */
    return (arrays - 1) * (hi - lo) + copied + most;
}

/* In place: the copied layers' level 0 and the odd leaves' scratch, as
 * dt_ddp_tree_floats counts them. */
static dt_status inplace_init(dt_ddp *d) {
    int n = dt_model_nlayers(d->model);
    d->c0off = malloc(((size_t)d->ntensors + 1) * sizeof *d->c0off);
    d->vlayer = calloc((size_t)n + 1, sizeof *d->vlayer);
    d->vfirst = calloc((size_t)n + 1, sizeof *d->vfirst);
    if (!d->c0off || !d->vlayer || !d->vfirst) return dt_error(DT_ERR_NOMEM, "out of memory for gradient accumulation");
    for (int t = 0; t <= d->ntensors; t++) d->c0off[t] = SIZE_MAX;
    size_t copied, most;
    if (tree_layers(dt_model_layer(d->model, 0), n, d->rlo, d->rhi, d, &copied, &most) < 0)
        return dt_error(DT_ERR_NOMEM, "out of memory for gradient accumulation");
    if (copied) DT_TRY(dt_mem_alloc(d->ops, DT_MEM_GRADS, (void **)&d->acc0c, copied * sizeof(float)));
    if (most) DT_TRY(dt_mem_alloc(d->ops, DT_MEM_GRADS, (void **)&d->leaf, most * sizeof(float)));
    return DT_OK;
}

/* In place: the layers that write their own gradients write an odd micro-batch's leaf
 * into the scratch (each layer's parameters at its start), an even one's into the
 * gradient array. */
static dt_status leaf_views(dt_ddp *d, int odd) {
    for (int v = 0; v < d->nv; v++) {
        float *base = odd ? (float *)((uintptr_t)d->leaf - d->vfirst[v] * sizeof(float)) : NULL;
        DT_TRY(dt_model_set_grad_view(d->model, d->vlayer[v], base));
    }
    return DT_OK;
}

/* ---- buckets ----------------------------------------------------------------------- */

/* A bucket's data as the all-reduce takes it: the gradient slice, in bf16 for
 * --grad-dtype bf16 (exact: its values are bf16 already), staged in host memory when
 * the backend needs host buffers; bucket_unpack puts the sum back. */
static dt_status bucket_pack(dt_ddp *d, const bucket *b, void **buf, dt_dtype *t) {
    float *g = dt_model_grads(d->model);
    size_t len = b->hi - b->lo, es = d->g16 ? sizeof(uint16_t) : sizeof(float);
    void *dev = g + b->lo;
    *t = DT_F32;
    if (d->g16) {
        DT_TRY(d->ops->f32_to_bf16(d->g16 + b->lo, g + b->lo, len));
        dev = d->g16 + b->lo;
        *t = DT_BF16;
    }
    *buf = dev;
    if (d->stage) {
        *buf = (char *)d->host + b->lo * es;
        DT_TRY(d->ops->copy_d2h(*buf, dev, len * es));
    }
    return DT_OK;
}

static dt_status bucket_unpack(dt_ddp *d, const bucket *b) {
    float *g = dt_model_grads(d->model);
    size_t len = b->hi - b->lo, es = d->g16 ? sizeof(uint16_t) : sizeof(float);
    void *dev = d->g16 ? (void *)(d->g16 + b->lo) : (void *)(g + b->lo);
    if (d->stage) DT_TRY(d->ops->copy_h2d(dev, (char *)d->host + b->lo * es, len * es));
    return d->g16 ? d->ops->bf16_to_f32(g + b->lo, d->g16 + b->lo, len) : DT_OK;
}

static dt_status launch_ready(dt_ddp *d) {
    for (int i = 0; i < d->nb; i++) {
        bucket *b = &d->b[i];
        if (b->launched || b->lo < d->ready_lo) continue;
        b->launched = 1;
        if (dt_testing_fault() == DT_FAULT_SKIP_ALLREDUCE) continue;   /* planted bug (testing.h) */
        void *buf;
        dt_dtype t;
        DT_TRY(bucket_pack(d, b, &buf, &t));
        DT_TRY(dt_allreduce_async(d->comm, buf, buf, b->hi - b->lo, t, DT_SUM, &b->work));
    }
    return DT_OK;
}

/* The model's grad_ready hook: parameters [first, first + count) are final for
 * this micro-batch. */
static dt_status on_grad_ready(void *ctx, int first, int count) {
    dt_ddp *d = ctx;
    if (count <= 0) return DT_OK;
    size_t lo = d->t_off[first];
    size_t hi = d->t_off[first + count - 1] + d->t_len[first + count - 1];
    /* the layer's view (sharding's slot, the odd leaves' scratch) or the flat array */
    float *g = dt_model_grads_written(d->model);
    float *fin = (d->inplace ? dt_model_grads(d->model) : g) + lo;   /* where the sum ends */
    dt_status s = grad_round(d, g, lo, hi - lo);   /* a leaf */
    if (s == DT_OK && d->k > 1) {
        s = tree_push(d, d->micro, first, g + lo, fin, lo, hi - lo);
        if (s == DT_OK && d->micro == d->k - 1 && !whole_tree(d->k)) s = tree_finish(d, first, fin, lo, hi - lo);
    }
    if (s == DT_OK && d->micro == d->k - 1 && d->final) s = d->final(d->final_ctx, lo, hi);
    if (s == DT_OK && d->micro == d->k - 1) {
        if (lo < d->ready_lo) d->ready_lo = lo;
        if (d->world > 1 && d->o.overlap && !d->o.local_only) s = launch_ready(d);
    }
    if (s != DT_OK && d->hook_status == DT_OK) d->hook_status = s;
    return s;
}

/* The kept staging buffer, at least `bytes` long (the training thread's calls only). */
static dt_status kept_host(dt_ddp *d, size_t bytes, void **out) {
    if (bytes > d->kept_bytes) {
        void *p = NULL;
        DT_TRY(dt_mem_host_alloc(d->ops, DT_MEM_COMM, &p, bytes));
        dt_mem_free(d->ops, d->kept);
        d->kept = p;
        d->kept_bytes = bytes;
    }
    *out = d->kept;
    return DT_OK;
}

/* Device-memory collectives: direct, or through a host copy when staging. */
static dt_status allreduce_dev(dt_ddp *d, float *buf, size_t n) {
    if (!d->stage) return dt_allreduce(d->comm, buf, buf, n, DT_F32, DT_SUM);
    void *h = NULL;
    DT_TRY(kept_host(d, n ? n * sizeof(float) : 1, &h));
    dt_status s = d->ops->copy_d2h(h, buf, n * sizeof(float));
    if (s == DT_OK) s = dt_allreduce(d->comm, h, h, n, DT_F32, DT_SUM);
    if (s == DT_OK) s = d->ops->copy_h2d(buf, h, n * sizeof(float));
    return s;
}

dt_status dt_ddp_allgather_dev(dt_ddp *d, const void *send, void *recv, size_t bytes) {
    if (!d->stage) return dt_allgather(d->comm, send, recv, bytes, DT_U8);
    size_t all = bytes * (size_t)d->world;
    void *h = NULL;
    DT_TRY(kept_host(d, all ? all : 1, &h));
    unsigned char *mine = (unsigned char *)h + bytes * (size_t)d->rank;
    dt_status s = d->ops->copy_d2h(mine, send, bytes);
    if (s == DT_OK) s = dt_allgather(d->comm, mine, h, bytes, DT_U8);
    if (s == DT_OK) s = d->ops->copy_h2d(recv, h, all);
    return s;
}

/* (At start and on resume only: its buffer is the size of the parameters, not kept.) */
static dt_status broadcast_dev(dt_ddp *d, void *buf, size_t bytes, int root) {
    if (!d->stage) return dt_broadcast(d->comm, buf, bytes, DT_U8, root);
    unsigned char *h = NULL;
    DT_TRY(dt_mem_host_alloc(d->ops, DT_MEM_COMM, (void **)&h, bytes ? bytes : 1));
    dt_status s = d->ops->copy_d2h(h, buf, bytes);
    if (s == DT_OK) s = dt_broadcast(d->comm, h, bytes, DT_U8, root);
    if (s == DT_OK) s = d->ops->copy_h2d(buf, h, bytes);
    dt_mem_free(d->ops, h);
    return s;
}

/* Synchronised batchnorm: per-channel sums (and the count) over every rank. */
static dt_status on_bn_sync(void *ctx, int backward, float *stats, size_t n, int64_t *count) {
    dt_ddp *d = ctx;
    DT_TRY(allreduce_dev(d, stats, n));
    if (!backward) DT_TRY(dt_allreduce(d->comm, count, count, 1, DT_I64, DT_SUM));
    return DT_OK;
}

/* Cut buckets from the end: tensors are taken whole, in reverse order, until a
 * bucket reaches its capacity (the first one smaller, so communication starts
 * early). */
static dt_status make_buckets(dt_ddp *d) {
    d->b = calloc((size_t)(d->ntensors > 0 ? d->ntensors : 1), sizeof *d->b);
    if (!d->b) return dt_error(DT_ERR_NOMEM, "out of memory for gradient buckets");
    size_t cap = d->o.first_bucket_bytes / sizeof(float);
    size_t hi = d->rhi, lo = d->rhi;
    int t0 = 0;   /* the range's first tensor */
    while (t0 < d->ntensors && d->t_off[t0] < d->rlo) t0++;
    for (int t = d->ntensors - 1; t >= t0; t--) {
        if (d->t_off[t] >= d->rhi) continue;
        lo = d->t_off[t];
        int last = (t == t0);
        if ((hi - lo) >= cap || last) {
            d->b[d->nb++] = (bucket){.lo = lo, .hi = hi};
            hi = lo;
            cap = d->o.bucket_bytes / sizeof(float);
        }
    }
    return DT_OK;
}

dt_status dt_ddp_init(dt_model *m, dt_comm *comm, int64_t k, const dt_ddp_opts *o, dt_ddp **out) {
    if (k < 1) return dt_error(DT_ERR_INVALID, "ddp: expected at least one local micro-batch, got %lld", (long long)k);
    dt_ddp *d = calloc(1, sizeof *d);
    if (!d) return dt_error(DT_ERR_NOMEM, "out of memory for DDP");
    d->model = m;
    d->ops = dt_model_ops(m);
    d->comm = comm;
    d->world = comm ? dt_comm_size(comm) : 1;
    d->rank = comm ? dt_comm_rank(comm) : 0;
    if (o) d->o = *o;
    else dt_ddp_opts_default(&d->o);
    if (d->o.bucket_bytes < sizeof(float)) d->o.bucket_bytes = sizeof(float);
    if (d->o.first_bucket_bytes < sizeof(float)) d->o.first_bucket_bytes = sizeof(float);
    d->k = k;
    d->n = dt_model_nparams(m);
    d->ntensors = dt_model_nparam_tensors(m);
    d->t_off = calloc((size_t)(d->ntensors + 1), sizeof *d->t_off);
    d->t_len = calloc((size_t)(d->ntensors + 1), sizeof *d->t_len);
    dt_status s = (d->t_off && d->t_len) ? DT_OK : dt_error(DT_ERR_NOMEM, "out of memory for DDP");
    for (int i = 0; s == DT_OK && i < d->ntensors; i++) {
        dt_tensor_info ti;
        s = dt_model_param(m, i, &ti);
        d->t_off[i] = ti.offset;
        d->t_len[i] = (size_t)ti.numel;
    }
    d->rlo = 0;
    d->rhi = d->n;
    if (d->o.range_hi > 0) {
        d->rlo = d->o.range_lo;
        d->rhi = d->o.range_hi;
        int edge_lo = 0, edge_hi = d->rhi == d->n;   /* the range's ends are tensors' edges */
        for (int i = 0; i < d->ntensors; i++) {
            edge_lo |= d->t_off[i] == d->rlo;
            edge_hi |= d->t_off[i] == d->rhi;
        }
        if (s == DT_OK && (d->rlo >= d->rhi || d->rhi > d->n || !edge_lo || !edge_hi))
            s = dt_error(DT_ERR_INVALID, "ddp: gradient range [%zu, %zu) is not a run of whole parameter tensors of "
                         "[0, %zu)", d->rlo, d->rhi, d->n);
    }
    if (s == DT_OK) s = make_buckets(d);
    d->levels = tree_levels(k);
    d->inplace = d->levels > 0 && d->o.in_place && !d->o.sharded_params;
    if (s == DT_OK && d->levels > 0) {
        d->acc = calloc((size_t)d->levels, sizeof *d->acc);
        if (!d->acc) s = dt_error(DT_ERR_NOMEM, "out of memory for gradient accumulation");
        for (int l = d->inplace; s == DT_OK && l < dt_ddp_tree_arrays(k); l++)
            s = dt_mem_alloc(d->ops, DT_MEM_GRADS, (void **)&d->acc[l], (d->rhi - d->rlo) * sizeof(float));
    }
    if (s == DT_OK && d->inplace) s = inplace_init(d);
    if (s != DT_OK) {
        dt_ddp_free(d);
        return s;
    }
    d->stage = d->world > 1 && !d->ops->host_memory && !dt_comm_device_buffers(comm);
    if (d->o.grad_dtype != DT_F32 && d->o.grad_dtype != DT_BF16)
        s = dt_error(DT_ERR_INVALID, "grad_dtype: expected f32 or bf16, got %s", dt_dtype_name(d->o.grad_dtype));
    if (s == DT_OK && d->stage) s = dt_mem_host_alloc(d->ops, DT_MEM_COMM, (void **)&d->host, d->n * sizeof(float));
    if (s == DT_OK && d->world > 1 && d->o.grad_dtype == DT_BF16)
        s = dt_mem_alloc(d->ops, DT_MEM_COMM, (void **)&d->g16, d->n * sizeof(uint16_t));
    if (s != DT_OK) {
        dt_ddp_free(d);
        return s;
    }
    dt_model_set_grad_ready(m, on_grad_ready, d);
    if (d->o.sync_bn && d->world > 1) dt_model_set_bn_sync(m, on_bn_sync, d);
    *out = d;
    return DT_OK;
}

void dt_ddp_free(dt_ddp *d) {
    if (!d) return;
    for (int i = 0; i < d->nb; i++)
        if (d->b[i].work) dt_work_wait(d->b[i].work);
    if (d->acc)
        for (int l = 0; l < d->levels; l++) dt_mem_free(d->ops, d->acc[l]);
    if (d->model && d->inplace) leaf_views(d, 0);
    dt_mem_free(d->ops, d->acc0c);
    dt_mem_free(d->ops, d->leaf);
    free(d->c0off), free(d->vlayer), free(d->vfirst);
    if (d->model) {
        dt_model_set_grad_ready(d->model, NULL, NULL);
        dt_model_set_bn_sync(d->model, NULL, NULL);
    }
    dt_mem_free(d->ops, d->host);
    dt_mem_free(d->ops, d->kept);
    dt_mem_free(d->ops, d->g16);
    free(d->acc);
    free(d->b);
    free(d->t_off);
    free(d->t_len);
    free(d);
}

void dt_ddp_set_final_hook(dt_ddp *d, dt_ddp_final_fn fn, void *ctx) {
    d->final = fn;
    d->final_ctx = ctx;
}

dt_status dt_ddp_begin_micro(dt_ddp *d, int64_t i) {
    if (i < 0 || i >= d->k)
        return dt_error(DT_ERR_INVALID, "ddp: micro-batch %lld out of range [0, %lld)", (long long)i, (long long)d->k);
    d->micro = i;
    d->hook_status = DT_OK;
    if (d->inplace) DT_TRY(leaf_views(d, (int)(i & 1)));
    if (i == 0) {
        d->ready_lo = d->rhi;
        for (int b = 0; b < d->nb; b++) d->b[b].launched = 0;
    }
    return DT_OK;
}

dt_status dt_ddp_finish(dt_ddp *d, double *wait_s) {
    double t0 = dt_now();
    dt_status s = d->hook_status;
    if (d->inplace && s == DT_OK) s = leaf_views(d, 0);   /* a backward without DDP writes the array */
    if (d->ready_lo != d->rlo && s == DT_OK)
        s = dt_error(DT_ERR_INTERNAL, "ddp: backward left gradients [%zu, %zu) unreported", d->rlo, d->ready_lo);
    if (s == DT_OK && d->world > 1 && !d->o.local_only) s = launch_ready(d);
    /* wait for every bucket, even after a failure, so no buffer is still in use */
    for (int i = 0; i < d->nb; i++) {
        if (!d->b[i].work) continue;
        dt_status w = dt_work_wait(d->b[i].work);
        d->b[i].work = NULL;
        if (w == DT_OK) w = bucket_unpack(d, &d->b[i]);
        if (s == DT_OK) s = w;
    }
    if (wait_s) *wait_s = dt_now() - t0;
    return s;
}

/* ---- start-of-run agreement ---------------------------------------------------------- */

static const char *param_name(dt_ddp *d, int t, char *buf, size_t n) {
    dt_tensor_info ti;
    if (dt_model_param(d->model, t, &ti) != DT_OK) snprintf(buf, n, "#%d", t);
    else snprintf(buf, n, "%s", ti.name);
    return buf;
}

/* A per-tensor signature (name and shape) or checksum, all-gathered; the first
 * tensor whose value differs between ranks is reported with the ranks. */
static dt_status compare_across(dt_ddp *d, const uint64_t *mine, int n, const char *what) {
    int W = d->world;
    uint64_t *all = malloc((size_t)W * (size_t)n * sizeof *all);
    if (!all) return dt_error(DT_ERR_NOMEM, "out of memory comparing %s across ranks", what);
    dt_status s = dt_allgather(d->comm, mine, all, (size_t)n, DT_I64);
    for (int t = 0; s == DT_OK && t < n; t++) {
        for (int r = 1; r < W; r++) {
            if (all[(size_t)r * n + t] == all[t]) continue;
            char nb[128];
            char ranks[256] = "";
            size_t used = 0;
            for (int q = 1; q < W && used < sizeof ranks - 16; q++)
                if (all[(size_t)q * n + t] != all[t])
                    used += (size_t)snprintf(ranks + used, sizeof ranks - used, "%s%d", used ? "," : "", q);
            s = dt_error(DT_ERR_MISMATCH, "rank %d: parameter '%s' has a different %s on rank%s %s than on rank 0",
                         d->rank, param_name(d, t, nb, sizeof nb), what, strchr(ranks, ',') ? "s" : "", ranks);
            break;
        }
    }
    free(all);
    return s;
}


static dt_status param_hashes(dt_ddp *d, uint64_t *h, int values) {
    float *host = NULL;
    size_t cap = 0;
    dt_status s = DT_OK;
    for (int t = 0; s == DT_OK && t < d->ntensors; t++) {
        dt_tensor_info ti;
        s = dt_model_param(d->model, t, &ti);
        if (s != DT_OK) break;
        if (!values) {
            char sig[256];
            int len = snprintf(sig, sizeof sig, "%s:%d", ti.name, ti.ndim);
            for (int i = 0; i < ti.ndim && len < (int)sizeof sig - 24; i++)
                len += snprintf(sig + len, sizeof sig - (size_t)len, ",%lld", (long long)ti.shape[i]);
            h[t] = dt_xxh64(sig, (size_t)len, 0);
            continue;
        }
        if (ti.offset < d->rlo || ti.offset >= d->rhi) {   /* not this rank's range: not held, not compared */
            h[t] = 0;
            continue;
        }
        size_t bytes = (size_t)ti.numel * sizeof(float);
        if (bytes > cap) {
            free(host);
            host = malloc(bytes);
            cap = bytes;
            if (!host) return dt_error(DT_ERR_NOMEM, "out of memory hashing parameters");
        }
        s = d->ops->copy_d2h(host, ti.data, bytes);
        h[t] = dt_xxh64(host, bytes, 0);
    }
    free(host);
    return s;
}

dt_status dt_ddp_check_equal(dt_ddp *d) {
    if (d->world <= 1) return DT_OK;
    uint64_t *h = calloc((size_t)d->ntensors + 1, sizeof *h);
    if (!h) return dt_error(DT_ERR_NOMEM, "out of memory hashing parameters");
    dt_status s = param_hashes(d, h, 1);
    if (s == DT_OK) s = compare_across(d, h, d->ntensors, "value (checksum)");
    free(h);
    return s;
}

dt_status dt_ddp_sync_start(dt_ddp *d) {
    if (d->world <= 1) return DT_OK;
    /* same number of parameter tensors and elements everywhere, else nothing below can match */
    int64_t mine[2] = {d->ntensors, (int64_t)d->n}, *all = malloc(2 * (size_t)d->world * sizeof *all);
    if (!all) return dt_error(DT_ERR_NOMEM, "out of memory checking the model across ranks");
    dt_status s = dt_allgather(d->comm, mine, all, 2, DT_I64);
    for (int r = 1; s == DT_OK && r < d->world; r++)
        if (all[2 * r] != mine[0]) {   /* same count: the signatures below name the tensor */
            s = dt_error(DT_ERR_MISMATCH,
                         "rank %d: the model differs across ranks: rank 0 has %lld parameter tensors (%lld values), "
                         "rank %d has %lld (%lld values); every rank must build the same model",
                         d->rank, (long long)all[0], (long long)all[1], r, (long long)all[2 * r],
                         (long long)all[2 * r + 1]);
        }
    free(all);
    if (s != DT_OK) return s;
    uint64_t *h = calloc((size_t)d->ntensors + 1, sizeof *h);
    if (!h) return dt_error(DT_ERR_NOMEM, "out of memory checking the model across ranks");
    s = param_hashes(d, h, 0);
    if (s == DT_OK) s = compare_across(d, h, d->ntensors, "name or shape");
    free(h);
    if (s != DT_OK) return s;
    if (d->o.sharded_params) {
        if (dt_model_nbuffers(d->model) > 0)
            DT_TRY(broadcast_dev(d, dt_model_buffers(d->model), dt_model_nbuffers(d->model) * sizeof(float), 0));
        return DT_OK;
    }
    DT_TRY(broadcast_dev(d, dt_model_params(d->model) + d->rlo, (d->rhi - d->rlo) * sizeof(float), 0));
    if (dt_model_nbuffers(d->model) > 0)
        DT_TRY(broadcast_dev(d, dt_model_buffers(d->model), dt_model_nbuffers(d->model) * sizeof(float), 0));
    return dt_ddp_check_equal(d);
}
