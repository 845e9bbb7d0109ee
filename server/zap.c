#include "zap.h"

#include "budget.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "fedmoe/clock.h"
#include "fedmoe/log.h"

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define ZAP_FRAMES 7 /* version, request id, domain, address, identity, mechanism, credentials */

struct fm_zap {
    void *sock;
    char dir[1024];
    fm_allowlist_t *allow;
    fm_budget_t *budget;     /* handshakes per key: a key cannot open connections as fast as it likes */
    double holds_end;        /* when the last hold ends: until then fm_zap_held looks the id up */
    fm_log_limit_t refusals; /* at most REFUSALS_PER_SECOND logged */
};

#define REFUSALS_PER_SECOND 20

fm_status fm_zap_open(fm_zap_t **out, void *ctx, const char *allow_dir)
{
    *out = NULL;
    fm_zap_t *z = calloc(1, sizeof *z);
    if (!z)
        return FM_ERR_NOMEM;
    snprintf(z->dir, sizeof z->dir, "%s", allow_dir);
    fm_status st = fm_allowlist_load(&z->allow, allow_dir);
    if (st == FM_OK)
        st = fm_budget_new(&z->budget, (int)fm_allowlist_count(z->allow) + 1024);
    if (st == FM_OK) {
        z->sock = zmq_socket(ctx, ZMQ_REP);
        if (!z->sock || zmq_bind(z->sock, ZAP_ENDPOINT) != 0) {
            fm_error_set("cannot start the authentication handler: %s", zmq_strerror(zmq_errno()));
            st = FM_ERR_IO;
        }
    }
    if (st != FM_OK) {
        fm_zap_close(&z);
        return st;
    }
    fm_info("allow-list %s: %zu client keys", allow_dir, fm_allowlist_count(z->allow));
    *out = z;
    return FM_OK;
}

void *fm_zap_socket(fm_zap_t *z) { return z->sock; }

/* Receives one request's frames (at most ZAP_FRAMES; the rest dropped). Returns
 * how many were read, -1 when nothing was waiting. */
static int recv_request(void *sock, zmq_msg_t *f)
{
    int n = 0;
    for (bool more = true; more;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, sock, n ? 0 : ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return n ? n : -1;
        }
        more = zmq_msg_more(&m);
        if (n < ZAP_FRAMES)
            f[n++] = m;
        else
            zmq_msg_close(&m);
    }
    return n;
}

/* The reply; an admitted peer's metadata carries its public key as X-Key (Z85),
 * which the daemon finds on every message of the connection. */
static void send_reply(void *sock, const zmq_msg_t *request_id, const char *code, const char *text, const char *user,
                       const uint8_t *key)
{
    uint8_t meta[1 + 5 + 4 + FM_KEY_Z85 + 1];
    size_t mlen = 0;
    if (key) {
        char z85[FM_KEY_Z85 + 1];
        zmq_z85_encode(z85, key, FM_KEY_BYTES);
        meta[0] = 5;
        memcpy(meta + 1, "X-Key", 5);
        meta[6] = meta[7] = meta[8] = 0;
        meta[9] = FM_KEY_Z85;
        memcpy(meta + 10, z85, FM_KEY_Z85);
        mlen = 10 + FM_KEY_Z85;
    }
    zmq_send(sock, "1.0", 3, ZMQ_SNDMORE);
    zmq_send(sock, zmq_msg_data((zmq_msg_t *)request_id), zmq_msg_size((zmq_msg_t *)request_id), ZMQ_SNDMORE);
    zmq_send(sock, code, strlen(code), ZMQ_SNDMORE);
    zmq_send(sock, text, strlen(text), ZMQ_SNDMORE);
    zmq_send(sock, user, strlen(user), ZMQ_SNDMORE);
    zmq_send(sock, meta, mlen, 0);
}

static bool frame_is(zmq_msg_t *m, const char *s)
{
    return zmq_msg_size(m) == strlen(s) && !memcmp(zmq_msg_data(m), s, strlen(s));
}

void fm_zap_handle(fm_zap_t *z)
{
    zmq_msg_t f[ZAP_FRAMES];
    int n;
    while ((n = recv_request(z->sock, f)) >= 0) {
        const char *id = NULL;
        if (n == ZAP_FRAMES && frame_is(&f[0], "1.0") && frame_is(&f[5], "CURVE") &&
            zmq_msg_size(&f[6]) == FM_KEY_BYTES)
            id = fm_allowlist_id(z->allow, zmq_msg_data(&f[6]));
        if (n >= 2) {
            double now = fm_clock_seconds();
            fm_budget_flush(z->budget, now);
            if (id && fm_zap_held(z, id, now)) {
                send_reply(z->sock, &f[1], "300", "this key sent messages that could not be read: try again later",
                           "", NULL);
            } else if (id && !fm_budget_take(z->budget, id, FM_BUDGET_HANDSHAKE, now)) {
                /* 300, a temporary failure: the client tries again later (400 would tell it its key is refused) */
                send_reply(z->sock, &f[1], "300", "too many handshakes from this key: try again later", "", NULL);
            } else if (id) {
                send_reply(z->sock, &f[1], "200", "OK", id, zmq_msg_data(&f[6]));
            } else {
                char addr[64] = "?";
                if (n > 3)
                    snprintf(addr, sizeof addr, "%.*s", (int)(zmq_msg_size(&f[3]) < 46 ? zmq_msg_size(&f[3]) : 46),
                             (const char *)zmq_msg_data(&f[3]));
                if (fm_log_limit_take(&z->refusals, fm_clock_seconds(), REFUSALS_PER_SECOND, "handshake refusals"))
                    fm_warn("refused a peer at %s: its key is not in the allow-list", addr);
                send_reply(z->sock, &f[1], "400", "key not allowed", "", NULL);
            }
        } else {
            zmq_send(z->sock, "", 0, 0); /* a REP socket must answer; a malformed request gets nothing useful */
        }
        for (int i = 0; i < n; i++)
            zmq_msg_close(&f[i]);
    }
}

void fm_zap_reload(fm_zap_t *z)
{
    fm_allowlist_t *fresh = NULL;
    if (fm_allowlist_load(&fresh, z->dir) != FM_OK) {
        fm_errorf("allow-list not reloaded, the old one stays: %s", fm_error_last());
        return;
    }
    fm_allowlist_free(&z->allow);
    z->allow = fresh;
    fm_info("allow-list %s reloaded: %zu client keys", z->dir, fm_allowlist_count(fresh));
}

bool fm_zap_allows(const fm_zap_t *z, const char *id, const char *key_z85)
{
    uint8_t key[FM_KEY_BYTES];
    if (!key_z85 || strlen(key_z85) != FM_KEY_Z85 || !zmq_z85_decode(key, key_z85))
        return false;
    const char *owner = fm_allowlist_id(z->allow, key);
    return owner && !strcmp(owner, id);
}

bool fm_zap_unreadable(fm_zap_t *z, const char *id, double now)
{
    if (fm_zap_held(z, id, now) || fm_budget_take(z->budget, id, FM_BUDGET_UNREADABLE, now))
        return false;
    fm_budget_hold(z->budget, id, now + FM_ZAP_HOLD_S, now);
    z->holds_end = now + FM_ZAP_HOLD_S;
    return true;
}

/* (asked of every message: while no key is held, a comparison, no lookup) */
bool fm_zap_held(fm_zap_t *z, const char *id, double now)
{
    return now < z->holds_end && fm_budget_held(z->budget, id, now);
}

void fm_zap_close(fm_zap_t **z)
{
    if (!z || !*z)
        return;
    if ((*z)->sock) {
        int linger = 0;
        zmq_setsockopt((*z)->sock, ZMQ_LINGER, &linger, sizeof linger);
        zmq_close((*z)->sock);
    }
    fm_allowlist_free(&(*z)->allow);
    fm_budget_free(&(*z)->budget);
    free(*z);
    *z = NULL;
}
