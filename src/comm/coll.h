/*
 * coll.h: the collectives as one list, and the kinds of call comm.c numbers.
 *
 * DT_COLLECTIVES(X) names every collective once, as X(ID, id, name, flags): ID spells
 * its dt_call_kind (DT_CALL_<ID>), id its members and functions (the backend member
 * dt_backend.<id>, the algorithm dt_algo_<id>), name is how messages and dtbench call
 * it, and flags say what it takes. What can be generated is generated from the list:
 * the kinds, their names and descriptions, the argument checks, the fingerprint, the
 * backend members and the dispatch to them or to algo.c (comm.c, comm_impl.h, algo.c),
 * dtbench's -o choices, and the table of cases that runs every collective on every
 * backend (tests/coll_cases.h: a missing case does not compile). The algorithm,
 * dt_algo_<id> in algo.c, is declared from the list, so a collective without one does
 * not link. What must be written by hand sits beside a _Static_assert on DT_COLL_COUNT,
 * so a collective added here and not there does not compile either: the public
 * functions (comm.c, declared in comm.h), dtbench's row (alias, bus bandwidth, check)
 * and the nccl backend's table (a device buffer needs NCCL's own call). The mpi backend
 * may add its own (else algo.c runs over MPI's point-to-point).
 *
 * Private to the library and its programs (dtbench, the tests): nothing here is
 * installed.
 */
#ifndef DT_COLL_H
#define DT_COLL_H

#include <stddef.h>
#include "comm.h"

/* What a collective takes, besides a communicator, a count and an element type. */
enum {
    DT_COLL_REDOP    = 1u << 0,  /* a reduction operator (call->op; else it is DT_SUM) */
    DT_COLL_ROOT     = 1u << 1,  /* a root rank (call->root; else it is -1) */
    DT_COLL_PER_RANK = 1u << 2,  /* count is per rank: one of size blocks (all_gather's send,
                                    reduce_scatter's recv) */
    DT_COLL_ONE_BUF  = 1u << 3,  /* one buffer, read on the root and written elsewhere (recv;
                                    send is NULL): broadcast */
    DT_COLL_ROOT_RECV = 1u << 4, /* recv is written, and must be given, on the root only */
    DT_COLL_NO_DATA  = 1u << 5,  /* no buffers and no count: barrier */
};

/*      ID              id              name              flags */
#define DT_COLLECTIVES(X) \
    X(ALLREDUCE,      allreduce,      "all_reduce",     DT_COLL_REDOP) \
    X(BROADCAST,      broadcast,      "broadcast",      DT_COLL_ROOT | DT_COLL_ONE_BUF) \
    X(ALLGATHER,      allgather,      "all_gather",     DT_COLL_PER_RANK) \
    X(REDUCE_SCATTER, reduce_scatter, "reduce_scatter", DT_COLL_REDOP | DT_COLL_PER_RANK) \
    X(REDUCE,         reduce,         "reduce",         DT_COLL_REDOP | DT_COLL_ROOT | DT_COLL_ROOT_RECV) \
    X(BARRIER,        barrier,        "barrier",        DT_COLL_NO_DATA)

/* The number of collectives. */
#define DT_COLL_ONE_(ID, id, name, flags) + 1
enum { DT_COLL_COUNT = 0 DT_COLLECTIVES(DT_COLL_ONE_) };
#undef DT_COLL_ONE_

/* The kinds of call: the collectives of the list, in its order, from 1 (0 is no call),
 * then the calls that are not collectives but are numbered and fingerprinted alike. */
typedef enum {
#define DT_CALL_KIND_(ID, id, name, flags) DT_CALL_##ID,
    DT_CALL_NONE = 0, DT_COLLECTIVES(DT_CALL_KIND_)
#undef DT_CALL_KIND_
    DT_CALL_P2P, DT_CALL_SPLIT, DT_CALL_INIT,
} dt_call_kind;

/* The row of collective `kind`: its name and flags; NULL when kind is not a collective. */
typedef struct {
    const char *name;
    unsigned    flags;
} dt_coll_row;

static inline const dt_coll_row *dt_coll_get(int kind) {
    static const dt_coll_row rows[] = {
#define DT_COLL_ROW_(ID, id, name, flags) { name, flags },
        DT_COLLECTIVES(DT_COLL_ROW_)
#undef DT_COLL_ROW_
    };
    return kind >= 1 && kind <= DT_COLL_COUNT ? &rows[kind - 1] : NULL;
}

/* comm.c: run collective `kind` as its public function does (dt_allreduce, ...): the
 * same checks, messages and sequence number. Arguments its row does not take are
 * ignored (op without DT_COLL_REDOP, root without DT_COLL_ROOT, send with
 * DT_COLL_ONE_BUF, everything with DT_COLL_NO_DATA). w == NULL: blocking; else queued on
 * the worker, as the _async forms. */
dt_status dt_coll_run(dt_comm *c, dt_call_kind kind, const void *send, void *recv, size_t count, dt_dtype t,
                      dt_redop op, int root, dt_work **w);

#endif /* DT_COLL_H */
