#include "zmtp.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (56 - 8 * i));
}

static bool write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n <= 0)
            return false;
        p += n;
        len -= (size_t)n;
    }
    return true;
}

int zmtp_tcp_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

int zmtp_null_peer(int port, const char *id)
{
    int fd = zmtp_tcp_connect(port);
    if (fd < 0)
        return -1;
    uint8_t greet[64] = {0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 0, 'N', 'U', 'L', 'L'};
    uint8_t cmd[128], *p = cmd + 2;
    size_t idn = strlen(id) < 64 ? strlen(id) : 64;
    *p++ = 5;
    memcpy(p, "READY", 5), p += 5;
    *p++ = 11;
    memcpy(p, "Socket-Type", 11), p += 11;
    *p++ = 0, *p++ = 0, *p++ = 0, *p++ = 6;
    memcpy(p, "DEALER", 6), p += 6;
    *p++ = 8;
    memcpy(p, "Identity", 8), p += 8;
    *p++ = 0, *p++ = 0, *p++ = 0, *p++ = (uint8_t)idn;
    memcpy(p, id, idn), p += idn;
    cmd[0] = 0x04;
    cmd[1] = (uint8_t)(p - cmd - 2);
    uint8_t msg[] = {0x00, 3, 'a', 'b', 'c'};
    uint8_t peer_greet[64];
    if (!write_all(fd, greet, sizeof greet) || recv(fd, peer_greet, sizeof peer_greet, MSG_WAITALL) != (ssize_t)sizeof peer_greet ||
        !write_all(fd, cmd, (size_t)(p - cmd)) || !write_all(fd, msg, sizeof msg)) {
        close(fd);
        return -1;
    }
    return fd;
}

/* A frame: flags (0x04 a command, 0x02 a long size), its size, its body. */
static bool write_frame(int fd, uint8_t flags, const uint8_t *body, size_t len)
{
    uint8_t head[9];
    size_t hn;
    if (len > 255) {
        head[0] = flags | 0x02;
        put_u64(head + 1, len);
        hn = 9;
    } else {
        head[0] = flags;
        head[1] = (uint8_t)len;
        hn = 2;
    }
    return write_all(fd, head, hn) && write_all(fd, body, len);
}

/* Reads one command frame's body (at most cap bytes) into body; its length, or -1. */
static long read_command(int fd, uint8_t *body, size_t cap)
{
    uint8_t flags, size[8];
    uint64_t len = 0;
    if (recv(fd, &flags, 1, MSG_WAITALL) != 1)
        return -1;
    int sn = (flags & 0x02) ? 8 : 1;
    if (recv(fd, size, (size_t)sn, MSG_WAITALL) != sn)
        return -1;
    for (int i = 0; i < sn; i++)
        len = (len << 8) | size[i];
    if (len > cap || (len && recv(fd, body, len, MSG_WAITALL) != (ssize_t)len))
        return -1;
    return (long)len;
}

static bool named(const uint8_t *body, long len, const char *name)
{
    size_t n = strlen(name);
    return len > (long)n && body[0] == n && memcmp(body + 1, name, n) == 0;
}

static void say_error(const uint8_t *body, long len)
{
    if (named(body, len, "ERROR") && len >= 7)
        fprintf(stderr, "zmtp_curve: the coordinator refused the handshake: %.*s\n",
                (int)(len - 7 < body[6] ? len - 7 : body[6]), (const char *)body + 7);
    else
        fprintf(stderr, "zmtp_curve: the handshake failed\n");
}

bool zmtp_curve_connect(zmtp_curve_t *z, int port, const char *rid, const char *client_pub_z85,
                        const char *client_secret_z85, const char *server_pub_z85)
{
    uint8_t C[32], c[32], S[32], Ct[32], ct[32], St[32];
    memset(z, 0, sizeof *z);
    z->fd = -1;
    if (sodium_init() < 0 || !zmq_z85_decode(C, client_pub_z85) || !zmq_z85_decode(c, client_secret_z85) ||
        !zmq_z85_decode(S, server_pub_z85))
        return false;
    crypto_box_keypair(Ct, ct);
    int fd = zmtp_tcp_connect(port);
    if (fd < 0)
        return false;
    z->fd = fd;
    /* greeting: signature, version 3.0, mechanism CURVE, as-server 0 */
    uint8_t greet[64] = {0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 0, 'C', 'U', 'R', 'V', 'E'};
    uint8_t peer[64];
    if (!write_all(fd, greet, sizeof greet) || recv(fd, peer, sizeof peer, MSG_WAITALL) != (ssize_t)sizeof peer)
        goto fail;
    /* HELLO: version 1.0, 72 bytes of padding, C', short nonce 1, Box[64 zeros](C' -> S) */
    uint8_t hello[200] = {5, 'H', 'E', 'L', 'L', 'O', 1, 0}, nonce[24], zeros[64] = {0};
    memcpy(hello + 80, Ct, 32);
    put_u64(hello + 112, ++z->nonce);
    memcpy(nonce, "CurveZMQHELLO---", 16);
    memcpy(nonce + 16, hello + 112, 8);
    if (crypto_box_easy(hello + 120, zeros, 64, nonce, S, ct) != 0 || !write_frame(fd, 0x04, hello, sizeof hello))
        goto fail;
    /* WELCOME: long nonce, Box[S' + cookie](S -> C') */
    uint8_t body[1024], plain[1024];
    long n = read_command(fd, body, sizeof body);
    if (n != 168 || !named(body, n, "WELCOME")) {
        say_error(body, n);
        goto fail;
    }
    memcpy(nonce, "WELCOME-", 8);
    memcpy(nonce + 8, body + 8, 16);
    if (crypto_box_open_easy(plain, body + 24, 144, nonce, S, ct) != 0)
        goto fail;
    memcpy(St, plain, 32);
    const uint8_t *cookie = plain + 32;
    /* INITIATE: cookie, short nonce 2, Box[C + vouch + metadata](C' -> S'),
     * the vouch Box[C' + S](C -> S') under a long nonce */
    uint8_t vouch_plain[64], vouch_nonce[24], meta[128], *m = meta;
    memcpy(vouch_plain, Ct, 32);
    memcpy(vouch_plain + 32, S, 32);
    memcpy(vouch_nonce, "VOUCH---", 8);
    randombytes_buf(vouch_nonce + 8, 16);
    size_t rn = strlen(rid) < 64 ? strlen(rid) : 64;
    *m++ = 11, memcpy(m, "Socket-Type", 11), m += 11;
    *m++ = 0, *m++ = 0, *m++ = 0, *m++ = 6, memcpy(m, "DEALER", 6), m += 6;
    *m++ = 8, memcpy(m, "Identity", 8), m += 8;
    *m++ = 0, *m++ = 0, *m++ = 0, *m++ = (uint8_t)rn, memcpy(m, rid, rn), m += rn;
    size_t ilen = 32 + 16 + 80 + (size_t)(m - meta);
    uint8_t init_plain[512], init[700] = {8, 'I', 'N', 'I', 'T', 'I', 'A', 'T', 'E'};
    memcpy(init_plain, C, 32);
    memcpy(init_plain + 32, vouch_nonce + 8, 16);
    if (crypto_box_easy(init_plain + 48, vouch_plain, 64, vouch_nonce, St, c) != 0)
        goto fail;
    memcpy(init_plain + 128, meta, (size_t)(m - meta));
    memcpy(init + 9, cookie, 96);
    put_u64(init + 105, ++z->nonce);
    memcpy(nonce, "CurveZMQINITIATE", 16);
    memcpy(nonce + 16, init + 105, 8);
    if (crypto_box_easy(init + 113, init_plain, ilen, nonce, St, ct) != 0 ||
        !write_frame(fd, 0x04, init, 113 + 16 + ilen))
        goto fail;
    /* READY (or ERROR: refused by the coordinator's authentication) */
    n = read_command(fd, body, sizeof body);
    if (n < 0 || !named(body, n, "READY")) {
        say_error(body, n);
        goto fail;
    }
    if (crypto_box_beforenm(z->precom, St, ct) != 0)
        goto fail;
    sodium_memzero(c, sizeof c);
    sodium_memzero(ct, sizeof ct);
    return true;
fail:
    sodium_memzero(c, sizeof c);
    sodium_memzero(ct, sizeof ct);
    zmtp_curve_close(z);
    return false;
}

bool zmtp_curve_send(zmtp_curve_t *z, const void *data, size_t len, bool more)
{
    if (z->fd < 0)
        return false;
    uint8_t *plain = malloc(1 + len), *body = malloc(16 + 16 + 1 + len), nonce[24];
    bool ok = plain && body;
    if (ok) {
        plain[0] = more ? 0x01 : 0x00;
        memcpy(plain + 1, data, len);
        memcpy(body, "\x07MESSAGE", 8);
        put_u64(body + 8, ++z->nonce);
        memcpy(nonce, "CurveZMQMESSAGEC", 16);
        memcpy(nonce + 16, body + 8, 8);
        ok = crypto_box_easy_afternm(body + 16, plain, 1 + len, nonce, z->precom) == 0 &&
             write_frame(z->fd, 0x00, body, 16 + 16 + 1 + len);
    }
    free(plain);
    free(body);
    return ok;
}

void zmtp_curve_close(zmtp_curve_t *z)
{
    if (z->fd >= 0)
        close(z->fd);
    z->fd = -1;
    sodium_memzero(z->precom, sizeof z->precom);
}
