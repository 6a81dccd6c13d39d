/*
 * dtrun_parse.h: the two messages that reach dtrun from outside it and that it reads into
 * fields, each parser on its own (dtrun_parse.c needs nothing but the C library, so the
 * fuzz targets and the unit test link it alone):
 *
 *   the program's answer to the elastic probe (dtrun_elastic.c)
 *       sizes=1,2,4,8 resume=auto checkpoint-dir=DIR
 *   the fields of a rendezvous START, node 0 -> node (dtrun_rdzv.c)
 *       <attempt> <kind> <restarts> <port> <world> <rank0> <nlocal> <group> <ngroups>
 *       <change time> <change|->
 *   the fields of PEERS, node 0 -> node (dtrun_rdzv.c): the job's live nodes, where each
 *   would serve the rendezvous should node 0 be lost
 *       <n> <node> <address> <port> ... (n triples)
 *
 * Each refuses what it cannot vouch for rather than passing on a value that is wrong
 * later: a number out of its range, a text that would have to be cut, anything extra.
 */
#ifndef DTRUN_PARSE_H
#define DTRUN_PARSE_H

#define DTRUN_MAX_RANKS  4096           /* ranks on one node */
#define DTRUN_MAX_NODES  4096
#define DTRUN_MAX_SIZES  64
#define DTRUN_CHANGE_MAX 600            /* bytes of a membership change's text, with the NUL */

typedef struct {
    int  sizes[DTRUN_MAX_SIZES];   /* the world sizes that keep the result exact, ascending */
    int  nsizes;
    char resume[32];               /* the program's --resume ("auto", a path, or "") */
    char ckpt_dir[1024];           /* its --checkpoint-dir, or "" */
} dtrun_exact;

/* Parse "sizes=1,2,4 resume=auto checkpoint-dir=DIR" (the part after "dtrain-elastic: ")
 * into ex; 0, or -1 if malformed. On success: 1 <= nsizes <= DTRUN_MAX_SIZES sizes,
 * strictly increasing, each in 1 .. DTRUN_MAX_RANKS * DTRUN_MAX_NODES; resume= (at most
 * once) up to the next space and checkpoint-dir= (last: the rest of the line, spaces and
 * all) whole and without control characters, else the answer is refused. */
int dtrun_parse_answer(const char *line, dtrun_exact *ex);

/* One attempt as node 0 announces it in START. */
typedef struct {
    int    attempt;     /* >= 0 */
    int    kind;        /* 0 the first attempt, 1 a restart after a failure, 2 a membership change */
    int    restarts;    /* >= 0 */
    int    port;        /* the ranks' MASTER_PORT, 1 .. 65535; 0 .. 65535 on a spare */
    int    world;       /* 1 .. DTRUN_MAX_RANKS * DTRUN_MAX_NODES */
    int    rank0;       /* this node runs ranks rank0 .. rank0 + nlocal - 1 of world */
    int    nlocal;      /* 0 .. DTRUN_MAX_RANKS; 0: a spare */
    int    group;       /* 0 .. ngroups - 1; -1 on a spare */
    int    ngroups;     /* 1 .. min(world, DTRUN_MAX_NODES) */
    double change_at;   /* finite, >= 0: when the change was noticed (seconds since the epoch), 0 if none */
    char   change[DTRUN_CHANGE_MAX];   /* the change, newlines decoded; "" for none ("-") */
} dtrun_start;

/* Parse START's fields (the line after "START "), separated by single spaces, into st;
 * 0, or -1 when malformed or out of the ranges above. */
int dtrun_parse_start(const char *args, dtrun_start *st);

/* The live nodes of an elastic job as node 0 lists them in PEERS. */
#define DTRUN_ADDR_MAX 64               /* a numeric IPv4 or IPv6 address, with the NUL */
typedef struct {
    int  n;                                   /* 1 .. DTRUN_MAX_NODES entries */
    int  node[DTRUN_MAX_NODES];               /* node ranks, strictly increasing, 0 .. DTRUN_MAX_NODES - 1 */
    char addr[DTRUN_MAX_NODES][DTRUN_ADDR_MAX];   /* hex digits, '.', ':' only; not empty */
    int  port[DTRUN_MAX_NODES];               /* where it would serve; 0 .. 65535 (0: it cannot) */
} dtrun_peers;

/* Parse PEERS' fields (the line after "PEERS "), separated by single spaces, into pe;
 * 0, or -1 when malformed, out of the ranges above or followed by anything. */
int dtrun_parse_peers(const char *args, dtrun_peers *pe);

/* A report's newlines travel as tabs: turn them back in place. */
void dtrun_decode(char *s);

#endif /* DTRUN_PARSE_H */
