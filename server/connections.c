#include "connections.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <zmq.h>

#include "fedmoe/log.h"

#define REFUSALS_PER_SECOND 20

struct fm_conns {
    void *watched, *events;
    int cap, open;
    fm_log_limit_t refused;
};

fm_status fm_conns_open(fm_conns_t **out, void *ctx, void *sock, int cap)
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
    free(c);
    *cp = NULL;
}
