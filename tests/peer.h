/* peer.h - a hand-driven ZeroMQ peer for attack tests: a DEALER whose
 * handshake events are watched, a Hello and its answer, a free loopback
 * endpoint. */
#ifndef FEDMOE_TEST_PEER_H
#define FEDMOE_TEST_PEER_H

typedef struct {
    void *ctx, *sock, *mon;
} peer_t;

/* A DEALER with routing id `id`, its handshake events (and `more`) watched on
 * inproc monitor n (unique within a test). */
peer_t peer_watching(const char *id, int n, int more);
/* The same, watching only the handshake. */
peer_t peer_new(const char *id, int n);
void peer_free(peer_t *p);
/* The first watched event within seconds (0 when none); its value in *value. */
int peer_event(peer_t *p, double seconds, int *value);
/* Sends a Hello as id; returns the kind of the coordinator's first answer
 * within seconds (Welcome, or Error when it was heard and refused), 0 when it
 * did not answer. */
int peer_hello(void *sock, const char *id, double seconds);
/* "tcp://127.0.0.1:PORT" with a port the kernel says is free, into buf (64 bytes). */
const char *peer_endpoint(char *buf);

#endif
