/* test_store.c: the rendezvous store — a server thread and clients in one process:
 * set/get/wait/add/delete, waiting for a key another thread sets later, timeouts,
 * a client of another job refused with both job ids named, and raw garbage written to
 * the port (bad magic, a hostile length, a truncated header) closing only that
 * connection while the server keeps serving. */
#include "store.h"
#include "sock.h"
#include "comm_impl.h"
#include "tap.h"

#include <pthread.h>
#include <sys/socket.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int port;

static void *late_setter(void *arg) {
    (void)arg;
    struct timespec ts = { 0, 200 * 1000 * 1000 };
    nanosleep(&ts, NULL);
    dt_store *st = NULL;
    if (dt_store_connect("127.0.0.1", port, "jobA", 5, &st) == DT_OK) {
        dt_store_set(st, "late", "here", 4);
        dt_store_close(st);
    }
    return NULL;
}

/* Write raw bytes to the port and report whether the server hung up (read gives EOF). */
static int raw_hangs_up(const void *bytes, size_t n) {
    int fd;
    if (dt_sock_connect("127.0.0.1", port, dt_now() + 5, &fd) != DT_OK) return 0;
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

int main(void) {
    dt_store_server *srv = NULL;
    is_int(dt_store_server_start("127.0.0.1", 0, "jobA", &srv), DT_OK, "server starts on a free port");
    if (!srv) return done_testing();
    port = dt_store_server_port(srv);
    ok(port > 0, "server reports its port (%d)", port);

    dt_store *a = NULL, *b = NULL;
    is_int(dt_store_connect("127.0.0.1", port, "jobA", 5, &a), DT_OK, "client a connects");
    is_int(dt_store_connect("127.0.0.1", port, "jobA", 5, &b), DT_OK, "client b connects");
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
    s = dt_store_connect("127.0.0.1", port, "jobB", 5, &f);
    is_int(s, DT_ERR_MISMATCH, "a client of another job is refused");
    like(dt_last_error(), "jobA", "error names the server's job");
    like(dt_last_error(), "jobB", "error names the client's job");

    /* garbage */
    ok(raw_hangs_up("GET / HTTP/1.0\r\n\r\n", 18), "HTTP request: connection closed");
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
    is_int(dt_store_connect("127.0.0.1", port, "jobA", 5, &c2), DT_OK, "and accepts new clients");
    dt_store_close(c2);

    s = dt_store_set(a, "big", "x", (size_t)DT_STORE_MAX_VALUE + 1);
    is_int(s, DT_ERR_INVALID, "client refuses to send an oversized value");

    dt_store_close(a);
    dt_store_close(b);
    dt_store_server_stop(srv);
    s = dt_store_connect("127.0.0.1", port, "jobA", 0.3, &a);
    ok(s != DT_OK, "connecting after stop fails within the timeout");
    return done_testing();
}
