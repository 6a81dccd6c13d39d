/*
 * sock.c: TCP helpers with absolute deadlines (see sock.h).
 */
#include "config.h"
#include "sock.h"
#include "comm_impl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int ms_left(double deadline) {
    double left = deadline - dt_now();
    if (left <= 0) return 0;
    if (left > 1e6) return 1000000000;
    return (int)(left * 1000.0) + 1;
}

void dt_sock_tune(int fd) {
    int one = 1, big = 4 << 20;
    /* failures here only cost speed, so they are not errors */
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
}

static dt_status resolve(const char *host, int port, struct sockaddr_in *sa) {
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    if (!host || !*host) { sa->sin_addr.s_addr = htonl(INADDR_ANY); return DT_OK; }
    if (inet_pton(AF_INET, host, &sa->sin_addr) == 1) return DT_OK;
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0 || !res)
        return dt_error(DT_ERR_INVALID, "cannot resolve host '%s': %s", host, gai_strerror(rc));
    sa->sin_addr = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
    freeaddrinfo(res);
    return DT_OK;
}

dt_status dt_sock_listen(const char *addr, int port, int *fd, int *bound_port) {
    struct sockaddr_in sa;
    DT_TRY(resolve(addr, port, &sa));
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) return dt_error(DT_ERR_IO, "socket: %s", strerror(errno));
    int one = 1;
    if (setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0) {
        int e = errno; close(s);
        return dt_error(DT_ERR_IO, "setsockopt(SO_REUSEADDR): %s", strerror(e));
    }
    if (bind(s, (struct sockaddr *)&sa, sizeof sa) < 0) {
        int e = errno; close(s);
        return dt_error(DT_ERR_IO, "cannot bind %s:%d: %s", addr && *addr ? addr : "0.0.0.0", port, strerror(e));
    }
    if (listen(s, 1024) < 0) {
        int e = errno; close(s);
        return dt_error(DT_ERR_IO, "listen: %s", strerror(e));
    }
    socklen_t len = sizeof sa;
    if (getsockname(s, (struct sockaddr *)&sa, &len) < 0) {
        int e = errno; close(s);
        return dt_error(DT_ERR_IO, "getsockname: %s", strerror(e));
    }
    *fd = s;
    if (bound_port) *bound_port = ntohs(sa.sin_port);
    return DT_OK;
}

dt_status dt_sock_connect(const char *host, int port, double deadline, int *fd) {
    struct sockaddr_in sa;
    DT_TRY(resolve(host, port, &sa));
    int last = 0;
    double pause = 0.01;
    /* A SYN that a full backlog dropped is sent again only after a second: a fresh
     * attempt after 100 ms (doubling up to a second, for slow links) does better. */
    int patience = 100;
    for (;;) {
        int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (s < 0) return dt_error(DT_ERR_IO, "socket: %s", strerror(errno));
        int rc = connect(s, (struct sockaddr *)&sa, sizeof sa);
        if (rc < 0 && errno == EINPROGRESS) {
            struct pollfd p = { .fd = s, .events = POLLOUT };
            int pr = poll(&p, 1, ms_left(deadline) < patience ? ms_left(deadline) : patience);
            if (patience < 1000) patience *= 2;
            if (pr > 0) {
                int err = 0; socklen_t el = sizeof err;
                if (getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &el) < 0) err = errno;
                rc = err ? -1 : 0;
                errno = err;
            } else {
                rc = -1;
                errno = pr == 0 ? ETIMEDOUT : errno;
            }
        }
        if (rc == 0) {
            int flags = fcntl(s, F_GETFL);
            if (flags < 0 || fcntl(s, F_SETFL, flags & ~O_NONBLOCK) < 0) {
                int e = errno; close(s);
                return dt_error(DT_ERR_IO, "fcntl: %s", strerror(e));
            }
            dt_sock_tune(s);
            *fd = s;
            return DT_OK;
        }
        last = errno;
        close(s);
        if (last != ECONNREFUSED && last != ETIMEDOUT && last != ECONNRESET && last != EHOSTUNREACH &&
            last != ENETUNREACH && last != EAGAIN && last != EINTR)
            return dt_error(DT_ERR_IO, "cannot connect to %s:%d: %s", host, port, strerror(last));
        if (dt_now() + pause > deadline)
            return dt_error(DT_ERR_TIMEOUT, "cannot connect to %s:%d: %s (gave up at the deadline)",
                            host, port, strerror(last));
        struct timespec ts = { 0, (long)(pause * 1e9) };
        nanosleep(&ts, NULL);
        if (pause < 0.2) pause *= 2;
    }
}

dt_status dt_sock_accept(int lfd, double deadline, int *fd) {
    for (;;) {
        struct pollfd p = { .fd = lfd, .events = POLLIN };
        int pr = poll(&p, 1, ms_left(deadline));
        if (pr < 0 && errno == EINTR) continue;
        if (pr < 0) return dt_error(DT_ERR_IO, "poll: %s", strerror(errno));
        if (pr == 0) return dt_error(DT_ERR_TIMEOUT, "no connection arrived before the deadline");
        int s = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (s < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
            return dt_error(DT_ERR_IO, "accept: %s", strerror(errno));
        }
        dt_sock_tune(s);
        *fd = s;
        return DT_OK;
    }
}

dt_status dt_sock_write_all(int fd, const void *buf, size_t n, double deadline) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) { p += w; n -= (size_t)w; continue; }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pf = { .fd = fd, .events = POLLOUT };
            int pr = poll(&pf, 1, ms_left(deadline));
            if (pr == 0) return dt_error(DT_ERR_TIMEOUT, "send timed out");
            if (pr < 0 && errno != EINTR) return dt_error(DT_ERR_IO, "poll: %s", strerror(errno));
            continue;
        }
        if (w < 0 && (errno == EPIPE || errno == ECONNRESET))
            return dt_error(DT_ERR_PEER, "connection closed by peer");
        return dt_error(DT_ERR_IO, "send: %s", w < 0 ? strerror(errno) : "wrote nothing");
    }
    return DT_OK;
}

dt_status dt_sock_read_all(int fd, void *buf, size_t n, double deadline) {
    char *p = buf;
    while (n > 0) {
        ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
        if (r > 0) { p += r; n -= (size_t)r; continue; }
        if (r == 0) return dt_error(DT_ERR_PEER, "connection closed by peer");
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            struct pollfd pf = { .fd = fd, .events = POLLIN };
            int pr = poll(&pf, 1, ms_left(deadline));
            if (pr == 0) return dt_error(DT_ERR_TIMEOUT, "receive timed out");
            if (pr < 0 && errno != EINTR) return dt_error(DT_ERR_IO, "poll: %s", strerror(errno));
            continue;
        }
        if (errno == ECONNRESET) return dt_error(DT_ERR_PEER, "connection reset by peer");
        return dt_error(DT_ERR_IO, "recv: %s", strerror(errno));
    }
    return DT_OK;
}

dt_status dt_sock_route_addr(const char *host, char *out, size_t n) {
    struct sockaddr_in sa;
    DT_TRY(resolve(host, 9, &sa));
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) return dt_error(DT_ERR_IO, "socket: %s", strerror(errno));
    /* connecting a UDP socket sends nothing; it only asks the kernel for the route */
    if (connect(s, (struct sockaddr *)&sa, sizeof sa) < 0) {
        int e = errno; close(s);
        return dt_error(DT_ERR_IO, "no route to %s: %s", host, strerror(e));
    }
    struct sockaddr_in me; socklen_t len = sizeof me;
    int rc = getsockname(s, (struct sockaddr *)&me, &len);
    int e = errno;
    close(s);
    if (rc < 0) return dt_error(DT_ERR_IO, "getsockname: %s", strerror(e));
    if (!inet_ntop(AF_INET, &me.sin_addr, out, (socklen_t)n)) return dt_error(DT_ERR_IO, "inet_ntop failed");
    return DT_OK;
}

/* Is name in the comma list? */
static int in_list(const char *list, const char *name) {
    size_t ln = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == ln && strncmp(p, name, l) == 0) return 1;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

dt_status dt_sock_pick_addr(const char *master, char *out, size_t n) {
    const char *want = getenv("DT_SOCKET_IFNAME");
    if (!want || !*want) return dt_sock_route_addr(master, out, n);
    int exclude = want[0] == '^';
    const char *list = exclude ? want + 1 : want;
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) < 0) return dt_error(DT_ERR_IO, "getifaddrs: %s", strerror(errno));
    dt_status s = dt_error(DT_ERR_INVALID, "DT_SOCKET_IFNAME=%s: no up IPv4 interface matches", want);
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
        if (exclude ? (in_list(list, i->ifa_name) || (i->ifa_flags & IFF_LOOPBACK)) : !in_list(list, i->ifa_name))
            continue;
        if (inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, out, (socklen_t)n)) {
            s = DT_OK;
            break;
        }
    }
    freeifaddrs(ifs);
    return s;
}

dt_status dt_sock_bind_addr(const char *master, char *out, size_t n) {
    struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_DGRAM }, *res = NULL;
    int ours = 0;
    if (getaddrinfo(master, NULL, &hints, &res) == 0 && res) {
        int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in sa = *(struct sockaddr_in *)res->ai_addr;
        sa.sin_port = 0;
        ours = fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
               inet_ntop(AF_INET, &sa.sin_addr, out, (socklen_t)n) != NULL;
        if (fd >= 0) close(fd);
        freeaddrinfo(res);
    }
    return ours ? DT_OK : dt_sock_pick_addr(master, out, n);
}
