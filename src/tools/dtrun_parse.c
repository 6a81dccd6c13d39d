/*
 * dtrun_parse.c: the elastic probe's answer, a rendezvous START and PEERS, read into fields
 * (dtrun_parse.h). Both come from another process, so neither trusts a byte: every number
 * is checked against its range before it is stored, and a text that does not fit its
 * buffer is refused, never cut (a cut checkpoint directory is another directory).
 */
#include "config.h"
#include "dtrun_parse.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_WORLD ((long)DTRUN_MAX_RANKS * DTRUN_MAX_NODES)

void dtrun_decode(char *s) {
    for (; *s; s++) if (*s == '\t') *s = '\n';
}

/* n bytes at s hold no control character (a CR of a CRLF line, a tab, an escape) */
static int plain(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) return 0;
    return 1;
}

static int answer(const char *line, dtrun_exact *ex) {
    if (strncmp(line, "sizes=", 6) != 0) return -1;
    const char *p = line + 6;
    long last = 0;
    for (;;) {   /* N,N,...: digits only, each larger than the one before */
        if (!isdigit((unsigned char)*p) || ex->nsizes == DTRUN_MAX_SIZES) return -1;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno != 0 || v <= last || v > MAX_WORLD) return -1;
        ex->sizes[ex->nsizes++] = (int)v;
        last = v;
        p = end;
        if (*p != ',') break;
        p++;
    }
    int have_resume = 0;
    while (*p == ' ') {
        p++;
        if (!have_resume && strncmp(p, "resume=", 7) == 0) {
            p += 7;
            size_t n = strcspn(p, " ");
            if (n >= sizeof ex->resume || !plain(p, n)) return -1;
            memcpy(ex->resume, p, n);
            ex->resume[n] = '\0';
            p += n;
            have_resume = 1;
        } else if (strncmp(p, "checkpoint-dir=", 15) == 0) {   /* the rest of the line */
            p += 15;
            size_t n = strlen(p);
            if (n >= sizeof ex->ckpt_dir || !plain(p, n)) return -1;
            memcpy(ex->ckpt_dir, p, n + 1);
            p += n;
        } else {
            return -1;
        }
    }
    return *p == '\0' ? 0 : -1;
}

int dtrun_parse_answer(const char *line, dtrun_exact *ex) {
    memset(ex, 0, sizeof *ex);
    if (answer(line, ex) == 0) return 0;
    memset(ex, 0, sizeof *ex);
    return -1;
}

/* One integer of START at *pp in lo .. hi, followed by a space (passed); 0 or -1. */
static int field(const char **pp, long lo, long hi, int *out) {
    const char *p = *pp;
    if (!isdigit((unsigned char)p[0]) && !(p[0] == '-' && isdigit((unsigned char)p[1]))) return -1;
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (errno != 0 || v < lo || v > hi || *end != ' ') return -1;
    *out = (int)v;
    *pp = end + 1;
    return 0;
}

static int start(const char *p, dtrun_start *st) {
    if (field(&p, 0, INT_MAX, &st->attempt) || field(&p, 0, 2, &st->kind) || field(&p, 0, INT_MAX, &st->restarts) ||
        field(&p, 0, 65535, &st->port) || field(&p, 1, MAX_WORLD, &st->world) ||
        field(&p, 0, MAX_WORLD, &st->rank0) || field(&p, 0, DTRUN_MAX_RANKS, &st->nlocal) ||
        field(&p, -1, DTRUN_MAX_NODES - 1, &st->group) || field(&p, 1, DTRUN_MAX_NODES, &st->ngroups))
        return -1;
    /* the ranks rank0 .. rank0+nlocal-1 lie in the world, on one of ngroups nodes that run
     * ranks (each at least one); a spare (nlocal 0) is in no group and may have no port */
    if (st->rank0 > st->world - st->nlocal || st->ngroups > st->world) return -1;
    if (st->nlocal > 0 ? st->group < 0 || st->group >= st->ngroups || st->port == 0 : st->group != -1) return -1;
    if (!isdigit((unsigned char)*p)) return -1;   /* no sign, "nan" or "inf" */
    char *end;
    st->change_at = strtod(p, &end);
    if (!isfinite(st->change_at) || st->change_at < 0 || *end != ' ') return -1;
    p = end + 1;
    size_t n = strlen(p);
    if (n == 0 || n >= sizeof st->change) return -1;   /* none is "-"; a longer one would be cut */
    if (strcmp(p, "-") != 0) {
        memcpy(st->change, p, n + 1);
        dtrun_decode(st->change);
    }
    return 0;
}

int dtrun_parse_start(const char *args, dtrun_start *st) {
    memset(st, 0, sizeof *st);
    if (start(args, st) == 0) return 0;
    memset(st, 0, sizeof *st);
    return -1;
}

static int peers(const char *p, dtrun_peers *pe) {
    int n, last = -1;
    if (field(&p, 1, DTRUN_MAX_NODES, &n)) return -1;
    for (int i = 0; i < n; i++) {
        if (field(&p, last + 1, DTRUN_MAX_NODES - 1, &pe->node[i])) return -1;
        last = pe->node[i];
        size_t a = strspn(p, "0123456789abcdefABCDEF.:");
        if (a == 0 || a >= DTRUN_ADDR_MAX || p[a] != ' ') return -1;
        memcpy(pe->addr[i], p, a);
        pe->addr[i][a] = '\0';
        p += a + 1;
        /* the last port ends the line, the others a space */
        if (!isdigit((unsigned char)*p)) return -1;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno != 0 || v > 65535 || *end != (i + 1 < n ? ' ' : '\0')) return -1;
        pe->port[i] = (int)v;
        p = *end ? end + 1 : end;
    }
    pe->n = n;
    return 0;
}

int dtrun_parse_peers(const char *args, dtrun_peers *pe) {
    pe->n = 0;
    if (peers(args, pe) == 0) return 0;
    pe->n = 0;
    return -1;
}
