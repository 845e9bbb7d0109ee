/* badpeer: a hostile client for fault injection. Connects to a coordinator and
 * sends N messages of each bad kind, counting the Error replies; the coordinator
 * must answer (where a reply is possible) and keep serving the honest clients.
 *   badpeer ENDPOINT N SEED [KEY SERVER_PUB]
 * With KEY (its key pair file) and SERVER_PUB (the coordinator's public key) it
 * talks CURVE as the key's id: an authenticated client that misbehaves.
 * Prints one line: "badpeer: kind=sent/errors ..." (oversized messages get no
 * reply: ZeroMQ closes the connection before the coordinator sees them). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "fedmoe/keys.h"
#include "fedmoe/log.h"
#include "fedmoe/rng.h"
#include "fedmoe/wire.h"

static void *sock;

static int send_bytes(const void *buf, size_t len)
{
    return zmq_send(sock, buf, len, 0) == (int)len ? 0 : -1;
}

static int send_env(Fedmoe__Envelope *env, uint32_t version)
{
    size_t len = fedmoe__envelope__get_packed_size(env);
    uint8_t *buf = malloc(len + 1);
    env->protocol_version = version;
    fedmoe__envelope__pack(env, buf);
    int rc = send_bytes(buf, len);
    free(buf);
    return rc;
}

/* Counts Error replies arriving within ms. */
static int drain_errors(int ms)
{
    int n = 0;
    zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
    while (zmq_poll(&it, 1, ms) > 0) {
        uint8_t *m;
        size_t len;
        if (fm_wire_recv(sock, ZMQ_DONTWAIT, (size_t)1 << 31, &m, &len) != FM_OK)
            break;
        Fedmoe__Envelope *e = fedmoe__envelope__unpack(NULL, len, m);
        if (e && e->body_case == FEDMOE__ENVELOPE__BODY_ERROR)
            n++;
        if (e)
            fedmoe__envelope__free_unpacked(e, NULL);
        free(m);
        ms = 200;
    }
    return n;
}

static void update(Fedmoe__Envelope *env, Fedmoe__Update *up, Fedmoe__Tensor *t, Fedmoe__Tensor **list, float *x,
                   uint32_t n, uint32_t round, uint64_t samples)
{
    fedmoe__envelope__init(env);
    fedmoe__update__init(up);
    fm_wire_tensor_set(t, "model", x, 1, n);
    list[0] = t;
    up->round = round;
    up->model = list;
    up->n_model = 1;
    up->train_samples = samples;
    env->body_case = FEDMOE__ENVELOPE__BODY_UPDATE;
    env->update = up;
}

int main(int argc, char **argv)
{
    if (argc != 4 && argc != 6) {
        fprintf(stderr, "usage: badpeer ENDPOINT N SEED [KEY SERVER_PUB]\n");
        return 2;
    }
    int N = atoi(argv[2]);
    fm_rng_t r;
    fm_rng_init(&r, strtoull(argv[3], NULL, 10), 0xBAD);
    void *ctx = zmq_ctx_new();
    sock = zmq_socket(ctx, ZMQ_DEALER);
    char id[64];
    snprintf(id, sizeof id, "badpeer-%s", argv[3]);
    if (argc == 6) {
        fm_key_t own, server;
        if (fm_key_read(argv[4], true, &own) != FM_OK || fm_key_read(argv[5], false, &server) != FM_OK ||
            fm_key_apply_client(sock, &own, server.public_z85) != FM_OK) {
            fprintf(stderr, "badpeer: %s\n", fm_error_last());
            return 2;
        }
        snprintf(id, sizeof id, "%s", own.id);
    }
    zmq_setsockopt(sock, ZMQ_ROUTING_ID, id, strlen(id));
    int linger = 0;
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_connect(sock, argv[1]);
    float x[64];
    for (int i = 0; i < 64; i++)
        x[i] = 0.5f;
    const char *names[] = {"random_bytes", "truncated", "wrong_version", "no_body", "before_hello", "wrong_round",
                           "absurd_samples", "multi_frame", "oversized"};
    int sent[9] = {0}, errs[9] = {0};
    for (int k = 0; k < 9; k++) {
        if (k == 5) { /* from here on, as a registered (never ready) client */
            Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
            Fedmoe__Hello h = FEDMOE__HELLO__INIT;
            h.client_id = id;
            h.protocol_version = FM_PROTOCOL_VERSION;
            h.specialists = 2;
            h.partition_index = -1;
            env.body_case = FEDMOE__ENVELOPE__BODY_HELLO;
            env.hello = &h;
            send_env(&env, FM_PROTOCOL_VERSION);
            drain_errors(1000);
        }
        for (int i = 0; i < N; i++) {
            Fedmoe__Envelope env;
            Fedmoe__Update up;
            Fedmoe__Tensor t, *list[1];
            uint8_t buf[512];
            update(&env, &up, &t, list, x, 64, 1, 100);
            switch (k) {
            case 0: {
                size_t len = 1 + fm_rng_below(&r, sizeof buf - 1);
                for (size_t j = 0; j < len; j++)
                    buf[j] = (uint8_t)fm_rng_u32(&r);
                send_bytes(buf, len);
                break;
            }
            case 1: {
                size_t len = fedmoe__envelope__get_packed_size(&env);
                uint8_t *full = malloc(len);
                env.protocol_version = FM_PROTOCOL_VERSION;
                fedmoe__envelope__pack(&env, full);
                send_bytes(full, 1 + fm_rng_below(&r, (uint32_t)(len - 1)));
                free(full);
                break;
            }
            case 2: send_env(&env, 2 + fm_rng_below(&r, 100)); break;
            case 3: {
                Fedmoe__Envelope empty = FEDMOE__ENVELOPE__INIT;
                send_env(&empty, FM_PROTOCOL_VERSION);
                break;
            }
            case 4: send_env(&env, FM_PROTOCOL_VERSION); break;
            case 5: up.round = 100000 + fm_rng_below(&r, 1000); send_env(&env, FM_PROTOCOL_VERSION); break;
            case 6: up.train_samples = 1ull << 40; up.round = 0; send_env(&env, FM_PROTOCOL_VERSION); break;
            case 7: zmq_send(sock, "x", 1, ZMQ_SNDMORE); send_env(&env, FM_PROTOCOL_VERSION); break;
            case 8: { /* over any message limit: ZeroMQ drops the connection, no reply is possible */
                size_t big = 64u << 20;
                uint8_t *junk = calloc(big, 1);
                send_bytes(junk, big);
                free(junk);
                break;
            }
            }
            fm_wire_tensor_clear(&t);
            sent[k]++;
        }
        errs[k] += drain_errors(2000);
    }
    printf("badpeer:");
    for (int k = 0; k < 9; k++)
        printf(" %s=%d/%d", names[k], sent[k], errs[k]);
    printf("\n");
    zmq_close(sock);
    zmq_ctx_term(ctx);
    return 0;
}
