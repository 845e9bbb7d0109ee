/* zmtp.h - ZMTP 3.0 peers written by hand on a TCP socket, for tests that must
 * send what libzmq never sends: part of a multipart message and never its end
 * (libzmq hands the I/O thread a multipart message only once its last frame is
 * queued, so no libzmq client can do this; a compromised client can), or a
 * reset at a chosen moment. A NULL peer (no security), and a CURVE client
 * (CurveZMQ, RFC 26; the frames as libzmq 4.3 writes them) on libsodium, the
 * library libzmq's own CURVE uses. */
#ifndef FEDMOE_TEST_ZMTP_H
#define FEDMOE_TEST_ZMTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A TCP connection to 127.0.0.1:port, or -1. */
int zmtp_tcp_connect(int port);

/* A NULL-mechanism peer on 127.0.0.1:port: greeting, READY as a DEALER with
 * routing id `id`, one message frame ("abc"). Returns the fd (or -1). */
int zmtp_null_peer(int port, const char *id);

typedef struct {
    int fd;
    uint64_t nonce;     /* the next short nonce (HELLO took 1, INITIATE 2) */
    uint8_t precom[32]; /* crypto_box_beforenm(server's transient public, our transient secret) */
} zmtp_curve_t;

/* Connects to 127.0.0.1:port as a DEALER with routing id rid, CURVE with the
 * client key pair (Z85 public and secret) to the coordinator's public key (Z85),
 * and completes the handshake (READY read). False with a reason on stderr when
 * the coordinator refused it (an ERROR command) or the socket failed. */
bool zmtp_curve_connect(zmtp_curve_t *z, int port, const char *rid, const char *client_pub_z85,
                        const char *client_secret_z85, const char *server_pub_z85);
/* Sends one frame of len bytes, MORE set when more: the encrypted MESSAGE frame
 * libzmq would send. Returns false when the socket refuses it (closed, or a
 * send timeout). */
bool zmtp_curve_send(zmtp_curve_t *z, const void *data, size_t len, bool more);
void zmtp_curve_close(zmtp_curve_t *z);

#endif
