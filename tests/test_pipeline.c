/*
 * test_pipeline.c: the pipeline schedules' action lists (pipeline.h) against their
 * definitions, for P = 1..8 stages and M = P..3P+1 micro-batches: every micro-batch's
 * forward and backward once per stage, forward first, boundary tensors received before
 * use and sent after, backwards in micro-batch order (the order one process sums in),
 * no hang when every send waits for its receive, GPipe holding M micro-batches of
 * activations and 1F1B at most P. The check itself is shown to catch a hang, an
 * out-of-order backward and a forward before its input; M < P is refused, naming both.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline.h"
#include "tap.h"

/* Every stage's list of schedule `name` for P stages and M micro-batches. */
static dt_status build_all(const char *name, int P, int M, dt_pp_list *lists) {
    for (int s = 0; s < P; s++) DT_TRY(dt_pp_build(dt_pp_find(name), P, s, M, &lists[s]));
    return DT_OK;
}

static void free_all(dt_pp_list *lists, int P) {
    for (int s = 0; s < P; s++) dt_pp_list_free(&lists[s]);
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
    ok(dt_pp_find("gpipe") && dt_pp_find("1f1b") && !dt_pp_find("zb"), "schedules by name");
    is_str(dt_pp_names(names, sizeof names), "gpipe or 1f1b", "their names for a message");
    test_grid("gpipe");
    test_grid("1f1b");
    test_check_catches();
    dt_pp_list l;
    ok(dt_pp_build(dt_pp_find("1f1b"), 4, 0, 3, &l) == DT_ERR_INVALID && strstr(dt_last_error(), "3 micro-batches") &&
       strstr(dt_last_error(), "4 stages"), "fewer micro-batches than stages: refused, naming both (%s)", dt_last_error());
    ok(dt_pp_build(dt_pp_find("1f1b"), 4, 4, 8, &l) == DT_ERR_INVALID, "a stage out of range: refused");
    /* stage 1 of 3 with 4 micro-batches, 1F1B: one warm-up forward, then alternating */
    char dump[1024];
    dt_pp_build(dt_pp_find("1f1b"), 3, 1, 4, &l);
    dt_pp_dump(&l, dump, sizeof dump);
    is_str(dump, "RECV_ACT 0\nFWD 0\nSEND_ACT 0\n"
                 "RECV_ACT 1\nFWD 1\nRECV_GRAD 0\nSEND_ACT 1\nBWD 0\nSEND_GRAD 0\n"
                 "RECV_ACT 2\nFWD 2\nRECV_GRAD 1\nSEND_ACT 2\nBWD 1\nSEND_GRAD 1\n"
                 "RECV_ACT 3\nFWD 3\nRECV_GRAD 2\nSEND_ACT 3\nBWD 2\nSEND_GRAD 2\n"
                 "RECV_GRAD 3\nBWD 3\nSEND_GRAD 3\n", "1f1b, stage 1 of 3, 4 micro-batches, as dumped");
    dt_pp_list_free(&l);
    return done_testing();
}
