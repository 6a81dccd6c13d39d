/*
 * fuzz_seal.c: libFuzzer target for the receiving side of --secure-transport (seal.h),
 * what an attacker on the wire between two ranks can send them.
 *
 * The first byte picks the mode (bit 0: auth or encrypt), the cipher (bit 1: AES-256-GCM
 * where the CPU has it) and what the rest is (bit 2):
 *   0: raw bytes on the wire: the receiver may refuse them (EBADMSG) or wait for more,
 *      but it must never hand out a byte, since nobody without the keys can make a
 *      record that opens;
 *   1: plaintext that a rank seals in records (cut where the second byte says), after
 *      which the wire byte at the position the third and fourth bytes name is flipped
 *      when bit 3 is set: the receiver hands out exactly a prefix of the plaintext, all
 *      of it when nothing was flipped, and refuses the record with the flipped byte.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "seal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static dt_auth auth;
static unsigned char n0[DT_SEAL_NONCE], n1[DT_SEAL_NONCE] = {1};

static int sock_pair(int sv[2]) {
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return -1;
    int big = 1 << 20;
    for (int i = 0; i < 2; i++) {
        setsockopt(sv[i], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
        setsockopt(sv[i], SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
        fcntl(sv[i], F_SETFL, fcntl(sv[i], F_GETFL) | O_NONBLOCK);
    }
    return 0;
}

/* Everything the receiver hands out of fd into out (cap bytes); *err: 0 (it waits for
 * more), EBADMSG, or another errno. */
static size_t drain(dt_seal *r, int fd, unsigned char *out, size_t cap, int *err) {
    size_t got = 0;
    *err = 0;
    for (;;) {
        unsigned char tmp[777];
        ssize_t k = dt_seal_recv(r, fd, tmp, sizeof tmp);
        if (k > 0) {
            if (got + (size_t)k > cap) abort();   /* more than was ever sealed */
            memcpy(out + got, tmp, (size_t)k);
            got += (size_t)k;
            continue;
        }
        if (k < 0 && errno != EAGAIN) *err = errno;
        return got;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 4 || size > 200000) return 0;
    if (!auth.has_secret && dt_auth_init_secret(&auth, "fuzz", "fuzz-secret", 11) != DT_OK) abort();
    int mode = data[0] & 1 ? DT_SEAL_ENCRYPT : DT_SEAL_AUTH, aes = (data[0] & 2) && dt_seal_have_aes();
    dt_seal *tx, *rx;
    if (dt_seal_new(&auth, mode, aes, 0, 1, n0, n1, &tx) != DT_OK) abort();
    if (dt_seal_new(&auth, mode, aes, 1, 0, n1, n0, &rx) != DT_OK) abort();
    int wire[2], in[2];
    if (sock_pair(wire) != 0 || sock_pair(in) != 0) abort();
    unsigned char *out = malloc(size + 1), *raw = NULL;
    int err;
    if (!(data[0] & 4)) {
        size_t w = (size_t)write(in[0], data + 1, size - 1);
        (void)w;
        if (drain(rx, in[1], out, size, &err) != 0) abort();   /* a forgery opened */
    } else {
        const uint8_t *plain = data + 4;
        size_t n = size - 4, cut = (size_t)data[1] * 97 + 1, sent = 0;
        while (sent < n) {   /* the socket holds it all: no EAGAIN */
            struct iovec v = {(void *)(plain + sent), n - sent < cut ? n - sent : cut};
            ssize_t k = dt_seal_sendv(tx, wire[0], &v, 1);
            if (k <= 0) abort();
            sent += (size_t)k;
        }
        size_t wn = n + (n / cut + 2) * (4 + DT_SEAL_TAG) + 16;
        raw = malloc(wn);
        ssize_t rn = 0, k;
        while ((size_t)rn < wn && (k = read(wire[1], raw + rn, wn - (size_t)rn)) > 0) rn += k;
        size_t at = ((size_t)data[2] << 8 | data[3]) % (rn ? (size_t)rn : 1);
        int flip = (data[0] & 8) && rn > 0;
        if (flip) raw[at] ^= 0x20;
        if (rn && write(in[0], raw, (size_t)rn) != rn) abort();
        size_t got = drain(rx, in[1], out, n, &err);
        if (memcmp(out, plain, got) != 0) abort();             /* not the plaintext's prefix */
        if (!flip && (got != n || err)) abort();               /* an honest stream refused */
        if (flip && (got == n || err != EBADMSG)) {
            /* a flipped length may only leave the receiver waiting for bytes that never come */
            if (got == n || err != 0) abort();
        }
    }
    free(out);
    free(raw);
    close(wire[0]), close(wire[1]), close(in[0]), close(in[1]);
    dt_seal_free(tx);
    dt_seal_free(rx);
    return 0;
}
