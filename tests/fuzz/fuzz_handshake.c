/*
 * fuzz_handshake.c: libFuzzer target for what a stranger can send to dtrain's ports.
 *
 * The first input byte picks the target, the rest is the byte stream a client sends:
 *   even: the server side of the authentication exchange (auth.h), as the store, the
 *         peer ports and dtrun's rendezvous run it before reading anything else;
 *   odd:  the store's request parser behind a successful authentication (what a rank
 *         with the secret, or a bug in one, can send), gets and waits capped at 1 ms.
 * Both run over a socketpair; a thread drains the answers so the server never blocks.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <fcntl.h>

#include "auth.h"
#include "clock.h"
#include "store.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static dt_auth auth;
static dt_store_server *srv;

static void *drain(void *arg) {
    int fd = *(int *)arg;
    char buf[65536];
    while (read(fd, buf, sizeof buf) > 0) {}
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 60000) return 0;
    if (!srv) {
        if (dt_auth_init_secret(&auth, "fuzz", "fuzz-secret", 11) != DT_OK) abort();
        if (dt_store_server_start("127.0.0.1", 0, &auth, &srv) != DT_OK) abort();
    }
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 0;
    int big = 1 << 20;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    /* the client's bytes, then end of file */
    size_t off = 1;
    while (off < size) {
        ssize_t w = write(sv[0], data + off, size - off);
        if (w <= 0) break;
        off += (size_t)w;
    }
    shutdown(sv[0], SHUT_WR);
    pthread_t th;
    int reader = sv[0];
    if (pthread_create(&th, NULL, drain, &reader) != 0) { close(sv[0]); close(sv[1]); return 0; }
    if (data[0] & 1) {
        dt_store_serve_stream(srv, sv[1], 0.001);
    } else {
        fcntl(sv[1], F_SETFL, O_NONBLOCK);
        dt_auth_conn c;
        dt_auth_conn_start(&c, sv[1], dt_now());
        for (int i = 0; i < 8 && dt_auth_conn_step(&auth, &c, DT_AUTH_STORE) == 0; i++) {}
    }
    shutdown(sv[1], SHUT_RDWR);
    pthread_join(th, NULL);
    close(sv[0]);
    close(sv[1]);
    return 0;
}
