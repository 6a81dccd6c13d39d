/* test_store.c: the rendezvous store — a server thread and clients in one process:
 * set/get/wait/add/delete, waiting for a key another thread sets later, timeouts,
 * authentication (a client of another job, with another secret or with none is
 * refused; a flood of silent or half-done connections neither shuts a client out nor
 * costs memory, and is counted by source), and raw garbage written to the port before
 * and after authentication (bad magic, a hostile length, a truncated header) closing
 * only that connection while the server keeps serving. Also the file of a file://
 * rendezvous (rdzv_file.h): what rank 0 writes reads back, and every malformed file is
 * refused naming what is wrong. */
#include "store.h"
#include "rdzv_file.h"
#include "auth.h"
#include "sock.h"
#include "comm_impl.h"
#include "tap.h"

#include <pthread.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int port;
static dt_auth job_a;   /* job "jobA" with secret "s3cret" */

static void *late_setter(void *arg) {
    (void)arg;
    struct timespec ts = { 0, 200 * 1000 * 1000 };
    nanosleep(&ts, NULL);
    dt_store *st = NULL;
    if (dt_store_connect("127.0.0.1", port, &job_a, 5, &st) == DT_OK) {
        dt_store_set(st, "late", "here", 4);
        dt_store_close(st);
    }
    return NULL;
}

/* Write raw bytes to the port (after authenticating when authed) and report whether the
 * server hung up (read gives EOF). */
static int raw_hangs_up_as(int authed, const void *bytes, size_t n) {
    int fd;
    if (dt_sock_connect("127.0.0.1", port, dt_now() + 5, &fd) != DT_OK) return 0;
    if (authed && dt_auth_client(&job_a, fd, DT_AUTH_STORE, dt_now() + 5) != DT_OK) { close(fd); return 0; }
    dt_sock_write_all(fd, bytes, n, dt_now() + 5);
    shutdown(fd, SHUT_WR);   /* and nothing more: a truncated request must not hang the server */
    char buf[256];
    int hung = 0;
    for (;;) {   /* an error reply may come first; then the connection must close */
        dt_status s = dt_sock_read_all(fd, buf, 1, dt_now() + 5);
        if (s == DT_ERR_PEER) { hung = 1; break; }
        if (s != DT_OK) break;
    }
    close(fd);
    return hung;
}
static int raw_hangs_up(const void *bytes, size_t n) { return raw_hangs_up_as(1, bytes, n); }

/* Open n connections to the port; with hello, each sends a valid HELLO and then stalls. */
static int flood(int *fds, int n, int hello) {
    int opened = 0;
    for (int i = 0; i < n; i++) {
        fds[i] = -1;
        if (dt_sock_connect("127.0.0.1", port, dt_now() + 5, &fds[i]) != DT_OK) continue;
        opened++;
        if (hello) {
            unsigned char m[48] = { 0 };
            dt_put32(m, 0x55415444u); dt_put32(m + 4, 1); dt_put32(m + 8, DT_AUTH_STORE); dt_put32(m + 12, 1);
            dt_sock_write_all(fds[i], m, sizeof m, dt_now() + 5);
        }
    }
    return opened;
}
/* The server's report, once it contains want (bounded wait: the server counts a
 * dropped connection when it sees the close, just after the client gave up). */
static const char *report_with(dt_store_server *srv, const char *want, char *rep, size_t n) {
    double end = dt_now() + 10;
    do {
        dt_store_server_report(srv, rep, n);
        if (strstr(rep, want)) break;
        struct timespec ts = { 0, 10 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    } while (dt_now() < end);
    return rep;
}

/* A client that answers the challenge with a forged proof: the verdict must refuse it. */
static int forged_refused(void) {
    int fd, refused = 0;
    if (dt_sock_connect("127.0.0.1", port, dt_now() + 5, &fd) != DT_OK) return 0;
    unsigned char m[48] = { 0 }, ch[76], resp[36] = { 0 }, ver[8];
    dt_put32(m, 0x55415444u); dt_put32(m + 4, 1); dt_put32(m + 8, DT_AUTH_STORE); dt_put32(m + 12, 1);
    dt_put32(resp, 0x52415444u);
    if (dt_sock_write_all(fd, m, sizeof m, dt_now() + 5) == DT_OK &&
        dt_sock_read_all(fd, ch, sizeof ch, dt_now() + 5) == DT_OK &&
        dt_sock_write_all(fd, resp, sizeof resp, dt_now() + 5) == DT_OK &&
        dt_sock_read_all(fd, ver, sizeof ver, dt_now() + 5) == DT_OK)
        refused = dt_get32(ver) == 0x56415444u && dt_get32(ver + 4) != 0;
    close(fd);
    return refused;
}

static void unflood(int *fds, int n) { for (int i = 0; i < n; i++) if (fds[i] >= 0) close(fds[i]); }

static long rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f)) if (sscanf(line, "VmRSS: %ld", &kb) == 1) break;
    if (f) fclose(f);
    return kb;
}

/* A file that must be refused, with sub in the message and nothing left in the fields. */
static void rdzv_bad(const char *what, const char *text, size_t n, const char *sub) {
    dt_rdzv_file f;
    memset(&f, 0x5a, sizeof f);
    dt_error_clear();
    is_int(dt_rdzv_file_parse(text, n, &f), DT_ERR_FORMAT, "rendezvous file %s: refused", what);
    like(dt_last_error(), sub, "rendezvous file %s: the message says so", what);
    ok(!f.job[0] && !f.addr[0] && !f.secret[0] && !f.port && !f.nonce, "rendezvous file %s: the fields are empty",
       what);
}

static void test_rdzv_file(void) {
    char line[512], big[1200];
    dt_rdzv_file f;
    /* what rank 0 writes (tcp.c's file_publish), and white space as fscanf took it */
    snprintf(line, sizeof line, DT_RDZV_FILE_LINE, "job-7", "10.1.2.3", 29500, 0xfedcba9876543210ull,
             "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff");
    is_int(dt_rdzv_file_parse(line, strlen(line), &f), DT_OK, "rendezvous file: rank 0's line parses");
    is_str(f.job, "job-7", "rendezvous file: the job");
    is_str(f.addr, "10.1.2.3", "rendezvous file: the address");
    is_int(f.port, 29500, "rendezvous file: the port");
    ok(f.nonce == 0xfedcba9876543210ull, "rendezvous file: the nonce, all 64 bits");
    is_str(f.secret, "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff", "rendezvous file: the secret");
    const char *lax = "  dtrain-store\t2 - 127.0.0.1 1 0 -\r\n\n";
    is_int(dt_rdzv_file_parse(lax, strlen(lax), &f), DT_OK, "rendezvous file: other white space, no job, no secret");
    ok(!strcmp(f.job, "-") && f.port == 1 && f.nonce == 0 && !strcmp(f.secret, "-"), "rendezvous file: its fields");
    const char *bare = "dtrain-store 2 j h 65535 ABCdef s";
    is_int(dt_rdzv_file_parse(bare, strlen(bare), &f), DT_OK, "rendezvous file: no newline, port 65535, hex in both cases");
    ok(f.port == 65535 && f.nonce == 0xabcdefull, "rendezvous file: its port and nonce");
    /* only the n bytes given are read: the text needs no terminating zero */
    memcpy(big, bare, strlen(bare));
    memset(big + strlen(bare), 'x', 16);
    is_int(dt_rdzv_file_parse(big, strlen(bare), &f), DT_OK, "rendezvous file: nothing past n bytes is read");
    is_str(f.secret, "s", "rendezvous file: the secret ends at n");
    rdzv_bad("cut before the secret", bare, strlen(bare) - 2, "the secret is missing");

    rdzv_bad("empty", "", 0, "it is empty");
    rdzv_bad("NULL", NULL, 5, "it is empty");
    rdzv_bad("of white space", " \n\t", 3, "it is empty");
    rdzv_bad("of another kind", "hello world", 11, "\"dtrain-store\" do not start it");
    rdzv_bad("of version 1", "dtrain-store 1 j h 1 1 -", 24, "version \"1\", this dtrain reads 2");
    rdzv_bad("of version 02x", "dtrain-store 02x j h 1 1 -", 26, "version \"02x\"");
    rdzv_bad("without a version", "dtrain-store", 12, "the version is missing");
    rdzv_bad("with the words run together", "dtrain-store2 j h 1 1 -", 23, "do not start it");
    rdzv_bad("without an address", "dtrain-store 2 j", 16, "the store's address is missing");
    rdzv_bad("without a nonce", "dtrain-store 2 j h 1", 20, "the nonce is missing");
    const char *ports[] = {"0", "65536", "70000", "-1", "+80", "80x", "123456", "0x50", NULL};
    for (int i = 0; ports[i]; i++) {
        char what[32];
        snprintf(line, sizeof line, "dtrain-store 2 j h %s 1 -", ports[i]);
        snprintf(what, sizeof what, "with port %s", ports[i]);
        rdzv_bad(what, line, strlen(line), "the store's port is not a number in 1..65535");
    }
    const char *nonces[] = {"0x1f", "-1", "g", "12345678901234567", NULL};
    for (int i = 0; nonces[i]; i++) {
        char what[48];
        snprintf(line, sizeof line, "dtrain-store 2 j h 80 %s -", nonces[i]);
        snprintf(what, sizeof what, "with nonce %s", nonces[i]);
        rdzv_bad(what, line, strlen(line), "the nonce is not 1 to 16 hex digits");
    }
    snprintf(line, sizeof line, "dtrain-store 2 %0128d h 80 1 -", 0);
    rdzv_bad("with a job id of 128 bytes", line, strlen(line), "the job id is longer than 127 bytes");
    snprintf(line, sizeof line, "dtrain-store 2 %0127d h 80 1 -", 0);
    is_int(dt_rdzv_file_parse(line, strlen(line), &f), DT_OK, "rendezvous file: a job id of 127 bytes is fine");
    snprintf(line, sizeof line, "dtrain-store 2 j %064d 80 1 -", 0);
    rdzv_bad("with an address of 64 bytes", line, strlen(line), "the store's address is longer than 63 bytes");
    snprintf(line, sizeof line, "dtrain-store 2 j h 80 1 %080d", 0);
    rdzv_bad("with a secret of 80 bytes", line, strlen(line), "the secret is longer than 79 bytes");
    rdzv_bad("with a zero byte in the job id", "dtrain-store 2 j\0b h 80 1 -", 27, "the job id is longer than 127 "
             "bytes or holds a zero byte");
    rdzv_bad("with a word after the secret", "dtrain-store 2 j h 80 1 - more", 30, "something follows the secret");
    rdzv_bad("with a zero byte after the secret", "dtrain-store 2 j h 80 1 -\n\0", 27, "something follows the secret");
}

int main(void) {
    test_rdzv_file();
    dt_store_server *srv = NULL;
    dt_auth job_b, wrong_secret, no_secret;
    is_int(dt_auth_init_secret(&job_a, "jobA", "s3cret", 6), DT_OK, "a job secret");
    dt_auth_init_secret(&job_b, "jobB", "s3cret", 6);
    dt_auth_init_secret(&wrong_secret, "jobA", "other", 5);
    dt_auth_init_secret(&no_secret, "jobA", NULL, 0);
    is_int(dt_store_server_start("127.0.0.1", 0, &job_a, &srv), DT_OK, "server starts on a free port");
    if (!srv) return done_testing();
    port = dt_store_server_port(srv);
    ok(port > 0, "server reports its port (%d)", port);

    dt_store *a = NULL, *b = NULL;
    is_int(dt_store_connect("127.0.0.1", port, &job_a, 5, &a), DT_OK, "client a connects");
    is_int(dt_store_connect("127.0.0.1", port, &job_a, 5, &b), DT_OK, "client b connects");
    is_int(dt_store_set(a, "k1", "value one", 9), DT_OK, "set");
    void *v = NULL;
    size_t n = 0;
    is_int(dt_store_get(b, "k1", &v, &n, 1), DT_OK, "get from another client");
    ok(v && n == 9 && strcmp(v, "value one") == 0, "value round-trips (NUL-terminated)");
    free(v);
    is_int(dt_store_set(a, "k1", "", 0), DT_OK, "replace with an empty value");
    v = NULL;
    is_int(dt_store_get(b, "k1", &v, &n, 1), DT_OK, "get empty value");
    ok(v && n == 0, "empty value has length 0");
    free(v);

    int64_t r = 0;
    dt_store_add(a, "ctr", 5, &r);
    is_int(r, 5, "add on a missing key starts at 0");
    dt_store_add(b, "ctr", -2, &r);
    is_int(r, 3, "add is cumulative across clients");
    dt_store_add(a, "big", INT64_MAX - 1, &r);
    is_int(dt_store_add(a, "big", 5, &r), DT_ERR_FORMAT, "an add past INT64_MAX is refused by the store");
    like(dt_last_error(), "overflow", "... saying it would overflow");
    is_int(dt_store_add(a, "big", 1, &r), DT_OK, "the counter is unchanged and still usable");
    ok(r == INT64_MAX, "... reaching INT64_MAX exactly");

    double t0 = dt_now();
    v = NULL;
    dt_status s = dt_store_get(a, "never", &v, &n, 0.3);
    is_int(s, DT_ERR_TIMEOUT, "get of a missing key times out");
    ok(dt_now() - t0 >= 0.25 && dt_now() - t0 < 5, "after about the timeout");
    like(dt_last_error(), "never", "timeout names the key");

    pthread_t th;
    pthread_create(&th, NULL, late_setter, NULL);
    const char *keys[] = { "k1", "late" };
    is_int(dt_store_wait(b, keys, 2, 5), DT_OK, "wait returns once another client sets the key");
    pthread_join(th, NULL);

    is_int(dt_store_delete(a, "k1"), DT_OK, "delete");
    is_int(dt_store_get(b, "k1", &v, &n, 0), DT_ERR_TIMEOUT, "deleted key is gone");

    dt_store *f = NULL;
    t0 = dt_now();
    s = dt_store_connect("127.0.0.1", port, &job_b, 5, &f);
    is_int(s, DT_ERR_MISMATCH, "a client of another job is refused");
    like(dt_last_error(), "another job", "... saying the server serves another job (or secret)");
    ok(dt_now() - t0 < 4, "... at once, without waiting for the timeout");
    is_int(dt_store_connect("127.0.0.1", port, &wrong_secret, 5, &f), DT_ERR_MISMATCH, "a client with another secret is refused");
    is_int(dt_store_connect("127.0.0.1", port, &no_secret, 5, &f), DT_ERR_MISMATCH, "a client without a secret is refused");
    like(dt_last_error(), "DT_JOB_SECRET", "... and told to set the same DT_JOB_SECRET everywhere");
    char rep[512];
    like(report_with(srv, "3 unauthenticated", rep, sizeof rep), "3 unauthenticated connections from 127.0.0.1", "the server counts the refused clients by source (%s)", rep);
    ok(forged_refused(), "a forged proof gets a refusing verdict");
    like(report_with(srv, "wrong proof", rep, sizeof rep), "1 connection from 127.0.0.1 with a wrong proof of the job secret", "... and is counted as such (%s)", rep);

    /* floods: silent connections, then connections that stall after a valid HELLO */
    enum { FLOOD = 300 };
    static int fds[FLOOD];
    long rss0 = rss_kib();
    ok(flood(fds, FLOOD, 0) >= FLOOD / 2, "a flood of silent connections is accepted by the kernel");
    t0 = dt_now();
    dt_store *c3 = NULL;
    is_int(dt_store_connect("127.0.0.1", port, &job_a, 20, &c3), DT_OK, "a real client still connects during the flood");
    ok(dt_now() - t0 < 10, "... in %.2f s", dt_now() - t0);
    is_int(dt_store_set(c3, "during", "flood", 5), DT_OK, "... and is served");
    dt_store_close(c3);
    unflood(fds, FLOOD);
    ok(flood(fds, FLOOD, 1) >= FLOOD / 2, "a flood of connections that say HELLO and stall");
    t0 = dt_now();
    c3 = NULL;
    is_int(dt_store_connect("127.0.0.1", port, &job_a, 20, &c3), DT_OK, "a real client still connects");
    ok(dt_now() - t0 < 10, "... in %.2f s", dt_now() - t0);
    dt_store_close(c3);
    unflood(fds, FLOOD);
    /* 8 requests announcing 63 MiB values: nothing is read before authentication */
    for (int i = 0; i < 8; i++) {
        int fd;
        if (dt_sock_connect("127.0.0.1", port, dt_now() + 5, &fd) != DT_OK) continue;
        unsigned char big[28] = { 0 };
        dt_put32(big, 0x54535444u); dt_put32(big + 4, 1); dt_put32(big + 8, 2); dt_put32(big + 20, 63u << 20);
        dt_sock_write_all(fd, big, sizeof big, dt_now() + 5);
        static char junk[1 << 20];
        for (int k = 0; k < 63 && dt_sock_write_all(fd, junk, sizeof junk, dt_now() + 0.5) == DT_OK; k++) {}
        close(fd);
    }
    long rss1 = rss_kib();
    ok(rss1 - rss0 < 64 * 1024, "the floods cost the server no real memory (%ld KiB more)", rss1 - rss0);
    dt_store_server_report(srv, rep, sizeof rep);
    like(rep, "unauthenticated connections from 127.0.0.1", "the floods are counted by source (%s)", rep);

    /* garbage */
    ok(raw_hangs_up_as(0, "GET / HTTP/1.0\r\n\r\n", 18), "HTTP request before authentication: connection closed");
    ok(raw_hangs_up("GET / HTTP/1.0\r\n\r\n", 18), "HTTP request after authentication: connection closed");
    unsigned char h[28] = { 0 };
    dt_put32(h, 0x54535444u); dt_put32(h + 4, 1); dt_put32(h + 8, 2);
    dt_put32(h + 20, 0xffffffffu);      /* a 4 GiB value */
    ok(raw_hangs_up(h, sizeof h), "hostile value length: refused without allocating it");
    dt_put32(h + 20, 0); dt_put32(h + 4, 99);
    ok(raw_hangs_up(h, sizeof h), "wrong protocol version: refused");
    dt_put32(h + 4, 1); dt_put32(h + 8, 77);
    ok(raw_hangs_up(h, sizeof h), "unknown operation: refused");
    ok(raw_hangs_up(h, 5), "truncated header then close: no crash");

    v = NULL;
    is_int(dt_store_get(b, "ctr", &v, &n, 1), DT_OK, "server still serves its clients after the garbage");
    ok(v && strcmp(v, "3") == 0, "and its data is intact");
    free(v);
    dt_store *c2 = NULL;
    is_int(dt_store_connect("127.0.0.1", port, &job_a, 5, &c2), DT_OK, "and accepts new clients");
    dt_store_close(c2);

    s = dt_store_set(a, "big", "x", (size_t)DT_STORE_MAX_VALUE + 1);
    is_int(s, DT_ERR_INVALID, "client refuses to send an oversized value");

    /* a full store: the next client is told so, not just hung up on */
    struct rlimit rl;
    int need = 2 * DT_STORE_MAX_CLIENTS + 512;   /* both ends of every connection are here */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (rlim_t)need && rl.rlim_max >= (rlim_t)need) {
        rl.rlim_cur = (rlim_t)need;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur < (rlim_t)need) {
        skip(3, "a full store needs 8704 open files (ulimit -n)");
    } else {
        static dt_store *many[DT_STORE_MAX_CLIENTS];
        int held = 0;
        s = DT_OK;
        while (held < DT_STORE_MAX_CLIENTS && (s = dt_store_connect("127.0.0.1", port, &job_a, 5, &many[held])) == DT_OK)
            held++;
        is_int(held, DT_STORE_MAX_CLIENTS - 2, "the store serves %d clients at once (2 before, %d more)",
               DT_STORE_MAX_CLIENTS, held);
        is_int(s, DT_ERR_PEER, "the next client is refused");
        like(dt_last_error(), "refused the connection: store full: 4096 clients connected",
             "... saying the store is full (%s)", dt_last_error());
        for (int i = 0; i < held; i++) dt_store_close(many[i]);
    }
    is_int(dt_store_connect("127.0.0.1", port, &job_a, 5, &c2), DT_OK, "with them gone, a client connects again");
    dt_store_close(c2);

    dt_store_close(a);
    dt_store_close(b);
    dt_store_server_stop(srv);
    s = dt_store_connect("127.0.0.1", port, &job_a, 0.3, &a);
    ok(s != DT_OK, "connecting after stop fails within the timeout");
    return done_testing();
}
