/*
 * test_pipeline.c: the pipeline schedules' action lists (pipeline.h) against their
 * definitions, for P = 1..8 stages and M = P..3P+1 micro-batches (interleaved: V = 1..4
 * chunks per stage, M the multiples of P up to 4P): every micro-batch's forward and
 * backward once per chunk, forward first, boundary tensors received before use and sent
 * after, each chunk's backwards in micro-batch order (the order one process sums in), no
 * hang when every send waits for its receive, GPipe holding M micro-batches of
 * activations, 1F1B at most P, interleaved at most (V + 1) P - 1 chunks. Timed on one
 * clock (a stage's forward 1, backward 2, split evenly over its chunks; every send
 * waiting for its receive), interleaved's idle fraction is below 1F1B's and near its
 * theory. The check itself is shown to catch a hang, an out-of-order backward (also one
 * chunk's), a forward before its input; M < P, M no multiple of P with chunks, chunks
 * on a schedule without, and chunks on one stage are refused, naming the numbers.
 * The cut's work shares sum to 1, and the cut by the work and by the parameters each
 * minimise what they balance.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline.h"
#include "tap.h"
#include "train.h"

/* Every stage's list of schedule `name` for P stages of V chunks and M micro-batches. */
static dt_status build_v(const char *name, int P, int V, int M, dt_pp_list *lists) {
    for (int s = 0; s < P; s++) DT_TRY(dt_pp_build(dt_pp_find(name), P, V, s, M, &lists[s]));
    return DT_OK;
}

static dt_status build_all(const char *name, int P, int M, dt_pp_list *lists) { return build_v(name, P, 1, M, lists); }

static void free_all(dt_pp_list *lists, int P) {
    for (int s = 0; s < P; s++) dt_pp_list_free(&lists[s]);
}

/* The lists run on one clock: a computation of a chunk takes 1 / V (forward) or 2 / V
 * (backward). With `wait` a send and its receive happen together once both stages are
 * there (dt_send as it is); without, a send takes no time and its receive waits for
 * it (a send that does not wait for its receiver). Returns the idle fraction of the
 * pipeline (1 - one stage's work over the time all take), or -1 when the lists hang. */
static double idle_fraction(const dt_pp_list *lists, int P, int M, int wait) {
    int V = lists[0].chunks, pos[16] = {0};
    double clock[16] = {0};
    double *sent = calloc((size_t)P * (size_t)V * (size_t)M * 2, sizeof *sent);   /* [c][m][act, grad]: when, or 0 */
    for (int moved = 1; moved;) {
        moved = 0;
        for (int s = 0; s < P; s++)
            while (pos[s] < lists[s].n) {
                dt_pp_action a = lists[s].a[pos[s]];
                if (a.op == DT_PP_FWD || a.op == DT_PP_BWD) {
                    clock[s] += (a.op == DT_PP_FWD ? 1.0 : 2.0) / V;
                    pos[s]++, moved = 1;
                    continue;
                }
                int up = a.op == DT_PP_SEND_ACT || a.op == DT_PP_RECV_GRAD;
                int c = a.chunk * P + s + (up ? 1 : -1), peer = c % P, chunk = c / P;
                if (!wait) {   /* the tensor's slot: the sending chunk's, by micro-batch and kind */
                    int send = a.op == DT_PP_SEND_ACT || a.op == DT_PP_SEND_GRAD, grad = a.op == DT_PP_SEND_GRAD ||
                                                                                        a.op == DT_PP_RECV_GRAD;
                    int from = send ? a.chunk * P + s : c;
                    double *t = &sent[((size_t)from * (size_t)M + (size_t)a.micro) * 2 + (size_t)grad];
                    if (send) *t = clock[s] + 1e-9;
                    else if (*t == 0.0) break;
                    else if (*t > clock[s]) clock[s] = *t;
                    pos[s]++, moved = 1;
                    continue;
                }
                dt_pp_op want = a.op == DT_PP_SEND_ACT ? DT_PP_RECV_ACT : a.op == DT_PP_RECV_ACT ? DT_PP_SEND_ACT
                              : a.op == DT_PP_SEND_GRAD ? DT_PP_RECV_GRAD : DT_PP_SEND_GRAD;
                if (pos[peer] >= lists[peer].n) break;
                dt_pp_action b = lists[peer].a[pos[peer]];
                if (b.op != want || b.micro != a.micro || b.chunk != chunk) break;
                double t = clock[s] > clock[peer] ? clock[s] : clock[peer];
                clock[s] = clock[peer] = t;
                pos[s]++, pos[peer]++, moved = 1;
            }
    }
    free(sent);
    double end = 0.0;
    for (int s = 0; s < P; s++) {
        if (pos[s] < lists[s].n) return -1.0;
        if (clock[s] > end) end = clock[s];
    }
    return 1.0 - 3.0 * M / end;
}

static void test_grid(const char *name) {
    int bad = 0, cases = 0, bound_ok = 1;
    char why[512] = "";
    for (int P = 1; P <= 8; P++)
        for (int M = P; M <= 3 * P + 1; M++) {
            dt_pp_list lists[8];
            memset(lists, 0, sizeof lists);
            int held = -1;
            dt_status s = build_all(name, P, M, lists);
            if (s == DT_OK) s = dt_pp_check(lists, P, M, &held);
            cases++;
            if (s != DT_OK && !bad++) snprintf(why, sizeof why, "P=%d M=%d: %s", P, M, dt_last_error());
            int want = !strcmp(name, "gpipe") ? M : P;   /* stage 0 holds the most */
            if (s == DT_OK && held != want) {
                bound_ok = 0;
                if (!why[0]) snprintf(why, sizeof why, "P=%d M=%d: %d in flight, expected %d", P, M, held, want);
            }
            free_all(lists, P);
        }
    ok(bad == 0, "%s: every list of %d (P, M) holds to the definitions and runs without a hang%s%s", name, cases,
       why[0] ? ": " : "", why);
    ok(bound_ok, "%s: activations in flight: %s", name, !strcmp(name, "gpipe") ? "M" : "P, at most");
}

static void test_interleaved_grid(void) {
    int bad = 0, cases = 0, bound_ok = 1;
    char why[512] = "";
    for (int P = 2; P <= 8; P++)
        for (int V = 1; V <= 4; V++)
            for (int M = P; M <= 4 * P; M += V > 1 ? P : 1) {
                dt_pp_list lists[8];
                memset(lists, 0, sizeof lists);
                int held = -1;
                dt_status s = build_v("interleaved", P, V, M, lists);
                if (s == DT_OK) s = dt_pp_check(lists, P, M, &held);
                cases++;
                if (s != DT_OK && !bad++) snprintf(why, sizeof why, "P=%d V=%d M=%d: %s", P, V, M, dt_last_error());
                int want = V == 1 ? P : (V + 1) * P - 1;
                if (want > V * M) want = V * M;
                if (s == DT_OK && held != want) {
                    bound_ok = 0;
                    if (!why[0]) snprintf(why, sizeof why, "P=%d V=%d M=%d: %d in flight, expected %d", P, V, M, held, want);
                }
                free_all(lists, P);
            }
    ok(bad == 0, "interleaved: every list of %d (P, V, M) holds to the definitions and runs without a hang%s%s", cases,
       why[0] ? ": " : "", why);
    ok(bound_ok, "interleaved: chunks of activations in flight: at most (V + 1) P - 1 (P with V = 1)%s%s",
       why[0] ? ": " : "", why);
    /* the point of it: a smaller bubble, near (P - 1) / (V M + P - 1), where sends do not
     * wait for their receivers; where they do, no hang, but no gain either */
    for (int P = 2; P <= 4; P *= 2)
        for (int M = 8; M <= 16; M *= 2) {
            dt_pp_list a[4], b[4];
            memset(a, 0, sizeof a), memset(b, 0, sizeof b);
            build_all("1f1b", P, M, a);
            build_v("interleaved", P, 2, M, b);
            double i1 = idle_fraction(a, P, M, 0), i2 = idle_fraction(b, P, M, 0), w1 = idle_fraction(a, P, M, 1),
                   w2 = idle_fraction(b, P, M, 1);
            double t1 = (P - 1.0) / (M + P - 1.0), t2 = (P - 1.0) / (2.0 * M + P - 1.0);
            ok(i2 >= 0 && i2 < i1 && i2 <= t2 + 0.02 && w2 >= 0, "P=%d M=%d: idle 1f1b %.3f (theory %.3f), interleaved "
               "V=2 %.3f (theory %.3f); with sends that wait %.3f and %.3f", P, M, i1, t1, i2, t2, w1, w2);
            free_all(a, P), free_all(b, P);
        }
}

/* Plant faults in correct 1F1B lists of 4 stages and 8 micro-batches: the check sees them. */
static void test_check_catches(void) {
    const int P = 4, M = 8;
    dt_pp_list lists[4];
    memset(lists, 0, sizeof lists);
    if (!ok(build_all("1f1b", P, M, lists) == DT_OK, "1f1b lists of 4 stages, 8 micro-batches")) return;
    /* the naive 1F1B order: a steady-state stage sends its output before it receives the
     * gradient its successor is sending it: both wait */
    dt_pp_list *l = &lists[1];
    int k = -1;
    for (int i = 0; i + 1 < l->n && k < 0; i++)
        if (l->a[i].op == DT_PP_RECV_GRAD && l->a[i + 1].op == DT_PP_SEND_ACT) k = i;
    if (ok(k >= 0, "stage 1 receives a gradient just before it sends an output")) {
        dt_pp_action t = l->a[k];
        l->a[k] = l->a[k + 1];
        l->a[k + 1] = t;
        ok(dt_pp_check(lists, P, M, NULL) == DT_ERR_INTERNAL && strstr(dt_last_error(), "hangs"),
           "sending first is caught as a hang (%s)", dt_last_error());
        l->a[k + 1] = l->a[k];
        l->a[k] = t;
    }
    ok(dt_pp_check(lists, P, M, NULL) == DT_OK, "the list restored passes again");
    free_all(lists, P);
    /* two backwards swapped (GPipe: all forwards first, so only the order is wrong) */
    memset(lists, 0, sizeof lists);
    build_all("gpipe", P, M, lists);
    l = &lists[3];
    int b0 = -1, b1 = -1;
    for (int i = 0; i < l->n; i++)
        if (l->a[i].op == DT_PP_BWD) { if (b0 < 0) b0 = i; else if (b1 < 0) b1 = i; }
    int tmp = l->a[b0].micro;
    l->a[b0].micro = l->a[b1].micro;
    l->a[b1].micro = tmp;
    ok(dt_pp_check(lists, P, M, NULL) == DT_ERR_INTERNAL && strstr(dt_last_error(), "out of micro-batch order"),
       "a backward out of micro-batch order is caught (%s)", dt_last_error());
    free_all(lists, P);
    /* interleaved: two backwards of one chunk swapped (the sums of that chunk's layers
     * would go in another order), and a receive from the wrong chunk */
    memset(lists, 0, sizeof lists);
    if (ok(build_v("interleaved", 2, 2, 4, lists) == DT_OK && dt_pp_check(lists, 2, 4, NULL) == DT_OK,
           "interleaved lists of 2 stages x 2 chunks, 4 micro-batches")) {
        l = &lists[1];
        /* both gradients of chunk 0 received first (stage 0 sends them in that order), then
         * its two backwards swapped */
        int g0 = -1, g1 = -1;
        for (int i = 0; i < l->n; i++)
            if (l->a[i].op == DT_PP_RECV_GRAD && l->a[i].chunk == 0) { if (g0 < 0) g0 = i; else if (g1 < 0) g1 = i; }
        dt_pp_action g = l->a[g1];
        memmove(&l->a[g0 + 2], &l->a[g0 + 1], (size_t)(g1 - g0 - 1) * sizeof *l->a);
        l->a[g0 + 1] = g;
        b0 = b1 = -1;
        for (int i = 0; i < l->n; i++)
            if (l->a[i].op == DT_PP_BWD && l->a[i].chunk == 0) { if (b0 < 0) b0 = i; else if (b1 < 0) b1 = i; }
        tmp = l->a[b0].micro;
        l->a[b0].micro = l->a[b1].micro;
        l->a[b1].micro = tmp;
        ok(dt_pp_check(lists, 2, 4, NULL) == DT_ERR_INTERNAL && strstr(dt_last_error(), "out of micro-batch order") &&
           strstr(dt_last_error(), "BWD 1.0 out of"), "one chunk's backwards out of order are caught (%s)", dt_last_error());
        l->a[b1].micro = l->a[b0].micro;
        l->a[b0].micro = tmp;
        int r = -1;
        for (int i = 0; i < l->n && r < 0; i++)
            if (l->a[i].op == DT_PP_RECV_ACT && l->a[i].chunk == 1) r = i;
        l->a[r].chunk = 0;
        ok(dt_pp_check(lists, 2, 4, NULL) == DT_ERR_INTERNAL, "a receive for the wrong chunk is caught (%s)",
           dt_last_error());
    }
    free_all(lists, 2);
    /* a forward before its input on stage 2 */
    memset(lists, 0, sizeof lists);
    build_all("gpipe", P, M, lists);
    l = &lists[2];
    dt_pp_action t = l->a[0];   /* RECV_ACT 0, FWD 0 */
    l->a[0] = l->a[1];
    l->a[1] = t;
    ok(dt_pp_check(lists, P, M, NULL) == DT_ERR_INTERNAL && strstr(dt_last_error(), "before its input arrived"),
       "a forward before its input is caught (%s)", dt_last_error());
    free_all(lists, P);
}

int main(void) {
    char names[64];
    ok(dt_pp_find("gpipe") && dt_pp_find("1f1b") && dt_pp_find("interleaved") && !dt_pp_find("zb"), "schedules by name");
    is_str(dt_pp_names(names, sizeof names), "gpipe, 1f1b or interleaved", "their names for a message");
    ok(dt_pp_chunked(dt_pp_find("interleaved")) && !dt_pp_chunked(dt_pp_find("1f1b")), "interleaved alone takes chunks");
    test_grid("gpipe");
    test_grid("1f1b");
    test_interleaved_grid();
    test_check_catches();
    dt_pp_list l;
    ok(dt_pp_build(dt_pp_find("1f1b"), 4, 1, 0, 3, &l) == DT_ERR_INVALID && strstr(dt_last_error(), "3 micro-batches") &&
       strstr(dt_last_error(), "4 stages"), "fewer micro-batches than stages: refused, naming both (%s)", dt_last_error());
    ok(dt_pp_build(dt_pp_find("1f1b"), 4, 1, 4, 8, &l) == DT_ERR_INVALID, "a stage out of range: refused");
    ok(dt_pp_build(dt_pp_find("1f1b"), 4, 2, 0, 8, &l) == DT_ERR_INVALID && strstr(dt_last_error(), "interleaved"),
       "chunks on a schedule without: refused (%s)", dt_last_error());
    ok(dt_pp_build(dt_pp_find("interleaved"), 4, 2, 0, 6, &l) == DT_ERR_INVALID &&
       strstr(dt_last_error(), "6 micro-batches are not a multiple of the 4 stages"),
       "interleaved chunks over micro-batches no multiple of the stages: refused (%s)", dt_last_error());
    ok(dt_pp_build(dt_pp_find("interleaved"), 1, 2, 0, 4, &l) == DT_ERR_INVALID && strstr(dt_last_error(), "at least 2"),
       "chunks on one stage: refused (%s)", dt_last_error());
    /* a library caller's chunk count beyond the option's bound is refused, not run */
    dt_train_opts o;
    dt_train_opts_default(&o);
    o.pipeline = 2;
    o.pipeline_schedule = "interleaved";
    o.micro_batches = 8;
    o.batch = 16;
    o.virtual_stages = 65;
    ok(dt_train_pipe_check(&o, 2, 8) == DT_ERR_INVALID && strstr(dt_last_error(), "at most 64 chunks"),
       "65 chunks a stage: refused (%s)", dt_last_error());
    o.virtual_stages = 2;
    ok(dt_train_pipe_check(&o, 2, 8) == DT_OK, "2 chunks a stage on 2 stages of 8 micro-batches: accepted");
    /* stage 1 of 3 with 4 micro-batches, 1F1B: one warm-up forward, then alternating */
    char dump[1024];
    dt_pp_build(dt_pp_find("1f1b"), 3, 1, 1, 4, &l);
    dt_pp_dump(&l, dump, sizeof dump);
    is_str(dump, "RECV_ACT 0\nFWD 0\nSEND_ACT 0\n"
                 "RECV_ACT 1\nFWD 1\nRECV_GRAD 0\nSEND_ACT 1\nBWD 0\nSEND_GRAD 0\n"
                 "RECV_ACT 2\nFWD 2\nRECV_GRAD 1\nSEND_ACT 2\nBWD 1\nSEND_GRAD 1\n"
                 "RECV_ACT 3\nFWD 3\nRECV_GRAD 2\nSEND_ACT 3\nBWD 2\nSEND_GRAD 2\n"
                 "RECV_GRAD 3\nBWD 3\nSEND_GRAD 3\n", "1f1b, stage 1 of 3, 4 micro-batches, as dumped");
    int in = -1, sets = -1, grads = -1, unsent = -1;
    dt_status hs = dt_pp_chunk_held(&l, 0, &in, &sets, &grads, &unsent);
    ok(hs == DT_OK && in == 2 && sets == 2 && grads == 1 && unsent == 1, "... holds 2 inputs, 2 forwarded micro-batches, 1 boundary gradient, 1 unsent (%d %d %d %d)", in,
       sets, grads, unsent);
    dt_pp_list_free(&l);
    /* interleaved, stage 1 of 2 with 2 chunks and 2 micro-batches, as dumped (micro.chunk):
     * 2 warm-up forwards, then one forward and one backward; its chunk 1 is the model's
     * last, whose backward follows its forward; each tensor goes the moment it is made
     * (a forward 1, a backward 2 on the builder's clock) */
    dt_pp_build(dt_pp_find("interleaved"), 2, 2, 1, 2, &l);
    dt_pp_dump(&l, dump, sizeof dump);
    is_str(dump, "RECV_ACT 0.0\nFWD 0.0\nRECV_ACT 1.0\nSEND_ACT 0.0\nFWD 1.0\nRECV_ACT 0.1\nSEND_ACT 1.0\n"
                 "FWD 0.1\nRECV_ACT 1.1\nBWD 0.1\nSEND_GRAD 0.1\nFWD 1.1\nBWD 1.1\nRECV_GRAD 0.0\nSEND_GRAD 1.1\n"
                 "BWD 0.0\nRECV_GRAD 1.0\nSEND_GRAD 0.0\nBWD 1.0\nSEND_GRAD 1.0\n",
           "interleaved, stage 1 of 2, 2 chunks, 2 micro-batches, as dumped");
    /* its chunk 0 (the model's chunk 1) receives micro-batch 1's gradient before it sent
     * 0's on: with a tied tensor owned by chunk 0 and read by chunk 3 it relays the
     * head's parts in 2 slots; chunk 1 (the model's last, the user) receives none */
    hs = dt_pp_chunk_held(&l, 0, &in, &sets, &grads, &unsent);
    ok(hs == DT_OK && in == 2 && sets == 2 && grads == 1 && unsent == 2, "... its chunk 0 holds 2 inputs, 2 forwarded, 1 gradient, 2 unsent (%d %d %d %d)", in, sets, grads,
       unsent);
    dt_pp_rider tied = {.off = 0, .len = 100, .owner = 0, .user = 3};
    ok(dt_pp_relay_slots(&tied, 1, 1, unsent, grads) == 2, "... so it keeps 2 relay slots");
    hs = dt_pp_chunk_held(&l, 1, &in, &sets, &grads, &unsent);
    ok(hs == DT_OK && in == 2 && sets == 1 && grads == 0 && unsent == 0, "... its chunk 1 holds 2 inputs, 1 forwarded, no gradient (%d %d %d %d)", in, sets, grads, unsent);
    size_t reads;
    dt_pp_rider_floats(&tied, 1, 3, &reads);
    ok(dt_pp_relay_slots(&tied, 1, 3, unsent, grads) == 0 && reads == 100,
       "... and no relay slot, but the tied tensor's 100 floats");
    ok(dt_pp_relay_slots(&tied, 1, 0, 0, 1) == 0 && dt_pp_relay_slots(&tied, 1, 0, 0, 2) == 2,
       "the owner keeps slots only where it holds more than one boundary gradient");
    dt_pp_list_free(&l);

    /* the cut's work shares: each stage's part of the model's planned work, summing to 1;
     * the work's cut has the smallest largest share, the parameters' cut the smallest
     * largest state */
    dt_spec sp;
    dt_shape shape = {.ndim = 3, .d = {1, 8, 8}};
    ok(dt_spec_parse("conv(8,3,pad=1) relu flatten linear(64) relu linear(10)", &sp) == DT_OK && dt_spec_infer(&sp, &shape) == DT_OK,
       "a cnn's spec (a convolution: much work, few parameters)");
    dt_pp_cut cw, cp;
    ok(dt_pp_cut_spec(&sp, 2, "auto", &cw) == DT_OK && dt_pp_cut_spec(&sp, 2, "params", &cp) == DT_OK,
       "cut by the work and by the parameters");
    double most_w = 0, most_p = 0, sum_w = 0, sum_p = 0;
    size_t state_w = 0, state_p = 0;
    for (int st = 0; st < 2; st++) {
        sum_w += cw.work[st], sum_p += cp.work[st];
        if (cw.work[st] > most_w) most_w = cw.work[st];
        if (cp.work[st] > most_p) most_p = cp.work[st];
        if (cw.plo[st + 1] - cw.plo[st] > state_w) state_w = cw.plo[st + 1] - cw.plo[st];
        if (cp.plo[st + 1] - cp.plo[st] > state_p) state_p = cp.plo[st + 1] - cp.plo[st];
    }
    ok(sum_w > 1 - 1e-12 && sum_w < 1 + 1e-12 && sum_p > 1 - 1e-12 && sum_p < 1 + 1e-12 && cw.work[1] > 0 && cp.work[1] > 0,
       "the shares sum to 1 (%.15f, %.15f)", sum_w, sum_p);
    ok(most_w < most_p && state_p < state_w, "the work's cut: the least largest share (%.3f < %.3f); the parameters': "
       "the least largest state (%zu < %zu)", most_w, most_p, state_p, state_w);
    dt_pp_cut_free(&cw), dt_pp_cut_free(&cp);
    ok(cw.work == NULL, "freed");
    dt_spec_free(&sp);
    return done_testing();
}
