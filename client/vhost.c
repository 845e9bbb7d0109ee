#include "vhost.h"

#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "fedmoe/clock.h"
#include "fedmoe/log.h"

#define STACK_BYTES ((size_t)2 << 20) /* a client thread's stack (training uses the heap) */

/* At most so many clients of a host between connecting and their Welcome: a
 * host starting thousands of clients at once would overflow the coordinator's
 * listen queue and turn the dropped connections into a storm of retries. */
#define CONNECTING_MAX 512

/* Freed model memory is given back to the system at most this often: left in
 * the arenas between the small allocations that stay, it fragmented them
 * (1,000 clients, 100 rounds: 3.8 GB). Measured with bench/virtual.sh, 200
 * clients, half a round, 40 rounds: peak 1,341 MB -> 803 MB, median round
 * 4.2 s -> 5.4 s (the pages fault in again); after every Task, rounds were
 * three times slower. */
#define TRIM_EVERY_S 5.0

/* A counted gate: at most `left` holders at once. */
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t free;
    int left;
} gate_t;

static void gate_init(gate_t *g, int n)
{
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->free, NULL);
    g->left = n;
}

/* Waits for a place, calling wait(user) every half second meanwhile (when
 * given); false, without a place, once *stop is set (when given). */
static bool gate_enter(gate_t *g, void (*wait)(void *user), void *user, volatile sig_atomic_t *stop)
{
    pthread_mutex_lock(&g->lock);
    while (g->left == 0 && !(stop && *stop)) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 500000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        if (pthread_cond_timedwait(&g->free, &g->lock, &until) != 0 && wait) {
            pthread_mutex_unlock(&g->lock); /* (heartbeats while waiting) */
            wait(user);
            pthread_mutex_lock(&g->lock);
        }
    }
    bool in = g->left > 0 && !(stop && *stop);
    g->left -= in;
    pthread_mutex_unlock(&g->lock);
    return in;
}

static void gate_leave(gate_t *g)
{
    pthread_mutex_lock(&g->lock);
    g->left++;
    pthread_cond_signal(&g->free);
    pthread_mutex_unlock(&g->lock);
}

struct fm_vhost {
    void *ctx;
    pthread_mutex_t data_lock;
    fm_data_cache_t cache;
    bool cached;
    fm_data_spec_t failed; /* the data that could not be loaded, and why */
    char failed_dataset[256];
    bool has_failed;
    char why[512];
    gate_t turn;    /* trainings at once: the workers */
    gate_t connect; /* clients connecting at once (CONNECTING_MAX) */
    pthread_mutex_t lock; /* (not data_lock, held while the dataset loads) for: */
    double trimmed;       /* when freed memory was last given back */
    char run_id[64];      /* the newest round any client was sent, and its run */
    int newest_round;
};

typedef struct {
    fm_session_config_t cfg;
    volatile sig_atomic_t *stop;
    pthread_t thread;
    bool started;
    fm_status st;
    char why[512];
} vclient_t;

void *fm_vhost_zmq(fm_vhost_t *h) { return h->ctx; }

fm_status fm_vhost_data(fm_vhost_t *h, const fm_data_spec_t *spec, fm_client_data_t *out)
{
    pthread_mutex_lock(&h->data_lock);
    fm_status st = FM_OK;
    if (h->has_failed && fm_data_spec_same(&h->failed, spec)) { /* (not once more per client) */
        fm_error_set("%s", h->why);
        pthread_mutex_unlock(&h->data_lock);
        return FM_ERR_ARG;
    }
    if (!h->cached || !fm_data_cache_serves(&h->cache, spec)) {
        if (h->cached)
            fm_data_cache_free(&h->cache);
        h->cached = (st = fm_data_cache_load(&h->cache, spec)) == FM_OK;
        if (!h->cached) {
            h->has_failed = true;
            h->failed = *spec;
            snprintf(h->failed_dataset, sizeof h->failed_dataset, "%s", spec->dataset);
            h->failed.dataset = h->failed_dataset;
            snprintf(h->why, sizeof h->why, "%s", fm_error_last());
        }
        if (h->cached)
            fm_info("virtual host: dataset %s loaded once for its clients (%zu examples, %d partitions)",
                    spec->dataset, h->cache.all.n, spec->count);
    }
    if (st == FM_OK)
        st = fm_client_data_from_cache(out, &h->cache, spec->index);
    pthread_mutex_unlock(&h->data_lock);
    return st;
}

void fm_vhost_train_enter(fm_vhost_t *h, void (*wait)(void *user), void *user)
{
    gate_enter(&h->turn, wait, user, NULL);
}

void fm_vhost_train_leave(fm_vhost_t *h) { gate_leave(&h->turn); }

bool fm_vhost_connect_enter(fm_vhost_t *h, volatile sig_atomic_t *stop)
{
    return gate_enter(&h->connect, NULL, NULL, stop);
}

void fm_vhost_connect_leave(fm_vhost_t *h) { gate_leave(&h->connect); }

void fm_vhost_trim(fm_vhost_t *h)
{
    pthread_mutex_lock(&h->lock);
    double now = fm_clock_seconds();
    bool due = now - h->trimmed >= TRIM_EVERY_S;
    h->trimmed = due ? now : h->trimmed;
    pthread_mutex_unlock(&h->lock);
    if (due)
        malloc_trim(0);
}

void fm_vhost_saw_round(fm_vhost_t *h, const char *run_id, int round)
{
    pthread_mutex_lock(&h->lock);
    if (strcmp(h->run_id, run_id) != 0) {
        snprintf(h->run_id, sizeof h->run_id, "%s", run_id);
        h->newest_round = 0;
    }
    h->newest_round = round > h->newest_round ? round : h->newest_round;
    pthread_mutex_unlock(&h->lock);
}

bool fm_vhost_round_over(fm_vhost_t *h, const char *run_id, int round)
{
    pthread_mutex_lock(&h->lock);
    bool over = strcmp(h->run_id, run_id) == 0 && round < h->newest_round;
    pthread_mutex_unlock(&h->lock);
    return over;
}

static void *client_main(void *arg)
{
    vclient_t *v = arg;
    v->st = fm_session_run(&v->cfg, v->stop);
    if (v->st != FM_OK) {
        snprintf(v->why, sizeof v->why, "%s", fm_error_last());
        fm_errorf("client %s: %s", v->cfg.id, v->why);
    }
    return NULL;
}

/* File descriptors for n clients (a socket's and its connection's each): the
 * soft limit raised as far as allowed, and a clear error when that is short. */
static fm_status enough_descriptors(int n)
{
    struct rlimit rl;
    rlim_t need = (rlim_t)fm_vhost_descriptors(n);
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return FM_OK;
    if (rl.rlim_cur < need) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need ? need : rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
        fm_error_set("%d virtual clients need %llu file descriptors; the limit is %llu (raise ulimit -n)", n,
                     (unsigned long long)need, (unsigned long long)rl.rlim_cur);
        return FM_ERR_ARG;
    }
    return FM_OK;
}

/* Client i's settings: base's, with its own id, key and partition. */
static fm_status client_config(const fm_session_config_t *base, const fm_vhost_config_t *vc, int i,
                               fm_vhost_t *h, fm_session_config_t *out)
{
    *out = *base;
    out->host = h;
    int number = vc->first_partition >= 0 ? vc->first_partition + i : i; /* (hosts of one run differ) */
    if (snprintf(out->id, sizeof out->id, "%s-%05d", base->id, number) >= (int)sizeof out->id) {
        fm_error_set("--id %s is too long for virtual client ids (ID-NNNNN)", base->id);
        return FM_ERR_ARG;
    }
    if (!base->insecure && snprintf(out->key, sizeof out->key, "%.950s/%s.key", vc->keys, out->id) >= (int)sizeof out->key) {
        fm_error_set("--keys %s: too long a path", vc->keys);
        return FM_ERR_ARG;
    }
    if (vc->first_partition >= 0)
        out->partition_index = vc->first_partition + i;
    return FM_OK;
}

fm_status fm_vhost_run(const fm_session_config_t *base, const fm_vhost_config_t *vc, volatile sig_atomic_t *stop)
{
    int n = vc->clients, cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    int workers = vc->workers > 0 ? vc->workers : cores > 0 ? cores : 1;
    fm_vhost_t h = {0};
    gate_init(&h.turn, workers);
    gate_init(&h.connect, CONNECTING_MAX);
    /* a malloc arena per worker, not per thread: thousands of threads each
     * keeping the freed memory of the models they built would hold gigabytes */
    mallopt(M_ARENA_MAX, workers + 1);
    pthread_mutex_init(&h.data_lock, NULL);
    pthread_mutex_init(&h.lock, NULL);
    vclient_t *v = calloc((size_t)n, sizeof *v);
    fm_status st = v ? enough_descriptors(n) : FM_ERR_NOMEM;
    if (st == FM_OK && !(h.ctx = zmq_ctx_new()))
        st = FM_ERR_IO;
    if (h.ctx)
        zmq_ctx_set(h.ctx, ZMQ_MAX_SOCKETS, n + 64);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, STACK_BYTES);
    fm_info("virtual host: %d clients (%s-00000 ...), %d training at once", n, base->id, workers);
    for (int i = 0; st == FM_OK && i < n; i++) {
        v[i].stop = stop;
        if ((st = client_config(base, vc, i, &h, &v[i].cfg)) != FM_OK)
            break;
        if (pthread_create(&v[i].thread, &attr, client_main, &v[i]) != 0) {
            fm_error_set("cannot start the thread of virtual client %d", i);
            st = FM_ERR_NOMEM;
            break;
        }
        v[i].started = true;
    }
    if (st != FM_OK)
        *stop = 1; /* (the clients started leave) */
    fm_status first = st;
    char why[512] = "";
    if (st != FM_OK)
        snprintf(why, sizeof why, "%s", fm_error_last());
    for (int i = 0; v && i < n; i++) {
        if (!v[i].started)
            continue;
        pthread_join(v[i].thread, NULL);
        if (first == FM_OK && v[i].st != FM_OK) {
            first = v[i].st;
            snprintf(why, sizeof why, "client %s: %.400s", v[i].cfg.id, v[i].why);
        }
    }
    pthread_attr_destroy(&attr);
    if (h.cached)
        fm_data_cache_free(&h.cache);
    if (h.ctx)
        zmq_ctx_term(h.ctx);
    free(v);
    if (first != FM_OK)
        fm_error_set("%s", why);
    return first;
}
