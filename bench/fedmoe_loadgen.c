/* fedmoe-loadgen: many protocol-correct clients in one process that answer
 * every Task at once (or spread over --spread seconds) without training, to
 * load a real coordinator: the scale benchmark (bench/scale.sh) and the scale
 * test. Each client says Hello with data of its own (fixed counts, so equal
 * weights), heartbeats as often as the Welcome says, and uploads the Task's model and prompt
 * plus a small offset chosen by its index modulo --classes: N clients of C
 * classes average to the same global state as C clients, whatever N (the
 * coordinator's aggregation is exact and order-independent). The Update of a
 * round is encoded once per class; each client's copy differs only in its
 * Task's nonce, patched in place.
 *   fedmoe-loadgen --connect EP --clients N [--keys DIR --server-key FILE | --insecure]
 *   fedmoe-loadgen --keys DIR --clients N --make-keys      (DIR/lgNNNNN.key and .pub) */
#define _GNU_SOURCE
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <zmq.h>

#include "fedmoe/clock.h"
#include "fedmoe/exchange.h"
#include "fedmoe/keys.h"
#include "fedmoe/log.h"
#include "fedmoe/model.h"
#include "fedmoe/rng.h"
#include "fedmoe/runspec.h"
#include "fedmoe/runspec_wire.h"
#include "fedmoe/wire.h"

#define TRAIN 1200 /* every client's declared counts: train, val = train/4, test = train/3 */
#define HEARTBEAT_S 1.0 /* until a Welcome says how often (Welcome.heartbeat_ms), as fedmoe-client */
#define MAX_CLASSES 16

static const uint8_t PLACEHOLDER[FM_NONCE_BYTES] = "fedmoe-loadgen!";

typedef struct {
    void *sock;
    char id[16];
    bool welcomed, pending, done;
    bool granted, announced; /* upload grants: its Grant came; its ready update announced */
    double send_at, last_beat, last_hello;
    uint8_t nonce[FM_NONCE_BYTES];
    uint32_t task_round, sent_round; /* reported in its heartbeats, as fedmoe-client does */
} lg_client_t;

typedef struct {
    const char *connect, *keys, *server_key;
    int clients, classes, first;
    double spread;
    bool insecure, make_keys;
} lg_options_t;

typedef struct {
    lg_options_t o;
    lg_client_t *c;
    fm_run_spec_t spec;
    fm_exchange_dims_t dims;
    bool have_spec;
    bool grants; /* the coordinator grants uploads (its Welcome) */
    double heartbeat_s; /* how often its clients beat (the Welcome's; HEARTBEAT_S before one) */
    int round; /* the round the encoded updates are for (0: none) */
    uint8_t *update[MAX_CLASSES];
    size_t update_len[MAX_CLASSES], nonce_at[MAX_CLASSES];
    long tasks, sent, errors;
} lg_t;

static volatile sig_atomic_t stop;
static void on_signal(int sig) { stop = sig; }

static void send_env(lg_client_t *k, Fedmoe__Envelope *env)
{
    uint8_t *buf;
    size_t len;
    if (fm_wire_encode(env, &buf, &len) == FM_OK) {
        zmq_send(k->sock, buf, len, ZMQ_DONTWAIT);
        free(buf);
    }
}

static void hello(lg_client_t *k)
{
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    Fedmoe__Hello h = FEDMOE__HELLO__INIT;
    h.client_id = k->id;
    h.protocol_version = FM_PROTOCOL_VERSION;
    h.specialists = 2;
    h.partition_index = -1;
    h.train_samples = TRAIN;
    h.val_samples = TRAIN / 4;
    h.test_samples = TRAIN / 3;
    h.own_data = true;
    env.body_case = FEDMOE__ENVELOPE__BODY_HELLO;
    env.hello = &h;
    send_env(k, &env);
    k->last_hello = fm_clock_seconds();
}

/* The run's sizes, from its Welcome: a model of its spec tells the federated vector's length. */
static fm_status learn_spec(lg_t *g, const Fedmoe__Welcome *w)
{
    fm_status st = fm_run_spec_from_welcome(&g->spec, w, 2);
    fm_model_t *m = NULL;
    if (st == FM_OK)
        st = fm_model_new(&m, &g->spec.model, g->spec.seed, fm_rng_stream(FM_STREAM_TEST, 0));
    if (st != FM_OK)
        return st;
    g->dims = fm_exchange_dims(&g->spec, fm_federated_size(m, g->spec.strategy));
    fm_model_destroy(&m);
    g->have_spec = true;
    fm_info("run %s: strategy %s, federated vector %zu floats", w->run_id, fm_strategy_name(g->spec.strategy),
            g->dims.nmodel);
    return FM_OK;
}

/* The updates of round t->round, one per class, from the first Task of the round. */
static fm_status encode_updates(lg_t *g, const Fedmoe__Task *t)
{
    fm_task_in_t in;
    fm_wire_code code;
    fm_status st = fm_exchange_read_task(&g->spec, &g->dims, t, &in, &code);
    if (st != FM_OK)
        return st;
    size_t nm = in.model ? g->dims.nmodel : 0, np = in.prompt ? g->dims.nprompt : 0;
    float *model = malloc(sizeof(float) * (nm + 1)), *prompt = malloc(sizeof(float) * (np + 1));
    for (int j = 0; st == FM_OK && j < g->o.classes; j++) {
        for (size_t i = 0; i < nm; i++)
            model[i] = in.model[i] + 1e-3f * (float)((int)((i * 31 + (size_t)j * 7) % 13) - 6);
        for (size_t i = 0; i < np; i++)
            prompt[i] = in.prompt[i] + 1e-3f * (float)((int)((i * 17 + (size_t)j * 5) % 11) - 5);
        fm_update_t u = {.round = in.round, .train_samples = TRAIN, .model = nm ? model : NULL,
                         .prompt = np ? prompt : NULL};
        u.metrics = (fm_metrics_t){.train_loss = 1.0, .val_loss = 1.0, .test_loss = 1.0,
                                   .test_samples = TRAIN / 3, .test_correct = TRAIN / 6,
                                   .val_samples = TRAIN / 4, .val_correct = TRAIN / 8, .seconds = 0.01,
                                   .generalist_share = 0.5};
        u.metrics.test_accuracy = (double)u.metrics.test_correct / (double)u.metrics.test_samples;
        memcpy(u.nonce, PLACEHOLDER, FM_NONCE_BYTES);
        free(g->update[j]);
        g->update[j] = NULL;
        st = fm_exchange_encode_update(&g->spec, &g->dims, &u, &g->update[j], &g->update_len[j]);
        uint8_t *at = st == FM_OK ? memmem(g->update[j], g->update_len[j], PLACEHOLDER, FM_NONCE_BYTES) : NULL;
        if (st == FM_OK && !at) {
            fm_error_set("the encoded update holds no nonce");
            st = FM_ERR_STATE;
        }
        g->nonce_at[j] = at ? (size_t)(at - g->update[j]) : 0;
    }
    g->round = st == FM_OK ? (int)in.round : 0;
    free(model);
    free(prompt);
    fm_exchange_task_free(&in);
    return st;
}

static void handle(lg_t *g, lg_client_t *k, const uint8_t *data, size_t len)
{
    Fedmoe__Envelope *env = NULL;
    if (fm_wire_decode(data, len, (size_t)1 << 31, &env) != FM_OK)
        return;
    switch (env->body_case) {
    case FEDMOE__ENVELOPE__BODY_WELCOME:
        if (!g->have_spec && learn_spec(g, env->welcome) != FM_OK) {
            fm_errorf("cannot read the run's welcome: %s", fm_error_last());
            stop = 1;
        }
        k->welcomed = true;
        g->grants = env->welcome->upload_grants;
        if (env->welcome->heartbeat_ms)
            g->heartbeat_s = env->welcome->heartbeat_ms / 1000.0;
        break;
    case FEDMOE__ENVELOPE__BODY_GRANT:
        k->granted = k->pending && env->grant->round == k->task_round;
        break;
    case FEDMOE__ENVELOPE__BODY_TASK:
        g->tasks++;
        if (!g->have_spec || env->task->nonce.len != FM_NONCE_BYTES)
            break;
        if (g->round != (int)env->task->round && encode_updates(g, env->task) != FM_OK) {
            fm_errorf("round %u: %s", env->task->round, fm_error_last());
            break;
        }
        memcpy(k->nonce, env->task->nonce.data, FM_NONCE_BYTES);
        k->task_round = env->task->round;
        k->pending = true;
        k->granted = k->announced = false;
        k->last_beat = 0.0; /* (a heartbeat now says it has the Task) */
        k->send_at = fm_clock_seconds() + g->o.spread * ((double)rand() / RAND_MAX);
        break;
    case FEDMOE__ENVELOPE__BODY_SHUTDOWN:
        if (!env->shutdown->resumable)
            k->done = true;
        break;
    case FEDMOE__ENVELOPE__BODY_ERROR:
        if (g->errors++ < 20)
            fm_warn("%s: coordinator error %u: %.200s", k->id, env->error->code, env->error->text);
        if (env->error->code == FM_WIRE_UNKNOWN_CLIENT && fm_clock_seconds() - k->last_hello > 3.0)
            hello(k);
        break;
    default: break;
    }
    fm_wire_free(env);
}

/* Due uploads and heartbeats; returns the seconds until the next one is due. */
static double send_due(lg_t *g, int index, double now)
{
    lg_client_t *k = &g->c[index];
    if (k->done)
        return 1.0;
    if (k->pending && now >= k->send_at && g->grants && !k->granted && !k->announced) {
        k->announced = true; /* ready: a heartbeat now says so */
        k->last_beat = 0.0;
    }
    if (k->pending && now >= k->send_at && (!g->grants || k->granted)) {
        int j = (g->o.first + index) % g->o.classes;
        memcpy(g->update[j] + g->nonce_at[j], k->nonce, FM_NONCE_BYTES);
        if (zmq_send(k->sock, g->update[j], g->update_len[j], ZMQ_DONTWAIT) >= 0) {
            g->sent++;
            k->sent_round = k->task_round;
            k->pending = false;
        } else {
            k->send_at = now + 0.05; /* (its queue is full: soon again) */
        }
    }
    if (k->welcomed && now - k->last_beat >= g->heartbeat_s) {
        Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
        Fedmoe__Heartbeat hb = FEDMOE__HEARTBEAT__INIT;
        hb.progress = true;
        hb.task_round = k->task_round;
        hb.sent_round = k->sent_round;
        hb.ready_round = k->pending && k->announced ? k->task_round : 0;
        env.body_case = FEDMOE__ENVELOPE__BODY_HEARTBEAT;
        env.heartbeat = &hb;
        send_env(k, &env);
        k->last_beat = now;
    }
    double next = k->welcomed ? k->last_beat + g->heartbeat_s - now : 1.0;
    if (k->pending && (!g->grants || k->granted) && k->send_at - now < next)
        next = k->send_at - now;
    return next;
}

static fm_status open_clients(lg_t *g, void *ctx)
{
    fm_key_t server;
    if (!g->o.insecure && fm_key_read(g->o.server_key, false, &server) != FM_OK)
        return FM_ERR_ARG;
    for (int i = 0; i < g->o.clients; i++) {
        lg_client_t *k = &g->c[i];
        snprintf(k->id, sizeof k->id, "lg%05d", g->o.first + i);
        if (!(k->sock = zmq_socket(ctx, ZMQ_DEALER))) {
            fm_error_set("socket %d: %s (raise the file-descriptor limit)", i, zmq_strerror(zmq_errno()));
            return FM_ERR_IO;
        }
        fm_wire_tune_socket(k->sock);
        /* no ZMTP heartbeats: thousands of connections in one process, and
         * libzmq 4.3.4 cancels each heartbeat's timer by a linear search of all
         * of them (the clients' own heartbeats say they are alive) */
        int off = 0;
        zmq_setsockopt(k->sock, ZMQ_HEARTBEAT_IVL, &off, sizeof off);
        int linger = 0;
        zmq_setsockopt(k->sock, ZMQ_LINGER, &linger, sizeof linger);
        if (g->o.insecure) {
            zmq_setsockopt(k->sock, ZMQ_ROUTING_ID, k->id, strlen(k->id));
        } else {
            char path[4200];
            fm_key_t own;
            snprintf(path, sizeof path, "%s/%s.key", g->o.keys, k->id);
            if (fm_key_read(path, true, &own) != FM_OK || fm_key_apply_client(k->sock, &own, server.public_z85) != FM_OK)
                return FM_ERR_ARG;
        }
        if (zmq_connect(k->sock, g->o.connect) != 0) {
            fm_error_set("connect %s: %s", g->o.connect, zmq_strerror(zmq_errno()));
            return FM_ERR_ARG;
        }
        hello(k);
    }
    return FM_OK;
}

static int run(lg_t *g)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    void *ctx = zmq_ctx_new();
    zmq_ctx_set(ctx, ZMQ_MAX_SOCKETS, g->o.clients + 16);
    g->c = calloc((size_t)g->o.clients, sizeof *g->c);
    zmq_pollitem_t *items = calloc((size_t)g->o.clients, sizeof *items);
    fm_status st = g->c && items ? FM_OK : FM_ERR_NOMEM;
    if (st == FM_OK)
        st = open_clients(g, ctx);
    if (st != FM_OK)
        fm_errorf("%s", fm_error_last());
    int left = g->o.clients;
    double t0 = fm_clock_seconds(), said = t0;
    while (st == FM_OK && !stop && left > 0) {
        double wait = 0.1, now = fm_clock_seconds();
        if (now - said >= 5.0) {
            fm_info("%.0f s: %ld tasks, %ld updates sent, %ld errors", now - t0, g->tasks, g->sent, g->errors);
            said = now;
        }
        left = 0;
        for (int i = 0; i < g->o.clients; i++) {
            double next = send_due(g, i, now);
            wait = next < wait ? next : wait;
            left += !g->c[i].done;
            items[i] = (zmq_pollitem_t){g->c[i].sock, 0, ZMQ_POLLIN, 0};
        }
        if (zmq_poll(items, g->o.clients, wait > 0 ? (long)(wait * 1000) + 1 : 0) < 0)
            continue;
        for (int i = 0; i < g->o.clients; i++) {
            if (!(items[i].revents & ZMQ_POLLIN))
                continue;
            uint8_t *m;
            size_t len;
            while (fm_wire_recv(g->c[i].sock, ZMQ_DONTWAIT, (size_t)1 << 31, &m, &len) == FM_OK) {
                handle(g, &g->c[i], m, len);
                free(m);
            }
        }
    }
    fm_info("%d clients: %ld tasks, %ld updates sent, %ld errors, %.1f s", g->o.clients, g->tasks, g->sent,
            g->errors, fm_clock_seconds() - t0);
    for (int i = 0; g->c && i < g->o.clients; i++)
        if (g->c[i].sock)
            zmq_close(g->c[i].sock);
    zmq_ctx_term(ctx);
    for (int j = 0; j < MAX_CLASSES; j++)
        free(g->update[j]);
    free(g->c);
    free(items);
    return st == FM_OK && !stop ? 0 : 1;
}

static int make_keys(const lg_options_t *o)
{
    for (int i = 0; i < o->clients; i++) {
        char id[16], path[4200];
        snprintf(id, sizeof id, "lg%05d", i);
        snprintf(path, sizeof path, "%s/%s.key", o->keys, id);
        FILE *f = fopen(path, "r");
        if (f) { /* made before */
            fclose(f);
            continue;
        }
        fm_key_t k;
        if (fm_key_generate(&k, id) != FM_OK || fm_key_write(&k, o->keys) != FM_OK) {
            fm_errorf("%s", fm_error_last());
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    static lg_t g;
    g.o = (lg_options_t){.connect = "tcp://127.0.0.1:5555", .clients = 100, .classes = 5};
    g.heartbeat_s = HEARTBEAT_S;
    static const struct option opts[] = {
        {"connect", required_argument, 0, 'c'}, {"clients", required_argument, 0, 'n'},
        {"keys", required_argument, 0, 'k'},    {"server-key", required_argument, 0, 's'},
        {"insecure", no_argument, 0, 'i'},      {"spread", required_argument, 0, 'p'},
        {"classes", required_argument, 0, 'l'}, {"make-keys", no_argument, 0, 'm'},
        {"first", required_argument, 0, 'f'},   {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (ch) {
        case 'c': g.o.connect = optarg; break;
        case 'n': g.o.clients = atoi(optarg); break;
        case 'k': g.o.keys = optarg; break;
        case 's': g.o.server_key = optarg; break;
        case 'i': g.o.insecure = true; break;
        case 'p': g.o.spread = atof(optarg); break;
        case 'l': g.o.classes = atoi(optarg); break;
        case 'm': g.o.make_keys = true; break;
        case 'f': g.o.first = atoi(optarg); break;
        case 'h':
            printf("usage: fedmoe-loadgen --connect EP --clients N [--keys DIR --server-key FILE | --insecure]\n"
                   "                      [--spread S] [--classes C] [--first I]\n"
                   "       fedmoe-loadgen --keys DIR --clients N --make-keys\n"
                   "Protocol-correct clients that answer every Task without training (a load for the\n"
                   "coordinator); client i is lgNNNNN (from I: several processes share a load) and\n"
                   "uploads the Task's state plus offset i %% C.\n");
            return 0;
        default: return 2;
        }
    }
    if (g.o.clients < 1 || g.o.clients > 100000 || g.o.first < 0 || g.o.first > 100000 || g.o.classes < 1 || g.o.classes > MAX_CLASSES ||
        !(g.o.spread >= 0.0) || (!g.o.insecure && (!g.o.keys || (!g.o.make_keys && !g.o.server_key)))) {
        fprintf(stderr, "fedmoe-loadgen: bad arguments (see --help)\n");
        return 2;
    }
    if (g.o.make_keys)
        return make_keys(&g.o);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    return run(&g);
}
