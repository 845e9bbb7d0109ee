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

#define PENDING_BUCKETS 4096 /* per-address counts of connections yet to deliver a message, hashed */
#define FIRST_MESSAGE_S 10.0 /* from the accept to the first message (the handshake takes at most 5 s) */
#define DRIP_BYTES_PER_S 65536.0 /* the slowest a message may arrive once silent_s has passed */

/* One accepted TCP connection, indexed by its descriptor: the bytes the kernel
 * had received from it when a message of its was last delivered, when that
 * was, and whose it is (the id of its first message: with CURVE, its key's). */
typedef struct {
    bool open, heard;
    uint64_t base;
    double heard_at, owned_at; /* (heard_at starts at the accept) */
    int bucket;     /* its address's pending count, while it has delivered nothing; -1 after */
    char addr[64];
    char owner[64]; /* "" until its first message */
    uint64_t got;   /* at the current check: bytes the kernel has received from it, */
    uint32_t idle;  /* and ms since it last received any */
    bool measured;  /* (false: not TCP, or gone) */
} conn_t;

struct fm_conns {
    void *watched, *events;
    int cap, open;
    uint64_t backlog; /* bytes a connection may send without completing a message */
    uint32_t silent_ms; /* how long a connection may send nothing at all */
    conn_t *by_fd;
    uint32_t *owner_of; /* by descriptor: a hash of the owner's id, 0 none (scanned per new owner, not conn_t) */
    int nfd;
    double last_check;
    double caught_up_at;                /* when the daemon last read every waiting message */
    int per_key, per_address;           /* connections one id may hold; pending ones from one address */
    uint16_t pending[PENDING_BUCKETS];  /* connections yet to deliver a message, by hashed address */
    uint64_t pending_bytes[PENDING_BUCKETS]; /* what those have received, summed at each check */
    fm_log_limit_t refused, cut;
    uint64_t accepted, failed[3]; /* since the start (the exit line: what a burst of joins cost); failed
                                     handshakes: broken or timed out, refused (ZAP), protocol errors */
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

/* FNV-1a of s (an address, an id). */
static uint32_t hash_of(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

static int bucket_of(const char *host) { return (int)(hash_of(host) % PENDING_BUCKETS); }

/* The connection no longer counts as pending for its address. */
static void unpend(fm_conns_t *c, conn_t *k)
{
    if (k->bucket >= 0 && c->pending[k->bucket] > 0)
        c->pending[k->bucket]--;
    k->bucket = -1;
}

/* The peer's IP address of fd into host ("" when not TCP). */
static void peer_host(int fd, char host[INET6_ADDRSTRLEN], unsigned *port)
{
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    host[0] = 0;
    *port = 0;
    if (getpeername(fd, (struct sockaddr *)&sa, &sl) != 0)
        return;
    if (sa.ss_family == AF_INET) {
        inet_ntop(AF_INET, &((struct sockaddr_in *)&sa)->sin_addr, host, INET6_ADDRSTRLEN);
        *port = ntohs(((struct sockaddr_in *)&sa)->sin_port);
    } else if (sa.ss_family == AF_INET6) {
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&sa)->sin6_addr, host, INET6_ADDRSTRLEN);
        *port = ntohs(((struct sockaddr_in6 *)&sa)->sin6_port);
    }
}

/* fd's peer as the log names it ("HOST port P"), or the event's address
 * when fd is not TCP; host gets the bare address ("" when not TCP). */
static void peer_name(int fd, const char *addr, char host[INET6_ADDRSTRLEN], char *name, size_t cap)
{
    unsigned port;
    peer_host(fd, host, &port);
    if (host[0])
        snprintf(name, cap, "%s port %u", host, port);
    else
        snprintf(name, cap, "%.63s", addr);
}

/* Starts tracking an accepted connection (its slot grown into existence;
 * descriptors are below the file limit); false when its address already has
 * per_address connections that have not delivered a message (it is shut). */
static bool track(fm_conns_t *c, int fd, const char *addr, double now)
{
    if (fd < 0)
        return true;
    if (fd >= c->nfd) {
        int n = fd + 64;
        conn_t *g = realloc(c->by_fd, (size_t)n * sizeof *g);
        if (g)
            c->by_fd = g;
        uint32_t *h = g ? realloc(c->owner_of, (size_t)n * sizeof *h) : NULL;
        if (!h)
            return true; /* (untracked: only the checks are lost for it) */
        c->owner_of = h;
        memset(g + c->nfd, 0, (size_t)(n - c->nfd) * sizeof *g);
        memset(h + c->nfd, 0, (size_t)(n - c->nfd) * sizeof *h);
        c->nfd = n;
    }
    conn_t *k = &c->by_fd[fd];
    memset(k, 0, sizeof *k);
    k->bucket = -1;
    k->open = received(fd, &k->base, NULL);
    k->heard_at = now;
    c->owner_of[fd] = 0;
    /* the peer's address (the event names the listening endpoint) */
    char host[INET6_ADDRSTRLEN];
    peer_name(fd, addr, host, k->addr, sizeof k->addr);
    if (!k->open || !host[0])
        return true;
    int b = bucket_of(host);
    if (c->pending[b] >= c->per_address) {
        k->open = false;
        return false;
    }
    c->pending[b]++;
    k->bucket = b;
    return true;
}

fm_status fm_conns_open(fm_conns_t **out, void *ctx, void *sock, int cap, size_t max_message, double silent_s,
                        int per_key)
{
    *out = NULL;
    fm_conns_t *c = calloc(1, sizeof *c);
    if (!c)
        return FM_ERR_NOMEM;
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://fedmoe-connections-%p", sock);
    int unbounded = 0; /* an event lost would leave the count wrong for good; events are tiny and read every loop */
    int watch = ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
    if (zmq_socket_monitor(sock, ep, watch) != 0 ||
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
    c->per_key = per_key < 1 ? 1 : per_key;
    c->per_address = cap / 2 > 64 ? cap / 2 : 64;
    c->backlog = 2 * (uint64_t)max_message + (1u << 20);
    c->silent_ms = silent_s < 1.0 ? 1000u : silent_s > 3600.0 ? 3600000u : (uint32_t)(silent_s * 1000.0);
    *out = c;
    return FM_OK;
}

void *fm_conns_socket(fm_conns_t *c) { return c->events; }
int fm_conns_open_count(const fm_conns_t *c) { return c->open; }

void fm_conns_totals(const fm_conns_t *c, uint64_t *accepted, uint64_t failed[3])
{
    *accepted = c->accepted;
    memcpy(failed, c->failed, sizeof c->failed);
}

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
        c->accepted += event == ZMQ_EVENT_ACCEPTED;
        if (event & (ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                     ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)) { /* (its DISCONNECTED follows) */
            c->failed[event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL ? 0 : event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH ? 1 : 2]++;
        } else if (event == ZMQ_EVENT_DISCONNECTED) {
            c->open -= c->open > 0;
            if ((int)fd >= 0 && (int)fd < c->nfd) {
                c->by_fd[fd].open = false;
                unpend(c, &c->by_fd[fd]);
            }
        } else if (event == ZMQ_EVENT_ACCEPTED && c->open >= c->cap) {
            /* libzmq sees the peer hang up and closes it; it counts until its
             * DISCONNECTED like any other */
            /* the event names the listening endpoint: the peer's address is asked
             * of the descriptor before it is shut, only for the lines logged (a
             * flood's refusals cost no system call each) */
            if (fm_log_limit_take(&c->refused, now, REFUSALS_PER_SECOND, "refused connections")) {
                char host[INET6_ADDRSTRLEN], name[80];
                peer_name((int)fd, addr, host, name, sizeof name);
                fm_warn("connection from %s refused: %d connections open, the most --max-connections allows", name,
                        c->cap);
            }
            shutdown((int)fd, SHUT_RDWR);
            c->open++;
        } else if (event == ZMQ_EVENT_ACCEPTED) {
            c->open++;
            if (!track(c, (int)fd, addr, now)) {
                shutdown((int)fd, SHUT_RDWR);
                if (fm_log_limit_take(&c->refused, now, REFUSALS_PER_SECOND, "refused connections"))
                    fm_warn("connection from %s refused: %d connections from its address have not sent a message "
                            "yet, the most one address may hold",
                            c->by_fd[fd].addr, c->per_address);
            }
        }
    }
}

/* Shuts fd (libzmq then reads its end and closes it), saying why. */
static void cut(fm_conns_t *c, conn_t *k, int fd, double now, const char *why)
{
    shutdown(fd, SHUT_RDWR);
    k->open = false;
    unpend(c, k);
    if (fm_log_limit_take(&c->cut, now, REFUSALS_PER_SECOND, "closed connections"))
        fm_warn("connection from %s closed: %s", k->addr, why);
}

/* An owner's hash in owner_of (never 0: none). Scans for an owner's
 * connections read those (4 bytes a descriptor), not conn_t, and compare names
 * only where the hash matches. */
static uint32_t owner_hash(const char *id) { return hash_of(id) | 1u; }

/* fd's first message came from id: it is id's, and id holds at most per_key
 * connections (the one it owned longest is shut, as a reconnect replaces a
 * connection). */
static void own(fm_conns_t *c, int fd, conn_t *k, const char *id, double now)
{
    snprintf(k->owner, sizeof k->owner, "%s", id);
    k->owned_at = now;
    uint32_t h = owner_hash(k->owner);
    c->owner_of[fd] = h;
    int held = 0, oldest = -1;
    for (int i = 0; i < c->nfd; i++) {
        conn_t *o = &c->by_fd[i];
        if (c->owner_of[i] != h || !o->open || strcmp(o->owner, k->owner) != 0)
            continue;
        held++;
        if (i != fd && (oldest < 0 || o->owned_at < c->by_fd[oldest].owned_at))
            oldest = i;
    }
    if (held > c->per_key && oldest >= 0) {
        char why[160];
        snprintf(why, sizeof why, "client %s opened a connection beyond the %d it may hold: its oldest is let go",
                 k->owner, c->per_key);
        cut(c, &c->by_fd[oldest], oldest, now, why);
    }
}

void fm_conns_cut_owner(fm_conns_t *c, const char *id, double now, const char *why)
{
    uint32_t h = owner_hash(id);
    for (int i = 0; i < c->nfd; i++) {
        conn_t *o = &c->by_fd[i];
        if (c->owner_of[i] == h && o->open && strncmp(o->owner, id, sizeof o->owner - 1) == 0)
            cut(c, o, i, now, why);
    }
}

void fm_conns_heard(fm_conns_t *c, int fd, const char *id, double now)
{
    if (fd < 0 || fd >= c->nfd || !c->by_fd[fd].open)
        return;
    conn_t *k = &c->by_fd[fd];
    k->heard = true;
    k->heard_at = now;
    unpend(c, k);
    if (id && strncmp(k->owner, id, sizeof k->owner - 1) != 0)
        own(c, fd, k, id, now);
}

/* What one address's connections that have delivered nothing hold together
 * is bounded like one key's connections: per_key backlogs. When its sum (this
 * check's, pending_bytes) is past that, a connection holding more than its
 * share (the bound over the address's connections yet to speak) is shut, and
 * its bytes leave the sum: the connections holding the bytes go, not one in the
 * middle of its handshake. */
static bool address_over(fm_conns_t *c, const conn_t *k)
{
    uint64_t bound = (uint64_t)c->per_key * c->backlog;
    if (k->bucket < 0 || k->got <= k->base || c->pending_bytes[k->bucket] <= bound)
        return false;
    uint64_t mine = k->got - k->base, share = bound / (c->pending[k->bucket] ? c->pending[k->bucket] : 1);
    if (mine <= share)
        return false;
    c->pending_bytes[k->bucket] -= mine;
    return true;
}

void fm_conns_check(fm_conns_t *c, double now, bool caught_up)
{
    /* deadlines count while every waiting message is being read: caught up
     * now, or behind for over 2 s (a flood; the ROUTER socket takes turns
     * between connections, so each one's messages were reached meanwhile) */
    if (caught_up || c->caught_up_at == 0.0)
        c->caught_up_at = now;
    caught_up = caught_up || now - c->caught_up_at > 2.0;
    double every = c->open / CHECKS_PER_S > CHECK_EVERY_S ? c->open / CHECKS_PER_S : CHECK_EVERY_S;
    if (now - c->last_check < every)
        return;
    c->last_check = now;
    /* first what each connection has received, and each address's sum over
     * its connections yet to speak */
    memset(c->pending_bytes, 0, sizeof c->pending_bytes);
    for (int fd = 0; fd < c->nfd; fd++) {
        conn_t *k = &c->by_fd[fd];
        k->measured = k->open && received(fd, &k->got, &k->idle);
        if (k->measured && !k->heard && k->bucket >= 0 && k->got > k->base)
            c->pending_bytes[k->bucket] += k->got - k->base;
    }
    for (int fd = 0; fd < c->nfd; fd++) {
        conn_t *k = &c->by_fd[fd];
        uint64_t got = k->got;
        uint32_t idle = k->idle;
        int unread = 0;
        if (!k->open || !k->measured)
            continue;
        double quiet = now - k->heard_at;
        if (k->heard) { /* (everything received so far may have been its messages) */
            k->heard = false;
            k->base = got;
        } else if (caught_up && !k->owner[0] && quiet > FIRST_MESSAGE_S) {
            /* (caught up: every message that had arrived was read, so none of its waits) */
            char why[160];
            snprintf(why, sizeof why, "no complete message %.1f s after connecting (the most is %.0f s)", quiet,
                     FIRST_MESSAGE_S);
            cut(c, k, fd, now, why);
        } else if (caught_up && got > k->base && quiet * 1000.0 > c->silent_ms && idle <= c->silent_ms / 2 &&
                   (double)(got - k->base) < DRIP_BYTES_PER_S * quiet) {
            /* (still sending: a drip, its last byte within half the allowed
             * silence; one whose last byte is older than that is on its way to
             * being silent, and said so below, even if a keepalive or a part
             * of a message came after its last message: a peer cut off in the
             * middle of a message has both its quiet and its idle time near
             * the limit at once) */
            char why[200];
            snprintf(why, sizeof why, "%llu bytes in %.1f s without a complete message (a message must arrive "
                     "within %.1f s, or at %.0f KiB/s at least)",
                     (unsigned long long)(got - k->base), quiet, c->silent_ms / 1000.0, DRIP_BYTES_PER_S / 1024);
            cut(c, k, fd, now, why);
        } else if (got > k->base && got - k->base > c->backlog) {
            char why[160];
            snprintf(why, sizeof why, "%llu bytes received without a complete message (an unfinished multipart "
                     "message?), more than the %llu allowed",
                     (unsigned long long)(got - k->base), (unsigned long long)c->backlog);
            cut(c, k, fd, now, why);
        } else if (address_over(c, k)) {
            char why[200];
            snprintf(why, sizeof why, "its address's connections that have not completed a message hold more than "
                     "%llu bytes together (unfinished multipart messages?)",
                     (unsigned long long)c->per_key * c->backlog);
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
    free(c->owner_of);
    free(c);
    *cp = NULL;
}
