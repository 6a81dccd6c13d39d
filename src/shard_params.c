/*
 * shard_params.c: --shard params (ZeRO-3 / FSDP, see shard.h): units of consecutive
 * layers gathered just before they run and dropped after, the pool of reused slots
 * they are gathered into, the gradient sums reduced to their owners as backward
 * finishes each slice, and the end-of-run gather to rank 0.
 */
#include "shard_impl.h"
#include "mem.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Forward holds a unit and the next; backward a unit, its gradient, the unit before it
 * (pre) and the gradient after it still being summed: a run of L units that are not
 * the rank's own takes min(L + 1, 4) slots, with post min(L + 1, 2) (one unit and one
 * gradient at a time). Gradients take at most two of them (post: one). The pool itself
 * may grow past this (slot_cap); the count is what is in use at once, which tests/plan.sh
 * holds to the measured peak. */
void dt_shard_pool_in_use(int run, int post, int *slots, int *grad_slots) {
    int n = run > 0 ? run + 1 : 0, cap = post ? 2 : 4;
    if (n > cap) n = cap;
    int g = n > 1 ? (n - 1 < 2 ? n - 1 : 2) : 0;
    if (post && g > 1) g = 1;
    *slots = n;
    *grad_slots = g;
}

/* The pool's slots back to the device, when none is taken (after dt_shard_drop_units
 * and the last gradient sums). A slot counts as parameters unless a gradient holds it. */
static void pool_free(dt_shard *s) {
    for (int i = 0; i < s->nslots; i++)
        if (s->slot_used[i]) return;
    for (int i = 0; i < s->nslots; i++) {
        s->ops->free(s->slots[i]);
        dt_mem_sub(DT_MEM_PARAMS, s->slot_floats * sizeof(float));
        s->slots[i] = NULL;
    }
    s->nslots = 0;
}

/* What params mode holds: the hooks and units (their gathers waited for), the pending
 * gradient sums, the ranges, the pool and the layers' views into it. */
void dt_shard_params_free_(dt_shard *s) {
    if (s->units) {
        dt_model_set_layer_hook(s->model, NULL, NULL);
        for (int u = 0; u < s->nunits; u++) {
            dt_mem_sub(DT_MEM_PARAMS, s->units[u].held);
            for (int i = 0; i < s->units[u].nwork; i++) dt_work_wait(s->units[u].work[i]);
            free(s->units[u].work);
        }
    }
    for (int i = 0; i < s->npend; i++) dt_work_wait(s->pend[i].work);
    free(s->units);
    free(s->lunit);
    free(s->pend);
    free(s->rlo);
    free(s->rcnt);
    free(s->rhi);
    free(s->lr0);
    if (s->slots) {
        for (int i = 0; i < dt_model_nlayers(s->model); i++) {
            dt_model_set_param_view(s->model, i, NULL);
            dt_model_set_grad_view(s->model, i, NULL);
        }
        dt_model_set_views_only(s->model, 0);
        pool_free(s);
    }
    free(s->slots);
    free(s->slot_used);
    free(s->lgrad);
    free(s->qlo);
    free(s->qhi);
    free(s->qpos);
    free(s->rrun);
    free(s->lrun);
    free(s->glrun);
}

/* ---- params: gather before a layer runs, drop after ---------------------------------- */

/* op (the device's discard or populate) over [a, b) of buf (a model array) but this
 * rank's shard: the one or two pieces on either side of it. */
static dt_status outside_shard(dt_shard *s, float *buf, size_t a, size_t b, dt_status (*op)(void *, size_t)) {
    size_t mine = s->per * (size_t)s->rank, end = mine + s->per;
    if (a < mine) DT_TRY(op(buf + a, ((b < mine ? b : mine) - a) * sizeof(float)));
    if (b > end) DT_TRY(op(buf + (a > end ? a : end), (b - (a > end ? a : end)) * sizeof(float)));
    return DT_OK;
}

/* Drop [a, b) of buf except this rank's shard. */
static dt_status drop_range(dt_shard *s, float *buf, size_t a, size_t b) {
    return outside_shard(s, buf, a, b, s->ops->discard);
}

/* Pages go back in the device's blocks where they can (ops page_block: the CPU's 2 MiB
 * huge pages). A block given back whole comes back as one page at its next use; one
 * given back in part is split into 4 KiB pages until the whole block is given back,
 * and each of those pages is a page fault at every gather (12 us on a virtual machine
 * here, where 2 MiB takes 250 us). blocks_init finds the blocks. */

/* 1: this rank needs nothing of the parameters [x, y) now: none of its shard, of a
 * unit gathered or of one arriving (the worker thread is writing those). */
static int params_idle(const dt_shard *s, size_t x, size_t y) {
    size_t mine = s->per * (size_t)s->rank, end = mine + s->per;
    if (x < end && mine < y) return 0;
    for (int v = 0; v < s->nunits; v++) {
        const struct shard_unit *V = &s->units[v];
        if (V->state == U_DROPPED) continue;
        for (int q = V->r0; q < V->r0 + V->nr; q++)
            if (s->rlo[q] < y && x < s->rhi[q]) return 0;
    }
    return 1;
}

/* 1: the parameter ranges [r0, r0 + nr) cover [x, y). */
static int ranges_cover(const dt_shard *s, int r0, int nr, size_t x, size_t y) {
    for (int moved = 1; x < y && moved;) {
        moved = 0;
        for (int r = r0; r < r0 + nr; r++)
            if (s->rlo[r] <= x && x < s->rhi[r]) {
                x = s->rhi[r];
                moved = 1;
            }
    }
    return x >= y;
}

static int unit_covers(const dt_shard *s, int u, size_t x, size_t y) {
    return ranges_cover(s, s->units[u].r0, s->units[u].nr, x, y);
}

/* Drop the parameters [a, b) of unit u (dropped), grown to the whole blocks around it
 * where u fills the rest of those blocks and nothing there is needed: such a block
 * comes back whole at u's next gather. A block that other units share stays in 4 KiB
 * pages: gathering one of them in a 2 MiB page would bring the others' bytes early. */
static dt_status drop_params(dt_shard *s, int u, float *p, size_t a, size_t b) {
    size_t bf = s->blk_floats;
    if (s->nblk) {
        size_t lo = a / bf * bf, hi = (b + bf - 1) / bf * bf;
        if (hi > s->nblk * bf) hi = s->nblk * bf;
        if (lo < a && unit_covers(s, u, lo, a) && params_idle(s, lo, a)) a = lo;
        if (hi > b && unit_covers(s, u, b, hi) && params_idle(s, b, hi)) b = hi;
    }
    return drop_range(s, p, a, b);
}

/* The part [*x, *y) of [a, b) in this rank's shard; 0 when there is none. */
static int in_shard(const dt_shard *s, size_t a, size_t b, size_t *x, size_t *y) {
    size_t mine = s->per * (size_t)s->rank, end = mine + s->per;
    *x = a > mine ? a : mine;
    *y = b < end ? b : end;
    return *x < *y;
}

/* Bytes of [a, b) outside this rank's shard: what gathering it adds (accounting). */
static size_t outside(const dt_shard *s, size_t a, size_t b) {
    size_t x, y, in = in_shard(s, a, b, &x, &y) ? y - x : 0;
    return (b - a - in) * sizeof(float);
}

/* One broadcast (or, reducing, one sum) per piece of [a, b) that a rank's shard holds;
 * async collects the handles into u (NULL: blocking). */
static dt_status per_owner(dt_shard *s, float *buf, size_t a, size_t b, int reduce, struct shard_unit *u) {
    for (int q = (int)(a / s->per); q < s->world && (size_t)q * s->per < b; q++) {
        size_t x = (size_t)q * s->per > a ? (size_t)q * s->per : a;
        size_t y = (size_t)(q + 1) * s->per < b ? (size_t)(q + 1) * s->per : b;
        if (u) {
            DT_TRY(dt_broadcast_async(s->comm, buf + x, y - x, DT_F32, q, &u->work[u->nwork]));
            u->nwork++;
            continue;
        }
        float *p = buf + x, *h = s->stage ? s->host + x : p;
        if (s->stage && (reduce || q == s->rank)) DT_TRY(s->ops->copy_d2h(h, p, (y - x) * sizeof(float)));
        if (reduce) DT_TRY(dt_reduce(s->comm, h, h, y - x, DT_F32, DT_SUM, q));
        else DT_TRY(dt_broadcast(s->comm, h, y - x, DT_F32, q));
        if (s->stage && (reduce ? q == s->rank : q != s->rank)) DT_TRY(s->ops->copy_h2d(p, h, (y - x) * sizeof(float)));
    }
    return DT_OK;
}

/* A range of another gathered (or arriving) unit than u that overlaps range r (a tied
 * embedding's two uses): its index, its unit in *v; -1 when none. */
static int live_range(const dt_shard *s, int u, int r, int *v) {
    for (*v = 0; *v < s->nunits; (*v)++) {
        const struct shard_unit *V = &s->units[*v];
        if (*v == u || V->state == U_DROPPED) continue;
        for (int q = V->r0; q < V->r0 + V->nr; q++)
            if (s->rlo[q] < s->rhi[r] && s->rlo[r] < s->rhi[q]) return q;
    }
    return -1;
}

/* The end of the run of ranges from r on (within [r, end)) that lie back to back:
 * consecutive layers' tensors, moved by one call. */
static int run_end(const dt_shard *s, int r, int end) {
    while (r + 1 < end && s->rhi[r] == s->rlo[r + 1]) r++;
    return r + 1;
}

/* ---- the pool ---- */

/* Run q's base in a slot: base + offset is the slot's copy of each parameter of the run
 * (the address arithmetic in integers: base itself may lie before the slot). */
static float *run_base(const dt_shard *s, int q, float *slot) {
    return (float *)((uintptr_t)(slot + s->qpos[q]) - s->qlo[q] * sizeof(float));
}

/* A layer's base in a slot for its run q (NULL: none, the flat array). */
static float *slot_base(const dt_shard *s, int q, float *slot) {
    return slot && q >= 0 ? run_base(s, q, slot) : NULL;
}

/* Point unit u's layers at its slot (NULL: at the flat array). Each layer reads its own
 * ranges' copy: in mixed precision that copy's GEMM weights are rounded in place. */
static dt_status unit_views(dt_shard *s, const struct shard_unit *U, float *slot) {
    for (int i = U->first; i <= U->last; i++) DT_TRY(dt_model_set_param_view(s->model, i, slot_base(s, s->lrun[i], slot)));
    return DT_OK;
}

/* The same for the gradients of the unit's layers that write into its gradient slot. */
static dt_status unit_gviews(dt_shard *s, const struct shard_unit *U, float *slot) {
    for (int i = U->first; i <= U->last; i++)
        if (s->lgrad[i]) DT_TRY(dt_model_set_grad_view(s->model, i, slot_base(s, s->glrun[i], slot)));
    return DT_OK;
}



/* A free slot of the pool. When every slot is taken and the pool has slot_cap of them,
 * the oldest gradient sums are waited for until one frees; a slot is made when none can
 * (at most two per unit). */
static dt_status slot_take(dt_shard *s, float **out) {
    for (;;) {
        for (int i = 0; i < s->nslots; i++)
            if (!s->slot_used[i]) {
                s->slot_used[i] = 1;
                *out = s->slots[i];
                return DT_OK;
            }
        if (s->nslots < s->slot_cap || s->npend == 0) break;
        DT_TRY(dt_shard_grads_settle_(s, 1));
    }
    if (s->nslots >= 2 * s->nunits) return dt_error(DT_ERR_INTERNAL, "shard: more slots taken than units");
    DT_TRY(s->ops->alloc((void **)&s->slots[s->nslots], s->slot_floats * sizeof(float)));
    dt_mem_add(DT_MEM_PARAMS, s->slot_floats * sizeof(float));
    s->slot_used[s->nslots] = 1;
    *out = s->slots[s->nslots++];
    return DT_OK;
}

static void slot_give(dt_shard *s, const float *slot) {
    for (int i = 0; i < s->nslots; i++)
        if (s->slots[i] == slot) s->slot_used[i] = 0;
}

/* The unit's gradient slot goes back once its backward is over and its sums are done. */
static dt_status gslot_settled(dt_shard *s, struct shard_unit *U) {
    if (!U->gslot || !U->gdone || U->gpend > 0) return DT_OK;
    slot_give(s, U->gslot);
    U->gslot = NULL;
    s->ngrad--;
    dt_mem_sub(DT_MEM_GRADS, s->slot_floats * sizeof(float));
    dt_mem_add(DT_MEM_PARAMS, s->slot_floats * sizeof(float));
    return unit_gviews(s, U, NULL);
}

/* Unit u's backward begins writing gradients into a slot: one is taken (two at most for
 * gradients: one written, one summed; the oldest sums are waited for when both are). */
static dt_status gslot_need(dt_shard *s, int u) {
    struct shard_unit *U = &s->units[u];
    U->gdone = 0;
    if (U->gslot) return DT_OK;
    while (s->ngrad >= 2 && s->npend > 0) DT_TRY(dt_shard_grads_settle_(s, 1));
    DT_TRY(slot_take(s, &U->gslot));
    s->ngrad++;
    dt_mem_sub(DT_MEM_PARAMS, s->slot_floats * sizeof(float));
    dt_mem_add(DT_MEM_GRADS, s->slot_floats * sizeof(float));
    return unit_gviews(s, U, U->gslot);
}

/* Gather unit u into a slot: each run's pieces broadcast from their owners (this rank's
 * own pieces copied in first, and sent from the slot); a unit wholly in this rank's
 * shard is sent from where it lies and read there. */
static dt_status pool_fetch(dt_shard *s, struct shard_unit *U) {
    float *p = dt_model_params(s->model);
    if (!U->own) DT_TRY(slot_take(s, &U->slot));
    for (int q = U->q0; q < U->q0 + U->nq; q++) {
        float *base = U->own ? p : run_base(s, q, U->slot);
        size_t x, y;
        if (!U->own && in_shard(s, s->qlo[q], s->qhi[q], &x, &y))
            DT_TRY(s->ops->copy_d2d(base + x, p + x, (y - x) * sizeof(float)));
        DT_TRY(per_owner(s, base, s->qlo[q], s->qhi[q], 0, U));
    }
    return U->own ? DT_OK : unit_views(s, U, U->slot);
}

/* Unit u's slot back to the pool, its layers pointed at the flat array. */
static dt_status pool_drop(dt_shard *s, struct shard_unit *U) {
    if (!U->slot) return DT_OK;
    slot_give(s, U->slot);
    U->slot = NULL;
    return unit_views(s, U, NULL);
}

/* The units' runs and the pool's slot size; the pool is off (0) where a layer's
 * tensors lie in more than one run (one view per layer could not address them). */
static dt_status pool_init(dt_shard *s) {
    int n = dt_model_nlayers(s->model);
    s->qlo = calloc((size_t)s->nranges + 1, sizeof *s->qlo);
    s->qhi = calloc((size_t)s->nranges + 1, sizeof *s->qhi);
    s->qpos = calloc((size_t)s->nranges + 1, sizeof *s->qpos);
    s->rrun = calloc((size_t)s->nranges + 1, sizeof *s->rrun);
    s->lrun = calloc((size_t)n + 1, sizeof *s->lrun);
    s->glrun = calloc((size_t)n + 1, sizeof *s->glrun);
    s->slots = calloc(2 * (size_t)s->nunits + 1, sizeof *s->slots);
    s->slot_used = calloc(2 * (size_t)s->nunits + 1, 1);
    s->lgrad = calloc((size_t)n + 1, 1);
    /* post: two slots, what the gathers in place hold beyond the shard (forward's running
     * and next unit; backward's unit and its gradient); pre: as many as it takes */
    s->slot_cap = s->post ? 2 : 2 * s->nunits;
    if (!s->qlo || !s->qhi || !s->qpos || !s->rrun || !s->lrun || !s->glrun || !s->slots || !s->slot_used || !s->lgrad)
        return dt_error(DT_ERR_NOMEM, "out of memory for sharding");
    /* mixed precision rounds a unit's GEMM weights in place where its layers read them:
     * never in the rank's own shard (the master weights), so every unit takes a slot */
    int lp = dt_model_precision(s->model) != DT_F32;
    size_t mine = s->per * (size_t)s->rank, end = mine + s->per;
    int nq = 0;
    for (int u = 0; u < s->nunits; u++) {
        struct shard_unit *U = &s->units[u];
        size_t pos = 0;
        U->q0 = nq;
        U->own = 1;
        for (int r = U->r0, e; r < U->r0 + U->nr; r = e) {
            e = run_end(s, r, U->r0 + U->nr);
            s->qlo[nq] = s->rlo[r];
            s->qhi[nq] = s->rhi[e - 1];
            s->qpos[nq] = pos;
            pos += s->qhi[nq] - s->qlo[nq];
            if (s->qlo[nq] < mine || s->qhi[nq] > end || lp) U->own = 0;
            for (int x = r; x < e; x++) s->rrun[x] = nq;
            nq++;
        }
        U->nq = nq - U->q0;
        if (!U->own && pos > s->slot_floats) s->slot_floats = pos;
        for (int i = U->first; i <= U->last; i++) {
            int a = s->lr0[i], b = s->lr0[i + 1];
            s->lrun[i] = s->glrun[i] = -1;
            if (a == b) continue;
            s->lrun[i] = s->rrun[a];
            for (int q = U->q0; q < nq; q++)
                if (s->qlo[q] <= s->rlo[a] && s->rhi[b - 1] <= s->qhi[q]) s->glrun[i] = q;
            for (int r = a; r + 1 < b; r++)
                if (s->rhi[r] != s->rlo[r + 1]) s->pool = 0;
            /* the gradient goes to the unit's slot unless the unit is this rank's own or a
             * range of the layer is another unit's too (the tied embedding: its two uses
             * add into one gradient, which stays in the flat array) */
            s->lgrad[i] = !U->own;
            for (int r = a; r < b; r++)
                for (int v = 0; v < s->nunits; v++)
                    for (int x = s->units[v].r0; v != u && x < s->units[v].r0 + s->units[v].nr; x++)
                        if (s->rlo[x] < s->rhi[r] && s->rlo[r] < s->rhi[x]) s->lgrad[i] = 0;
        }
    }
    return DT_OK;
}

/* Start gathering unit u (blocking when staging through host memory). */
static dt_status unit_fetch(dt_shard *s, int u) {
    struct shard_unit *U = &s->units[u];
    if (U->state != U_DROPPED) return DT_OK;
    U->made = 0;
    if (s->pool) {
        DT_TRY(pool_fetch(s, U));
        U->state = U_FLIGHT;
        return DT_OK;
    }
    float *p = dt_model_params(s->model);
    for (int r = U->r0, e; r < U->r0 + U->nr; r = e) {
        /* one broadcast per owner for a run of ranges, and the dropped pages come back
         * in one call each side, not one fault per page */
        e = run_end(s, r, U->r0 + U->nr);
        DT_TRY(outside_shard(s, p, s->rlo[r], s->rhi[e - 1], s->ops->populate));
        DT_TRY(per_owner(s, p, s->rlo[r], s->rhi[e - 1], 0, s->stage ? NULL : U));
    }
    for (int r = U->r0; r < U->r0 + U->nr; r++) {
        int v, q = live_range(s, u, r, &v);
        s->rcnt[r] = !(q >= 0 && s->rcnt[q]);   /* already resident and counted: not again */
        if (s->rcnt[r]) U->held += outside(s, s->rlo[r], s->rhi[r]);
    }
    dt_mem_add(DT_MEM_PARAMS, U->held);
    U->state = s->stage ? U_HERE : U_FLIGHT;
    return DT_OK;
}

/* Unit u is here when this returns. */
static dt_status unit_need(dt_shard *s, int u) {
    struct shard_unit *U = &s->units[u];
    if (U->state == U_HERE && U->made) return DT_OK;
    DT_TRY(unit_fetch(s, u));
    dt_status st = DT_OK;
    for (int i = 0; i < U->nwork; i++) {
        dt_status w = dt_work_wait(U->work[i]);
        if (st == DT_OK) st = w;
    }
    U->nwork = 0;
    U->state = U_HERE;
    U->made = 1;
    /* the parameters arrived in the middle of a pass: the model's derived copies of them
     * (mixed precision's rounded weights) are made now */
    for (int i = U->first; i <= U->last; i++)
        for (int r = s->lr0[i]; st == DT_OK && r < s->lr0[i + 1]; r++)
            st = dt_model_params_arrived(s->model, i, s->rlo[r], s->rhi[r]);
    return st;
}

/* Drop unit u's parameters, except ranges another gathered (or arriving) unit shares
 * (a tied embedding). */
static dt_status unit_drop(dt_shard *s, int u) {
    struct shard_unit *U = &s->units[u];
    if (U->state != U_HERE) return DT_OK;
    U->state = U_DROPPED;
    if (s->pool) return pool_drop(s, U);
    dt_mem_sub(DT_MEM_PARAMS, U->held);
    U->held = 0;
    float *p = dt_model_params(s->model);
    for (int r = U->r0; r < U->r0 + U->nr; r++) {
        int v, q = live_range(s, u, r, &v);
        if (q >= 0 && s->rcnt[r] && !s->rcnt[q]) {   /* it stays: the unit keeping it counts it now */
            size_t b = outside(s, s->rlo[q], s->rhi[q]);
            s->rcnt[q] = 1;
            s->units[v].held += b;
            dt_mem_add(DT_MEM_PARAMS, b);
        }
        s->rcnt[r] = 0;
    }
    /* runs of back-to-back ranges no other unit holds go in one call each */
    for (int r = U->r0, e, v; r < U->r0 + U->nr; r = e) {
        e = r + 1;
        if (live_range(s, u, r, &v) >= 0) continue;
        while (e < U->r0 + U->nr && s->rhi[e - 1] == s->rlo[e] && live_range(s, u, e, &v) < 0) e++;
        DT_TRY(drop_params(s, u, p, s->rlo[r], s->rhi[e - 1]));
    }
    return DT_OK;
}

/* Before a layer's backward writes its gradient: the sums in flight are settled
 * (oldest first) until they and this layer's gradient together fit in a unit, so at
 * most a unit's worth of gradient outside the shard is resident at any time; then the
 * gradient's pages are brought back. */
static dt_status grads_room(dt_shard *s, int layer) {
    const dt_layer *L = dt_model_layer(s->model, layer);
    size_t n = 0;
    for (int t = 0; t < L->ntensors; t++)
        if (L->t[t].role == DT_TENSOR_PARAM) n += (size_t)L->t[t].numel;
    while (s->npend > 0 && n > 0 && s->pend_floats + n > s->unit_floats) DT_TRY(dt_shard_grads_settle_(s, 1));
    /* the gradient's dropped pages come back in one call, not one fault per page */
    float *g = dt_model_grads(s->model);
    for (int r = s->lr0[layer], e; r < s->lr0[layer + 1]; r = e) {
        e = run_end(s, r, s->lr0[layer + 1]);
        DT_TRY(outside_shard(s, g, s->rlo[r], s->rhi[e - 1], s->ops->populate));
    }
    return DT_OK;
}

static dt_status on_layer(void *ctx, int layer, dt_layer_phase phase) {
    dt_shard *s = ctx;
    if (layer == 0 && phase == DT_HOOK_FWD_PRE && s->nblk)   /* a pass begins: no sum in flight */
        memset(s->blk_dead, 0, s->nblk * sizeof *s->blk_dead);
    if (s->full) return DT_OK;
    int u = s->lunit[layer];
    const struct shard_unit *U = &s->units[u];
    switch (phase) {
    case DT_HOOK_FWD_PRE:
        /* a forward begins: the last pass's units (an evaluation's last, kept as for a
         * backward) are not needed now */
        for (int v = 1; layer == 0 && v < s->nunits; v++) DT_TRY(unit_drop(s, v));
        DT_TRY(unit_need(s, u));
        return u + 1 < s->nunits ? unit_fetch(s, u + 1) : DT_OK;
    case DT_HOOK_FWD_POST:
        return layer == U->last && u + 1 < s->nunits ? unit_drop(s, u) : DT_OK;
    case DT_HOOK_BWD_PRE:
        s->cur = layer;
        if (s->pool && s->lgrad[layer]) DT_TRY(gslot_need(s, u));
        else DT_TRY(grads_room(s, layer));
        DT_TRY(unit_need(s, u));
        return u > 0 && !s->post ? unit_fetch(s, u - 1) : DT_OK;
    case DT_HOOK_BWD_POST:
        if (layer != U->first) return DT_OK;
        s->units[u].gdone = 1;
        DT_TRY(gslot_settled(s, &s->units[u]));
        DT_TRY(unit_drop(s, u));
        return u > 0 && s->post ? unit_fetch(s, u - 1) : DT_OK;
    case DT_HOOK_RECOMPUTE:   /* forward again, in backward: the block's next unit is
                               * fetched by PREFETCH, the one before it once backward
                               * reaches this unit, not now: one block in flight. With
                               * post, the gradient sums still in flight settle first */
        if (s->post && s->npend > 0) DT_TRY(dt_shard_grads_settle_(s, s->npend));
        return unit_need(s, u);
    case DT_HOOK_RECOMPUTE_POST:   /* post: backward gathers it again */
        return s->post && layer == U->last ? unit_drop(s, u) : DT_OK;
    case DT_HOOK_PREFETCH:
        return unit_fetch(s, u);
    }
    return DT_OK;
}

/* The gradients [lo, hi) outside the shard are summed and dropped (their whole pages):
 * a block they complete goes back whole, so that the page table of its 4 KiB pieces
 * goes too and the next backward writes it as one 2 MiB page. */
static dt_status grads_blocks(dt_shard *s, float *g, size_t lo, size_t hi) {
    size_t bf = s->blk_floats;
    for (size_t b = s->nblk ? lo / bf : 0; b < s->nblk && b * bf < hi; b++) {
        size_t x = b * bf > lo ? b * bf : lo, y = (b + 1) * bf < hi ? (b + 1) * bf : hi;
        if (!s->blk_need[b]) continue;
        if (y > s->n) y = s->n;
        s->blk_dead[b] += y > x ? y - x : 0;
        if (s->blk_dead[b] < s->blk_need[b]) continue;
        s->blk_dead[b] = 0;
        DT_TRY(s->ops->discard(g + b * bf, bf * sizeof(float)));
    }
    return DT_OK;
}

/* Gradient sums in flight, oldest first: wait for the first `force` of them, settle
 * the ones after that are done already; a settled slice is dropped but for this rank's
 * shard. */
dt_status dt_shard_grads_settle_(dt_shard *s, int force) {
    float *g = dt_model_grads(s->model);
    dt_status st = DT_OK;
    int i = 0;
    for (; i < s->npend && (i < force || dt_work_test(s->pend[i].work)); i++) {
        dt_status w = dt_work_wait(s->pend[i].work);
        if (s->pend[i].unit >= 0) {   /* from a gradient slot: this rank's part to the shard */
            struct shard_unit *U = &s->units[s->pend[i].unit];
            size_t x, y;
            if (w == DT_OK && in_shard(s, s->pend[i].lo, s->pend[i].hi, &x, &y))
                w = s->ops->copy_d2d(g + x, s->pend[i].base + x, (y - x) * sizeof(float));
            U->gpend--;
            if (w == DT_OK) w = gslot_settled(s, U);
            if (st == DT_OK) st = w;
            continue;
        }
        if (w == DT_OK) w = drop_range(s, g, s->pend[i].lo, s->pend[i].hi);
        if (w == DT_OK) w = grads_blocks(s, g, s->pend[i].lo, s->pend[i].hi);
        dt_mem_sub(DT_MEM_GRADS, outside(s, s->pend[i].lo, s->pend[i].hi));
        if (st == DT_OK) st = w;
        s->pend_floats -= s->pend[i].hi - s->pend[i].lo;
    }
    memmove(s->pend, s->pend + i, (size_t)(s->npend - i) * sizeof *s->pend);
    s->npend -= i;
    return st;
}

/* A gradient slice is final on this rank: summed over the ranks in the all-reduce's tree
 * (comm.h), on the worker thread while backward goes on, then dropped but for this
 * rank's shard. At most a unit's worth is in flight. */
static dt_status on_final(void *ctx, size_t lo, size_t hi) {
    dt_shard *s = ctx;
    float *g = dt_model_grads(s->model);
    if (s->stage) {
        DT_TRY(per_owner(s, g, lo, hi, 1, NULL));
        return drop_range(s, g, lo, hi);
    }
    float *base = dt_model_grads_written(s->model);
    if (base != g) {   /* the layer wrote into its unit's gradient slot */
        if (s->npend == s->pend_cap) DT_TRY(dt_shard_grads_settle_(s, 1));
        DT_TRY(dt_allreduce_async(s->comm, base + lo, base + lo, hi - lo, DT_F32, DT_SUM, &s->pend[s->npend].work));
        s->units[s->lunit[s->cur]].gpend++;
        s->pend[s->npend].lo = lo;
        s->pend[s->npend].hi = hi;
        s->pend[s->npend].base = base;
        s->pend[s->npend++].unit = s->lunit[s->cur];
        return dt_shard_grads_settle_(s, 0);
    }
    while (s->npend > 0 && (s->npend == s->pend_cap || s->pend_floats > s->unit_floats))
        DT_TRY(dt_shard_grads_settle_(s, 1));
    DT_TRY(dt_allreduce_async(s->comm, g + lo, g + lo, hi - lo, DT_F32, DT_SUM, &s->pend[s->npend].work));
    s->pend[s->npend].unit = -1;
    dt_mem_add(DT_MEM_GRADS, outside(s, lo, hi));   /* backward wrote it; held until summed */
    s->pend[s->npend].lo = lo;
    s->pend[s->npend++].hi = hi;
    s->pend_floats += hi - lo;
    return dt_shard_grads_settle_(s, 0);
}

/* The model's arrays in blocks. A block inside the shard stays resident, whole. One
 * outside it that one unit's parameters fill comes and goes with the unit (drop_params),
 * and its gradients go back once summed if one layer's parameters fill it: blk_need
 * gradients (a block layers share would be written as one 2 MiB page by the first
 * layer's backward, before grads_room has made room for the next layer's gradient).
 * Every other block stays in small pages: it is resident in part. */
static dt_status blocks_init(dt_shard *s) {
    size_t pb = s->ops->page_block, cap = s->per * (size_t)s->world, mine = s->per * (size_t)s->rank,
           end = mine + s->per, bf = pb / sizeof(float);
    float *p = dt_model_params(s->model), *g = dt_model_grads(s->model);
    /* a partial last block is in 4 KiB pages (cpu_alloc) */
    if (!bf || cap < bf || (((uintptr_t)p | (uintptr_t)g) & (pb - 1))) return DT_OK;
    size_t nblk = cap / bf;
    s->blk_need = calloc(nblk, sizeof *s->blk_need);
    s->blk_dead = calloc(nblk, sizeof *s->blk_dead);
    if (!s->blk_need || !s->blk_dead) return dt_error(DT_ERR_NOMEM, "out of memory for sharding");
    s->nblk = nblk;
    s->blk_floats = bf;
    for (size_t b = 0; b < s->nblk; b++) {
        size_t lo = b * bf, hi = lo + bf < s->n ? lo + bf : s->n;
        if (lo >= mine && lo + bf <= end) continue;
        int unit = 0, layer = 0, shard = lo < end && mine < lo + bf;
        for (int u = 0; u < s->nunits && !unit && !shard && hi > lo; u++) unit = unit_covers(s, u, lo, hi);
        for (int i = 0; i < dt_model_nlayers(s->model) && !layer && unit; i++)
            layer = ranges_cover(s, s->lr0[i], s->lr0[i + 1] - s->lr0[i], lo, hi);
        if (layer) s->blk_need[b] = hi - lo;
        else DT_TRY(s->ops->small_pages(g + lo, bf * sizeof(float)));
        if (!unit) DT_TRY(s->ops->small_pages(p + lo, bf * sizeof(float)));
    }
    return DT_OK;
}

dt_status dt_shard_attach(dt_shard *s, dt_ddp *ddp, size_t unit_bytes, dt_shard_prefetch prefetch) {
    if (!params_sharded(s)) return DT_OK;
    s->post = prefetch == DT_PREFETCH_POST;
    s->unit_floats = unit_bytes / sizeof(float) > 0 ? unit_bytes / sizeof(float) : 1;
    int n = dt_model_nlayers(s->model), cap = 0;
    for (int i = 0; i < n; i++) cap += dt_model_layer(s->model, i)->ntensors;
    s->rlo = calloc((size_t)cap + 1, sizeof *s->rlo);
    s->rhi = calloc((size_t)cap + 1, sizeof *s->rhi);
    s->rcnt = calloc((size_t)cap + 1, sizeof *s->rcnt);
    s->lunit = calloc((size_t)n + 1, sizeof *s->lunit);
    s->lr0 = calloc((size_t)n + 1, sizeof *s->lr0);
    s->units = calloc((size_t)n + 1, sizeof *s->units);
    s->pend_cap = cap + 1;
    s->pend = calloc((size_t)s->pend_cap, sizeof *s->pend);
    if (!s->rlo || !s->rhi || !s->rcnt || !s->lunit || !s->lr0 || !s->units || !s->pend) return dt_error(DT_ERR_NOMEM, "out of memory for sharding");
    s->nunits = dt_model_units(s->model, s->unit_floats, s->lunit, NULL);
    int nr = 0;
    for (int i = 0; i < n; i++) {
        const dt_layer *L = dt_model_layer(s->model, i);
        struct shard_unit *U = &s->units[s->lunit[i]];
        if (i == 0 || s->lunit[i] != s->lunit[i - 1]) {
            U->first = i;
            U->r0 = nr;
        }
        s->lr0[i] = nr;
        for (int t = 0; t < L->ntensors; t++) {
            const dt_layer_tensor *T = &L->t[t];
            if ((T->role != DT_TENSOR_PARAM && T->role != DT_TENSOR_TIED) || T->numel == 0) continue;
            s->rlo[nr] = T->offset;
            s->rhi[nr++] = T->offset + (size_t)T->numel;
        }
        U->last = i;
        U->nr = nr - U->r0;
    }
    s->nranges = s->lr0[n] = nr;
    for (int u = 0; u < s->nunits; u++) {   /* the most broadcasts a unit's gather takes */
        struct shard_unit *V = &s->units[u];
        for (int r = V->r0; r < V->r0 + V->nr; r++) V->cap += (int)((s->rhi[r] - 1) / s->per - s->rlo[r] / s->per) + 1;
        if (!(V->work = calloc((size_t)V->cap + 1, sizeof *V->work))) return dt_error(DT_ERR_NOMEM, "out of memory for sharding");
    }
    int pool;
    DT_TRY(dt_shard_pool_env(&pool));
    s->pool = !s->stage && pool;
    if (s->pool) DT_TRY(pool_init(s));
    if (s->ops->page_block) DT_TRY(blocks_init(s));
    s->full = 1;   /* until the start-of-run broadcast is done and drop_params is called */
    dt_model_set_layer_hook(s->model, on_layer, s);
    dt_ddp_set_final_hook(ddp, on_final, s);
    return DT_OK;
}

#define SHARD_GATHER_TAG 0x5348   /* the end-of-run gather's messages to rank 0 */

dt_status dt_shard_gather_root(dt_shard *s) {
    if (!params_sharded(s) || s->full) return DT_OK;
    for (int u = 0; u < s->nunits; u++)
        if (s->units[u].state == U_FLIGHT) DT_TRY(unit_need(s, u));
    float *p = dt_model_params(s->model);
    for (int q = 1; q < s->world; q++) {
        size_t lo = (size_t)q * s->per, hi = lo + s->per < s->n ? lo + s->per : s->n;
        if (lo >= hi || (s->rank != 0 && s->rank != q)) continue;
        float *h = s->stage ? s->host + lo : p + lo;
        if (s->rank == 0) DT_TRY(s->ops->populate(p + lo, (hi - lo) * sizeof(float)));
        if (s->rank == q) {
            if (s->stage) DT_TRY(s->ops->copy_d2h(h, p + lo, (hi - lo) * sizeof(float)));
            DT_TRY(dt_send(s->comm, h, hi - lo, DT_F32, 0, SHARD_GATHER_TAG));
        } else {
            DT_TRY(dt_recv(s->comm, h, hi - lo, DT_F32, q, SHARD_GATHER_TAG));
            if (s->stage) DT_TRY(s->ops->copy_h2d(p + lo, h, (hi - lo) * sizeof(float)));
        }
    }
    /* training is over: the pool goes back (an evaluation after this takes slots again) */
    if (s->rank != 0) {
        DT_TRY(dt_shard_drop_units(s));   /* its shard only, as between steps */
        if (s->pool) pool_free(s);
        return DT_OK;
    }
    for (int u = 0; u < s->nunits && s->pool; u++) DT_TRY(pool_drop(s, &s->units[u]));   /* read the whole array */
    dt_model_set_views_only(s->model, 0);
    dt_model_set_resident(s->model, 0, SIZE_MAX);
    if (s->pool) pool_free(s);
    for (int u = 0; u < s->nunits; u++) {
        s->units[u].state = U_HERE;
        dt_mem_sub(DT_MEM_PARAMS, s->units[u].held);
        s->units[u].held = 0;
    }
    memset(s->rcnt, 0, (size_t)s->nranges);
    s->full_held = outside(s, 0, s->n);
    dt_mem_add(DT_MEM_PARAMS, s->full_held);
    s->full = 1;
    return DT_OK;
}

dt_status dt_shard_drop_units(dt_shard *s) {
    if (!params_sharded(s) || s->full) return DT_OK;
    for (int u = 0; u < s->nunits; u++) {
        if (s->units[u].state == U_FLIGHT) DT_TRY(unit_need(s, u));
        DT_TRY(unit_drop(s, u));
    }
    return DT_OK;
}

dt_status dt_shard_release_grads(dt_shard *s) {
    if (!params_sharded(s) || s->grads_gone || !gives_back(s)) return DT_OK;
    DT_TRY(dt_shard_grads_settle_(s, s->npend));
    pool_free(s);   /* unless a unit still holds a slot: then at the end-of-run gather */
    DT_TRY(s->ops->discard(dt_model_grads(s->model), s->per * (size_t)s->world * sizeof(float)));
    s->grads_gone = s->per * sizeof(float);
    dt_mem_sub(DT_MEM_GRADS, s->grads_gone);
    return DT_OK;
}

dt_status dt_shard_drop_params(dt_shard *s) {
    if (!params_sharded(s)) return DT_OK;
    size_t all = s->per * (size_t)s->world;
    DT_TRY(drop_range(s, dt_model_params(s->model), 0, all));
    DT_TRY(drop_range(s, dt_model_grads(s->model), 0, all));
    for (int u = 0; u < s->nunits; u++) {
        if (s->pool) DT_TRY(pool_drop(s, &s->units[u]));
        s->units[u].state = U_DROPPED;
        dt_mem_sub(DT_MEM_PARAMS, s->units[u].held);
        s->units[u].held = 0;
    }
    memset(s->rcnt, 0, (size_t)s->nranges);
    dt_mem_sub(DT_MEM_PARAMS, s->full_held);
    s->full_held = 0;
    s->full = 0;
    /* mixed precision: the layers read their units' slots, rounded there */
    dt_model_set_views_only(s->model, s->pool && dt_model_precision(s->model) != DT_F32);
    dt_model_set_resident(s->model, s->per * (size_t)s->rank, s->per * (size_t)(s->rank + 1));
    return DT_OK;
}

