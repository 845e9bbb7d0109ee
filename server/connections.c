#include "connections.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <linux/sockios.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <zmq.h>

#include "fedmoe/log.h"

#define REFUSALS_PER_SECOND 20
#define CHECK_EVERY_S 0.05
#define CHECKS_PER_S 5000.0 /* TCP_INFO calls a second at most (a check costs one per connection) */

/* One accepted TCP connection, indexed by its descriptor: the bytes the kernel
 * had received from it when a message of its was last delivered. */
typedef struct {
    bool open, heard;
    uint64_t base;
    char addr[64];
} conn_t;

struct fm_conns {
    void *watched, *events;
    int cap, open;
    uint64_t backlog; /* bytes a connection may send without completing a message */
    uint32_t silent_ms; /* how long a connection may send nothing at all */
    conn_t *by_fd;
    int nfd;
    double last_check;
    fm_log_limit_t refused, cut;
};

/* Bytes the kernel has received on fd (in order, whether or not libzmq has
 * read them) and the milliseconds since it last received any; false when fd is
 * not TCP (ipc). */
static bool received(int fd, uint64_t *bytes, uint32_t *idle_ms)
{
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    memset(&ti, 0, sizeof ti);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
        len < offsetof(struct tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received)
        return false;
    *bytes = ti.tcpi_bytes_received;
    if (idle_ms)
        *idle_ms = ti.tcpi_last_data_recv;
    return true;
}

/* Starts tracking an accepted connection (its slot grown into existence;
 * descriptors are below the file limit). */
static void track(fm_conns_t *c, int fd, const char *addr)
{
    if (fd < 0)
        return;
    if (fd >= c->nfd) {
        int n = fd + 64;
        conn_t *g = realloc(c->by_fd, (size_t)n * sizeof *g);
        if (!g)
            return; /* (untracked: only the backlog check is lost for it) */
        memset(g + c->nfd, 0, (size_t)(n - c->nfd) * sizeof *g);
        c->by_fd = g;
        c->nfd = n;
    }
    conn_t *k = &c->by_fd[fd];
    memset(k, 0, sizeof *k);
    k->open = received(fd, &k->base, NULL);
    /* the peer's address (the event names the listening endpoint) */
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    char host[INET6_ADDRSTRLEN] = "";
    if (getpeername(fd, (struct sockaddr *)&sa, &sl) == 0 && sa.ss_family == AF_INET)
        inet_ntop(AF_INET, &((struct sockaddr_in *)&sa)->sin_addr, host, sizeof host);
    else if (sa.ss_family == AF_INET6)
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&sa)->sin6_addr, host, sizeof host);
    if (host[0])
        snprintf(k->addr, sizeof k->addr, "%s port %u", host,
                 ntohs(sa.ss_family == AF_INET ? ((struct sockaddr_in *)&sa)->sin_port
                                               : ((struct sockaddr_in6 *)&sa)->sin6_port));
    else
        snprintf(k->addr, sizeof k->addr, "%.63s", addr);
}

fm_status fm_conns_open(fm_conns_t **out, void *ctx, void *sock, int cap, size_t max_message, double silent_s)
{
    *out = NULL;
    fm_conns_t *c = calloc(1, sizeof *c);
    if (!c)
        return FM_ERR_NOMEM;
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://fedmoe-connections-%p", sock);
    int unbounded = 0; /* an event lost would leave the count wrong for good; events are tiny and read every loop */
    if (zmq_socket_monitor(sock, ep, ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) != 0 ||
        !(c->events = zmq_socket(ctx, ZMQ_PAIR)) ||
        zmq_setsockopt(c->events, ZMQ_RCVHWM, &unbounded, sizeof unbounded) != 0 || zmq_connect(c->events, ep) != 0) {
        fm_error_set("cannot watch the coordinator's connections: %s", zmq_strerror(zmq_errno()));
        if (c->events)
            zmq_close(c->events);
        free(c);
        return FM_ERR_IO;
    }
    int linger = 0;
    zmq_setsockopt(c->events, ZMQ_LINGER, &linger, sizeof linger);
    c->watched = sock;
    c->cap = cap;
    c->backlog = 2 * (uint64_t)max_message + (1u << 20);
    c->silent_ms = silent_s < 1.0 ? 1000u : silent_s > 3600.0 ? 3600000u : (uint32_t)(silent_s * 1000.0);
    *out = c;
    return FM_OK;
}

void *fm_conns_socket(fm_conns_t *c) { return c->events; }
int fm_conns_open_count(const fm_conns_t *c) { return c->open; }

void fm_conns_handle(fm_conns_t *c, double now)
{
    for (;;) {
        /* an event: 6 bytes (u16 event, u32 value: the descriptor), then the address */
        uint8_t head[6];
        char addr[256];
        int n = zmq_recv(c->events, head, sizeof head, ZMQ_DONTWAIT);
        if (n < 0)
            return;
        int more = 0;
        size_t ml = sizeof more;
        zmq_getsockopt(c->events, ZMQ_RCVMORE, &more, &ml);
        int an = more ? zmq_recv(c->events, addr, sizeof addr - 1, 0) : 0;
        addr[an > 0 ? (an < (int)sizeof addr - 1 ? an : (int)sizeof addr - 1) : 0] = 0;
        if (n != (int)sizeof head)
            continue;
        uint16_t event;
        uint32_t fd;
        memcpy(&event, head, 2);
        memcpy(&fd, head + 2, 4);
        if (event == ZMQ_EVENT_DISCONNECTED) {
            c->open -= c->open > 0;
            if ((int)fd >= 0 && (int)fd < c->nfd)
                c->by_fd[fd].open = false;
        } else if (event == ZMQ_EVENT_ACCEPTED && c->open >= c->cap) {
            /* libzmq sees the peer hang up and closes it; it counts until its
             * DISCONNECTED like any other */
            shutdown((int)fd, SHUT_RDWR);
            c->open++;
            if (fm_log_limit_take(&c->refused, now, REFUSALS_PER_SECOND, "refused connections"))
                fm_warn("connection from %s refused: %d connections open, the most --max-connections allows", addr,
                        c->cap);
        } else if (event == ZMQ_EVENT_ACCEPTED) {
            c->open++;
            track(c, (int)fd, addr);
        }
    }
}

void fm_conns_heard(fm_conns_t *c, int fd)
{
    if (fd >= 0 && fd < c->nfd)
        c->by_fd[fd].heard = true;
}

/* Shuts fd (libzmq then reads its end and closes it), saying why. */
static void cut(fm_conns_t *c, conn_t *k, int fd, double now, const char *why)
{
    shutdown(fd, SHUT_RDWR);
    k->open = false;
    if (fm_log_limit_take(&c->cut, now, REFUSALS_PER_SECOND, "closed connections"))
        fm_warn("connection from %s closed: %s", k->addr, why);
}

void fm_conns_check(fm_conns_t *c, double now)
{
    double every = c->open / CHECKS_PER_S > CHECK_EVERY_S ? c->open / CHECKS_PER_S : CHECK_EVERY_S;
    if (now - c->last_check < every)
        return;
    c->last_check = now;
    for (int fd = 0; fd < c->nfd; fd++) {
        conn_t *k = &c->by_fd[fd];
        uint64_t got;
        uint32_t idle;
        int unread = 0;
        if (!k->open || !received(fd, &got, &idle))
            continue;
        if (k->heard) { /* (everything received so far may have been its messages) */
            k->heard = false;
            k->base = got;
        } else if (got > k->base && got - k->base > c->backlog) {
            char why[160];
            snprintf(why, sizeof why, "%llu bytes received without a complete message (an unfinished multipart "
                     "message?), more than the %llu allowed",
                     (unsigned long long)(got - k->base), (unsigned long long)c->backlog);
            cut(c, k, fd, now, why);
        } else if (idle > c->silent_ms && ioctl(fd, SIOCINQ, &unread) == 0 && unread == 0) {
            /* (nothing waits unread: the silence is the peer's, not a full queue of ours) */
            char why[160];
            snprintf(why, sizeof why, "nothing received for %.1f s (the most is %.1f s): a peer gone without "
                     "closing, or stopped", idle / 1000.0, c->silent_ms / 1000.0);
            cut(c, k, fd, now, why);
        }
    }
}

void fm_conns_close(fm_conns_t **cp)
{
    fm_conns_t *c = cp ? *cp : NULL;
    if (!c)
        return;
    zmq_socket_monitor(c->watched, NULL, 0);
    zmq_close(c->events);
    free(c->by_fd);
    free(c);
    *cp = NULL;
}
