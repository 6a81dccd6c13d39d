/* test_seal.c: the sealed records of --secure-transport (seal.h) over socket pairs, for
 * each mode and each cipher this CPU has: bytes arrive as sent whatever the cut of the
 * sends and receives, also when the socket fills and a send must be offered again; with
 * encrypt the plaintext is not on the wire, with auth it is but carries a tag; and every
 * tampering is caught (EBADMSG): a flipped bit in the body, the tag or the length, a
 * record replayed, dropped, reordered or reflected back to its sender, another secret,
 * another job, another pair of nonces, a length of 0 or beyond a record. */
#define _GNU_SOURCE   /* memmem */
#include "seal.h"
#include "auth.h"
#include "tap.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static unsigned char na[DT_SEAL_NONCE], nb[DT_SEAL_NONCE];

static void pair(int fd[2], int sndbuf) {
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fd) != 0) { perror("socketpair"); exit(1); }
    for (int i = 0; i < 2; i++) fcntl(fd[i], F_SETFL, fcntl(fd[i], F_GETFL) | O_NONBLOCK);
    if (sndbuf) {
        setsockopt(fd[0], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
        setsockopt(fd[1], SOL_SOCKET, SO_RCVBUF, &sndbuf, sizeof sndbuf);
    }
}

/* Ranks 0 (a) and 1 (b) of a job, each end of one connection. */
static void ends(const dt_auth *x, const dt_auth *y, int mode, int aes, dt_seal **a, dt_seal **b) {
    *a = *b = NULL;
    if (dt_seal_new(x, mode, aes, 0, 1, na, nb, a) != DT_OK || dt_seal_new(y, mode, aes, 1, 0, nb, na, b) != DT_OK) {
        diag("dt_seal_new: %s", dt_last_error());
        exit(1);
    }
}

/* Send n bytes from a through fd[0] in pieces of the sizes cut[] (cycled, two buffers per
 * call), receiving at b through fd[1] in pieces of rcut; both sides step without blocking,
 * a sender offering the same bytes again after EAGAIN. 1 when every byte came back. */
static int roundtrip(dt_seal *a, dt_seal *b, int fd[2], const unsigned char *src, size_t n, const size_t *cut,
                     int ncut, size_t rcut, int *again) {
    unsigned char *dst = malloc(n);
    size_t sent = 0, got = 0;
    int k = 0, rounds = 0;
    *again = 0;
    while (got < n && rounds++ < 1000000) {
        if (sent < n) {
            size_t p1 = cut[k % ncut], p2 = cut[(k + 1) % ncut];
            if (p1 > n - sent) p1 = n - sent;
            if (p2 > n - sent - p1) p2 = n - sent - p1;
            struct iovec v[2] = {{(void *)(src + sent), p1}, {(void *)(src + sent + p1), p2}};
            ssize_t w = dt_seal_sendv(a, fd[0], v, p2 ? 2 : 1);
            if (w > 0) sent += (size_t)w, k++;
            else if (w < 0 && errno == EAGAIN) ++*again;
            else { diag("send: %zd %s", w, strerror(errno)); break; }
        }
        for (;;) {
            size_t want = rcut < n - got ? rcut : n - got;
            if (!want) break;
            ssize_t r = dt_seal_recv(b, fd[1], dst + got, want);
            if (r > 0) { got += (size_t)r; continue; }
            if (r < 0 && errno == EAGAIN) break;
            diag("recv: %zd %s", r, strerror(errno));
            rounds = 1 << 30;
            break;
        }
    }
    int same = got == n && memcmp(src, dst, n) == 0;
    free(dst);
    return same;
}

/* The wire bytes of one record from s sealing buf (read raw off a fresh pair). */
static size_t record(dt_seal *s, const void *buf, size_t n, unsigned char *wire, size_t cap) {
    int fd[2];
    pair(fd, 0);
    struct iovec v = {(void *)buf, n};
    ssize_t w = dt_seal_sendv(s, fd[0], &v, 1);
    ssize_t r = w > 0 ? recv(fd[1], wire, cap, 0) : -1;
    close(fd[0]);
    close(fd[1]);
    return r > 0 ? (size_t)r : 0;
}

/* Feed raw wire bytes to s: what dt_seal_recv says of them (the errno when -1). */
static int feed(dt_seal *s, const unsigned char *wire, size_t n, unsigned char *out, size_t cap, ssize_t *got) {
    int fd[2];
    pair(fd, 0);
    if (write(fd[0], wire, n) != (ssize_t)n) return -1;
    *got = dt_seal_recv(s, fd[1], out, cap);
    int e = *got < 0 ? errno : 0;
    close(fd[0]);
    close(fd[1]);
    return e;
}

static void one_cipher(int mode, int aes, const dt_auth *job) {
    const char *what = dt_seal_name(mode);
    dt_seal *a, *b;
    ends(job, job, mode, aes, &a, &b);
    diag("%s with %s", what, dt_seal_cipher(a));
    is_str(dt_seal_cipher(a), aes ? "AES-256-GCM" : "ChaCha20-Poly1305", "%s: the cipher asked for", what);

    /* bytes through, cut every which way, and through a socket that fills */
    size_t n = 3 * DT_SEAL_RECORD + 12345;
    unsigned char *src = malloc(n);
    for (size_t i = 0; i < n; i++) src[i] = (unsigned char)(i * 2654435761u >> 13);
    int fd[2], again;
    pair(fd, 0);
    size_t cuts1[] = {1, 40, 7000, DT_SEAL_RECORD + 3, 5};
    ok(roundtrip(a, b, fd, src, n, cuts1, 5, 333, &again), "%s: %zu bytes in odd pieces arrive as sent", what, n);
    size_t cuts2[] = {n};
    ok(roundtrip(a, b, fd, src, n, cuts2, 1, n, &again), "%s: the same in one call each way", what);
    close(fd[0]);
    close(fd[1]);
    pair(fd, 4096);
    size_t big = 4 * n;
    unsigned char *src2 = malloc(big);
    for (size_t i = 0; i < big; i++) src2[i] = (unsigned char)(i * 40503u >> 7);
    int same = roundtrip(a, b, fd, src2, big, cuts2, 1, 1000, &again);
    ok(same && again > 0, "%s: through a small socket buffer, every byte (sends offered again %d times)", what, again);
    close(fd[0]);
    close(fd[1]);
    free(src2);
    dt_seal_free(a);
    dt_seal_free(b);

    /* the wire: a record of text, and what each tampering does */
    ends(job, job, mode, aes, &a, &b);
    const char text[] = "the gradients of layer 7, which nobody should read or change on the way";
    unsigned char w1[256], w2[256], out[256];
    size_t l1 = record(a, text, sizeof text, w1, sizeof w1), l2 = record(a, text, sizeof text, w2, sizeof w2);
    is_int(l1, 4 + sizeof text + DT_SEAL_TAG, "%s: a record is its length, its body and a 16-byte tag", what);
    int plain = memmem(w1, l1, "nobody should read", 18) != NULL;
    ok(mode == DT_SEAL_ENCRYPT ? !plain : plain, "%s: the plaintext is %s on the wire", what,
       mode == DT_SEAL_ENCRYPT ? "not" : "in the clear");
    ok(memcmp(w1, w2, l1) != 0, "%s: the same bytes sealed twice make other records (the counter)", what);
    ssize_t got;
    dt_seal *b2;
    /* in order: both open */
    int e = feed(b, w1, l1, out, sizeof out, &got);
    ok(e == 0 && got == (ssize_t)sizeof text && !memcmp(out, text, sizeof text), "%s: the first record opens", what);
    e = feed(b, w1, l1, out, sizeof out, &got);
    is_int(e, EBADMSG, "%s: the first record replayed fails", what);
    dt_seal_free(b);
    dt_seal *x;
    ends(job, job, mode, aes, &x, &b2);
    e = feed(b2, w2, l2, out, sizeof out, &got);
    is_int(e, EBADMSG, "%s: the second record first (the first dropped, or the two reordered) fails", what);
    dt_seal_free(b2);
    dt_seal_free(x);
    struct { const char *what; size_t at; } flips[] = {{"a bit of the body", 4 + 10}, {"a bit of the tag", l1 - 1},
                                                       {"a bit of the length", 0}};
    for (int f = 0; f < 3; f++) {
        ends(job, job, mode, aes, &x, &b2);
        unsigned char t[256 + 64] = {0};   /* and more bytes after it: a length that grew is read whole */
        memcpy(t, w1, l1);
        t[flips[f].at] ^= 0x01;
        e = feed(b2, t, l1 + 64, out, sizeof out, &got);
        /* a length one less makes the body's last byte the tag's first: the check fails
         * (the tag covers the length too) */
        is_int(e, EBADMSG, "%s: %s flipped fails", what, flips[f].what);
        dt_seal_free(x);
        dt_seal_free(b2);
    }
    ends(job, job, mode, aes, &x, &b2);
    e = feed(x, w1, l1, out, sizeof out, &got);
    is_int(e, EBADMSG, "%s: a record reflected back to its sender fails (each direction its own key)", what);
    dt_seal_free(x);
    dt_seal_free(b2);
    unsigned char zero[4 + DT_SEAL_TAG] = {0}, huge[4] = {0xff, 0xff, 0xff, 0x7f};
    ends(job, job, mode, aes, &x, &b2);
    is_int(feed(b2, zero, sizeof zero, out, sizeof out, &got), EBADMSG, "%s: a record of length 0 is refused", what);
    dt_seal_free(b2);
    dt_seal_free(x);
    ends(job, job, mode, aes, &x, &b2);
    is_int(feed(b2, huge, sizeof huge, out, sizeof out, &got), EBADMSG,
           "%s: a length beyond a record is refused before anything is read", what);
    dt_seal_free(b2);
    dt_seal_free(x);

    /* other keys: another secret, another job, other nonces */
    dt_auth other_secret, other_job;
    dt_auth_init_secret(&other_secret, "jobA", "another", 7);
    dt_auth_init_secret(&other_job, "jobB", "s3cret", 6);
    const dt_auth *others[] = {&other_secret, &other_job};
    const char *onames[] = {"another secret", "another job"};
    for (int k = 0; k < 2; k++) {
        ends(job, others[k], mode, aes, &x, &b2);
        size_t l = record(x, text, sizeof text, w1, sizeof w1);
        is_int(feed(b2, w1, l, out, sizeof out, &got), EBADMSG, "%s: a receiver with %s cannot open it", what,
               onames[k]);
        dt_seal_free(x);
        dt_seal_free(b2);
    }
    dt_seal *c;
    unsigned char nc[DT_SEAL_NONCE];
    memcpy(nc, nb, sizeof nc);
    nc[0] ^= 1;
    ends(job, job, mode, aes, &x, &b2);
    dt_seal_new(job, mode, aes, 1, 0, nc, na, &c);
    size_t l = record(x, text, sizeof text, w1, sizeof w1);
    is_int(feed(c, w1, l, out, sizeof out, &got), EBADMSG, "%s: a receiver whose nonce was altered cannot open it",
           what);
    dt_seal_free(c);
    dt_seal_free(x);
    dt_seal_free(b2);
    dt_seal_free(a);
    free(src);
}

int main(void) {
    int m;
    ok(dt_seal_parse(NULL, &m) == DT_OK && m == DT_SEAL_OFF, "no value: off");
    ok(dt_seal_parse("off", &m) == DT_OK && m == DT_SEAL_OFF, "off");
    ok(dt_seal_parse("0", &m) == DT_OK && m == DT_SEAL_OFF, "0: off");
    ok(dt_seal_parse("auth", &m) == DT_OK && m == DT_SEAL_AUTH, "auth");
    ok(dt_seal_parse("encrypt", &m) == DT_OK && m == DT_SEAL_ENCRYPT, "encrypt");
    ok(dt_seal_parse("1", &m) == DT_OK && m == DT_SEAL_ENCRYPT, "1: encrypt");
    ok(dt_seal_parse("yes please", &m) == DT_ERR_INVALID, "anything else is refused");
    like(dt_last_error(), "expected off, auth or encrypt, got 'yes please'", "naming the values");

    dt_auth job, none;
    dt_auth_init_secret(&job, "jobA", "s3cret", 6);
    dt_auth_init_secret(&none, "jobA", NULL, 0);
    for (int i = 0; i < DT_SEAL_NONCE; i++) na[i] = (unsigned char)(i * 7 + 1), nb[i] = (unsigned char)(i * 13 + 5);
    dt_seal *s = NULL;
    ok(dt_seal_new(&none, DT_SEAL_ENCRYPT, 0, 0, 1, na, nb, &s) == DT_ERR_INVALID && !s, "no secret: refused");
    like(dt_last_error(), "needs a job secret", "saying why");
    ok(dt_seal_new(&job, DT_SEAL_OFF, 0, 0, 1, na, nb, &s) == DT_ERR_INVALID && !s, "mode off: nothing to seal with");

    for (int mode = DT_SEAL_AUTH; mode <= DT_SEAL_ENCRYPT; mode++) {
        one_cipher(mode, 0, &job);
        if (dt_seal_have_aes()) one_cipher(mode, 1, &job);
        else diag("this CPU has no AES-256-GCM (libsodium): ChaCha20-Poly1305 only");
    }
    return done_testing();
}
