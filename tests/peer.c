#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <zmq.h>

#include "peer.h"
#include "procs.h"

/* A DEALER with routing id `id`, its handshake events (and `more`) watched. */
peer_t peer_watching(const char *id, int n, int more)
{
    peer_t p = {.ctx = zmq_ctx_new()};
    p.sock = zmq_socket(p.ctx, ZMQ_DEALER);
    zmq_setsockopt(p.sock, ZMQ_ROUTING_ID, id, strlen(id));
    int linger = 0;
    zmq_setsockopt(p.sock, ZMQ_LINGER, &linger, sizeof linger);
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://mon-%d", n);
    assert_int_equal(zmq_socket_monitor(p.sock, ep,
                                        ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                                            ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                            ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | more),
                     0);
    p.mon = zmq_socket(p.ctx, ZMQ_PAIR);
    assert_int_equal(zmq_connect(p.mon, ep), 0);
    return p;
}

peer_t peer_new(const char *id, int n) { return peer_watching(id, n, 0); }

void peer_free(peer_t *p)
{
    zmq_close(p->mon);
    zmq_close(p->sock);
    zmq_ctx_term(p->ctx);
}

/* The first handshake event within seconds (0 when none); its value in *value. */
int peer_event(peer_t *p, double seconds, int *value)
{
    zmq_pollitem_t it = {p->mon, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, (long)(seconds * 1000)) <= 0)
        return 0;
    uint8_t ev[6];
    char addr[256];
    int n = zmq_recv(p->mon, ev, sizeof ev, 0);
    zmq_recv(p->mon, addr, sizeof addr, 0);
    assert_int_equal(n, 6);
    uint16_t e;
    uint32_t v;
    memcpy(&e, ev, 2);
    memcpy(&v, ev + 2, 4);
    *value = (int)v;
    return e;
}

/* Sends a Hello as id; returns the kind of the coordinator's first answer
 * within seconds (Welcome, or Error when it was heard and refused), 0 when it
 * did not answer. */
int peer_hello(void *sock, const char *id, double seconds)
{
    Fedmoe__Envelope env;
    Fedmoe__Hello h;
    procs_hello(&env, &h, id, -1, 0);
    int ms = 1000; /* a DEALER with no connection would wait to send for ever */
    zmq_setsockopt(sock, ZMQ_SNDTIMEO, &ms, sizeof ms);
    if (procs_send_env(sock, &env) != 0)
        return 0;
    Fedmoe__Envelope *e = procs_recv_kind(sock, 0, seconds, NULL, NULL);
    int kind = e ? (int)e->body_case : 0;
    if (e)
        fm_wire_free(e);
    return kind;
}

const char *peer_endpoint(char *buf)
{
    snprintf(buf, 64, "tcp://127.0.0.1:%d", procs_free_port());
    return buf;
}

