/*
 * train_snap.c: in-memory snapshots for jobs whose nodes come and go (--snapshot-every).
 *
 * dtrun --nnodes MIN:MAX kills every rank of the job when a node is lost, so a rank's own
 * memory cannot carry the state across a membership change. What survives is the node:
 * its dtrun gives the node's ranks a directory in memory (tmpfs, DT_SNAPSHOT_DIR), and
 * every K steps the ranks save the state there in the checkpoint format (ckpt.h) that
 * resumes on any world size and in any sharding mode, each node keeping the newest two.
 * A new snapshot is written over the files of the older one (ckpt_impl.h's reuse: tmpfs
 * pages written in place cost a third of fresh ones, which the kernel allocates, zeroes
 * and later frees), so while it is written the node holds the newest one alone.
 *
 * Where the state is replicated (no sharding), each node's first rank writes all of it.
 * Where it is sharded (or pipelined), each rank writes its shard and sends a copy to its
 * partner, the rank of the same index on the next node (nodes in the order of their first
 * rank, the last node's partner the first), so the loss of any one node leaves every
 * shard on a survivor; each node's first rank writes the buffers and the manifest. A
 * node's snapshot of a step is installed atomically (ckpt.h's rule), but holds only the
 * shards of its own ranks and of the node before it.
 *
 * On a resume ("auto") the ranks say which files of their node's snapshots they hold; the
 * newest step whose files the nodes hold together wins when it is at least as new as the
 * newest checkpoint on disk. Each file a node lacks goes from the lowest rank holding it
 * to the node's first rank; then every node holds the whole snapshot and its ranks open
 * it as a checkpoint, with all of a checkpoint's checks. A snapshot that cannot be assembled or
 * opened anywhere is passed over for the disk's newest, and the start note says why.
 *
 * Nodes are told apart by host name and directory (several dtruns may share a host).
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_impl.h"
#include "clock.h"
#include "fileio.h"
#include "hash.h"
#include "trace.h"
#include "train_impl.h"

#define SNAP_KEEP  2          /* snapshots a node keeps */
#define SNAP_SCAN  4          /* the newest of a node's snapshots a resume looks at */
#define SNAP_FILES 1024       /* files of one snapshot a rank can say it holds */
#define SNAP_TAG   0x534e     /* the partner copies' point-to-point tag */
#define SNAP_DEFAULT_EVERY 50 /* without --checkpoint-every */

struct train_snap {
    int64_t  every;
    char     dir[4096];
    dt_comm *node;            /* the ranks sharing dir; its rank 0 writes the node's files */
    int      nnodes, node_ix; /* nodes in the order of their first rank; this rank's */
    int     *node_of;         /* world: each rank's node */
    int     *first;           /* each node's first rank (it writes the node's files) */
    int      partner;         /* the rank keeping a copy of this rank's shard; -1: one node */
    int     *from;            /* the ranks whose shards this rank keeps */
    int      nfrom;
};

/* One snapshot a node holds: its step, the writer's shard count (0: not sharded) and the
 * files present (bit 0 train_state, 1 model, 2 + r shard r). step -1: none. */
typedef struct {
    int64_t step, shards;
    uint8_t have[SNAP_FILES / 8];
} snap_entry;
typedef struct { snap_entry e[SNAP_SCAN]; } snap_desc;

static int  has(const snap_entry *e, int f) { return (e->have[f / 8] >> (f % 8)) & 1; }
static void put(snap_entry *e, int f) { e->have[f / 8] |= (uint8_t)(1u << (f % 8)); }

void dt_train_snap_free_(trainer *t) {
    struct train_snap *sn = t->snap;
    if (!sn) return;
    if (sn->node && sn->node != t->comm) dt_comm_destroy(sn->node);
    free(sn->node_of);
    free(sn->first);
    free(sn->from);
    free(sn);
    t->snap = NULL;
}

dt_status dt_train_snap_setup_(trainer *t) {
    const dt_train_opts *o = t->o;
    if (!o->snapshot_dir || !*o->snapshot_dir || o->snapshot_every == 0) return DT_OK;
    struct train_snap *sn = calloc(1, sizeof *sn);
    if (!sn) return dt_error(DT_ERR_NOMEM, "snapshots: out of memory");
    t->snap = sn;
    sn->every = o->snapshot_every > 0 ? o->snapshot_every : o->ckpt_every > 0 ? o->ckpt_every : SNAP_DEFAULT_EVERY;
    sn->partner = -1;
    if (snprintf(sn->dir, sizeof sn->dir, "%s", o->snapshot_dir) >= (int)sizeof sn->dir)
        return dt_error(DT_ERR_INVALID, "snapshot directory: longer than %zu bytes", sizeof sn->dir - 1);
    struct stat st;
    if (stat(sn->dir, &st) != 0 || !S_ISDIR(st.st_mode) || access(sn->dir, W_OK) != 0)
        return dt_error(DT_ERR_INVALID, "snapshot directory %s (DT_SNAPSHOT_DIR): not a writable directory", sn->dir);
    sn->node_of = calloc((size_t)t->world, sizeof *sn->node_of);
    sn->from = calloc((size_t)t->world, sizeof *sn->from);
    uint64_t *keys = calloc((size_t)t->world, sizeof *keys);
    if (!sn->node_of || !sn->from || !keys) {
        free(keys);
        return dt_error(DT_ERR_NOMEM, "snapshots: out of memory");
    }
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    uint64_t mine = dt_xxh64(sn->dir, strlen(sn->dir), dt_xxh64(host, strlen(host), 0));
    dt_status s = t->world > 1 ? dt_allgather(t->comm, &mine, keys, 1, DT_I64) : DT_OK;
    keys[t->rank] = mine;
    /* nodes in the order of their first rank; each rank's index within its node */
    int *index = calloc((size_t)t->world, sizeof *index), *size = calloc((size_t)t->world, sizeof *size);
    int *first = sn->first = calloc((size_t)t->world, sizeof *first);
    if (s == DT_OK && (!index || !size || !first)) s = dt_error(DT_ERR_NOMEM, "snapshots: out of memory");
    for (int r = 0; s == DT_OK && r < t->world; r++) {
        int n = 0;
        while (n < sn->nnodes && keys[first[n]] != keys[r]) n++;
        if (n == sn->nnodes) first[sn->nnodes++] = r;
        sn->node_of[r] = n;
        index[r] = size[n]++;
    }
    sn->node_ix = sn->node_of[t->rank];
    /* the partner: the rank of the same index (modulo its size) on the next node */
    for (int r = 0; s == DT_OK && sn->nnodes > 1 && r < t->world; r++) {
        int next = (sn->node_of[r] + 1) % sn->nnodes, want = index[r] % size[next], p = -1;
        for (int q = 0; q < t->world && p < 0; q++) if (sn->node_of[q] == next && index[q] == want) p = q;
        if (r == t->rank) sn->partner = p;
        if (p == t->rank) sn->from[sn->nfrom++] = r;
    }
    free(index);
    free(size);
    free(keys);
    if (s == DT_OK) s = t->world > 1 ? dt_comm_split(t->comm, sn->node_ix, t->rank, &sn->node) : DT_OK;
    if (s == DT_OK && t->world <= 1) sn->node = t->comm;
    return s;
}

/* A file's bytes into *buf (malloc'd), *n of them. */
static dt_status read_all(const char *path, uint8_t **buf, int64_t *n) {
    int fd;
    *buf = NULL;
    DT_TRY(dt_file_open_read(path, &fd, n));
    *buf = malloc(*n > 0 ? (size_t)*n : 1);
    dt_status s = *buf ? dt_file_pread(fd, path, *buf, (size_t)*n, 0)
                       : dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    close(fd);
    if (s != DT_OK) {
        free(*buf);
        *buf = NULL;
    }
    return s;
}

/* After a rank's shards (one a chunk) are written into tmp: a copy to its partner, and
 * the shards whose copies it keeps into tmp. Nodes of even index send first, the others
 * receive first, so the ring of copies cannot wait on itself. A shard that could not be
 * written goes as a length of -1 (the partner keeps nothing of it). */
static dt_status copy_to_partner(trainer *t, const char *tmp, dt_status st) {
    struct train_snap *sn = t->snap;
    const int V = dt_train_pipe_chunks_(t), W = dt_train_pieces_(t);
    dt_status s = DT_OK, sent = DT_OK, got = DT_OK, kept = DT_OK;
    for (int turn = 0; turn < 2; turn++) {
        if ((turn == 0) == (sn->node_ix % 2 == 0)) {   /* send each of ours */
            for (int j = 0; j < V && sent == DT_OK; j++) {
                char name[64], path[4096];
                uint8_t *buf = NULL;
                int64_t hdr[2] = {-1, dt_train_piece_(t, t->rank, j)};
                dt_ckpt_shard_name_(name, sizeof name, (int)hdr[1], W);
                dt_status r = dt_ckpt_join_(path, sizeof path, tmp, name);
                if (r == DT_OK && st == DT_OK) r = read_all(path, &buf, &hdr[0]);
                if (r != DT_OK) hdr[0] = -1;
                if (s == DT_OK) s = r;
                sent = dt_send(t->comm, hdr, 2, DT_I64, sn->partner, SNAP_TAG);
                if (sent == DT_OK && hdr[0] > 0) sent = dt_send(t->comm, buf, (size_t)hdr[0], DT_U8, sn->partner, SNAP_TAG);
                free(buf);
            }
        } else {                                          /* receive each kept shard */
            for (int i = 0; i < sn->nfrom * V && got == DT_OK; i++) {
                int from_rank = sn->from[i / V];
                int64_t h[2];
                got = dt_recv(t->comm, h, 2, DT_I64, from_rank, SNAP_TAG);
                if (got != DT_OK || h[0] < 0) continue;
                uint8_t *b = malloc(h[0] > 0 ? (size_t)h[0] : 1);
                if (!b) {
                    got = dt_error(DT_ERR_NOMEM, "snapshot: out of memory for rank %d's shard", from_rank);
                    break;
                }
                if (h[0] > 0) got = dt_recv(t->comm, b, (size_t)h[0], DT_U8, from_rank, SNAP_TAG);
                char nm[64], p[4096], from[4096];
                dt_ckpt_shard_name_(nm, sizeof nm, (int)h[1], W);
                if (got == DT_OK && kept == DT_OK && (kept = dt_ckpt_join_(p, sizeof p, tmp, nm)) == DT_OK &&
                    (kept = dt_ckpt_reuse_from_(p, from, sizeof from)) == DT_OK)
                    kept = dt_write_over(p, from, b, (size_t)h[0]);
                free(b);
            }
        }
    }
    if (sent != DT_OK) return sent;
    if (got != DT_OK) return got;
    return s != DT_OK && st == DT_OK ? s : kept;
}

dt_status dt_train_snapshot_(trainer *t, int64_t done, int force) {
    struct train_snap *sn = t->snap;
    if (!sn || (!force && (done % sn->every != 0 || done >= t->total))) return DT_OK;
    double t0 = dt_now();
    dt_train_place_ pl = {.dir = sn->dir, .keep = SNAP_KEEP, .reuse = 1, .group = sn->node,
                          .copy = sn->nnodes > 1 ? copy_to_partner : NULL};
    dt_status s = dt_train_save_(t, done, &pl);
    if (s != DT_OK)
        return dt_error_wrap(s, "snapshot at step %lld (into %s; --snapshot-every 0 turns snapshots off): ",
                             (long long)done, sn->dir);
    char d[48];
    snprintf(d, sizeof d, "step %lld", (long long)done);
    dt_trace_span("snapshot", "checkpoint", t0, dt_now(), d);
    return DT_OK;
}

/* ---- resuming from the nodes' snapshots ------------------------------------------------- */

/* The files of dir's newest SNAP_SCAN snapshots. */
static void scan(const char *dir, snap_desc *d) {
    memset(d, 0, sizeof *d);
    for (int i = 0; i < SNAP_SCAN; i++) d->e[i].step = -1;
    dt_ckpt_entry_ *v = NULL;
    size_t cnt = 0;
    int missing = 0;
    if (dt_ckpt_list_(dir, &v, &cnt, &missing) != DT_OK) return;
    for (size_t i = 0; i < cnt && i < SNAP_SCAN; i++) {
        snap_entry *e = &d->e[i];
        char p[4096];
        if (dt_ckpt_join_(p, sizeof p, dir, v[i].name) != DT_OK) continue;
        DIR *dd = opendir(p);
        if (!dd) continue;
        struct dirent *de;
        int ok = 1;
        e->shards = -1;
        while ((de = readdir(dd))) {
            int r, w, end = 0;
            if (!strcmp(de->d_name, "train_state.safetensors")) put(e, 0);
            else if (!strcmp(de->d_name, "model.safetensors")) put(e, 1);
            else if (sscanf(de->d_name, "shard-%5d-of-%5d.safetensors%n", &r, &w, &end) == 2 &&
                     end == (int)strlen(de->d_name)) {
                if (w < 1 || r < 0 || r >= w || w > SNAP_FILES - 2 || (e->shards >= 0 && e->shards != w)) ok = 0;
                else {
                    e->shards = w;
                    put(e, 2 + r);
                }
            }
        }
        closedir(dd);
        if (e->shards < 0) e->shards = 0;
        if (ok) e->step = v[i].step;
        else memset(e, 0, sizeof *e), e->step = -1;
    }
    free(v);
}

/* Whether one rank's descriptor holds file f of (step, shards). */
static int rank_has(const snap_desc *d, int64_t step, int64_t shards, int f) {
    for (int i = 0; i < SNAP_SCAN; i++)
        if (d->e[i].step == step && d->e[i].shards == shards && has(&d->e[i], f)) return 1;
    return 0;
}

/* Whether the ranks' descriptors hold file f of (step, shards) together; the lowest rank
 * that holds it into *who. */
static int holder(const snap_desc *all, int world, int64_t step, int64_t shards, int f, int *who) {
    for (int r = 0; r < world; r++)
        if (rank_has(&all[r], step, shards, f)) {
            *who = r;
            return 1;
        }
    return 0;
}

/* Whether node n holds file f of (step, shards): its first rank's descriptor says (every
 * rank of a node scans the same directory). */
static int node_has(const struct train_snap *sn, const snap_desc *all, int n, int64_t step, int64_t shards, int f) {
    return rank_has(&all[sn->first[n]], step, shards, f);
}

static void file_name(char *out, size_t n, int f, int64_t shards) {
    if (f == 0) snprintf(out, n, "train_state.safetensors");
    else if (f == 1) snprintf(out, n, "model.safetensors");
    else dt_ckpt_shard_name_(out, n, f - 2, (int)shards);
}

/* Every file of (step, shards) that a node lacks, sent by the lowest rank holding it to
 * that node's first rank, which writes it (a length, an answer that there is room, the
 * bytes). Every rank walks the files in the same order, so no pair waits on another;
 * *copied: the files some node lacked. This rank's first failure is returned, once the
 * walk is done. */
static dt_status assemble(trainer *t, const snap_desc *all, int64_t step, int64_t shards, const char *path,
                          int *copied) {
    struct train_snap *sn = t->snap;
    dt_status mine = DT_OK;
    *copied = 0;
    for (int f = 0; f < 2 + (int)shards; f++) {
        int lack = 0, who = -1;
        for (int k = 0; k < sn->nnodes; k++) lack += !node_has(sn, all, k, step, shards, f);
        if (!lack) continue;
        (*copied)++;
        holder(all, t->world, step, shards, f, &who);
        char name[64], p[4096];
        file_name(name, sizeof name, f, shards);
        uint8_t *buf = NULL;
        int64_t n = -1, room = 0;
        if (who == t->rank) {
            if (dt_ckpt_join_(p, sizeof p, path, name) != DT_OK || read_all(p, &buf, &n) != DT_OK) {
                n = -1;
                if (mine == DT_OK) mine = dt_error(DT_ERR_IO, "%s/%s: %s", path, name, dt_last_error());
            }
            for (int k = 0; k < sn->nnodes; k++) {
                if (node_has(sn, all, k, step, shards, f)) continue;
                dt_status s = dt_send(t->comm, &n, 1, DT_I64, sn->first[k], SNAP_TAG);
                if (s == DT_OK && n >= 0) s = dt_recv(t->comm, &room, 1, DT_I64, sn->first[k], SNAP_TAG);
                if (s == DT_OK && n > 0 && room) s = dt_send(t->comm, buf, (size_t)n, DT_U8, sn->first[k], SNAP_TAG);
                if (s != DT_OK) {
                    free(buf);
                    return s;
                }
            }
        } else if (t->rank == sn->first[sn->node_ix] && !node_has(sn, all, sn->node_ix, step, shards, f)) {
            DT_TRY(dt_recv(t->comm, &n, 1, DT_I64, who, SNAP_TAG));
            if (n < 0) {
                if (mine == DT_OK)
                    mine = dt_error(DT_ERR_IO, "rank %d could not read %s of its node's snapshot", who, name);
                continue;
            }
            buf = malloc(n > 0 ? (size_t)n : 1);
            room = buf != NULL;
            dt_status s = dt_send(t->comm, &room, 1, DT_I64, who, SNAP_TAG);
            if (s == DT_OK && n > 0 && room) s = dt_recv(t->comm, buf, (size_t)n, DT_U8, who, SNAP_TAG);
            if (s != DT_OK) {
                free(buf);
                return s;
            }
            if (!room && mine == DT_OK)
                mine = dt_error(DT_ERR_NOMEM, "out of memory for %lld bytes of %s", (long long)n, name);
            if (room && mine == DT_OK) {
                mkdir(path, 0755);   /* a node that held nothing of this step */
                if ((mine = dt_ckpt_join_(p, sizeof p, path, name)) == DT_OK) mine = dt_write_atomic(p, buf, (size_t)n);
            }
        }
        free(buf);
    }
    return mine;
}

/* The node's snapshots of steps after `step` (pieces of a timeline the run does not
 * continue: the steps will be saved again), removed by the node's first rank, so that a
 * later resume does not look at them instead of the new ones. */
static void drop_newer(trainer *t, int64_t step) {
    struct train_snap *sn = t->snap;
    if (sn->node && dt_comm_rank(sn->node) != 0) return;
    dt_ckpt_entry_ *v = NULL;
    size_t cnt = 0;
    int missing = 0;
    if (dt_ckpt_list_(sn->dir, &v, &cnt, &missing) != DT_OK) return;
    for (size_t i = 0; i < cnt && v[i].step > step; i++) {
        char p[4096];
        if (dt_ckpt_join_(p, sizeof p, sn->dir, v[i].name) == DT_OK && dt_ckpt_only_(p, 1, 0)) dt_ckpt_rm_tree_(p);
    }
    free(v);
}

dt_status dt_train_snap_resume_(trainer *t, int64_t disk_step, char *path, size_t pathn, int *used) {
    struct train_snap *sn = t->snap;
    *used = 0;
    snap_desc mine, *all = calloc((size_t)t->world, sizeof *all);
    if (!all) return dt_error(DT_ERR_NOMEM, "snapshots: out of memory");
    scan(sn->dir, &mine);
    dt_status s = t->world > 1 ? dt_allgather(t->comm, &mine, all, sizeof mine, DT_U8) : DT_OK;
    if (t->world <= 1) all[0] = mine;
    /* the newest (step, shards) whose files the nodes hold together */
    int64_t best = -1, bshards = 0;
    for (int r = 0; s == DT_OK && r < t->world; r++)
        for (int i = 0; i < SNAP_SCAN; i++) {
            const snap_entry *e = &all[r].e[i];
            if (e->step <= best) continue;
            int complete = 1, who;
            for (int f = 0; f < 2 + e->shards && complete; f++)
                complete = holder(all, t->world, e->step, e->shards, f, &who);
            if (complete) best = e->step, bshards = e->shards;
        }
    if (s != DT_OK || best < 0 || best < disk_step) {
        free(all);
        if (s == DT_OK) drop_newer(t, disk_step);
        return s;
    }
    double t0 = dt_now();
    int copied = 0;
    char step_dir[4096];
    s = dt_ckpt_path(sn->dir, best, step_dir, sizeof step_dir);
    if (s == DT_OK) s = assemble(t, all, best, bshards, step_dir, &copied);
    free(all);
    /* every node's leader has written what its node lacked: now every rank opens it */
    int64_t st = s;
    int who;
    char why[600];
    snprintf(why, sizeof why, "%s", s != DT_OK ? dt_last_error() : "");
    DT_TRY(dt_train_agree_(t, &st, &who));
    if (st == DT_OK) {
        s = dt_ckpt_open(step_dir, &t->resume);
        snprintf(why, sizeof why, "%s", s != DT_OK ? dt_last_error() : "");
        st = s;
        DT_TRY(dt_train_agree_(t, &st, &who));
    }
    if (st != DT_OK) {   /* passed over: the disk's newest, if any */
        dt_ckpt_close(t->resume);
        t->resume = NULL;
        drop_newer(t, disk_step);
        snprintf(t->note, sizeof t->note, "the nodes' in-memory snapshot of step %lld was passed over (rank %d: %s); ",
                 (long long)best, who, who == t->rank ? why : "see its log");
        return DT_OK;
    }
    *used = 1;
    drop_newer(t, best);
    snprintf(path, pathn, "%s", step_dir);
    size_t l = strlen(t->note);
    if (copied)
        snprintf(t->note + l, sizeof t->note - l, "resumed from the nodes' in-memory snapshot of step %lld (%d file%s "
                 "copied between nodes, %.2f s)", (long long)best, copied, copied == 1 ? "" : "s", dt_now() - t0);
    else
        snprintf(t->note + l, sizeof t->note - l, "resumed from the nodes' in-memory snapshot of step %lld",
                 (long long)best);
    return DT_OK;
}
