/*
 * auth.c: the job secret and the challenge-response exchange (see auth.h).
 */
#include "config.h"
#include "auth.h"
#include "clock.h"
#include "sock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define AUTH_VERSION 1u
#define M_HELLO      0x55415444u   /* "DTAU" */
#define M_CHALLENGE  0x43415444u   /* "DTAC" */
#define M_RESPONSE   0x52415444u   /* "DTAR" */
#define M_VERDICT    0x56415444u   /* "DTAV" */
#define HELLO_BYTES     (16 + DT_AUTH_NONCE)
#define CHALLENGE_BYTES (12 + DT_AUTH_NONCE + DT_AUTH_MAC)
#define RESPONSE_BYTES  (4 + DT_AUTH_MAC)
#define VERDICT_BYTES   8
#define FLAG_SECRET  1u

enum { CH_OK = 0, CH_PROTOCOL = 1, CH_PURPOSE = 2 };
enum { S_HELLO, S_RESPONSE, S_DONE, S_FAILED };

static const char *purpose_name(unsigned p) {
    return p == DT_AUTH_STORE ? "store" : p == DT_AUTH_PEER ? "peer" : p == DT_AUTH_LAUNCH ? "launcher" : "unknown";
}

static dt_status sodium_ready(void) {
    if (sodium_init() < 0) return dt_error(DT_ERR_INTERNAL, "libsodium failed to initialise");
    return DT_OK;
}

dt_status dt_auth_init_secret(dt_auth *a, const char *job_id, const char *secret, size_t len) {
    if (!job_id) job_id = "";
    if (strlen(job_id) > DT_AUTH_MAX_JOB)
        return dt_error(DT_ERR_INVALID, "job id '%.40s...' is longer than %u bytes", job_id, DT_AUTH_MAX_JOB);
    char job[DT_AUTH_MAX_JOB + 1];   /* job_id may be a->job itself */
    snprintf(job, sizeof job, "%s", job_id);
    memset(a, 0, sizeof *a);
    memcpy(a->job, job, sizeof job);
    if (secret && len) {
        if (len > DT_AUTH_MAX_SECRET)
            return dt_error(DT_ERR_INVALID, "the job secret is longer than %u bytes", DT_AUTH_MAX_SECRET);
        memcpy(a->secret, secret, len);
        a->secret_len = len;
        a->has_secret = 1;
    }
    return sodium_ready();
}

/* The secret file: ours, a regular file, no access for group or others. */
static dt_status read_secret_file(const char *path, char *buf, size_t *len) {
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return dt_error(DT_ERR_INVALID, "DT_JOB_SECRET_FILE=%s: %s%s", path, strerror(errno),
                        errno == ELOOP ? " (a symbolic link is not accepted)" : "");
    struct stat sb;
    dt_status s = DT_OK;
    if (fstat(fd, &sb) != 0)
        s = dt_error(DT_ERR_INVALID, "DT_JOB_SECRET_FILE=%s: %s", path, strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        s = dt_error(DT_ERR_INVALID, "DT_JOB_SECRET_FILE=%s is not a regular file", path);
    else if (sb.st_uid != geteuid())
        s = dt_error(DT_ERR_INVALID, "DT_JOB_SECRET_FILE=%s belongs to user %u, not to this user (%u)", path,
                     (unsigned)sb.st_uid, (unsigned)geteuid());
    else if (sb.st_mode & 077)
        s = dt_error(DT_ERR_INVALID, "DT_JOB_SECRET_FILE=%s is readable by others (mode %03o): "
                     "make it private with chmod 600", path, (unsigned)(sb.st_mode & 0777));
    else if (sb.st_size > DT_AUTH_MAX_SECRET + 1)
        s = dt_error(DT_ERR_INVALID, "DT_JOB_SECRET_FILE=%s is larger than %u bytes", path, DT_AUTH_MAX_SECRET);
    size_t n = 0;
    while (s == DT_OK && n < DT_AUTH_MAX_SECRET + 1) {
        ssize_t r = read(fd, buf + n, DT_AUTH_MAX_SECRET + 1 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) s = dt_error(DT_ERR_INVALID, "DT_JOB_SECRET_FILE=%s: %s", path, strerror(errno));
        if (r <= 0) break;
        n += (size_t)r;
    }
    close(fd);
    if (s != DT_OK) return s;
    if (n && buf[n - 1] == '\n') n--;
    if (n && buf[n - 1] == '\r') n--;
    if (n == 0) return dt_error(DT_ERR_INVALID, "DT_JOB_SECRET_FILE=%s is empty", path);
    if (n > DT_AUTH_MAX_SECRET)
        return dt_error(DT_ERR_INVALID, "DT_JOB_SECRET_FILE=%s is larger than %u bytes", path, DT_AUTH_MAX_SECRET);
    *len = n;
    return DT_OK;
}

dt_status dt_auth_init(dt_auth *a, const char *job_id) {
    const char *env = getenv("DT_JOB_SECRET"), *file = getenv("DT_JOB_SECRET_FILE");
    if (env && *env) return dt_auth_init_secret(a, job_id, env, strlen(env));
    if (file && *file) {
        char *buf = malloc(DT_AUTH_MAX_SECRET + 1);
        if (!buf) return dt_error(DT_ERR_NOMEM, "out of memory");
        size_t n = 0;
        dt_status s = read_secret_file(file, buf, &n);
        if (s == DT_OK) s = dt_auth_init_secret(a, job_id, buf, n);
        sodium_memzero(buf, DT_AUTH_MAX_SECRET + 1);
        free(buf);
        return s;
    }
    return dt_auth_init_secret(a, job_id, NULL, 0);
}

int dt_auth_is_loopback(const char *addr) {
    if (!addr || !*addr) return 0;
    if (strcmp(addr, "localhost") == 0) return 1;
    struct in_addr v4;
    struct in6_addr v6;
    if (inet_pton(AF_INET, addr, &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, addr, &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
    /* a host name: loopback when every address it resolves to is */
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *res = NULL;
    if (getaddrinfo(addr, NULL, &hints, &res) != 0 || !res) return 0;
    int all = 1;
    for (struct addrinfo *r = res; r && all; r = r->ai_next) {
        if (r->ai_family == AF_INET)
            all = (ntohl(((struct sockaddr_in *)r->ai_addr)->sin_addr.s_addr) >> 24) == 127;
        else if (r->ai_family == AF_INET6)
            all = IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)r->ai_addr)->sin6_addr);
        else
            all = 0;
    }
    freeaddrinfo(res);
    return all;
}

dt_status dt_auth_allow(const dt_auth *a, const char *addr) {
    if (a->has_secret || dt_auth_is_loopback(addr)) return DT_OK;
    return dt_error(DT_ERR_INVALID, "a job that reaches beyond this host (%s) needs a job secret: set DT_JOB_SECRET to "
                    "the same random string on every process, or DT_JOB_SECRET_FILE to a file of mode 0600 they "
                    "all read (for example: umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > "
                    "FILE); dtrun sets one for the ranks it starts on one node", addr && *addr ? addr : "?");
}

void dt_auth_new_secret(char out[65]) {
    unsigned char raw[32];
    if (sodium_init() < 0) abort();   /* cannot happen on a supported system; never run without randomness */
    randombytes_buf(raw, sizeof raw);
    sodium_bin2hex(out, 65, raw, sizeof raw);
    sodium_memzero(raw, sizeof raw);
}

static void mac(const dt_auth *a, char role, unsigned purpose, const unsigned char *nc, const unsigned char *ns,
                unsigned char out[DT_AUTH_MAC]) {
    crypto_auth_hmacsha256_state st;
    unsigned char head[24];
    memcpy(head, "dtrain-auth-1", 13);
    head[13] = (unsigned char)role;
    dt_put32(head + 14, purpose);
    size_t jl = strlen(a->job);
    dt_put32(head + 18, (unsigned)jl);
    crypto_auth_hmacsha256_init(&st, a->secret, a->secret_len);
    crypto_auth_hmacsha256_update(&st, head, 22);
    crypto_auth_hmacsha256_update(&st, (const unsigned char *)a->job, jl);
    crypto_auth_hmacsha256_update(&st, nc, DT_AUTH_NONCE);
    crypto_auth_hmacsha256_update(&st, ns, DT_AUTH_NONCE);
    crypto_auth_hmacsha256_final(&st, out);
    sodium_memzero(&st, sizeof st);
}

/* ---- client -------------------------------------------------------------------------- */

dt_status dt_auth_client(const dt_auth *a, int fd, unsigned purpose, double deadline) {
    unsigned char hello[HELLO_BYTES], ch[CHALLENGE_BYTES], resp[RESPONSE_BYTES], ver[VERDICT_BYTES];
    unsigned char nc[DT_AUTH_NONCE], want[DT_AUTH_MAC];
    DT_TRY(sodium_ready());
    randombytes_buf(nc, sizeof nc);
    dt_put32(hello, M_HELLO);
    dt_put32(hello + 4, AUTH_VERSION);
    dt_put32(hello + 8, purpose);
    dt_put32(hello + 12, a->has_secret ? FLAG_SECRET : 0);
    memcpy(hello + 16, nc, DT_AUTH_NONCE);
    dt_status s;
    if ((s = dt_sock_write_all(fd, hello, sizeof hello, deadline)) != DT_OK ||
        (s = dt_sock_read_all(fd, ch, sizeof ch, deadline)) != DT_OK)
        return dt_error_wrap(s, "authentication: ");
    if (dt_get32(ch) != M_CHALLENGE)
        return dt_error(DT_ERR_MISMATCH, "authentication: the %s port answered something other than dtrain's "
                        "challenge (another program, or a dtrain without authentication)", purpose_name(purpose));
    unsigned status = dt_get32(ch + 4), sflags = dt_get32(ch + 8);
    if (status == CH_PURPOSE)
        return dt_error(DT_ERR_MISMATCH, "authentication: this is not a %s port of dtrain", purpose_name(purpose));
    if (status != CH_OK)
        return dt_error(DT_ERR_MISMATCH, "authentication: the server speaks another version of the protocol");
    if ((sflags & FLAG_SECRET) != (a->has_secret ? FLAG_SECRET : 0))
        return dt_error(DT_ERR_MISMATCH, "authentication: %s a job secret and the server %s: set the same "
                        "DT_JOB_SECRET (or DT_JOB_SECRET_FILE) on every process of the job",
                        a->has_secret ? "this process has" : "this process has no",
                        sflags & FLAG_SECRET ? "has one" : "has none");
    mac(a, 'S', purpose, nc, ch + 12, want);
    if (sodium_memcmp(want, ch + 12 + DT_AUTH_NONCE, DT_AUTH_MAC) != 0)
        return dt_error(DT_ERR_MISMATCH, "authentication: the server does not prove this job's secret and id "
                        "(it serves another job, or DT_JOB_SECRET differs between the processes)");
    dt_put32(resp, M_RESPONSE);
    mac(a, 'C', purpose, nc, ch + 12, resp + 4);
    if ((s = dt_sock_write_all(fd, resp, sizeof resp, deadline)) != DT_OK ||
        (s = dt_sock_read_all(fd, ver, sizeof ver, deadline)) != DT_OK)
        return dt_error_wrap(s, "authentication: ");
    if (dt_get32(ver) != M_VERDICT || dt_get32(ver + 4) != 0)
        return dt_error(DT_ERR_MISMATCH, "authentication: the server refused this process's proof of the secret");
    return DT_OK;
}

dt_status dt_auth_connect(const dt_auth *a, const char *host, int port, unsigned purpose, double deadline, int *fd) {
    /* A server answers at once or drops the connection (a flood makes it shed the
     * unproven ones), so an attempt that hears nothing for a while is stuck in a queue:
     * a fresh one does better than waiting there. Patience doubles for slow links. */
    double attempt = 0.5, pause = 0.002;
    for (;;) {
        DT_TRY(dt_sock_connect(host, port, deadline, fd));
        double t = dt_now() + attempt;
        dt_status s = dt_auth_client(a, *fd, purpose, t < deadline ? t : deadline);
        if (s == DT_OK) return DT_OK;
        close(*fd);
        *fd = -1;
        if (s == DT_ERR_MISMATCH || dt_now() + pause >= deadline) return s;
        if (attempt < 2 * DT_AUTH_DEADLINE) attempt *= 2;
        struct timespec ts = { 0, (long)(pause * 1e9) };
        nanosleep(&ts, NULL);
        if (pause < 0.1) pause *= 2;
    }
}

/* ---- server -------------------------------------------------------------------------- */

void dt_auth_conn_start(dt_auth_conn *c, int fd, double now) {
    memset(c, 0, sizeof *c);
    c->fd = fd;
    c->state = S_HELLO;
    c->since = now;
    c->deadline = now + DT_AUTH_STEP;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    snprintf(c->addr, sizeof c->addr, "?");
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET)
            inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, c->addr, sizeof c->addr);
        else if (ss.ss_family == AF_INET6)
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, c->addr, sizeof c->addr);
    }
}

/* The whole message at once: a few dozen bytes always fit a fresh socket's buffer, and a
 * client that cannot take them is not worth waiting for. */
static int send_now(int fd, const unsigned char *m, size_t n) {
    ssize_t w;
    do w = send(fd, m, n, MSG_NOSIGNAL | MSG_DONTWAIT); while (w < 0 && errno == EINTR);
    return w == (ssize_t)n;
}

int dt_auth_conn_step(const dt_auth *a, dt_auth_conn *c, unsigned purpose) {
    if (c->state == S_DONE) return 1;
    if (c->state == S_FAILED) return -1;
    size_t need = c->state == S_HELLO ? HELLO_BYTES : RESPONSE_BYTES;
    while (c->got < need) {
        ssize_t r = recv(c->fd, c->in + c->got, need - c->got, MSG_DONTWAIT);
        if (r > 0) { c->got += (size_t)r; continue; }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        c->state = S_FAILED;   /* end of file or an error */
        return -1;
    }
    c->got = 0;
    if (c->state == S_HELLO) {
        unsigned char ch[CHALLENGE_BYTES];
        memset(ch, 0, sizeof ch);
        dt_put32(ch, M_CHALLENGE);
        dt_put32(ch + 8, a->has_secret ? FLAG_SECRET : 0);
        if (dt_get32(c->in) != M_HELLO) { c->state = S_FAILED; return -1; }   /* not ours: no answer at all */
        /* a client that hung up after its HELLO gave up waiting in the queue (a real
         * client sends nothing more before the challenge): no answer, and no stranger */
        unsigned char b;
        ssize_t pk;
        do pk = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT); while (pk < 0 && errno == EINTR);
        if (pk == 0 || (pk < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
            c->gone = 1;
            c->state = S_FAILED;
            return -1;
        }
        unsigned status = dt_get32(c->in + 4) != AUTH_VERSION ? CH_PROTOCOL
                        : dt_get32(c->in + 8) != purpose ? CH_PURPOSE : CH_OK;
        dt_put32(ch + 4, status);
        if (status == CH_OK) {
            memcpy(c->nc, c->in + 16, DT_AUTH_NONCE);
            randombytes_buf(c->ns, DT_AUTH_NONCE);
            memcpy(ch + 12, c->ns, DT_AUTH_NONCE);
            mac(a, 'S', purpose, c->nc, c->ns, ch + 12 + DT_AUTH_NONCE);
        }
        if (!send_now(c->fd, ch, sizeof ch) || status != CH_OK) { c->state = S_FAILED; return -1; }
        c->state = S_RESPONSE;
        c->deadline = dt_now() + DT_AUTH_STEP;   /* the proof takes one round trip */
        return 0;
    }
    unsigned char want[DT_AUTH_MAC], ver[VERDICT_BYTES];
    mac(a, 'C', purpose, c->nc, c->ns, want);
    int good = dt_get32(c->in) == M_RESPONSE && sodium_memcmp(want, c->in + 4, DT_AUTH_MAC) == 0;
    dt_put32(ver, M_VERDICT);
    dt_put32(ver + 4, good ? 0 : 1);
    int sent = send_now(c->fd, ver, sizeof ver);
    if (!good) c->bad_mac = 1;
    c->state = good && sent ? S_DONE : S_FAILED;
    return c->state == S_DONE ? 1 : -1;
}
