/*
 * seal.c: records sealed with an AEAD over a non-blocking socket (seal.h).
 */
#include "config.h"
#include "seal.h"
#include "clock.h"

#include <errno.h>
#include <poll.h>
#include <sodium.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define HDR 4
#define WIRE (HDR + DT_SEAL_RECORD + DT_SEAL_TAG)

/* one direction: its key (expanded for AES-GCM) and the next record's counter */
typedef struct {
    crypto_aead_aes256gcm_state aes;   /* first: libsodium wants it 16-byte aligned */
    unsigned char key[32];
    uint64_t counter;
} dir_t;

struct dt_seal {
    dir_t out, in;
    int mode, use_aes;
    /* the record going out: wire bytes [ooff, olen) still to write; it holds the first
     * opend bytes the caller offered */
    unsigned char *obuf;
    size_t olen, ooff, opend;
    /* the record coming in: igot wire bytes read; once opened, plaintext [ipos, iend) */
    unsigned char *ibuf;
    size_t igot, ipos, iend;
    uint64_t flip_at;   /* testing.h's seal-flip: this record (1-based) goes out altered */
};

static const char *const names[] = {"off", "auth", "encrypt"};

dt_status dt_seal_parse(const char *s, int *mode) {
    if (!s || !*s || !strcmp(s, "off") || !strcmp(s, "0")) *mode = DT_SEAL_OFF;
    else if (!strcmp(s, "auth")) *mode = DT_SEAL_AUTH;
    else if (!strcmp(s, "encrypt") || !strcmp(s, "1") || !strcmp(s, "on")) *mode = DT_SEAL_ENCRYPT;
    else return dt_error(DT_ERR_INVALID, "secure_transport: expected off, auth or encrypt, got '%s'", s);
    return DT_OK;
}

const char *dt_seal_name(int mode) { return mode >= 0 && mode <= DT_SEAL_ENCRYPT ? names[mode] : "?"; }

int dt_seal_have_aes(void) { return sodium_init() >= 0 && crypto_aead_aes256gcm_is_available(); }

void dt_seal_testing_flip(dt_seal *s, unsigned long long record) { s->flip_at = record; }

const char *dt_seal_cipher(const dt_seal *s) { return s->use_aes ? "AES-256-GCM" : "ChaCha20-Poly1305"; }
int         dt_seal_uses_aes(const dt_seal *s) { return s->use_aes; }

static void derive(const dt_auth *a, unsigned from, unsigned to, const unsigned char *n_from,
                   const unsigned char *n_to, unsigned char key[32]) {
    static const char label[] = "dtrain-seal-1";
    unsigned char ranks[8];
    for (int i = 0; i < 4; i++) ranks[i] = (unsigned char)(from >> (8 * i)), ranks[4 + i] = (unsigned char)(to >> (8 * i));
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, a->secret, a->secret_len);
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)label, sizeof label);   /* with its NUL */
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)a->job, strlen(a->job) + 1);
    crypto_auth_hmacsha256_update(&st, ranks, sizeof ranks);
    crypto_auth_hmacsha256_update(&st, n_from, DT_SEAL_NONCE);
    crypto_auth_hmacsha256_update(&st, n_to, DT_SEAL_NONCE);
    crypto_auth_hmacsha256_final(&st, key);
    sodium_memzero(&st, sizeof st);
}

dt_status dt_seal_new(const dt_auth *a, int mode, int aes, unsigned me, unsigned peer,
                      const unsigned char nonce_me[DT_SEAL_NONCE], const unsigned char nonce_peer[DT_SEAL_NONCE],
                      dt_seal **out) {
    *out = NULL;
    if (mode != DT_SEAL_AUTH && mode != DT_SEAL_ENCRYPT)
        return dt_error(DT_ERR_INVALID, "secure transport: no mode to seal with (%d)", mode);
    if (!a->has_secret)
        return dt_error(DT_ERR_INVALID, "secure transport needs a job secret (DT_JOB_SECRET or DT_JOB_SECRET_FILE; "
                        "dtrun makes one): without one anybody could compute the keys");
    if (sodium_init() < 0) return dt_error(DT_ERR_INTERNAL, "libsodium failed to initialise");
    if (aes && !crypto_aead_aes256gcm_is_available())
        return dt_error(DT_ERR_UNSUPPORTED, "secure transport: this CPU cannot run AES-256-GCM");
    dt_seal *s = aligned_alloc(64, (sizeof *s + 63) / 64 * 64);
    if (!s) return dt_error(DT_ERR_NOMEM, "out of memory for a sealed connection");
    memset(s, 0, sizeof *s);
    s->mode = mode;
    s->use_aes = aes;
    derive(a, me, peer, nonce_me, nonce_peer, s->out.key);
    derive(a, peer, me, nonce_peer, nonce_me, s->in.key);
    if (aes) {
        crypto_aead_aes256gcm_beforenm(&s->out.aes, s->out.key);
        crypto_aead_aes256gcm_beforenm(&s->in.aes, s->in.key);
    }
    *out = s;
    return DT_OK;
}

void dt_seal_free(dt_seal *s) {
    if (!s) return;
    free(s->obuf);
    free(s->ibuf);
    sodium_memzero(s, sizeof *s);
    free(s);
}

static void nonce_of(uint64_t counter, unsigned char n[12]) {
    memset(n, 0, 12);
    for (int i = 0; i < 8; i++) n[i] = (unsigned char)(counter >> (8 * i));
}

/* Seal the record in obuf (its header and len plaintext bytes) in place. */
static void seal(dt_seal *s, size_t len) {
    unsigned char n[12], *body = s->obuf + HDR, *tag = body + len;
    nonce_of(s->out.counter++, n);
    unsigned long long tl;
    if (s->mode == DT_SEAL_ENCRYPT) {
        if (s->use_aes)
            crypto_aead_aes256gcm_encrypt_detached_afternm(body, tag, &tl, body, len, s->obuf, HDR, NULL, n, &s->out.aes);
        else
            crypto_aead_chacha20poly1305_ietf_encrypt_detached(body, tag, &tl, body, len, s->obuf, HDR, NULL, n,
                                                               s->out.key);
    } else {   /* the tag alone, over the header and the plaintext as associated data (no
                * bytes are encrypted: body is named only because the calls want a pointer) */
        if (s->use_aes)
            crypto_aead_aes256gcm_encrypt_detached_afternm(body, tag, &tl, body, 0, s->obuf, HDR + len, NULL, n,
                                                           &s->out.aes);
        else
            crypto_aead_chacha20poly1305_ietf_encrypt_detached(body, tag, &tl, body, 0, s->obuf, HDR + len, NULL, n,
                                                               s->out.key);
    }
}

/* Open the record in ibuf (len plaintext bytes) in place: 0, or -1 when its tag fails. */
static int open_record(dt_seal *s, size_t len) {
    unsigned char n[12], *body = s->ibuf + HDR, *tag = body + len;
    nonce_of(s->in.counter, n);
    int rc;
    if (s->mode == DT_SEAL_ENCRYPT)
        rc = s->use_aes ? crypto_aead_aes256gcm_decrypt_detached_afternm(body, NULL, body, len, tag, s->ibuf, HDR, n,
                                                                         &s->in.aes)
                        : crypto_aead_chacha20poly1305_ietf_decrypt_detached(body, NULL, body, len, tag, s->ibuf, HDR,
                                                                             n, s->in.key);
    else
        rc = s->use_aes ? crypto_aead_aes256gcm_decrypt_detached_afternm(body, NULL, body, 0, tag, s->ibuf, HDR + len,
                                                                         n, &s->in.aes)
                        : crypto_aead_chacha20poly1305_ietf_decrypt_detached(body, NULL, body, 0, tag, s->ibuf,
                                                                             HDR + len, n, s->in.key);
    if (rc != 0) return -1;
    s->in.counter++;
    return 0;
}

ssize_t dt_seal_sendv(dt_seal *s, int fd, const struct iovec *iov, int niov) {
    size_t total = 0;
    for (int i = 0; i < niov; i++) total += iov[i].iov_len;
    if (!s->olen) {   /* no record going out: seal the first bytes offered */
        if (!total) return 0;
        if (!s->obuf && !(s->obuf = malloc(WIRE))) { errno = ENOMEM; return -1; }
        size_t len = total < DT_SEAL_RECORD ? total : DT_SEAL_RECORD, at = 0;
        for (int i = 0; i < niov && at < len; i++) {
            size_t k = iov[i].iov_len < len - at ? iov[i].iov_len : len - at;
            memcpy(s->obuf + HDR + at, iov[i].iov_base, k);
            at += k;
        }
        for (int i = 0; i < 4; i++) s->obuf[i] = (unsigned char)(len >> (8 * i));
        seal(s, len);
        if (s->flip_at && s->out.counter == s->flip_at) s->obuf[HDR] ^= 0x01;
        s->olen = HDR + len + DT_SEAL_TAG;
        s->ooff = 0;
        s->opend = len;
    } else if (total < s->opend) {   /* the caller broke the rule of seal.h */
        errno = EPROTO;
        return -1;
    }
    while (s->ooff < s->olen) {
        ssize_t w = send(fd, s->obuf + s->ooff, s->olen - s->ooff, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return -1;
        if (w == 0) { errno = EPIPE; return -1; }
        s->ooff += (size_t)w;
    }
    s->olen = 0;
    return (ssize_t)s->opend;
}

ssize_t dt_seal_recv(dt_seal *s, int fd, void *buf, size_t n) {
    for (;;) {
        if (s->ipos < s->iend) {
            size_t k = s->iend - s->ipos < n ? s->iend - s->ipos : n;
            memcpy(buf, s->ibuf + s->ipos, k);
            s->ipos += k;
            return (ssize_t)k;
        }
        if (!n) return 0;
        if (!s->ibuf && !(s->ibuf = malloc(WIRE))) { errno = ENOMEM; return -1; }
        size_t len = 0, need = HDR;
        if (s->igot >= HDR) {
            for (int i = 0; i < 4; i++) len |= (size_t)s->ibuf[i] << (8 * i);
            need = HDR + len + DT_SEAL_TAG;
        }
        ssize_t r = recv(fd, s->ibuf + s->igot, need - s->igot, MSG_DONTWAIT);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return r;
        s->igot += (size_t)r;
        if (s->igot == HDR) {
            for (int i = 0; i < 4; i++) len |= (size_t)s->ibuf[i] << (8 * i);
            if (len == 0 || len > DT_SEAL_RECORD) { errno = EBADMSG; return -1; }
            continue;
        }
        if (s->igot < need) continue;
        if (open_record(s, len) != 0) { errno = EBADMSG; return -1; }
        s->igot = 0;
        s->ipos = HDR;
        s->iend = HDR + len;
    }
}

static dt_status wait_fd(int fd, short ev, double deadline) {
    double left = deadline - dt_now();
    if (left <= 0) return dt_error(DT_ERR_TIMEOUT, "timed out");
    struct pollfd p = {.fd = fd, .events = ev};
    int ms = left > 1.0 ? 1000 : (int)(left * 1000) + 1;
    if (poll(&p, 1, ms) < 0 && errno != EINTR) return dt_error(DT_ERR_IO, "poll: %s", strerror(errno));
    return DT_OK;
}

dt_status dt_seal_write_all(dt_seal *s, int fd, const void *buf, size_t n, double deadline) {
    size_t done = 0;
    while (done < n) {
        struct iovec v = {(char *)buf + done, n - done};
        ssize_t w = dt_seal_sendv(s, fd, &v, 1);
        if (w > 0) { done += (size_t)w; continue; }
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return dt_error(DT_ERR_PEER, "sending a sealed record: %s", strerror(errno));
        DT_TRY(wait_fd(fd, POLLOUT, deadline));
    }
    return DT_OK;
}

dt_status dt_seal_read_all(dt_seal *s, int fd, void *buf, size_t n, double deadline) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = dt_seal_recv(s, fd, (char *)buf + got, n - got);
        if (r > 0) { got += (size_t)r; continue; }
        if (r == 0) return dt_error(DT_ERR_PEER, "connection closed by peer");
        if (errno == EBADMSG)
            return dt_error(DT_ERR_PEER, "a sealed record failed its check: altered on the way, or sealed with "
                            "other keys");
        if (errno != EAGAIN && errno != EWOULDBLOCK) return dt_error(DT_ERR_PEER, "%s", strerror(errno));
        DT_TRY(wait_fd(fd, POLLIN, deadline));
    }
    return DT_OK;
}
