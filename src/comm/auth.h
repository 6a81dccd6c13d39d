/*
 * auth.h: who may join a job — a job secret and an HMAC-SHA256 challenge-response.
 *
 * Every connection to the store, to a rank's peer port and to dtrun's rendezvous opens
 * with the same exchange, before either side reads anything else:
 *
 *   client -> server  HELLO     magic 'DTAU', version, purpose, flags, nonce_c[32]
 *   server -> client  CHALLENGE magic 'DTAC', status, flags, nonce_s[32], mac_s[32]
 *   client -> server  RESPONSE  magic 'DTAR', mac_c[32]
 *   server -> client  VERDICT   magic 'DTAV', status
 *
 *   mac_x = HMAC-SHA256(key = the job secret,
 *                       "dtrain-auth-1" | role ('S' or 'C') | purpose | job id | nonce_c | nonce_s)
 *
 * Both sides prove they know the secret; both nonces are fresh (libsodium's
 * randombytes), so a recorded exchange cannot be replayed, and the role byte keeps a
 * server's proof from being reflected as a client's. Nothing secret goes over the wire.
 * The purpose (store, peer port, launcher) keeps a proof for one port from being
 * accepted by another. HMAC-SHA256 is libsodium's (crypto_auth_hmacsha256).
 *
 * The secret comes from DT_JOB_SECRET, or from the file named by DT_JOB_SECRET_FILE
 * (owned by this user, mode 0600 or stricter, at most 4 KiB; a trailing newline is
 * dropped). dtrun generates one for the ranks it starts. Without a secret the key is
 * empty and the exchange proves only the job id: that is allowed on loopback only
 * (dt_auth_allow says so), since any local process may already read the job id.
 *
 * This file needs only status.c, clock.c, sock.c and libsodium, so dtrun (which does not
 * link libdtrain) builds it in too. gate.h builds the comm layer's servers on it.
 */
#ifndef DT_AUTH_H
#define DT_AUTH_H

#include <stddef.h>
#include <stdint.h>
#include "status.h"

#define DT_AUTH_NONCE      32
#define DT_AUTH_MAC        32
#define DT_AUTH_MAX_SECRET 4096
#define DT_AUTH_MAX_JOB    127
/* seconds an authenticated client has to say what it wants (the mesh handshake,
 * dtrun's HELLO line); a client's attempt at the exchange gets twice this at most
 * (dt_auth_connect gives its first attempts less) */
#define DT_AUTH_DEADLINE   2.0
/* seconds a server waits for a client's HELLO after accepting it, and again for its
 * proof after sending the challenge: each takes a client one network round trip */
#define DT_AUTH_STEP       0.5

/* what a connection is for: a proof for one is refused by the others */
enum { DT_AUTH_STORE = 1, DT_AUTH_PEER = 2, DT_AUTH_LAUNCH = 3 };

typedef struct {
    unsigned char secret[DT_AUTH_MAX_SECRET];
    size_t secret_len;
    int has_secret;
    char job[DT_AUTH_MAX_JOB + 1];
} dt_auth;

/* Read the secret from the environment (see above) for job_id (NULL: ""). Errors
 * (DT_ERR_INVALID): a secret file that is missing, a link, not ours, readable by
 * others, empty or too long; a job id too long. */
dt_status dt_auth_init(dt_auth *a, const char *job_id);
/* Same, with the secret given (NULL or "": none). */
dt_status dt_auth_init_secret(dt_auth *a, const char *job_id, const char *secret, size_t len);
/* May this job use addr (where it listens, or the server it connects to)? Always with a
 * secret; without one only on loopback (127.0.0.0/8, ::1, localhost), else
 * DT_ERR_INVALID saying how to set a secret. */
dt_status dt_auth_allow(const dt_auth *a, const char *addr);
/* A fresh secret as 64 hex characters (32 random bytes) in out[65]. */
void dt_auth_new_secret(char out[65]);
/* Is addr (numeric IPv4/IPv6 or a host name) a loopback address? */
int  dt_auth_is_loopback(const char *addr);

/* Client side: run the exchange on a connected socket (blocking or not) before the
 * absolute deadline (dt_now() time). DT_OK: both sides proved the secret. Else the
 * message says why (DT_ERR_TIMEOUT, DT_ERR_PEER; DT_ERR_MISMATCH for a server of another
 * job, purpose or secret), without naming the server: callers add who it was. */
dt_status dt_auth_client(const dt_auth *a, int fd, unsigned purpose, double deadline);
/* Connect to host:port and run the exchange, retrying refused, reset and timed-out
 * attempts until the deadline (a server shedding a flood may drop one): the first
 * attempts are short (0.5 s, doubling up to 2 * DT_AUTH_DEADLINE) and a dropped one is
 * retried within milliseconds, so a client never waits long on a connection the server
 * will not answer; a server of another job, purpose or secret (DT_ERR_MISMATCH) is an
 * error at once. */
dt_status dt_auth_connect(const dt_auth *a, const char *host, int port, unsigned purpose, double deadline, int *fd);

/* Server side, one connection, driven by poll: the socket must be non-blocking. */
typedef struct {
    int fd;
    int state;                 /* 0: waiting for HELLO; the rest is internal */
    double since;              /* dt_now() time it was accepted */
    double deadline;           /* dt_now() time the current step must end by (DT_AUTH_STEP) */
    unsigned char in[64];
    size_t got;
    unsigned char nc[DT_AUTH_NONCE], ns[DT_AUTH_NONCE];
    char addr[64];             /* the peer's address, for messages */
    int bad_mac;               /* it answered, with a wrong proof */
    int gone;                  /* it had hung up before it was answered: a client that gave up
                                * waiting (a rank retrying), not a stranger the server dropped */
} dt_auth_conn;

/* Take a freshly accepted non-blocking socket (the address is looked up here). */
void dt_auth_conn_start(dt_auth_conn *c, int fd, double now);
/* Read what is there and answer. Returns 1 when the client is authenticated (c->fd is
 * then the caller's), 0 while the exchange goes on (poll c->fd for POLLIN; the challenge
 * sent, c->deadline moves to DT_AUTH_STEP from now), -1 when it failed (a protocol
 * error, a wrong proof, end of file; the caller closes c->fd). A connection past its
 * deadline is the caller's to drop. */
int  dt_auth_conn_step(const dt_auth *a, dt_auth_conn *c, unsigned purpose);
/* 1 while the client has not sent its HELLO (state 0). */
static inline int dt_auth_conn_silent(const dt_auth_conn *c) { return c->state == 0; }

#endif /* DT_AUTH_H */
