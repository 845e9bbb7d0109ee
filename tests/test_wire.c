/* The protocol codec: round trips, and every kind of bad input rejected with the
 * right code: too large, random bytes, truncated, wrong version, no body, tensors
 * with a wrong name, shape, length, digest, or non-finite values. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "fedmoe/rng.h"
#include "fedmoe/runspec.h"
#include "fedmoe/runspec_wire.h"
#include "fedmoe/secagg.h"
#include "fedmoe/wire.h"

static void make_update(Fedmoe__Envelope *env, Fedmoe__Update *up, Fedmoe__Tensor *t, Fedmoe__Tensor **list,
                        const float *x, uint32_t rows, uint32_t cols)
{
    fedmoe__envelope__init(env);
    fedmoe__update__init(up);
    assert_int_equal(fm_wire_tensor_set(t, "model", x, rows, cols), FM_OK);
    list[0] = t;
    up->round = 3;
    up->n_model = 1;
    up->model = list;
    up->train_samples = 1234;
    env->body_case = FEDMOE__ENVELOPE__BODY_UPDATE;
    env->update = up;
}

static void test_round_trip(void **state)
{
    (void)state;
    float x[6] = {1, -2, 3.5f, 0, 1e-30f, -7};
    Fedmoe__Envelope env;
    Fedmoe__Update up;
    Fedmoe__Tensor t, *list[1];
    make_update(&env, &up, &t, list, x, 2, 3);
    uint8_t *buf;
    size_t len;
    assert_int_equal(fm_wire_encode(&env, &buf, &len), FM_OK);
    Fedmoe__Envelope *got;
    assert_int_equal(fm_wire_decode(buf, len, 1 << 20, &got), FM_OK);
    assert_int_equal(got->body_case, FEDMOE__ENVELOPE__BODY_UPDATE);
    assert_int_equal(got->update->round, 3);
    assert_int_equal(got->update->train_samples, 1234);
    float y[6];
    assert_int_equal(fm_wire_tensor_get(got->update->model[0], "model", 2, 3, y), FM_OK);
    assert_memory_equal(x, y, sizeof x);
    /* the bytes are little-endian float32: 1.0f is 00 00 80 3f */
    assert_int_equal(got->update->model[0]->data.data[3], 0x3f);
    assert_int_equal(got->update->model[0]->data.data[2], 0x80);
    /* the decoded message is one block of the schema's charge: its tensor's
     * bytes, its name and the Update itself lie inside it */
    const uint8_t *block = (const uint8_t *)got, *end = block + fm_wire_decode_cost(buf, len);
    const uint8_t *inside[] = {got->update->model[0]->data.data, (const uint8_t *)got->update->model[0]->name,
                               (const uint8_t *)got->update};
    for (int i = 0; i < 3; i++)
        assert_true(inside[i] > block && inside[i] < end);
    /* wrong expectations are rejected */
    assert_int_equal(fm_wire_tensor_get(got->update->model[0], "prompt", 2, 3, y), FM_ERR_FORMAT);
    assert_int_equal(fm_wire_last_code(), FM_WIRE_BAD_TENSOR);
    assert_int_equal(fm_wire_tensor_get(got->update->model[0], "model", 3, 2, y), FM_ERR_FORMAT);
    assert_int_equal(fm_wire_last_code(), FM_WIRE_BAD_TENSOR);
    assert_int_equal(fm_wire_tensor_get(NULL, "model", 2, 3, y), FM_ERR_FORMAT);
    /* a flipped data byte breaks the digest */
    got->update->model[0]->data.data[5] ^= 1;
    assert_int_equal(fm_wire_tensor_get(got->update->model[0], "model", 2, 3, y), FM_ERR_FORMAT);
    assert_int_equal(fm_wire_last_code(), FM_WIRE_BAD_TENSOR);
    /* short data */
    got->update->model[0]->data.data[5] ^= 1;
    got->update->model[0]->data.len -= 4;
    assert_int_equal(fm_wire_tensor_get(got->update->model[0], "model", 2, 3, y), FM_ERR_FORMAT);
    fm_wire_free(got);
    /* too large, before any decoding */
    assert_int_equal(fm_wire_decode(buf, len, len - 1, &got), FM_ERR_FORMAT);
    assert_int_equal(fm_wire_last_code(), FM_WIRE_TOO_LARGE);
    assert_null(got);
    /* truncated at every length: never accepted as the same update, never a crash */
    for (size_t cut = 0; cut < len; cut++) {
        if (fm_wire_decode(buf, cut, 1 << 20, &got) == FM_OK) {
            /* a cut at a field boundary can decode; its tensor must then fail or be absent */
            bool complete = got->body_case == FEDMOE__ENVELOPE__BODY_UPDATE && got->update->n_model == 1 &&
                            fm_wire_tensor_get(got->update->model[0], "model", 2, 3, y) == FM_OK &&
                            got->update->train_samples == 1234;
            assert_false(complete);
            fm_wire_free(got);
        }
    }
    free(buf);
    fm_wire_tensor_clear(&t);
}

static void test_nan_and_version(void **state)
{
    (void)state;
    float x[4] = {1, NAN, 2, 3};
    Fedmoe__Envelope env;
    Fedmoe__Update up;
    Fedmoe__Tensor t, *list[1];
    make_update(&env, &up, &t, list, x, 1, 4);
    float y[4];
    assert_int_equal(fm_wire_tensor_get(&t, "model", 1, 4, y), FM_ERR_FORMAT);
    assert_int_equal(fm_wire_last_code(), FM_WIRE_BAD_VALUE);
    x[1] = INFINITY;
    fm_wire_tensor_clear(&t);
    make_update(&env, &up, &t, list, x, 1, 4);
    assert_int_equal(fm_wire_tensor_get(&t, "model", 1, 4, y), FM_ERR_FORMAT);
    /* wrong protocol version */
    uint8_t *buf;
    size_t len;
    assert_int_equal(fm_wire_encode(&env, &buf, &len), FM_OK);
    free(buf);
    env.protocol_version = 99;
    len = fedmoe__envelope__get_packed_size(&env);
    buf = malloc(len);
    fedmoe__envelope__pack(&env, buf);
    Fedmoe__Envelope *got;
    assert_int_equal(fm_wire_decode(buf, len, 1 << 20, &got), FM_ERR_FORMAT);
    assert_int_equal(fm_wire_last_code(), FM_WIRE_VERSION);
    free(buf);
    /* no body */
    Fedmoe__Envelope empty = FEDMOE__ENVELOPE__INIT;
    assert_int_equal(fm_wire_encode(&empty, &buf, &len), FM_OK);
    assert_int_equal(fm_wire_decode(buf, len, 1 << 20, &got), FM_ERR_FORMAT);
    assert_int_equal(fm_wire_last_code(), FM_WIRE_MALFORMED);
    free(buf);
    fm_wire_tensor_clear(&t);
}

static void test_random_bytes(void **state)
{
    (void)state;
    fm_rng_t r;
    fm_rng_init(&r, 9, 9);
    uint8_t buf[512];
    int accepted = 0;
    for (int trial = 0; trial < 20000; trial++) {
        size_t len = fm_rng_below(&r, sizeof buf);
        for (size_t i = 0; i < len; i++)
            buf[i] = (uint8_t)fm_rng_u32(&r);
        Fedmoe__Envelope *got;
        if (fm_wire_decode(buf, len, sizeof buf, &got) == FM_OK) {
            accepted++;
            fm_wire_free(got);
        }
    }
    assert_true(accepted < 20);
}

/* Decode amplification: an Update of n empty tensors is ~2 bytes a tensor on
 * the wire and a ~130-byte structure each once decoded (2.9 MB cost 192 MB).
 * Past the decode budget (and FM_WIRE_MAX_SUBMESSAGES) it is refused before
 * decoding; within it decodes. */
static void test_many_empty_tensors(void **state)
{
    (void)state;
    int counts[2] = {200, 200000}; /* (200: within the decode budget's slack) */
    for (int k = 0; k < 2; k++) {
        int n = counts[k];
        Fedmoe__Tensor *t = calloc((size_t)n, sizeof *t), **list = calloc((size_t)n, sizeof *list);
        for (int i = 0; i < n; i++) {
            fedmoe__tensor__init(&t[i]);
            list[i] = &t[i];
        }
        Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
        Fedmoe__Update up = FEDMOE__UPDATE__INIT;
        up.model = list;
        up.n_model = (size_t)n;
        env.protocol_version = FM_PROTOCOL_VERSION;
        env.body_case = FEDMOE__ENVELOPE__BODY_UPDATE;
        env.update = &up;
        size_t len = fedmoe__envelope__get_packed_size(&env);
        uint8_t *buf = malloc(len);
        fedmoe__envelope__pack(&env, buf);
        assert_true(len < 8 + 3 * (size_t)n); /* a few bytes a tensor */
        Fedmoe__Envelope *got = NULL;
        if (k == 0) {
            assert_int_equal(fm_wire_decode(buf, len, len, &got), FM_OK);
            assert_int_equal(got->update->n_model, (size_t)n);
            fm_wire_free(got);
        } else {
            assert_int_equal(fm_wire_decode(buf, len, len, &got), FM_ERR_FORMAT);
            assert_int_equal(fm_wire_last_code(), FM_WIRE_TOO_LARGE);
            assert_null(got);
        }
        free(buf);
        free(list);
        free(t);
    }
}

/* protobuf-c's allocations, counted (16 bytes a block for the allocator's own,
 * the charge the decode budget makes). */
static size_t g_allocated;
static void *counted_alloc(void *data, size_t size)
{
    (void)data;
    g_allocated += size + 16;
    return malloc(size);
}
static void counted_free(void *data, void *p)
{
    (void)data;
    free(p);
}

/* What decoding buf allocates, measured; and it is never more than the charge. */
static size_t decoded_bytes(const uint8_t *buf, size_t len)
{
    ProtobufCAllocator a = {counted_alloc, counted_free, NULL};
    g_allocated = 0;
    Fedmoe__Envelope *env = fedmoe__envelope__unpack(&a, len, buf);
    assert_non_null(env);
    fedmoe__envelope__free_unpacked(env, &a);
    assert_true(g_allocated <= fm_wire_decode_cost(buf, len));
    return g_allocated;
}

static uint8_t *pack(Fedmoe__Envelope *env, size_t *len)
{
    env->protocol_version = FM_PROTOCOL_VERSION;
    *len = fedmoe__envelope__get_packed_size(env);
    uint8_t *buf = malloc(*len + 4 * 1024 * 1024);
    assert_non_null(buf);
    fedmoe__envelope__pack(env, buf);
    return buf;
}

/* Messages built to decode large (29x, 36x and 18x their size in memory, seen
 * at 2.9 MB): unknown fields, empty repeated strings, a tensor shape of 1.46 M
 * entries. Each is refused before decoding, as too costly; an honest Update of
 * the same size decodes at about its size and is accepted. */
static void test_decode_cost_budget(void **state)
{
    (void)state;
    const size_t big = 2900000;
    Fedmoe__Envelope *got = NULL;
    /* an honest Update of 725,000 floats */
    size_t nf = big / 4;
    float *x = calloc(nf, sizeof *x);
    Fedmoe__Envelope env;
    Fedmoe__Update up;
    Fedmoe__Tensor t, *list[1];
    make_update(&env, &up, &t, list, x, 1, (uint32_t)nf);
    size_t len;
    uint8_t *buf = pack(&env, &len);
    assert_int_equal(fm_wire_decode(buf, len, len, &got), FM_OK);
    fm_wire_free(got);
    assert_true(decoded_bytes(buf, len) < len + 4096);
    fm_wire_tensor_clear(&t);
    free(buf);
    free(x);

    /* a Heartbeat followed by ~970,000 unknown fields (3 bytes each) */
    Fedmoe__Heartbeat hb = FEDMOE__HEARTBEAT__INIT;
    fedmoe__envelope__init(&env);
    env.body_case = FEDMOE__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    buf = pack(&env, &len);
    size_t head = len;
    while (len + 3 <= big) { /* field 1000, varint 0 */
        buf[len++] = 0xc0;
        buf[len++] = 0x3e;
        buf[len++] = 0x00;
    }
    size_t small = head + 3 * 10000; /* (a short run of them is within the slack, and measured) */
    assert_true(decoded_bytes(buf, small) > 10 * small);
    assert_int_equal(fm_wire_decode(buf, len, len, &got), FM_ERR_FORMAT);
    assert_int_equal(fm_wire_last_code(), FM_WIRE_TOO_LARGE);
    assert_null(got);
    free(buf);

    /* a Hello with 1.45 M empty capabilities (2 bytes each) */
    size_t nc = big / 2;
    char **caps = malloc(nc * sizeof *caps);
    for (size_t i = 0; i < nc; i++)
        caps[i] = "";
    Fedmoe__Hello h = FEDMOE__HELLO__INIT;
    h.client_id = "x";
    h.capabilities = caps;
    h.n_capabilities = nc;
    fedmoe__envelope__init(&env);
    env.body_case = FEDMOE__ENVELOPE__BODY_HELLO;
    env.hello = &h;
    buf = pack(&env, &len);
    h.n_capabilities = 10000;
    size_t slen;
    uint8_t *sbuf = pack(&env, &slen);
    assert_true(decoded_bytes(sbuf, slen) > 10 * slen);
    free(sbuf);
    assert_int_equal(fm_wire_decode(buf, len, len, &got), FM_ERR_FORMAT);
    assert_int_equal(fm_wire_last_code(), FM_WIRE_TOO_LARGE);
    free(buf);
    free(caps);

    /* a tensor whose shape has 1.45 M entries (packed, 2 bytes each) */
    size_t ns = big / 2;
    uint32_t *shape = malloc(ns * sizeof *shape);
    for (size_t i = 0; i < ns; i++)
        shape[i] = 200;
    Fedmoe__Tensor bad = FEDMOE__TENSOR__INIT;
    bad.name = "model";
    bad.shape = shape;
    bad.n_shape = ns;
    Fedmoe__Tensor *blist[1] = {&bad};
    fedmoe__envelope__init(&env);
    fedmoe__update__init(&up);
    up.model = blist;
    up.n_model = 1;
    env.body_case = FEDMOE__ENVELOPE__BODY_UPDATE;
    env.update = &up;
    buf = pack(&env, &len);
    assert_int_equal(fm_wire_decode(buf, len, len, &got), FM_ERR_FORMAT);
    assert_int_equal(fm_wire_last_code(), FM_WIRE_TOO_LARGE);
    bad.n_shape = 10000;
    sbuf = pack(&env, &slen);
    assert_true(decoded_bytes(sbuf, slen) > 2 * slen);
    free(sbuf);
    free(buf);
    free(shape);
}

static void test_zmq_router_dealer(void **state)
{
    (void)state;
    void *ctx = zmq_ctx_new();
    void *router = zmq_socket(ctx, ZMQ_ROUTER), *dealer = zmq_socket(ctx, ZMQ_DEALER);
    assert_int_equal(zmq_bind(router, "tcp://127.0.0.1:*"), 0);
    char ep[256];
    size_t eplen = sizeof ep;
    zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, ep, &eplen);
    zmq_setsockopt(dealer, ZMQ_ROUTING_ID, "client-7", 8);
    assert_int_equal(zmq_connect(dealer, ep), 0);
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    Fedmoe__Heartbeat hb = FEDMOE__HEARTBEAT__INIT;
    hb.unix_ms = 42;
    env.body_case = FEDMOE__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    int timeout = 5000;
    zmq_setsockopt(router, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    zmq_setsockopt(dealer, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    /* DEALER -> ROUTER, then an Error back to the identity */
    uint8_t *buf;
    size_t len;
    fm_wire_encode(&env, &buf, &len);
    assert_int_equal(zmq_send(dealer, buf, len, 0), (int)len);
    free(buf);
    char id[64], msg[256];
    int idn = zmq_recv(router, id, sizeof id, 0);
    assert_int_equal(idn, 8);
    id[idn] = 0;
    assert_string_equal(id, "client-7");
    int n = zmq_recv(router, msg, sizeof msg, 0);
    Fedmoe__Envelope *got;
    assert_int_equal(fm_wire_decode((uint8_t *)msg, (size_t)n, 1024, &got), FM_OK);
    assert_int_equal(got->heartbeat->unix_ms, 42);
    fm_wire_free(got);
    assert_int_equal(fm_wire_send_error(router, id, FM_WIRE_WRONG_ROUND, "round 3 is closed"), FM_OK);
    n = zmq_recv(dealer, msg, sizeof msg, 0);
    assert_true(n > 0);
    assert_int_equal(fm_wire_decode((uint8_t *)msg, (size_t)n, 1024, &got), FM_OK);
    assert_int_equal(got->body_case, FEDMOE__ENVELOPE__BODY_ERROR);
    assert_int_equal(got->error->code, FM_WIRE_WRONG_ROUND);
    assert_string_equal(got->error->text, "round 3 is closed");
    fm_wire_free(got);
    int linger = 0;
    zmq_setsockopt(router, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(dealer, ZMQ_LINGER, &linger, sizeof linger);
    zmq_close(router);
    zmq_close(dealer);
    zmq_ctx_term(ctx);
}

/* --gating shared: the gating's eight tensors join the shared group (drawn from
 * the shared stream, so alike on every client, and carried by the strategy's
 * model vector: 4 x (d x d + d) more values), the switch reaches the client
 * through Welcome, and a strategy without a gating refuses it. */
static void test_gating_shared(void **state)
{
    (void)state;
    fm_strategy strategies[] = {FM_STRATEGY_FULL, FM_STRATEGY_PFEDMOAP};
    for (int i = 0; i < 2; i++) {
        fm_run_spec_t s, got;
        size_t n[2];
        for (int shared = 0; shared < 2; shared++) {
            fm_run_spec_default(&s);
            s.strategy = strategies[i];
            s.model.gating_shared = shared;
            assert_int_equal(fm_run_spec_finish(&s), FM_OK);
            fm_model_t *a = NULL, *b = NULL;
            assert_int_equal(fm_model_new(&a, &s.model, 3, fm_rng_stream(FM_STREAM_LOCAL, 0)), FM_OK);
            assert_int_equal(fm_model_new(&b, &s.model, 3, fm_rng_stream(FM_STREAM_LOCAL, 1)), FM_OK);
            n[shared] = fm_federated_size(a, s.strategy);
            const fm_param_t *g = fm_params_find(fm_model_params(a), "gating.wq");
            const fm_param_t *h = fm_params_find(fm_model_params(b), "gating.wq");
            assert_non_null(g);
            assert_int_equal(g->group, shared ? FM_GROUP_SHARED : FM_GROUP_LOCAL);
            assert_int_equal(memcmp(g->view->w, h->view->w, sizeof(float) * g->size) == 0, shared);
            assert_int_equal(fm_strategy_federates(s.strategy, g), shared);
            fm_model_destroy(&a);
            fm_model_destroy(&b);
            fm_welcome_pb_t w;
            fm_run_spec_welcome(&s, "run-x", 2, 1, &w);
            assert_int_equal(w.model.gating_shared, shared);
            assert_int_equal(fm_run_spec_from_welcome(&got, &w.welcome, s.model.specialists), FM_OK);
            assert_int_equal(got.model.gating_shared, shared);
        }
        size_t d = (size_t)s.model.d;
        assert_int_equal(n[1] - n[0], 4 * (d * d + d));
    }
    fm_run_spec_t s;
    fm_run_spec_default(&s);
    s.strategy = FM_STRATEGY_COMIGS;
    s.model.gating_shared = true;
    assert_int_equal(fm_run_spec_finish(&s), FM_ERR_ARG);
}

/* The run's training settings (and the holdout switch) reach the client through Welcome: values survive
 * the trip, the anchor is off where specialists are averaged, and out-of-range or
 * non-finite settings from the network are refused. */
static void test_welcome_train_spec(void **state)
{
    (void)state;
    fm_run_spec_t s, got;
    fm_run_spec_default(&s);
    s.train.anchor = 5.0f;
    s.train.lower.weight_decay = 0.02f;
    s.train.batch = 16;
    s.holdout = true;
    s.model.shared = FM_SHARED_EXPERTS;
    assert_int_equal(fm_run_spec_finish(&s), FM_OK);
    fm_welcome_pb_t w;
    fm_run_spec_welcome(&s, "run-x", 2, 1, &w);
    assert_int_equal(fm_run_spec_from_welcome(&got, &w.welcome, s.model.specialists), FM_OK);
    assert_int_equal(got.model.shared, FM_SHARED_EXPERTS);
    /* what the shared group holds: a name it knows, "all" when empty (older coordinators) */
    w.model.shared = "everything";
    assert_int_equal(fm_run_spec_from_welcome(&got, &w.welcome, s.model.specialists), FM_ERR_FORMAT);
    w.model.shared = "";
    assert_int_equal(fm_run_spec_from_welcome(&got, &w.welcome, s.model.specialists), FM_OK);
    assert_int_equal(got.model.shared, FM_SHARED_ALL);
    assert_float_equal(got.train.anchor, 5.0f, 0.0);
    assert_float_equal(got.train.lower.weight_decay, 0.02f, 0.0);
    assert_int_equal(got.train.batch, 16);
    assert_true(got.holdout);

    s.strategy = FM_STRATEGY_FEDAVG;
    assert_int_equal(fm_run_spec_finish(&s), FM_ERR_ARG); /* (--shared experts: comigs and full only) */
    s.model.shared = FM_SHARED_ALL;
    assert_int_equal(fm_run_spec_finish(&s), FM_OK);
    assert_float_equal(s.train.anchor, 0.0f, 0.0);

    s.strategy = FM_STRATEGY_FULL;
    s.train.anchor = 5.0f;
    const float bad_anchor[] = {NAN, -1.0f, 1e9f};
    for (int i = 0; i < 3; i++) {
        fm_run_spec_welcome(&s, "run-x", 2, 1, &w);
        w.train.anchor = bad_anchor[i];
        assert_int_equal(fm_run_spec_from_welcome(&got, &w.welcome, s.model.specialists), FM_ERR_ARG);
    }
    fm_run_spec_welcome(&s, "run-x", 2, 1, &w);
    w.train.weight_decay = INFINITY;
    assert_int_equal(fm_run_spec_from_welcome(&got, &w.welcome, s.model.specialists), FM_ERR_ARG);
}

/* Under secure aggregation the clients' own bound and noise travel in the
 * Welcome and come back as they were; a Welcome with them out of range, or
 * without secure aggregation, or noise without a bound, is refused. */
static void test_welcome_client_bounds(void **state)
{
    (void)state;
    const struct { double clip_norm, z; } t[] = {{0.0, 0.0}, {3.0, 0.0}, {FM_CLIP_AUTO, 1.25}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        fm_run_spec_t s, got;
        fm_run_spec_default(&s);
        s.strategy = FM_STRATEGY_FEDAVG;
        s.secure_aggregation = true;
        s.clip_norm = t[i].clip_norm;
        if (t[i].z > 0.0) {
            s.dp.noise = t[i].z;
            s.dp.clip = 0.25;
            s.dp.mode = FM_DP_DISTRIBUTED;
        }
        assert_int_equal(fm_run_spec_finish(&s), FM_OK);
        fm_welcome_pb_t w;
        fm_run_spec_welcome(&s, "run-x", 2, 1, &w);
        assert_int_equal(fm_run_spec_from_welcome(&got, &w.welcome, s.model.specialists), FM_OK);
        assert_true(got.secure_aggregation);
        assert_true(fm_run_client_clip(&got) == fm_run_client_clip(&s));
        assert_true(fm_run_client_noise(&got) == fm_run_client_noise(&s));
    }
    fm_run_spec_t s, got;
    fm_run_spec_default(&s);
    s.strategy = FM_STRATEGY_FEDAVG;
    s.secure_aggregation = true;
    assert_int_equal(fm_run_spec_finish(&s), FM_OK);
    fm_welcome_pb_t w;
    const struct { double clip, z; bool secagg; } bad[] = {
        {-1.0, 0.0, true}, {NAN, 0.0, true}, {1.0, -0.5, true}, {0.0, 1.0, true}, {1.0, 0.0, false}, {1.0, 1.0, false},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fm_run_spec_welcome(&s, "run-x", 2, 1, &w);
        w.welcome.client_clip = bad[i].clip;
        w.welcome.client_noise = bad[i].z;
        w.welcome.secure_aggregation = bad[i].secagg;
        assert_int_equal(fm_run_spec_from_welcome(&got, &w.welcome, s.model.specialists), FM_ERR_FORMAT);
    }
}

/* Every field of the run spec that travels in the Welcome comes back as it
 * was: each set away from its default, compared through the spec's JSON (which
 * names them all; an independent list from the one runspec_wire.c copies). */
static void test_welcome_carries_every_field(void **state)
{
    (void)state;
    fm_run_spec_t s, got;
    fm_run_spec_default(&s);
    s.strategy = FM_STRATEGY_COMIGS;
    s.seed = 77;
    fm_model_config_t *c = &s.model;
    c->in_dim = 784; c->img_h = 28; c->img_w = 28; c->classes = 10;
    c->d = 24; c->blocks = 3; c->generalists = 2; c->specialists = 3; c->ffn_hidden = 40; c->top_k = 1;
    c->lb_weight = 0.03f; c->generalist_importance = 0.7f; c->prompt_len = 5; c->prompt_dim = 12;
    c->text_hidden = 20; c->heads = 3; c->max_nonlocal = 4; c->attn_scale = 0.5f; c->lambda = 0.25f;
    c->tau = 2.5f; c->gating_on_validation = !c->gating_on_validation; c->untied = !c->untied;
    s.train.batch = 24; s.train.expert_steps = 7; s.train.router_steps = 3; s.train.local_steps = 11;
    s.local_epochs = 2; s.train.lower.lr = 0.004f; s.train.upper.lr = 0.0007f;
    s.train.lower.weight_decay = 0.02f; s.train.lb_in_upper = !s.train.lb_in_upper; s.train.anchor = 30.0f;
    s.part.kind = FM_PARTITION_DIRICHLET; s.part.alpha = 0.3; s.part.min_samples = 9; s.partition_count = 7;
    s.holdout = true; s.data_seed = 5;
    assert_int_equal(fm_cap_parse("x", "25..400", &s.regime.examples), FM_OK);
    assert_int_equal(fm_domains_parse("x", "rotate", &s.regime.domains), FM_OK);
    s.regime.concept_groups = 2;
    assert_int_equal(fm_run_spec_finish(&s), FM_OK);
    fm_welcome_pb_t w;
    fm_run_spec_welcome(&s, "run-x", 2, 1, &w);
    assert_int_equal(fm_run_spec_from_welcome(&got, &w.welcome, c->specialists), FM_OK);
    got.lr_schedule = s.lr_schedule; /* (the coordinator's alone: not in the Welcome) */
    got.aggregate = s.aggregate;
    got.clip_norm = s.clip_norm;
    got.eval_sample = s.eval_sample;
    char a[4096], b[4096];
    assert_true(fm_run_spec_json(&s, a, sizeof a) < sizeof a);
    assert_true(fm_run_spec_json(&got, b, sizeof b) < sizeof b);
    assert_string_equal(b, a);
}

/* Secure aggregation's largest messages, at FM_SA_MAX_CLIENTS participants
 * (every key, every sealed share, every unmasking share, every survivor),
 * decode within the decoding budget and round-trip their records (as one
 * message a record each, the keys cost 6x their size to decode and were
 * refused from about 400 clients). */
static void test_secagg_tables_at_most_clients(void **state)
{
    (void)state;
    const uint32_t n = FM_SA_MAX_CLIENTS;
    uint8_t *keys = calloc(n, FM_SA_KEYS_RECORD), *sealed = calloc(n - 1, FM_SA_SEALED_RECORD),
            *shares = calloc(n, FM_SA_SHARE_RECORD);
    uint32_t *survivors = malloc(sizeof *survivors * n);
    assert_non_null(keys);
    assert_non_null(sealed);
    assert_non_null(shares);
    assert_non_null(survivors);
    for (uint32_t i = 0; i < n; i++) {
        fm_sa_keys_t k = {.who = i + 1};
        memset(k.c_pk, (int)(i & 0xff), sizeof k.c_pk);
        fm_sa_keys_put(&k, keys + (size_t)FM_SA_KEYS_RECORD * i);
        fm_sa_share_t sh = {.owner = i + 1, .kind = (uint8_t)(i & 1)};
        memset(sh.y, 7, sizeof sh.y);
        fm_sa_share_put(&sh, shares + (size_t)FM_SA_SHARE_RECORD * i);
        survivors[i] = i + 1;
        if (i + 1 < n) {
            fm_sa_sealed_t se = {.from = 1, .to = i + 2};
            fm_sa_sealed_put(&se, sealed + (size_t)FM_SA_SEALED_RECORD * i);
        }
    }
    Fedmoe__SecAgg m = FEDMOE__SEC_AGG__INIT;
    m.round = 3;
    m.keys = (ProtobufCBinaryData){(size_t)FM_SA_KEYS_RECORD * n, keys};
    m.sealed = (ProtobufCBinaryData){(size_t)FM_SA_SEALED_RECORD * (n - 1), sealed};
    m.shares = (ProtobufCBinaryData){(size_t)FM_SA_SHARE_RECORD * n, shares};
    m.survivors = survivors;
    m.n_survivors = n;
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT, *out = NULL;
    env.body_case = FEDMOE__ENVELOPE__BODY_SECAGG;
    env.secagg = &m;
    uint8_t *buf;
    size_t len;
    assert_int_equal(fm_wire_encode(&env, &buf, &len), FM_OK);
    assert_int_equal(fm_wire_decode(buf, len, len, &out), FM_OK);
    assert_int_equal(out->secagg->n_survivors, n);
    fm_sa_keys_t k;
    fm_sa_keys_get(out->secagg->keys.data + (size_t)FM_SA_KEYS_RECORD * 700, &k);
    assert_int_equal(k.who, 701);
    assert_int_equal(k.c_pk[31], 700 & 0xff);
    fm_sa_share_t sh;
    fm_sa_share_get(out->secagg->shares.data + (size_t)FM_SA_SHARE_RECORD * 9, 42, &sh);
    assert_int_equal(sh.owner, 10);
    assert_int_equal(sh.holder, 42);
    assert_int_equal(sh.kind, 1);
    fm_sa_sealed_t se;
    fm_sa_sealed_get(out->secagg->sealed.data + (size_t)FM_SA_SEALED_RECORD * (n - 2), &se);
    assert_int_equal(se.to, n);
    fm_wire_free(out);
    free(buf);
    free(keys);
    free(sealed);
    free(shares);
    free(survivors);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_secagg_tables_at_most_clients),
        cmocka_unit_test(test_nan_and_version),
        cmocka_unit_test(test_random_bytes),
        cmocka_unit_test(test_many_empty_tensors),
        cmocka_unit_test(test_decode_cost_budget),
        cmocka_unit_test(test_zmq_router_dealer),
        cmocka_unit_test(test_welcome_train_spec),
        cmocka_unit_test(test_gating_shared),
        cmocka_unit_test(test_welcome_carries_every_field),
        cmocka_unit_test(test_welcome_client_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
