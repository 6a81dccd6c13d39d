/*
 * seal.h: --secure-transport, the tcp backend's frames between ranks sealed with an AEAD.
 *
 * Off by default: after the handshake (auth.h) the bytes between ranks are neither
 * encrypted nor integrity-protected, as in Gloo and NCCL. With a mode on, every byte a
 * rank writes on a peer's socket travels in records
 *
 *   length u32 (little-endian, 1 .. DT_SEAL_RECORD)  body (length bytes)  tag (16 bytes)
 *
 *   auth     the body is the plaintext; the tag authenticates the length and the body
 *   encrypt  the body is the ciphertext; the tag authenticates the length and the body
 *
 * with AES-256-GCM where both ends have AES-NI and PCLMUL (libsodium says so), else
 * ChaCha20-Poly1305 (IETF). The nonce is a counter per direction, never sent: a record
 * dropped, replayed, reordered or altered on the way fails its tag. Each direction of each
 * connection has its own key,
 *
 *   key(a -> b) = HMAC-SHA256(job secret, "dtrain-seal-1" | job id | a | b | nonce_a | nonce_b)
 *
 * from fresh random nonces the two ranks exchange over the authenticated connection
 * (tcp.c), so a key is never reused, no key crosses the wire, and nobody without the job
 * secret can compute one. Same-host shared-memory rings are not sealed (nothing leaves the
 * host; their control records on the socket are). The store's connections (addresses and
 * ports, no training data) and dtrun's rendezvous are authenticated but not sealed.
 *
 * The calls are non-blocking and mirror sendmsg/recv, with one rule for the sender: a
 * call that returned -1 (EAGAIN) may have sealed the first bytes of its buffers into a
 * record that is still going out, so the next call must offer those same bytes again (as
 * TLS libraries ask), which the tcp data path does: it retries from where it stands.
 * A record that fails its tag is -1 with errno EBADMSG.
 */
#ifndef DT_SEAL_H
#define DT_SEAL_H

#include <stddef.h>
#include <sys/types.h>
#include <sys/uio.h>
#include "status.h"
#include "auth.h"

#define DT_SEAL_RECORD (64u << 10)   /* plaintext bytes of a record at most */
#define DT_SEAL_TAG    16
#define DT_SEAL_NONCE  32            /* each side's contribution to the keys */

enum { DT_SEAL_OFF = 0, DT_SEAL_AUTH = 1, DT_SEAL_ENCRYPT = 2 };

/* "off" (also "0", "", NULL), "auth", "encrypt" (also "1", "on"); DT_ERR_INVALID
 * "secure_transport: expected off, auth or encrypt, got 'X'" for anything else. */
dt_status   dt_seal_parse(const char *s, int *mode);
const char *dt_seal_name(int mode);   /* "off", "auth", "encrypt" */
/* 1 when this CPU can run AES-256-GCM (libsodium's test); both ends must, to use it. */
int         dt_seal_have_aes(void);

typedef struct dt_seal dt_seal;

/* One connection's two directions between rank `me` and rank `peer` (their nonces), in
 * mode (not off), with AES-256-GCM if aes else ChaCha20-Poly1305. The auth must hold a
 * secret (DT_ERR_INVALID otherwise: without one anybody could compute the keys). */
dt_status dt_seal_new(const dt_auth *a, int mode, int aes, unsigned me, unsigned peer,
                      const unsigned char nonce_me[DT_SEAL_NONCE], const unsigned char nonce_peer[DT_SEAL_NONCE],
                      dt_seal **out);
void      dt_seal_free(dt_seal *s);
/* testing.h's seal-flip: flip a bit of the body of the record-th record sealed (1-based),
 * after sealing it. */
void      dt_seal_testing_flip(dt_seal *s, unsigned long long record);
/* "AES-256-GCM" or "ChaCha20-Poly1305"; 1 for the first */
const char *dt_seal_cipher(const dt_seal *s);
int         dt_seal_uses_aes(const dt_seal *s);

/* Non-blocking, as sendmsg(fd, iov, MSG_DONTWAIT | MSG_NOSIGNAL): bytes taken (> 0),
 * 0 for no bytes offered, -1 with errno (EAGAIN: call again with the same bytes first). */
ssize_t   dt_seal_sendv(dt_seal *s, int fd, const struct iovec *iov, int niov);
/* Non-blocking, as recv(fd, buf, n, MSG_DONTWAIT): bytes of plaintext (> 0), 0 at end
 * of file, -1 with errno (EAGAIN; EBADMSG: a record failed its tag or its length). */
ssize_t   dt_seal_recv(dt_seal *s, int fd, void *buf, size_t n);
/* Blocking versions until the absolute dt_now() deadline (DT_ERR_TIMEOUT, DT_ERR_PEER for
 * end of file or a failed tag, DT_ERR_IO), for the handshake's confirmation. */
dt_status dt_seal_write_all(dt_seal *s, int fd, const void *buf, size_t n, double deadline);
dt_status dt_seal_read_all(dt_seal *s, int fd, void *buf, size_t n, double deadline);

#endif /* DT_SEAL_H */
