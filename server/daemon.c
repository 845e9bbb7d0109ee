/* The coordinator daemon: one ROUTER socket, one zmq_poll loop that feeds the
 * coordinator object messages and clock ticks. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <zmq.h>

#include "coordinator.h"
#include "fedmoe/clock.h"
#include "fedmoe/log.h"
#include "fedmoe/wire.h"

#define POLL_S 0.2

/* user points to the socket (bound after the coordinator said how large a
 * message may be). */
static fm_status send_zmq(void *user, const char *id, const uint8_t *data, size_t len)
{
    void *sock = *(void **)user;
    return sock ? fm_wire_send_bytes(sock, id, data, len) : FM_ERR_STATE;
}

/* Reads every waiting message (identity frame + one payload frame). */
static void drain(fm_coordinator_t *c, void *sock)
{
    for (;;) {
        zmq_msg_t idm, msg;
        zmq_msg_init(&idm);
        if (zmq_msg_recv(&idm, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&idm);
            return;
        }
        char id[64] = "";
        size_t idn = zmq_msg_size(&idm);
        bool id_ok = fm_wire_valid_id(zmq_msg_data(&idm), idn);
        if (id_ok)
            memcpy(id, zmq_msg_data(&idm), idn);
        zmq_msg_init(&msg);
        bool have = zmq_msg_more(&idm) && zmq_msg_recv(&msg, sock, ZMQ_DONTWAIT) >= 0;
        bool extra = have && zmq_msg_more(&msg);
        while (have && zmq_msg_more(&msg)) { /* drop surplus frames */
            zmq_msg_close(&msg);
            zmq_msg_init(&msg);
            if (zmq_msg_recv(&msg, sock, ZMQ_DONTWAIT) < 0)
                break;
        }
        if (!id_ok)
            fm_warn("dropped a message from a peer without a valid client id (set ZMQ_ROUTING_ID to [A-Za-z0-9._-]{1,63})");
        else if (!have)
            fm_warn("client %s: empty message", id);
        else if (extra)
            fm_wire_send_error(sock, id, FM_WIRE_MALFORMED, "a message is one frame");
        else
            fm_coordinator_handle(c, id, zmq_msg_data(&msg), zmq_msg_size(&msg), fm_clock_seconds());
        zmq_msg_close(&msg);
        zmq_msg_close(&idm);
    }
}

static void *open_socket(void *ctx, const fm_server_config_t *cfg, size_t max_message)
{
    void *sock = zmq_socket(ctx, ZMQ_ROUTER);
    if (!sock) {
        fm_error_set("cannot create a ZeroMQ socket: %s", zmq_strerror(zmq_errno()));
        return NULL;
    }
    int64_t maxsz = (int64_t)max_message;
    int one = 1, linger = 2000;
    zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &maxsz, sizeof maxsz);
    zmq_setsockopt(sock, ZMQ_ROUTER_HANDOVER, &one, sizeof one);
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    fm_wire_tune_socket(sock);
    if (zmq_bind(sock, cfg->bind) != 0) {
        fm_error_set("cannot bind %s: %s", cfg->bind, zmq_strerror(zmq_errno()));
        zmq_close(sock);
        return NULL;
    }
    return sock;
}

fm_status fm_coordinator_run(const fm_server_config_t *cfg, volatile sig_atomic_t *stop)
{
    void *ctx = zmq_ctx_new(), *sock = NULL;
    fm_coordinator_t *c = NULL;
    fm_status st = fm_coordinator_new(&c, cfg, send_zmq, &sock);
    if (st != FM_OK)
        goto out;
    if (!ctx || !(sock = open_socket(ctx, cfg, fm_coordinator_max_message(c)))) {
        st = FM_ERR_IO;
        goto out;
    }
    fm_info("listening on %s (database %s, messages up to %zu bytes)", cfg->bind, cfg->db,
            fm_coordinator_max_message(c));
    while (!*stop && !fm_coordinator_finished(c)) {
        if ((st = fm_coordinator_tick(c, fm_clock_seconds())) != FM_OK || fm_coordinator_finished(c))
            break;
        zmq_pollitem_t item = {sock, 0, ZMQ_POLLIN, 0};
        long timeout = (long)(fm_coordinator_wait(c, fm_clock_seconds(), POLL_S) * 1000.0 + 1);
        if (zmq_poll(&item, 1, timeout) < 0 && zmq_errno() != EINTR) {
            fm_error_set("poll: %s", zmq_strerror(zmq_errno()));
            st = FM_ERR_IO;
            goto out;
        }
        if (item.revents & ZMQ_POLLIN)
            drain(c, sock);
    }
    if (st == FM_OK && !fm_coordinator_finished(c))
        st = fm_coordinator_stop(c);
out:
    fm_coordinator_destroy(&c);
    if (sock)
        zmq_close(sock);
    if (ctx)
        zmq_ctx_term(ctx);
    return st;
}
