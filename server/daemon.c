/* The coordinator daemon: one ROUTER socket (CURVE unless insecure), the ZAP
 * handler that admits peers by key, and one zmq_poll loop that feeds the
 * coordinator object messages and clock ticks. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <zmq.h>

#include "coordinator.h"
#include "connections.h"
#include "routes.h"
#include "zap.h"
#include "fedmoe/clock.h"
#include "fedmoe/keys.h"
#include "fedmoe/log.h"
#include "fedmoe/wire.h"

#define POLL_S 0.05 /* also how often connections are checked (connections.h) */
#define DROPS_PER_SECOND 20
/* a connection that sends nothing for two client timeouts, and at least 10 s
 * (a client repeats its Hello every 3 s until it is welcomed), is closed
 * (connections.h) */
#define SILENT_TIMEOUTS 2.0
#define SILENT_MIN_S 10.0
/* connections one client id (one key) may hold at once (connections.h) */
#define CONNECTIONS_PER_KEY 4
/* what one pass of the loop reads at most before rounds and timers are decided
 * again: no stream of messages can postpone a decision (ROUTER sockets take
 * turns between connections, and an id holds at most CONNECTIONS_PER_KEY) */
#define DRAIN_MESSAGES 256
#define DRAIN_BYTES (64u << 20)

static fm_log_limit_t drops; /* messages dropped unread: at most DROPS_PER_SECOND logged */

/* What the send callback needs: the socket (bound after the coordinator said
 * how large a message may be) and, with CURVE, the routes from ids to
 * connections (NULL when insecure: the routing id is the client id). */
typedef struct {
    void *sock;
    fm_routes_t *routes;
    fm_conns_t *conns;
} daemon_t;

static fm_status send_zmq(void *user, const char *id, const fm_frame_t *f, int n)
{
    daemon_t *d = user;
    if (!d->sock)
        return FM_ERR_STATE;
    size_t rlen = strlen(id);
    const void *rid = d->routes ? (const void *)fm_routes_get(d->routes, id, &rlen) : (const void *)id;
    if (!rid) {
        fm_error_set("no connection of %s", id);
        return FM_ERR_STATE;
    }
    if (fm_wire_send_frames(d->sock, rid, rlen, f, n) != FM_OK) {
        fm_error_set("send to %s: %s", id, zmq_strerror(zmq_errno()));
        return FM_ERR_IO;
    }
    return FM_OK;
}

/* With CURVE: the id of the key a message came with (its ZAP User-Id) into id,
 * if that key still belongs to that id in the allow-list (not removed or
 * replaced since); false for a message to drop. The routing id plays no part:
 * a peer cannot speak as another id by choosing one. */
static bool key_id(const fm_zap_t *zap, zmq_msg_t *msg, char id[64])
{
    const char *user = zmq_msg_gets(msg, "User-Id");
    if (!user || !fm_id_valid(user, strlen(user)))
        return false; /* (the handler names every admitted connection) */
    snprintf(id, 64, "%s", user);
    if (fm_zap_allows(zap, id, zmq_msg_gets(msg, "X-Key")))
        return true;
    if (fm_log_limit_take(&drops, fm_clock_seconds(), DROPS_PER_SECOND, "dropped messages"))
        fm_warn("dropped a message from %s: its key was removed from the allow-list or replaced", id);
    return false;
}

/* Receives one message: the routing frame into idm, the payload into msg
 * (surplus frames dropped, *extra set). Returns false when nothing waits. */
static bool receive(void *sock, zmq_msg_t *idm, zmq_msg_t *msg, bool *have, bool *extra)
{
    zmq_msg_init(idm);
    zmq_msg_init(msg);
    if (zmq_msg_recv(idm, sock, ZMQ_DONTWAIT) < 0)
        return false;
    *have = zmq_msg_more(idm) && zmq_msg_recv(msg, sock, ZMQ_DONTWAIT) >= 0;
    *extra = *have && zmq_msg_more(msg);
    while (*have && zmq_msg_more(msg)) {
        zmq_msg_close(msg);
        zmq_msg_init(msg);
        if (zmq_msg_recv(msg, sock, ZMQ_DONTWAIT) < 0)
            break;
    }
    return true;
}

/* A message of id's could not be read: past its allowance its key is held
 * (zap.h) and every connection of it closed, so that a stream of costly
 * messages costs the coordinator a few of them a minute, not the decryption
 * and refusal of all it can send. Without CURVE there is no key to hold. */
static void unreadable(daemon_t *d, fm_zap_t *zap, const char *id, double now)
{
    if (!zap || !fm_zap_unreadable(zap, id, now))
        return;
    char why[200];
    snprintf(why, sizeof why, "client %s sent more messages that could not be read than it may: its key is "
             "held for %.0f s", id, FM_ZAP_HOLD_S);
    fm_warn("%s (its connections closed, its handshakes put off)", why);
    fm_conns_cut_owner(d->conns, id, now, why);
}

/* Reads the waiting messages, DRAIN_MESSAGES or DRAIN_BYTES at most, and hands
 * each to the coordinator under its client id: the key's id with CURVE, the
 * routing id when insecure. True when it read every one that was waiting. */
static bool drain(fm_coordinator_t *c, daemon_t *d, fm_zap_t *zap)
{
    zmq_msg_t idm, msg;
    bool have, extra;
    int count = 0;
    size_t bytes = 0;
    for (;;) {
        if (count >= DRAIN_MESSAGES || bytes >= DRAIN_BYTES)
            return false;
        if (!receive(d->sock, &idm, &msg, &have, &extra))
            break;
        count++;
        bytes += have ? zmq_msg_size(&msg) : 0;
        char id[64] = "";
        size_t idn = zmq_msg_size(&idm);
        bool ok = have;
        if (ok && zap) {
            ok = key_id(zap, &msg, id) && fm_routes_set(d->routes, id, zmq_msg_data(&idm), idn) == FM_OK;
        } else if (ok && (ok = fm_id_valid(zmq_msg_data(&idm), idn))) {
            memcpy(id, zmq_msg_data(&idm), idn);
        } else if (have && fm_log_limit_take(&drops, fm_clock_seconds(), DROPS_PER_SECOND, "dropped messages")) {
            fm_warn("dropped a message from a peer without a valid client id (set ZMQ_ROUTING_ID to "
                    "[A-Za-z0-9._-]{1,63})");
        }
        double now = fm_clock_seconds();
        if (have)
            fm_conns_heard(d->conns, zmq_msg_get(&msg, ZMQ_SRCFD), ok ? id : NULL, now);
        if (ok && zap && fm_zap_held(zap, id, now)) {
            /* dropped unread, and its connection closed: what it sent before
             * the hold closed its connections, or on a connection that had
             * not spoken yet then (heard above: its own now) */
            fm_conns_cut_owner(d->conns, id, now, "its key is held: it sent messages that could not be read");
        } else if (ok && extra) {
            uint8_t *buf;
            size_t len;
            if (fm_wire_encode_error(FM_WIRE_MALFORMED, "a message is one frame", &buf, &len) == FM_OK) {
                fm_frame_t f = {buf, len, NULL};
                send_zmq(d, id, &f, 1);
                free(buf);
            }
            unreadable(d, zap, id, now);
        } else if (ok && fm_coordinator_handle(c, id, zmq_msg_data(&msg), zmq_msg_size(&msg), now) == FM_ERR_FORMAT) {
            unreadable(d, zap, id, now);
        }
        zmq_msg_close(&msg);
        zmq_msg_close(&idm);
    }
    zmq_msg_close(&msg);
    zmq_msg_close(&idm);
    return true;
}

/* The ROUTER socket, bound. No ZMQ_ROUTER_HANDOVER: handover with ZMTP
 * heartbeats can abort libzmq 4.3.4 (stream_engine_base.cpp:331) when a
 * taken-over connection is reset. (With CURVE, routing ids name nobody: see
 * routes.h.) */
static void *open_socket(void *ctx, const fm_server_config_t *cfg, const fm_key_t *own, size_t max_message,
                         int max_conns)
{
    void *sock = zmq_socket(ctx, ZMQ_ROUTER);
    if (!sock) {
        fm_error_set("cannot create a ZeroMQ socket: %s", zmq_strerror(zmq_errno()));
        return NULL;
    }
    int64_t maxsz = (int64_t)max_message;
    int linger = 2000;
    zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &maxsz, sizeof maxsz);
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    fm_wire_tune_socket(sock);
    /* no ZMTP heartbeats: dead connections are found by their silence
     * (connections.h), without libzmq's per-connection timers */
    int off = 0;
    zmq_setsockopt(sock, ZMQ_HEARTBEAT_IVL, &off, sizeof off);
    /* a listen queue for every connection at once (the kernel caps it at
     * net.core.somaxconn): with libzmq's 100, thousands of clients starting
     * together overflowed it, and the dropped handshakes came back as a storm
     * of retries (10,000 virtual clients took over 6 minutes to join) */
    int backlog = max_conns > 100 ? max_conns : 100;
    zmq_setsockopt(sock, ZMQ_BACKLOG, &backlog, sizeof backlog);
    if (!cfg->insecure && fm_key_apply_server(sock, own) != FM_OK) {
        zmq_close(sock);
        return NULL;
    }
    if (zmq_bind(sock, cfg->bind) != 0) {
        fm_error_set("cannot bind %s: %s", cfg->bind, zmq_strerror(zmq_errno()));
        zmq_close(sock);
        return NULL;
    }
    return sock;
}

/* Raises the open-file limit to its hard maximum (each client connection holds
 * a file descriptor) and warns when it is below what the run's clients need;
 * returns the connections the coordinator will hold at once (--max-connections,
 * kept 64 below the limit), or -1 (FM_ERR_ARG's reason set) when that is fewer
 * than a round's quorum: no round could ever start, so the run does not wait. */
static int raise_fd_limit(const fm_server_config_t *cfg)
{
    int cap = cfg->max_connections ? cfg->max_connections : 2 * cfg->spec.partition_count + 64;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        rl.rlim_cur = rl.rlim_max = RLIM_INFINITY; /* (unknown: only --max-connections bounds it) */
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    rlim_t need = (rlim_t)cfg->spec.partition_count + 64;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need)
        fm_warn("only %llu file descriptors (ulimit -n): fewer than the %d clients of this run can connect; raise "
                "the hard limit",
                (unsigned long long)rl.rlim_cur, cfg->spec.partition_count);
    bool by_limit = false;
    if (rl.rlim_cur != RLIM_INFINITY && (rlim_t)cap + 64 > rl.rlim_cur) {
        cap = rl.rlim_cur > 128 ? (int)(rl.rlim_cur - 64) : 64;
        by_limit = true;
    }
    if (cap < cfg->min_clients) {
        if (by_limit)
            fm_error_set("a round needs %d clients (--min-clients) but only %d connections can be held: %llu file "
                         "descriptors (ulimit -n), 64 kept for the coordinator; raise the hard limit or lower "
                         "--min-clients",
                         cfg->min_clients, cap, (unsigned long long)rl.rlim_cur);
        else
            fm_error_set("a round needs %d clients (--min-clients) but --max-connections %d holds fewer",
                         cfg->min_clients, cap);
        return -1;
    }
    return cap;
}

/* The coordinator's key pair and its ZAP handler with the allow-list, read and
 * checked before anything else is opened; nothing when insecure. */
static fm_status start_security(const fm_server_config_t *cfg, void *ctx, fm_key_t *own, fm_zap_t **zap)
{
    *zap = NULL;
    memset(own, 0, sizeof *own);
    if (cfg->insecure)
        return FM_OK;
    if (!cfg->key[0] || !cfg->allow[0]) {
        fm_error_set("no keys: give --key FILE (the coordinator's key pair) and --allow DIR (client public "
                     "keys), made with fedmoe-keygen, or --insecure on a trusted network");
        return FM_ERR_ARG;
    }
    fm_status st = fm_key_read(cfg->key, true, own);
    if (st == FM_OK)
        st = fm_zap_open(zap, ctx, cfg->allow);
    return st == FM_ERR_FORMAT || st == FM_ERR_IO ? FM_ERR_ARG : st;
}

fm_status fm_coordinator_run(const fm_server_config_t *cfg, volatile sig_atomic_t *stop,
                             volatile sig_atomic_t *reload)
{
    void *ctx = zmq_ctx_new();
    daemon_t d = {NULL, NULL, NULL};
    fm_coordinator_t *c = NULL;
    fm_zap_t *zap = NULL;
    fm_key_t own;
    int max_conns = raise_fd_limit(cfg);
    fm_status st = max_conns < 0 ? FM_ERR_ARG : ctx ? start_security(cfg, ctx, &own, &zap) : FM_ERR_IO;
    if (st == FM_OK && zap)
        st = fm_routes_new(&d.routes);
    if (st != FM_OK || (st = fm_coordinator_new(&c, cfg, send_zmq, &d)) != FM_OK)
        goto out;
    if (cfg->insecure)
        fm_warn("INSECURE: --insecure given: no encryption and no authentication; anyone who reaches %s can "
                "join, read and change the model",
                cfg->bind);
    if (!(d.sock = open_socket(ctx, cfg, &own, fm_coordinator_max_message(c), max_conns)) ||
        fm_conns_open(&d.conns, ctx, d.sock, max_conns, fm_coordinator_max_message(c),
                      fmax(SILENT_TIMEOUTS * cfg->client_timeout, SILENT_MIN_S), CONNECTIONS_PER_KEY) != FM_OK) {
        st = FM_ERR_IO;
        goto out;
    }
    fm_info("listening on %s (%s, database %s, messages up to %zu bytes)", cfg->bind,
            zap ? "CURVE, keys checked" : "INSECURE", cfg->db, fm_coordinator_max_message(c));
    while (!*stop && !fm_coordinator_finished(c)) {
        if ((st = fm_coordinator_tick(c, fm_clock_seconds())) != FM_OK || fm_coordinator_finished(c))
            break;
        if (*reload) {
            *reload = 0;
            if (zap)
                fm_zap_reload(zap);
        }
        zmq_pollitem_t items[3] = {{d.sock, 0, ZMQ_POLLIN, 0},
                                   {fm_conns_socket(d.conns), 0, ZMQ_POLLIN, 0},
                                   {zap ? fm_zap_socket(zap) : NULL, 0, ZMQ_POLLIN, 0}};
        long timeout = (long)(fm_coordinator_wait(c, fm_clock_seconds(), POLL_S) * 1000.0 + 1);
        if (zmq_poll(items, zap ? 3 : 2, timeout) < 0 && zmq_errno() != EINTR) {
            fm_error_set("poll: %s", zmq_strerror(zmq_errno()));
            st = FM_ERR_IO;
            goto out;
        }
        if (items[1].revents & ZMQ_POLLIN)
            fm_conns_handle(d.conns, fm_clock_seconds());
        if (zap && (items[2].revents & ZMQ_POLLIN))
            fm_zap_handle(zap);
        bool caught_up = true;
        if (items[0].revents & ZMQ_POLLIN)
            caught_up = drain(c, &d, zap);
        fm_conns_check(d.conns, fm_clock_seconds(), caught_up); /* after drain: what it read counts as heard */
    }
    if (st == FM_OK && !fm_coordinator_finished(c))
        st = fm_coordinator_stop(c);
    struct rusage ru;
    uint64_t accepted, failed[3];
    fm_conns_totals(d.conns, &accepted, failed);
    if (getrusage(RUSAGE_SELF, &ru) == 0) /* (tests and benchmarks read it) */
        fm_info("peak memory %ld KB (maximum resident set), %d connections at the end; %llu accepted since the "
                "start, %llu handshakes failed (%llu broken or timed out, %llu refused, %llu protocol errors); "
                "CPU %.2f s (user and system)",
                ru.ru_maxrss, fm_conns_open_count(d.conns), (unsigned long long)accepted,
                (unsigned long long)(failed[0] + failed[1] + failed[2]), (unsigned long long)failed[0],
                (unsigned long long)failed[1], (unsigned long long)failed[2],
                (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
                    ru.ru_stime.tv_usec / 1e6);
out:
    fm_conns_close(&d.conns); /* before its socket */
    fm_coordinator_destroy(&c);
    if (d.sock)
        zmq_close(d.sock);
    fm_routes_free(&d.routes);
    fm_zap_close(&zap);
    if (ctx)
        zmq_ctx_term(ctx);
    return st;
}
