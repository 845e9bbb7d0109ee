/* connections.h - a cap on the connections the coordinator's socket holds.
 *
 * libzmq has no limit of its own on a ROUTER's connections, and each holds a
 * file descriptor (and, with CURVE, a handshake's work). The counter watches the
 * socket's monitor events: every accepted connection counts until libzmq reports
 * it gone; one accepted beyond the cap is shut down at once (shutdown(2) on its
 * descriptor, which libzmq then closes as a peer that hung up). Connections
 * that never finish their handshake are closed by libzmq after
 * FM_WIRE_HANDSHAKE_MS, so a flood holds at most `cap` descriptors, for at most
 * that long each.
 *
 * It also bounds what one connection can make libzmq hold unseen. libzmq
 * delivers a multipart message only when its last frame arrives, and its
 * queues count whole messages: a peer that sends frames of one message and
 * never the last grows the coordinator without bound (ZMQ_MAXMSGSIZE bounds
 * each frame). So every CHECK_EVERY_S (50 ms; with more than 250 connections
 * every connections / 5,000 s, so that the check costs at most 5,000 system
 * calls a second: 2 s at 10,000 clients) the counter asks the kernel how many bytes
 * each TCP connection has received (TCP_INFO) and shuts a connection that has
 * received more than twice the largest message plus 1 MiB since a message of
 * its was last delivered (fm_conns_heard, from the message's ZMQ_SRCFD). An
 * honest client completes a message every few seconds (its heartbeat).
 *
 * The same check closes a connection from which the kernel has received
 * nothing at all for `silent_s` while nothing of its waits unread: a peer whose
 * machine or network died without closing, or that is stopped. This is what
 * tells the coordinator a connection is dead; it sends no ZMTP heartbeats of
 * its own (libzmq 4.3.4 cancels each heartbeat's timer by a linear search of
 * all of them: with thousands of connections, a third of the coordinator's
 * CPU), and TCP alone would keep a silently dead peer's descriptor for hours.
 *
 * And it bounds what one party holds, whatever it opens:
 * - per id: a connection belongs to the id of its first message (with CURVE,
 *   its key's); an id holds at most `per_key` connections, and one more shuts
 *   the one it has owned longest (as a reconnect replaces a connection);
 * - before the first message: a connection must deliver a complete message
 *   within FIRST_MESSAGE_S (10 s) of its accept (a client says Hello at once),
 *   and one address may have at most max(64, cap / 2) connections that have
 *   not yet done so, so a flood of handshakes (or of bare TCP connections)
 *   from one address cannot take every slot; and what those connections have
 *   received together is bounded like one id's connections (per_key times the
 *   bound of one): a key that never completes a message on any of its
 *   connections holds no more than one that does;
 * - drips: a connection that has delivered no message for silent_s while
 *   receiving bytes slower than 64 KiB/s is shut (an honest upload of the
 *   largest message on a slower link would need a longer --client-timeout).
 * The deadlines apply while the daemon is caught up (`caught_up`: its last
 * read emptied the socket), or has been behind for over 2 s (a flood: the
 * ROUTER socket takes turns between connections), so a briefly busy
 * coordinator never blames a peer for a message it has not read yet. */
#ifndef FEDMOE_CONNECTIONS_H
#define FEDMOE_CONNECTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fedmoe/status.h"

typedef struct fm_conns fm_conns_t;

/* Watches sock (a bound or about to be bound socket of ctx) with a cap of
 * `cap` connections, at most per_key of them one id's, whose messages are at
 * most max_message bytes, silent for at most silent_s seconds (1 s to an
 * hour). Caller closes with fm_conns_close before closing sock. */
fm_status fm_conns_open(fm_conns_t **out, void *ctx, void *sock, int cap, size_t max_message, double silent_s,
                        int per_key);
/* The socket to poll for events (owned by the counter). */
void *fm_conns_socket(fm_conns_t *c);
/* Handles every waiting event; `now` for rate-limited log lines. */
void fm_conns_handle(fm_conns_t *c, double now);
/* A message from descriptor fd (its ZMQ_SRCFD) was delivered at now, from id
 * (NULL: a message dropped, from nobody known). */
void fm_conns_heard(fm_conns_t *c, int fd, const char *id, double now);
/* Shuts every connection id owns, saying why (a key held: zap.h). */
void fm_conns_cut_owner(fm_conns_t *c, const char *id, double now, const char *why);
/* Shuts connections holding more than their bound of undelivered bytes, silent
 * ones, and (when caught_up) ones past their first-message or drip deadline;
 * does the work at most every CHECK_EVERY_S (call it every loop). */
void fm_conns_check(fm_conns_t *c, double now, bool caught_up);
/* Connections open now. */
int fm_conns_open_count(const fm_conns_t *c);
/* Connections accepted since the start, and handshakes that failed: [0] broken
 * or timed out (libzmq's "no detail"), [1] refused (ZAP: the allow-list, a
 * key's handshake budget), [2] protocol errors. A join that needed several
 * handshakes shows in both. */
void fm_conns_totals(const fm_conns_t *c, uint64_t *accepted, uint64_t failed[3]);
/* Stops watching and frees the counter; sets *c to NULL; safe on NULL. */
void fm_conns_close(fm_conns_t **c);

#endif
