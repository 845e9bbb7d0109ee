/* The client host (host.h): one poll loop over every session's connection,
 * a pool of training workers, and what a virtual host's clients share (the
 * ZeroMQ context, the dataset's copy, the newest round). The loop thread owns
 * every session and socket; a worker touches only the session whose job it
 * runs, between the loop's hand-out and its work_done. */
#include "host.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>
#include <zmq.h>

#include "fedmoe/clock.h"
#include "fedmoe/log.h"
#include "fedmoe/wire.h"
#include "link.h"

/* At most so many clients of a host between connecting and their Welcome (or
 * CONNECTING_S): a host starting thousands of clients at once would overflow
 * the coordinator's listen queue and turn the dropped connections into a
 * storm of retries. */
#define CONNECTING_MAX 512
#define CONNECTING_S 10.0

/* The sessions' timers run this often (heartbeats are due every 0.5 s at the
 * most often). */
#define TICK_S 0.1

/* Freed model memory is given back to the system at most this often: left in
 * the arenas between the small allocations that stay, it fragmented them
 * (1,000 clients, 100 rounds: 3.8 GB). Measured with bench/virtual.sh, 200
 * clients, half a round, 40 rounds: peak 1,341 MB -> 803 MB, median round
 * 4.2 s -> 5.4 s (the pages fault in again); after every Task, rounds were
 * three times slower. */
#define TRIM_EVERY_S 5.0

#define EV_WAKE UINT64_MAX /* epoll's tag of the workers' wake-up; a member's is 2i, its monitor's 2i+1 */

typedef enum { M_UNOPENED, M_LIVE, M_BUSY, M_OVER } member_state_t;

struct host;
typedef struct {
    struct host *h;
    fm_session_t *s;
    fm_link_t link;
    member_state_t state;
    bool holding;        /* holds a place to connect (until welcomed, or CONNECTING_S) */
    bool sent;           /* sent since its socket's events were last read */
    double opened;
    fm_status failed;    /* a failure met while its job was out (said): ended when it comes back */
} member_t;

typedef struct host {
    const fm_session_config_t *base;
    const fm_host_config_t *hc;
    bool virt;
    volatile sig_atomic_t *stop;
    void *ctx;            /* the shared context (virtual) */
    member_t *m;
    int n, opened, live, connecting;
    int epfd, wake;
    fm_status first;      /* the first failure, and why */
    char why[512];
    /* the workers, and the jobs between them and the loop */
    pthread_t *threads;
    int workers, started;
    pthread_mutex_t lock;
    pthread_cond_t more;
    int *queue, qhead, qlen; /* members whose job waits for a worker (a ring of n) */
    int *done, dlen;         /* members whose job is back */
    int *back;               /* (the loop's copy of done, taken at once) */
    bool quit;
    /* shared by a virtual host's clients */
    fm_data_cache_t cache;
    bool cached;
    fm_data_spec_t failed; /* the data that could not be loaded, and why */
    char failed_dataset[256];
    bool has_failed;
    char failed_why[512];
    double trimmed;
    char run_id[64];      /* the newest round any client trained, and its run */
    int newest_round;
} host_t;

/* ---- the workers ---- */

static void *worker_main(void *arg)
{
    host_t *h = arg;
    pthread_mutex_lock(&h->lock);
    for (;;) {
        while (!h->qlen && !h->quit)
            pthread_cond_wait(&h->more, &h->lock);
        if (h->quit)
            break;
        int i = h->queue[h->qhead];
        h->qhead = (h->qhead + 1) % h->n;
        h->qlen--;
        pthread_mutex_unlock(&h->lock);
        fm_session_work(h->m[i].s, h->stop);
        pthread_mutex_lock(&h->lock);
        h->done[h->dlen++] = i;
        uint64_t one = 1;
        if (write(h->wake, &one, sizeof one) < 0) { /* (a full counter is still a wake-up) */
        }
    }
    pthread_mutex_unlock(&h->lock);
    return NULL;
}

static void hand_out(host_t *h, int i)
{
    h->m[i].state = M_BUSY;
    pthread_mutex_lock(&h->lock);
    h->queue[(h->qhead + h->qlen++) % h->n] = i;
    pthread_cond_signal(&h->more);
    pthread_mutex_unlock(&h->lock);
}

static fm_status start_workers(host_t *h)
{
    if (!(h->threads = calloc((size_t)h->workers, sizeof *h->threads)))
        return FM_ERR_NOMEM;
    for (; h->started < h->workers; h->started++)
        if (pthread_create(&h->threads[h->started], NULL, worker_main, h) != 0) {
            fm_error_set("cannot start a training worker");
            return FM_ERR_NOMEM;
        }
    return FM_OK;
}

/* Jobs not begun are dropped; those running end at their next progress check
 * (*stop is set) or when done. */
static void stop_workers(host_t *h)
{
    pthread_mutex_lock(&h->lock);
    h->quit = true;
    h->qlen = 0;
    pthread_cond_broadcast(&h->more);
    pthread_mutex_unlock(&h->lock);
    for (int i = 0; i < h->started; i++)
        pthread_join(h->threads[i], NULL);
    free(h->threads);
}

/* ---- what a virtual host's sessions share (their ops) ---- */

/* A client's data from the shared copy, loaded at the first Welcome (a
 * dataset that failed is not tried again for every client). */
static fm_status shared_data(void *user, const fm_data_spec_t *spec, fm_client_data_t *out)
{
    host_t *h = ((member_t *)user)->h;
    if (h->has_failed && fm_data_spec_same(&h->failed, spec)) {
        fm_error_set("%s", h->failed_why);
        return FM_ERR_ARG;
    }
    if (!h->cached || !fm_data_cache_serves(&h->cache, spec)) {
        if (h->cached)
            fm_data_cache_free(&h->cache);
        h->cached = fm_data_cache_load(&h->cache, spec) == FM_OK;
        if (!h->cached) {
            h->has_failed = true;
            h->failed = *spec;
            snprintf(h->failed_dataset, sizeof h->failed_dataset, "%s", spec->dataset);
            h->failed.dataset = h->failed_dataset;
            snprintf(h->failed_why, sizeof h->failed_why, "%s", fm_error_last());
            return FM_ERR_ARG;
        }
        fm_info("virtual host: dataset %s loaded once for its clients (%zu examples, %d partitions)", spec->dataset,
                h->cache.all.n, spec->count);
    }
    return fm_client_data_from_cache(out, &h->cache, spec->index);
}

static void released(void *user)
{
    host_t *h = ((member_t *)user)->h;
    double now = fm_clock_seconds();
    if (now - h->trimmed >= TRIM_EVERY_S) {
        h->trimmed = now;
        malloc_trim(0);
    }
}

/* The rounds the clients trained: a round older than the newest one of its
 * run is over (a round number moves on only when its round commits), so what
 * a client kept to run it again can go. */
static void saw_round(void *user, const char *run_id, int round)
{
    host_t *h = ((member_t *)user)->h;
    if (strcmp(h->run_id, run_id) != 0) {
        snprintf(h->run_id, sizeof h->run_id, "%s", run_id);
        h->newest_round = 0;
    }
    h->newest_round = round > h->newest_round ? round : h->newest_round;
}

static bool round_over(void *user, const char *run_id, int round)
{
    host_t *h = ((member_t *)user)->h;
    return strcmp(h->run_id, run_id) == 0 && round < h->newest_round;
}

static fm_status member_send(void *user, const uint8_t *msg, size_t len)
{
    member_t *m = user;
    m->sent = true;
    return fm_link_send(&m->link, msg, len);
}

/* ---- the members ---- */

static int index_of(const host_t *h, const member_t *m) { return (int)(m - h->m); }

static void epoll_watch(host_t *h, void *sock, uint64_t tag, int op)
{
    int fd;
    size_t sz = sizeof fd;
    if (!sock || zmq_getsockopt(sock, ZMQ_FD, &fd, &sz) != 0)
        return;
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = tag};
    if (epoll_ctl(h->epfd, op, fd, &ev) != 0 && op == EPOLL_CTL_ADD)
        fm_warn("a client's socket is not watched (epoll: %s): its messages wait for its next heartbeat",
                strerror(errno));
}

/* A client's failure: said (a virtual host's, with its id), and the first
 * one kept for the host's exit. */
static void record_failure(host_t *h, fm_status st, const char *id)
{
    char why[512];
    snprintf(why, sizeof why, "%s", fm_error_last());
    if (h->virt)
        fm_errorf("client %s: %s", id, why);
    if (h->first == FM_OK) {
        h->first = st;
        if (h->virt)
            snprintf(h->why, sizeof h->why, "client %s: %.400s", id, why);
        else
            snprintf(h->why, sizeof h->why, "%s", why);
    }
}

/* A member is over: ended well (st FM_OK), or failed (its reason in the
 * last error); its socket and session go. */
static void member_over(host_t *h, member_t *m, fm_status st, const char *id)
{
    int i = index_of(h, m);
    if (st != FM_OK)
        record_failure(h, st, id);
    if (m->holding)
        h->connecting--;
    m->holding = false;
    epoll_watch(h, m->link.sock, 2 * (uint64_t)i, EPOLL_CTL_DEL);
    epoll_watch(h, m->link.mon, 2 * (uint64_t)i + 1, EPOLL_CTL_DEL);
    fm_link_close(&m->link);
    fm_session_destroy(&m->s);
    m->state = M_OVER;
    h->live--;
}

/* Reads the member's waiting messages into its session (none while its job
 * is out: they wait in the socket, as they would for a client busy
 * training); reading the socket's events also clears its wake-up. */
static void serve(host_t *h, member_t *m, double now)
{
    m->sent = false;
    while (m->state == M_LIVE) {
        int events = 0;
        size_t sz = sizeof events;
        if (zmq_getsockopt(m->link.sock, ZMQ_EVENTS, &events, &sz) != 0 || !(events & ZMQ_POLLIN))
            return;
        uint8_t *msg = NULL;
        size_t len = 0;
        fm_status got = fm_wire_recv(m->link.sock, ZMQ_DONTWAIT, (size_t)1 << 31, &msg, &len);
        if (got != FM_OK) {
            if (got != FM_ERR_STATE)
                fm_warn("bad message from the coordinator: %s", fm_error_last());
            continue;
        }
        fm_status st = fm_session_handle(m->s, msg, len, now);
        free(msg);
        if (st != FM_OK || fm_session_ended(m->s))
            member_over(h, m, st, fm_session_id(m->s));
        else if (fm_session_job_waiting(m->s))
            hand_out(h, index_of(h, m));
    }
    if (m->state == M_BUSY) { /* (clears the wake-up; the messages stay) */
        int events;
        size_t sz = sizeof events;
        zmq_getsockopt(m->link.sock, ZMQ_EVENTS, &events, &sz);
    }
}

/* The member's timers, its handshakes and its place to connect. */
static void tick(host_t *h, member_t *m, double now)
{
    fm_status st = fm_link_check(&m->link, now);
    if (st == FM_OK && (st = fm_session_tick(m->s, now)) == FM_ERR_IO)
        fm_error_set("%s%s", fm_error_last(), fm_link_why_silent(&m->link));
    if (m->holding && (fm_session_welcomed(m->s) || now - m->opened > CONNECTING_S)) {
        m->holding = false; /* (not welcomed yet, refused or no coordinator: it goes on trying, out of the way) */
        h->connecting--;
    }
    if (st != FM_OK && m->state == M_BUSY) {
        record_failure(h, st, fm_session_id(m->s));
        m->failed = st; /* (ended when its job is back) */
    } else if (st != FM_OK) {
        member_over(h, m, st, fm_session_id(m->s));
    } else if (m->sent) {
        serve(h, m, now); /* (a send may have taken its socket's wake-up) */
    }
}

/* Client i's id and key file (a virtual one's), into id and key. */
static fm_status member_names(const host_t *h, int i, char id[64], char key[1024])
{
    const fm_session_config_t *b = h->base;
    snprintf(key, 1024, "%s", b->key);
    if (!h->virt) {
        snprintf(id, 64, "%s", b->id);
        return FM_OK;
    }
    int number = h->hc->first_partition >= 0 ? h->hc->first_partition + i : i; /* (hosts of one run differ) */
    if (snprintf(id, 64, "%s-%05d", b->id, number) >= 64) {
        fm_error_set("--id %s is too long for virtual client ids (ID-NNNNN)", b->id);
        return FM_ERR_ARG;
    }
    if (!b->insecure && snprintf(key, 1024, "%.950s/%s.key", h->hc->keys, id) >= 1024) {
        fm_error_set("--keys %s: too long a path", h->hc->keys);
        return FM_ERR_ARG;
    }
    return FM_OK;
}

/* Opens client i: its session, its connection, its first tick (a Hello). */
static void member_open(host_t *h, int i, double now)
{
    member_t *m = &h->m[i];
    char id[64], key[1024];
    fm_status st = member_names(h, i, id, key);
    int partition = h->virt && h->hc->first_partition >= 0 ? h->hc->first_partition + i : -1;
    fm_session_ops_t ops = {.send = member_send, .user = m};
    if (h->virt) {
        ops.data = shared_data;
        ops.saw_round = saw_round;
        ops.round_over = round_over;
        ops.released = released;
    }
    m->h = h;
    if (st == FM_OK)
        st = fm_session_new(&m->s, h->base, id, partition, &ops);
    if (st == FM_OK)
        st = fm_link_open(&m->link, h->base, id, key, h->ctx);
    h->opened++;
    m->state = M_LIVE;
    h->live++;
    m->holding = h->virt;
    h->connecting += m->holding;
    m->opened = now;
    if (st != FM_OK) { /* (this client's key, say: the others go on) */
        member_over(h, m, st, id);
        return;
    }
    epoll_watch(h, m->link.sock, 2 * (uint64_t)i, EPOLL_CTL_ADD);
    epoll_watch(h, m->link.mon, 2 * (uint64_t)i + 1, EPOLL_CTL_ADD);
    if (!h->virt)
        fm_info("client %s connecting to %s (%s)", id, h->base->connect, h->base->insecure ? "INSECURE" : "CURVE");
    tick(h, m, now);
}

/* ---- the loop ---- */

/* The jobs the workers brought back: what they made is sent, and their
 * sessions read their sockets again. */
static void collect(host_t *h, double now)
{
    uint64_t count;
    if (read(h->wake, &count, sizeof count) < 0 && errno != EAGAIN)
        fm_warn("reading the workers' wake-up: %s", strerror(errno));
    pthread_mutex_lock(&h->lock); /* (all of them: the workers go on meanwhile) */
    int n = h->dlen;
    memcpy(h->back, h->done, sizeof(int) * (size_t)n);
    h->dlen = 0;
    pthread_mutex_unlock(&h->lock);
    for (int k = 0; k < n; k++) {
        member_t *m = &h->m[h->back[k]];
        m->state = M_LIVE;
        fm_status st = fm_session_work_done(m->s, now);
        if (m->failed != FM_OK)
            member_over(h, m, FM_OK, fm_session_id(m->s)); /* (its failure said already) */
        else if (st != FM_OK)
            member_over(h, m, st, fm_session_id(m->s));
        else
            serve(h, m, now);
    }
}

static void tick_all(host_t *h, double now)
{
    for (int i = 0; i < h->opened; i++)
        if (h->m[i].state == M_LIVE || h->m[i].state == M_BUSY)
            tick(h, &h->m[i], now);
}

static fm_status loop(host_t *h)
{
    struct epoll_event evs[256];
    double last_tick = 0.0;
    while (!*h->stop) {
        double now = fm_clock_seconds();
        while (h->opened < h->n && h->connecting < CONNECTING_MAX)
            member_open(h, h->opened, now);
        if (h->live == 0 && h->opened == h->n)
            break;
        int k = epoll_wait(h->epfd, evs, 256, (int)(TICK_S * 1000));
        if (k < 0 && errno != EINTR) {
            fm_error_set("epoll: %s", strerror(errno));
            *h->stop = 1; /* (the jobs out end at their next progress check) */
            return FM_ERR_IO;
        }
        now = fm_clock_seconds();
        for (int e = 0; e < k; e++) {
            uint64_t tag = evs[e].data.u64;
            if (tag == EV_WAKE) {
                collect(h, now);
                continue;
            }
            member_t *m = &h->m[tag / 2];
            if (m->state == M_OVER)
                continue;
            if (tag % 2)
                tick(h, m, now); /* (its handshakes) */
            else
                serve(h, m, now);
        }
        if (now - last_tick >= TICK_S) {
            tick_all(h, now);
            last_tick = now;
        }
    }
    return FM_OK;
}

/* File descriptors for n clients (a socket's and its connection's each): the
 * soft limit raised as far as allowed, and a clear error when that is short. */
static fm_status enough_descriptors(int n)
{
    struct rlimit rl;
    rlim_t need = (rlim_t)fm_host_descriptors(n);
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

/* The host's parts: members, the epoll set and wake-up, the shared context
 * (virtual), the workers. */
static fm_status host_open(host_t *h)
{
    char id[64], key[1024];
    fm_status st = h->virt ? member_names(h, h->n - 1, id, key) : FM_OK; /* (the longest id) */
    if (st == FM_OK && h->virt)
        st = enough_descriptors(h->n);
    if (st != FM_OK)
        return st;
    h->m = calloc((size_t)h->n, sizeof *h->m);
    h->queue = calloc((size_t)h->n, sizeof *h->queue);
    h->done = calloc((size_t)h->n, sizeof *h->done);
    h->back = calloc((size_t)h->n, sizeof *h->back);
    if (!h->m || !h->queue || !h->done || !h->back)
        return FM_ERR_NOMEM;
    if ((h->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0 || (h->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
        fm_error_set("cannot poll: %s", strerror(errno));
        return FM_ERR_IO;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = EV_WAKE};
    epoll_ctl(h->epfd, EPOLL_CTL_ADD, h->wake, &ev);
    if (h->virt) {
        if (!(h->ctx = zmq_ctx_new())) {
            fm_error_set("cannot create a ZeroMQ context: %s", zmq_strerror(zmq_errno()));
            return FM_ERR_IO;
        }
        zmq_ctx_set(h->ctx, ZMQ_MAX_SOCKETS, h->n + 64);
        /* a malloc arena per worker, not per thread: the freed memory of the
         * models they built stays in few arenas */
        mallopt(M_ARENA_MAX, h->workers + 1);
    }
    return start_workers(h);
}

static void host_close(host_t *h)
{
    if (h->started || h->threads)
        stop_workers(h);
    for (int i = 0; h->m && i < h->opened; i++)
        if (h->m[i].state != M_OVER) {
            fm_link_close(&h->m[i].link);
            fm_session_destroy(&h->m[i].s);
        }
    if (h->cached)
        fm_data_cache_free(&h->cache);
    if (h->ctx)
        zmq_ctx_term(h->ctx);
    if (h->epfd >= 0)
        close(h->epfd);
    if (h->wake >= 0)
        close(h->wake);
    free(h->m);
    free(h->queue);
    free(h->done);
    free(h->back);
}

fm_status fm_host_run(const fm_session_config_t *base, const fm_host_config_t *hc, volatile sig_atomic_t *stop)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    host_t h = {.base = base, .hc = hc, .virt = hc->clients > 0, .stop = stop, .epfd = -1, .wake = -1};
    h.n = h.virt ? hc->clients : 1;
    h.workers = hc->workers > 0 ? hc->workers : !h.virt ? 1 : cores > 0 ? (int)cores : 1;
    pthread_mutex_init(&h.lock, NULL);
    pthread_cond_init(&h.more, NULL);
    if (h.virt)
        fm_info("virtual host: %d clients (%s-00000 ...), %d training at once", h.n, base->id, h.workers);
    fm_status st = host_open(&h);
    if (st == FM_OK)
        st = loop(&h);
    host_close(&h);
    pthread_mutex_destroy(&h.lock);
    pthread_cond_destroy(&h.more);
    if (st != FM_OK)
        return st;
    if (h.first != FM_OK)
        fm_error_set("%s", h.why);
    return h.first;
}
