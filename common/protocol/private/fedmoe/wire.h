/* wire.h (private) - the protocol codec: envelopes to and from bytes, tensors with digests,
 * and sending / receiving them on ZeroMQ sockets.
 *
 * Limits are enforced before decoding (maximum message size) and after (protocol
 * version, a body present, tensor names, shapes, digests, finite values). Every
 * rejection returns FM_ERR_FORMAT with a reason in fm_error_last() and an
 * fm_wire_code for the Error reply. */
#ifndef FEDMOE_WIRE_H
#define FEDMOE_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fedmoe.pb-c.h"
#include "fedmoe/blob.h"
#include "fedmoe/id.h"
#include "fedmoe/status.h"

#define FM_PROTOCOL_VERSION 1

/* Error codes carried in Error.code (docs/protocol.md). */
/* The most embedded messages (tensors, specs, ...) at any depth that a message
 * may hold: counted by the schema before decoding, so decoding costs memory in
 * proportion to the message's size (a Task with 64 pool prompts has ~80). */
#define FM_WIRE_MAX_SUBMESSAGES 1024
/* What decoding a message may allocate, at most: FM_WIRE_DECODE_FACTOR x its
 * size plus FM_WIRE_DECODE_SLACK, charged by the schema before decoding (an
 * honest message costs about 1x: its tensors are bytes fields). */
#define FM_WIRE_DECODE_FACTOR 4
#define FM_WIRE_DECODE_SLACK (64 * 1024)
size_t fm_wire_decode_budget(size_t len);
/* The charge for decoding buf (an Envelope): at least what protobuf-c allocates
 * for it; SIZE_MAX when it is not a valid message by the schema's framing. */
size_t fm_wire_decode_cost(const uint8_t *buf, size_t len);

/* A connection that has not finished its ZMTP / CURVE handshake after this long
 * is closed (libzmq's default is 30 s): how long a connection that never speaks
 * holds one of the coordinator's file descriptors. */
#define FM_WIRE_HANDSHAKE_MS 5000
/* The longest wait between a client's attempts to connect (from 0.1 s, doubled
 * at each failure): how soon clients are back after a coordinator restarts. */
#define FM_WIRE_RECONNECT_MAX_MS 2000

typedef enum {
    FM_WIRE_OK = 0,
    FM_WIRE_MALFORMED = 1,      /* not a decodable Envelope, or no body */
    FM_WIRE_VERSION = 2,        /* protocol version not spoken here */
    FM_WIRE_TOO_LARGE = 3,      /* over the maximum message size */
    FM_WIRE_UNKNOWN_CLIENT = 4, /* a message before Hello */
    FM_WIRE_WRONG_ROUND = 5,    /* an update for a round that is not open for this client */
    FM_WIRE_DUPLICATE = 6,      /* a second update for the same round */
    FM_WIRE_BAD_TENSOR = 7,     /* wrong name, shape, length or digest */
    FM_WIRE_BAD_VALUE = 8,      /* NaN / Inf, or absurd counts */
    FM_WIRE_REJECTED = 9,       /* a valid message the coordinator will not accept (e.g. wrong model) */
} fm_wire_code;


/* The code of the last rejection by this module (thread-local). */
fm_wire_code fm_wire_last_code(void);

/* Fills t with rows x cols floats: name, shape, little-endian bytes, SHA-256. The
 * data and digest are malloc'd and owned by t: release with fm_wire_tensor_clear. */
fm_status fm_wire_tensor_set(Fedmoe__Tensor *t, const char *name, const float *x, uint32_t rows, uint32_t cols);
/* Frees what fm_wire_tensor_set allocated in t (name, shape, data, digest) and resets it. */
void fm_wire_tensor_clear(Fedmoe__Tensor *t);
/* Checks that t is named `name`, holds rows x cols finite floats and that the
 * digest matches; then copies them into out (rows*cols floats). */
fm_status fm_wire_tensor_get(const Fedmoe__Tensor *t, const char *name, uint32_t rows, uint32_t cols, float *out);

/* Serializes env (setting its protocol version) into a malloc'd buffer. */
fm_status fm_wire_encode(Fedmoe__Envelope *env, uint8_t **buf, size_t *len);
/* Decodes a message of len bytes; rejects len > max_len, undecodable bytes, a
 * wrong version, a missing body. On success the caller frees *out with
 * fm_wire_free. */
fm_status fm_wire_decode(const uint8_t *buf, size_t len, size_t max_len, Fedmoe__Envelope **out);
/* Frees a message fm_wire_decode made (one block: never
 * fedmoe__envelope__free_unpacked); safe on NULL. */
void fm_wire_free(Fedmoe__Envelope *env);

/* Messages queued per peer and direction at the most (ZMQ_SNDHWM and
 * ZMQ_RCVHWM). A round is a few messages per peer, so an honest peer never
 * comes near it; what is sent to a peer that does not read is dropped beyond it
 * (sends never wait), so such a peer cannot make the coordinator hold memory. */
#define FM_WIRE_HWM 64

/* The socket options both sides use: FM_WIRE_HWM, ZMTP heartbeats every 2 s with
 * a 10 s timeout so dead TCP peers are noticed. */
void fm_wire_tune_socket(void *socket);

/* Sends env on a ZeroMQ socket; with a non-NULL identity (ROUTER) the identity
 * frame goes first. Non-blocking: a peer that cannot take it gets nothing. */
fm_status fm_wire_send(void *socket, const char *identity, Fedmoe__Envelope *env);
/* Sends len encoded bytes (identity frame first with a non-NULL identity).
 * Non-blocking, like fm_wire_send. */
fm_status fm_wire_send_bytes(void *socket, const char *identity, const uint8_t *buf, size_t len);
/* Sends one message in n frames (docs/protocol.md: a receiver joins them),
 * after a routing frame of ridlen bytes when rid is set. Non-blocking; the
 * frames of a message go together or not at all. A blob frame goes with zero
 * copy: ZeroMQ holds a reference until it is written. */
fm_status fm_wire_send_frames(void *socket, const void *rid, size_t ridlen, const fm_frame_t *f, int n);
/* Receives one message, its frames joined into *buf (malloc'd, *len bytes; the
 * caller frees it). FM_ERR_STATE when nothing waits (flags ZMQ_DONTWAIT),
 * FM_ERR_FORMAT (FM_WIRE_TOO_LARGE) for a message over max_len bytes (read
 * and dropped), FM_ERR_IO otherwise. */
fm_status fm_wire_recv(void *socket, int flags, size_t max_len, uint8_t **buf, size_t *len);
/* An Error envelope, encoded; *buf is malloc'd, the caller frees it. */
fm_status fm_wire_encode_error(fm_wire_code code, const char *text, uint8_t **buf, size_t *len);
/* Sends an Error envelope. */
fm_status fm_wire_send_error(void *socket, const char *identity, fm_wire_code code, const char *text);

#endif
