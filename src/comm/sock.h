/*
 * sock.h: small checked wrappers over TCP sockets, with deadlines.
 *
 * The store and the tcp backend both need "write all of this before t", "read exactly n
 * bytes before t" and "connect, retrying until t". Deadlines are absolute times from
 * dt_now(). Writes use MSG_NOSIGNAL: a closed peer is an error, never SIGPIPE.
 * Errors: DT_ERR_PEER (connection closed or reset), DT_ERR_TIMEOUT, DT_ERR_IO; the message
 * says what failed without naming a rank: callers wrap it with who the peer was.
 */
#ifndef DT_SOCK_H
#define DT_SOCK_H

#include <stddef.h>
#include "status.h"

/* Listen on addr:port (addr NULL or "": all interfaces; port 0: any free one). */
dt_status dt_sock_listen(const char *addr, int port, int *fd, int *bound_port);
/* Connect to host:port, retrying refused connections until the deadline. */
dt_status dt_sock_connect(const char *host, int port, double deadline, int *fd);
/* Accept one connection before the deadline (DT_ERR_TIMEOUT otherwise). */
dt_status dt_sock_accept(int lfd, double deadline, int *fd);
dt_status dt_sock_write_all(int fd, const void *buf, size_t n, double deadline);
dt_status dt_sock_read_all (int fd, void *buf, size_t n, double deadline);
/* TCP_NODELAY, large buffers, close-on-exec. */
void      dt_sock_tune(int fd);
/* The local IPv4 address the kernel would use to reach host (for 127.0.0.1: 127.0.0.1). */
dt_status dt_sock_route_addr(const char *host, char *out, size_t n);
/* The IPv4 address to listen on for peers: $DT_SOCKET_IFNAME ("eth0,ib0" or "^docker0")
 * when set, else the address that routes to the master. */
dt_status dt_sock_pick_addr(const char *master, char *out, size_t n);

/* Where to serve for peers that reach this host at master (the store, dtrun's
 * rendezvous): master's address itself when this host has it (a test bind tells), else
 * dt_sock_pick_addr's. Never the wildcard. */
dt_status dt_sock_bind_addr(const char *master, char *out, size_t n);

/* Little-endian field encoding for wire headers. */
static inline void dt_put32(unsigned char *p, unsigned v) { for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static inline unsigned dt_get32(const unsigned char *p) { unsigned v = 0; for (int i = 3; i >= 0; i--) v = (v << 8) | p[i]; return v; }
static inline void dt_put64(unsigned char *p, unsigned long long v) { for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static inline unsigned long long dt_get64(const unsigned char *p) { unsigned long long v = 0; for (int i = 7; i >= 0; i--) v = (v << 8) | p[i]; return v; }

#endif /* DT_SOCK_H */
