#include "link.h"

#include <string.h>
#include <zmq.h>

#include "fedmoe/clock.h"
#include "fedmoe/keys.h"
#include "fedmoe/log.h"
#include "fedmoe/wire.h"

/* Watches sock's CURVE handshakes (s->mon). */
static fm_status watch_handshakes(fm_link_t *s, const char *id)
{
    char ep[128];
    snprintf(ep, sizeof ep, "inproc://fedmoe-client-handshakes-%s", id);
    if (zmq_socket_monitor(s->sock, ep,
                           ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) != 0 ||
        !(s->mon = zmq_socket(s->ctx, ZMQ_PAIR)) || zmq_connect(s->mon, ep) != 0) {
        fm_error_set("cannot watch the handshake: %s", zmq_strerror(zmq_errno()));
        return FM_ERR_IO;
    }
    return FM_OK;
}

/* The reason a refusal of our key gives (for the last error). */
static void refused_reason(const fm_link_t *s)
{
    fm_error_set("the coordinator at %s refused this client's key (%s): it is not in the coordinator's allow-list, "
                 "or was removed from it",
                 s->cfg->connect, s->cfg->key);
}

fm_status fm_link_check(fm_link_t *s, double now)
{
    uint8_t ev[6];
    char addr[256];
    while (s->mon && zmq_recv(s->mon, ev, sizeof ev, ZMQ_DONTWAIT) == 6) {
        zmq_recv(s->mon, addr, sizeof addr, 0);
        uint16_t e;
        uint32_t value;
        memcpy(&e, ev, 2);
        memcpy(&value, ev + 2, 4);
        if (e == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
            s->refused_since = 0.0;
            s->unproven = false;
            continue;
        }
        /* a refusal is not authenticated (anyone answering on the address can
         * send one): the end only once refusals have gone on for a while */
        if (e == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH && value == 400) {
            if (s->refused_since == 0.0) {
                s->refused_since = now;
                refused_reason(s);
                fm_warn("%s; retrying for %.0f s", fm_error_last(), FM_LINK_REFUSED_GIVE_UP_S);
            } else if (now - s->refused_since >= FM_LINK_REFUSED_GIVE_UP_S) {
                refused_reason(s);
                return FM_ERR_ARG;
            }
            continue;
        }
        if (!s->unproven)
            fm_warn("handshake with %s failed: the coordinator did not prove the key in %s (another coordinator, "
                    "or one without CURVE); retrying",
                    s->cfg->connect, s->cfg->server_key);
        s->unproven = true;
    }
    return FM_OK;
}

/* CURVE with the client's key pair, talking only to the coordinator's key;
 * plain text only when asked for, with a warning. */
static fm_status secure_socket(void *sock, const fm_session_config_t *cfg, const char *id, const char *key_path)
{
    if (cfg->insecure) {
        fm_warn("INSECURE: --insecure given: no encryption; the coordinator is not authenticated");
        return FM_OK;
    }
    if (!key_path[0] || !cfg->server_key[0]) {
        fm_error_set("no keys: give --key FILE (this client's key pair) and --server-key FILE (the "
                     "coordinator's public key), made with fedmoe-keygen, or --insecure on a trusted network");
        return FM_ERR_ARG;
    }
    fm_key_t own, server;
    fm_status st = fm_key_read(key_path, true, &own);
    if (st == FM_OK && strcmp(own.id, id) != 0) {
        fm_error_set("client id %s, but the key %s belongs to %s", id, key_path, own.id);
        st = FM_ERR_ARG;
    }
    if (st == FM_OK)
        st = fm_key_read(cfg->server_key, false, &server);
    if (st == FM_OK)
        st = fm_key_apply_client(sock, &own, server.public_z85);
    return st == FM_ERR_FORMAT || st == FM_ERR_IO ? FM_ERR_ARG : st;
}

fm_status fm_link_open(fm_link_t *l, const fm_session_config_t *cfg, const char *id, const char *key_path,
                       void *shared_ctx)
{
    memset(l, 0, sizeof *l);
    l->cfg = cfg;
    /* the clients of a virtual host share its context (one I/O thread) */
    l->ctx = shared_ctx ? shared_ctx : zmq_ctx_new();
    l->own_ctx = !shared_ctx;
    l->sock = l->ctx ? zmq_socket(l->ctx, ZMQ_DEALER) : NULL;
    if (!l->sock) {
        fm_error_set("cannot create a ZeroMQ socket: %s", zmq_strerror(zmq_errno()));
        return FM_ERR_IO;
    }
    /* with CURVE the coordinator knows us by our key; the routing id is libzmq's
     * own (a fresh one per connection). Plain, the routing id is the client id. */
    if (cfg->insecure)
        zmq_setsockopt(l->sock, ZMQ_ROUTING_ID, id, strlen(id));
    int linger = 2000;
    zmq_setsockopt(l->sock, ZMQ_LINGER, &linger, sizeof linger);
    fm_wire_tune_socket(l->sock);
    if (shared_ctx) {
        /* no ZMTP heartbeats: thousands of connections share the I/O thread, and
         * libzmq 4.3.4 cancels each heartbeat's timer by a linear search of all
         * of them; the session's own heartbeats show it alive */
        int off = 0;
        zmq_setsockopt(l->sock, ZMQ_HEARTBEAT_IVL, &off, sizeof off);
    }
    fm_status st = secure_socket(l->sock, cfg, id, key_path);
    if (st == FM_OK && !cfg->insecure && !shared_ctx) /* (a virtual host: two sockets less a client) */
        st = watch_handshakes(l, id);
    if (st != FM_OK)
        return st;
    if (zmq_connect(l->sock, cfg->connect) != 0) {
        fm_error_set("cannot connect to %s: %s", cfg->connect, zmq_strerror(zmq_errno()));
        return FM_ERR_ARG;
    }
    return FM_OK;
}

const char *fm_link_why_silent(const fm_link_t *l)
{
    return l->refused_since > 0.0 ? ": the coordinator refused this client's key"
           : l->unproven          ? ": the coordinator did not prove the key in --server-key"
                                  : "";
}

fm_status fm_link_send(fm_link_t *l, const uint8_t *msg, size_t len)
{
    return fm_wire_send_bytes(l->sock, NULL, msg, len);
}

void fm_link_close(fm_link_t *l)
{
    if (l->mon)
        zmq_close(l->mon);
    if (l->sock)
        zmq_close(l->sock);
    if (l->ctx && l->own_ctx)
        zmq_ctx_term(l->ctx);
    memset(l, 0, sizeof *l);
}
