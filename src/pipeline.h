/*
 * pipeline.h: pipeline schedules as lists of actions, one list per stage.
 *
 * A pipeline cuts the model's top-level modules into P consecutive stages, one per
 * rank of a pipeline group (model.h: dt_model_forward_range / dt_model_backward_range
 * are the seam a stage runs), and cuts each step's local batch into M micro-batches
 * that flow through the stages. A schedule says, for each stage, in which order it
 * runs its forwards and backwards and moves the boundary tensors:
 *
 *   FWD m        forward of micro-batch m over the stage's range
 *   BWD m        backward of micro-batch m (its forward ran before, on this stage)
 *   SEND_ACT m   the stage's output of m to the next stage     (not on the last)
 *   RECV_ACT m   the previous stage's output of m, our input   (not on the first)
 *   SEND_GRAD m  the gradient of our input of m to the previous stage (not on the first)
 *   RECV_GRAD m  the gradient of our output of m from the next stage  (not on the last)
 *
 * The schedules are rows (name, builder):
 *   gpipe        every forward, then every backward: M micro-batches of activations held;
 *   1f1b         after P - 1 - s warm-up forwards, stage s alternates one forward and one
 *                backward: at most P - s micro-batches of activations held;
 *   interleaved  (Megatron's interleaved 1F1B) the model is cut into V x P chunks and
 *                stage s holds V of them, chunks s, s + P, ..., s + (V - 1) P, so a
 *                micro-batch passes every stage V times (from the last stage back to the
 *                first between rounds). Forwards go in groups of P micro-batches through
 *                chunk 0, then chunk 1, ...; backwards through the last chunk first; after
 *                2 (P - 1 - s) + (V - 1) P warm-up forwards one forward and one backward
 *                alternate. The bubble shrinks to (P - 1) / (V M + P - 1); M must be a
 *                multiple of P (V > 1). Its sends and receives are placed by simulating
 *                every stage on one clock (a forward 1, a backward 2), each transfer where
 *                its receiver starts: the lists are projections of one order of atomic
 *                events, which cannot hang when every send waits for its receive.
 * All run the backwards of each chunk of a stage in micro-batch order 0, 1, ..., M - 1,
 * so a stage sums its gradients in the order one process does (rule 2 of
 * docs/DESIGN.md): the layout changes where work runs, never the order of a sum.
 *
 * Sends are blocking and meet their receive (the comm layer's dt_send / dt_recv may
 * wait for the peer), so a list is usable only if no two neighbours wait on each other:
 * dt_pp_check simulates every stage's list under exactly that rule and refuses a
 * schedule that would hang, as well as one that breaks the definitions above.
 *
 * The trainer runs these lists (src/train_pipe.c, docs/pipeline.md): it keeps the
 * activations of every micro-batch in flight (the model's activation sets), carries the
 * tied embedding's gradient part back in one process's order, and gathers every
 * micro-batch's loss to every rank.
 */
#ifndef DT_PIPELINE_H
#define DT_PIPELINE_H

#include <stddef.h>
#include "dt_api.h"
#include "model.h"
#include "status.h"

typedef enum { DT_PP_FWD, DT_PP_BWD, DT_PP_SEND_ACT, DT_PP_RECV_ACT, DT_PP_SEND_GRAD, DT_PP_RECV_GRAD } dt_pp_op;

typedef struct {
    dt_pp_op op;
    int      micro;    /* the micro-batch, 0 .. M - 1 */
    int      chunk;    /* the stage's chunk, 0 .. V - 1 (model chunk chunk x P + stage); 0 but
                        * for interleaved. A boundary tensor's chunk is the sender's for a
                        * send and the receiver's for a receive */
} dt_pp_action;

typedef struct {
    dt_pp_action *a;
    int           n;
    int           chunks;   /* V */
} dt_pp_list;

/* The schedules by name ("gpipe", "1f1b", "interleaved"); NULL for another. Their
 * names, for a message: "gpipe, 1f1b or interleaved". dt_pp_chunked: takes V > 1. */
typedef struct dt_pp_schedule dt_pp_schedule;
DT_API const dt_pp_schedule *dt_pp_find(const char *name);
DT_API const char           *dt_pp_name(const dt_pp_schedule *s);
DT_API const char           *dt_pp_names(char *buf, size_t n);
DT_API int                   dt_pp_chunked(const dt_pp_schedule *s);

/* Stage `stage`'s actions (0 .. stages - 1) with `chunks` chunks per stage (1 but for
 * interleaved) and `micro` micro-batches; free with dt_pp_list_free. DT_ERR_INVALID for
 * fewer micro-batches than stages (the pipeline could not fill: the message names both
 * numbers), interleaved chunks over micro-batches that are no multiple of the stages,
 * chunks for a schedule without, or a stage out of range. */
DT_API dt_status dt_pp_build(const dt_pp_schedule *s, int stages, int chunks, int stage, int micro, dt_pp_list *out);
DT_API void      dt_pp_list_free(dt_pp_list *l);

/* Every stage's list (lists[0 .. stages), each of lists[0].chunks chunks) holds to the
 * definitions: each micro-batch's forward and backward once on every chunk, its forward
 * first; the boundary tensors received before they are used and sent after they are
 * made, the first chunk of the model receiving and the last sending nothing; each
 * chunk's backwards in micro-batch order; and the lists run to their end when each send
 * waits for its receive (no hang). *in_flight receives the most micro-batch chunks whose
 * activations a stage held at once (optional). The message says which stage and action
 * break which rule. */
DT_API dt_status dt_pp_check(const dt_pp_list *lists, int stages, int micro, int *in_flight);

/* The most micro-batches a stage's list holds at once: *inputs received (RECV_ACT) and
 * not yet backwarded (the stage's input slots), *sets forwarded and not yet backwarded
 * (the activation sets its model keeps). Either may be NULL. */
DT_API void      dt_pp_held(const dt_pp_list *l, int *inputs, int *sets);
/* The same for chunk j of a stage's list, and *grads the boundary gradients it received
 * and has not yet backwarded, *unsent those it has not yet sent on (its slots for the
 * riders' parts, dt_pp_relay_slots). DT_ERR_NOMEM only. */
DT_API dt_status dt_pp_chunk_held(const dt_pp_list *l, int j, int *inputs, int *sets, int *grads, int *unsent);

/* A list as text, one action a line ("FWD 3", "SEND_ACT 3"; with chunks, "FWD 3.1" for
 * micro-batch 3 on chunk 1), for --schedule-dump. */
DT_API size_t    dt_pp_dump(const dt_pp_list *l, char *buf, size_t n);

/* ---- the cut (pipeline_cut.c) --------------------------------------------------------------
 * Where the stages lie in a model: the top-level modules cut into `stages` runs, each
 * with parameters; the trainer runs them and dtrain plan estimates them. */
typedef struct {
    int     stages;
    int    *mod_lo;     /* stage s: top-level modules [mod_lo[s], mod_lo[s + 1]) */
    int    *layer_lo;   /* stage s: layers [layer_lo[s], layer_lo[s + 1]) */
    size_t *plo;        /* stage s: parameters [plo[s], plo[s + 1]) (a tied tensor is its owner's) */
    double *work;       /* stage s: its share of the model's planned work (whatever the cut balanced) */
} dt_pp_cut;

/* The cut of an inferred spec: text "auto" (or NULL) balances the modules' planned work
 * (twice their GEMM weights per position plus their outputs), "params" the parameters
 * they own (the state a stage holds), "0-3,4-7" names the runs.
 * DT_ERR_INVALID (the trainer's messages) for fewer modules, or modules with parameters,
 * than stages, a bad or incomplete list, a stage without parameters. Free with
 * dt_pp_cut_free. */
DT_API dt_status dt_pp_cut_spec(const dt_spec *sp, int stages, const char *text, dt_pp_cut *out);
/* The cut into P x V chunks for P stages of V chunks each (V = 1: the stages), its
 * message naming both where they are more than the model allows. */
DT_API dt_status dt_pp_cut_chunks(const dt_spec *sp, int P, int V, const char *text, dt_pp_cut *out);
DT_API void      dt_pp_cut_free(dt_pp_cut *c);

/* The parameters stage `stage`'s rank keeps resident, [*lo, *hi): its range, padded to
 * whole shards over its replicas when the optimizer state or gradients are sharded
 * (sharding != 0; shard.h pads the arrays so). */
DT_API void      dt_pp_keep(const dt_pp_cut *c, int stage, int replicas, int sharding, size_t *lo, size_t *hi);

/* A tied tensor that stage `user` reads and stage `owner` holds (gpt's embedding, read
 * by the head): the user holds its parameters, every stage in (owner, user] its
 * gradient, relayed back towards the owner. */
typedef struct {
    size_t off, len;    /* its floats in the parameter array */
    int    owner, user;
    int    layer;       /* the user's layer that reads it */
} dt_pp_rider;

/* The riders of a cut over the model's layers (nlayers of them, in order; free *out). */
DT_API dt_status dt_pp_riders(const dt_pp_cut *c, const dt_layer *layers, int nlayers, dt_pp_rider **out, int *n);
/* The floats of riders that chunk `chunk` (a stage, V = 1) reads beyond its range: their
 * parameters and their gradient (the head writes its part there). */
DT_API void      dt_pp_rider_floats(const dt_pp_rider *r, int n, int chunk, size_t *floats);
/* The slots, each of every rider's floats, in which chunk `chunk` keeps the riders'
 * gradient parts that arrived with a boundary gradient: a chunk between owner and user as
 * many as it holds unsent at once (`unsent`, dt_pp_chunk_held), the owner as many as the
 * boundary gradients it holds at once where that is more than one (`grads`: a later
 * micro-batch's may arrive before its backward); 0: none, the owner lays them in its
 * gradient array at once. */
DT_API int       dt_pp_relay_slots(const dt_pp_rider *r, int n, int chunk, int unsent, int grads);

/* The global gradient norm's parts: the part of the summed gradient that rank (stage,
 * replica) answers for, [*a, *b): its stage's range on replica 0 (every replica holds the
 * same sum), or with sharded gradients (--shard grads) the replica's shard of it. The
 * parts tile the parameter array. */
DT_API void      dt_pp_norm_part(const dt_pp_cut *c, int stage, int replica, int replicas, int sharded,
                                 size_t *a, size_t *b);
/* The chunks of `chunk` floats that the parts' edges cut, ascending and each once, into
 * bch (stages x replicas entries at most); returns their number. */
DT_API int       dt_pp_norm_edges(const dt_pp_cut *c, int replicas, int sharded, size_t chunk, size_t *bch);

#endif /* DT_PIPELINE_H */
