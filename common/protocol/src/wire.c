#include "fedmoe/wire.h"

#include <errno.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "fedmoe/log.h"

static _Thread_local fm_wire_code g_code;

fm_wire_code fm_wire_last_code(void) { return g_code; }


static fm_status reject(fm_wire_code code)
{
    g_code = code;
    return FM_ERR_FORMAT;
}

static void sha256(const uint8_t *data, size_t len, uint8_t out[32])
{
    unsigned int n = 32;
    EVP_Digest(data, len, out, &n, EVP_sha256(), NULL);
}

static inline uint32_t to_le32(uint32_t v)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return v;
#else
    return __builtin_bswap32(v);
#endif
}

fm_status fm_wire_tensor_set(Fedmoe__Tensor *t, const char *name, const float *x, uint32_t rows, uint32_t cols)
{
    fedmoe__tensor__init(t);
    size_t n = (size_t)rows * cols;
    t->name = strdup(name);
    t->shape = malloc(sizeof(uint32_t) * 2);
    t->data.data = malloc(n ? n * 4 : 1);
    t->sha256.data = malloc(32);
    if (!t->name || !t->shape || !t->data.data || !t->sha256.data) {
        fm_wire_tensor_clear(t);
        return FM_ERR_NOMEM;
    }
    t->n_shape = 2;
    t->shape[0] = rows;
    t->shape[1] = cols;
    for (size_t i = 0; i < n; i++) {
        uint32_t v;
        memcpy(&v, &x[i], 4);
        v = to_le32(v);
        memcpy(t->data.data + 4 * i, &v, 4);
    }
    t->data.len = n * 4;
    sha256(t->data.data, t->data.len, t->sha256.data);
    t->sha256.len = 32;
    return FM_OK;
}

void fm_wire_tensor_clear(Fedmoe__Tensor *t)
{
    if (t->name != protobuf_c_empty_string)
        free(t->name);
    free(t->shape);
    free(t->data.data);
    free(t->sha256.data);
    fedmoe__tensor__init(t);
}

fm_status fm_wire_tensor_get(const Fedmoe__Tensor *t, const char *name, uint32_t rows, uint32_t cols, float *out)
{
    if (!t) {
        fm_error_set("tensor '%s' missing", name);
        return reject(FM_WIRE_BAD_TENSOR);
    }
    if (!t->name || strcmp(t->name, name) != 0) {
        fm_error_set("tensor named '%.40s', expected '%s'", t->name ? t->name : "", name);
        return reject(FM_WIRE_BAD_TENSOR);
    }
    if (t->n_shape != 2 || t->shape[0] != rows || t->shape[1] != cols) {
        fm_error_set("tensor '%s' has the wrong shape, expected %u x %u", name, rows, cols);
        return reject(FM_WIRE_BAD_TENSOR);
    }
    size_t n = (size_t)rows * cols;
    if (t->data.len != n * 4) {
        fm_error_set("tensor '%s' holds %zu bytes, expected %zu", name, t->data.len, n * 4);
        return reject(FM_WIRE_BAD_TENSOR);
    }
    uint8_t digest[32];
    sha256(t->data.data, t->data.len, digest);
    if (t->sha256.len != 32 || memcmp(digest, t->sha256.data, 32) != 0) {
        fm_error_set("tensor '%s': SHA-256 does not match its data", name);
        return reject(FM_WIRE_BAD_TENSOR);
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t v;
        memcpy(&v, t->data.data + 4 * i, 4);
        v = to_le32(v);
        float f;
        memcpy(&f, &v, 4);
        if (!isfinite(f)) {
            fm_error_set("tensor '%s': value %zu is not finite", name, i);
            return reject(FM_WIRE_BAD_VALUE);
        }
        out[i] = f;
    }
    g_code = FM_WIRE_OK;
    return FM_OK;
}

fm_status fm_wire_encode(Fedmoe__Envelope *env, uint8_t **buf, size_t *len)
{
    env->protocol_version = FM_PROTOCOL_VERSION;
    size_t n = fedmoe__envelope__get_packed_size(env);
    *buf = malloc(n ? n : 1);
    if (!*buf)
        return FM_ERR_NOMEM;
    *len = fedmoe__envelope__pack(env, *buf);
    return FM_OK;
}

static bool varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; shift < 64 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return true;
    }
    return false;
}

/* What decoding a message of type d in p..end may allocate, counted by its
 * schema before anything is decoded, in *cost (bytes), and its embedded
 * messages in *count (at any depth). protobuf-c allocates a scan record for
 * every field it reads, the structure of each embedded message, an array entry
 * for each element of a repeated field, a copy of each string, bytes field and
 * unknown field: a 2-byte empty string or a 3-byte unknown field costs over 100
 * bytes, a 1-byte packed integer 8, an empty embedded message its structure. Every charge is at least what protobuf-c allocates for it (with
 * FM_WIRE_ALLOC_OVERHEAD for the allocator's own); fuzz/fuzz_wire.c checks
 * that against a counting allocator. False when the count passes
 * FM_WIRE_MAX_SUBMESSAGES, the nesting passes 8 or the framing is broken. */
#define FM_WIRE_ALLOC_OVERHEAD 16
static bool decode_cost(const ProtobufCMessageDescriptor *d, const uint8_t *p, const uint8_t *end, int depth,
                        size_t *count, size_t *cost, size_t limit)
{
    if (depth > 8)
        return false;
    while (p < end) {
        uint64_t key, n = 0;
        if (!varint(&p, end, &key))
            return false;
        const ProtobufCFieldDescriptor *f =
            key >> 3 <= UINT32_MAX ? protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3)) : NULL;
        bool rep = f && f->label == PROTOBUF_C_LABEL_REPEATED;
        size_t payload;
        switch (key & 7) {
        case 0: {
            const uint8_t *v = p;
            if (!varint(&p, end, &n))
                return false;
            payload = (size_t)(p - v);
            break;
        }
        case 1:
        case 5:
            payload = (key & 7) == 1 ? 8 : 4;
            if ((size_t)(end - p) < payload)
                return false;
            p += payload;
            break;
        case 2:
            if (!varint(&p, end, &n) || n > (uint64_t)(end - p))
                return false;
            payload = (size_t)n;
            break;
        default: return false; /* groups and unknown wire types: not in this protocol */
        }
        /* every field read: protobuf-c's scan record of it (32 bytes, in slabs
         * that at most double, freed after its message) */
        *cost += 2 * 32 + FM_WIRE_ALLOC_OVERHEAD;
        /* an element of a repeated field: its array entry (at most 16 bytes),
         * and the array's own allocation charged to each element */
        size_t entry = rep ? 16 + FM_WIRE_ALLOC_OVERHEAD : 0;
        if (!f) { /* kept as an unknown field: its record and a copy of its bytes */
            *cost += sizeof(ProtobufCMessageUnknownField) + FM_WIRE_ALLOC_OVERHEAD + payload;
        } else if ((key & 7) != 2) { /* a scalar: in the structure, or an array entry */
            *cost += entry;
        } else if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
            const ProtobufCMessageDescriptor *sub = f->descriptor;
            *cost += sub->sizeof_message + FM_WIRE_ALLOC_OVERHEAD + entry;
            if (++*count > FM_WIRE_MAX_SUBMESSAGES || !decode_cost(sub, p, p + n, depth + 1, count, cost, limit))
                return false;
        } else if (f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_BYTES) {
            *cost += payload + 1 + FM_WIRE_ALLOC_OVERHEAD + entry;
        } else { /* packed scalars: one array, at most one 8-byte entry a byte */
            *cost += 8 * payload + FM_WIRE_ALLOC_OVERHEAD;
        }
        if ((key & 7) == 2)
            p += n;
        if (*cost > limit)
            return false; /* (over the budget: no need to walk the rest) */
    }
    return true;
}

size_t fm_wire_decode_budget(size_t len) { return FM_WIRE_DECODE_FACTOR * len + FM_WIRE_DECODE_SLACK; }

size_t fm_wire_decode_cost(const uint8_t *buf, size_t len)
{
    size_t parts = 0, cost = fedmoe__envelope__descriptor.sizeof_message + FM_WIRE_ALLOC_OVERHEAD;
    return decode_cost(&fedmoe__envelope__descriptor, buf, buf + len, 0, &parts, &cost, SIZE_MAX) ? cost : SIZE_MAX;
}

/* Decoding allocates from one block of the schema's charge (at least what
 * protobuf-c asks for: each request rounded up to 16 bytes is within the
 * charge's FM_WIRE_ALLOC_OVERHEAD), so a decoded message is one allocation,
 * freed at once, instead of one for each tensor copy, scan record and string.
 * (It was meant to stop the coordinator's resident set growing with the
 * rounds; measured, it did not change that: BENCHMARKS.md, "Memory over the
 * rounds".) protobuf-c allocates the message's own structure first, so the
 * Envelope is the block's first allocation. */
typedef struct {
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} arena_t;

static void *arena_alloc(void *user, size_t size)
{
    arena_t *a = user;
    size_t need = (size + 15) & ~(size_t)15;
    if (need < size || a->cap - a->used < need)
        return NULL;
    void *p = a->data + a->used;
    a->used += need;
    return p;
}

static void arena_free(void *user, void *p)
{
    (void)user;
    (void)p; /* (the block goes at once: fm_wire_free) */
}

void fm_wire_free(Fedmoe__Envelope *env)
{
    if (env)
        free((unsigned char *)env - offsetof(arena_t, data));
}

fm_status fm_wire_decode(const uint8_t *buf, size_t len, size_t max_len, Fedmoe__Envelope **out)
{
    *out = NULL;
    if (len > max_len) {
        fm_error_set("message of %zu bytes is over the limit of %zu", len, max_len);
        return reject(FM_WIRE_TOO_LARGE);
    }
    size_t parts = 0, cost = fedmoe__envelope__descriptor.sizeof_message + FM_WIRE_ALLOC_OVERHEAD;
    size_t budget = fm_wire_decode_budget(len);
    if (!decode_cost(&fedmoe__envelope__descriptor, buf, buf + len, 0, &parts, &cost, budget)) {
        if (cost > budget) {
            fm_error_set("message of %zu bytes would take more than %zu bytes to decode (%dx its size plus %d KiB: "
                         "unknown fields, empty repeated entries?)",
                         len, budget, FM_WIRE_DECODE_FACTOR, FM_WIRE_DECODE_SLACK / 1024);
            return reject(FM_WIRE_TOO_LARGE);
        }
        if (parts <= FM_WIRE_MAX_SUBMESSAGES) {
            fm_error_set("message of %zu bytes is not a valid Envelope", len);
            return reject(FM_WIRE_MALFORMED);
        }
        fm_error_set("message of %zu bytes has more than %d embedded messages", len, FM_WIRE_MAX_SUBMESSAGES);
        return reject(FM_WIRE_TOO_LARGE);
    }
    arena_t *a = malloc(sizeof *a + cost);
    if (!a) {
        fm_error_set("out of memory decoding a message of %zu bytes", len);
        return reject(FM_WIRE_TOO_LARGE);
    }
    a->used = 0;
    a->cap = cost;
    ProtobufCAllocator arena = {arena_alloc, arena_free, a};
    Fedmoe__Envelope *env = fedmoe__envelope__unpack(&arena, len, buf);
    if (!env || (void *)env != (void *)a->data) {
        free(a); /* (not the first allocation: a protobuf-c this code does not know) */
        fm_error_set("message of %zu bytes is not a valid Envelope", len);
        return reject(FM_WIRE_MALFORMED);
    }
    if (env->protocol_version != FM_PROTOCOL_VERSION) {
        fm_error_set("protocol version %u, this side speaks %u", env->protocol_version, FM_PROTOCOL_VERSION);
        fm_wire_free(env);
        return reject(FM_WIRE_VERSION);
    }
    if (env->body_case == FEDMOE__ENVELOPE__BODY__NOT_SET) {
        fm_error_set("envelope without a body");
        fm_wire_free(env);
        return reject(FM_WIRE_MALFORMED);
    }
    *out = env;
    return FM_OK;
}

void fm_wire_tune_socket(void *socket)
{
    int hwm = FM_WIRE_HWM, hb_ivl = 2000, hb_timeout = 10000, handshake = FM_WIRE_HANDSHAKE_MS;
    zmq_setsockopt(socket, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(socket, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(socket, ZMQ_HEARTBEAT_IVL, &hb_ivl, sizeof hb_ivl);
    zmq_setsockopt(socket, ZMQ_HEARTBEAT_TIMEOUT, &hb_timeout, sizeof hb_timeout);
    zmq_setsockopt(socket, ZMQ_HANDSHAKE_IVL, &handshake, sizeof handshake);
    /* a peer that cannot connect tries again after 0.1 s, doubling up to 2 s
     * (libzmq adds up to one interval of jitter): thousands of clients waiting
     * for a coordinator do not flood it with connection attempts */
    int reconnect_max = FM_WIRE_RECONNECT_MAX_MS;
    zmq_setsockopt(socket, ZMQ_RECONNECT_IVL_MAX, &reconnect_max, sizeof reconnect_max);
}

static void blob_free(void *data, void *hint)
{
    (void)data;
    fm_blob_unref(hint);
}

/* One frame, more to follow or not; 0 or -1 (zmq_errno). */
static int send_frame(void *socket, const fm_frame_t *f, int flags)
{
    if (!f->blob)
        return zmq_send(socket, f->data, f->len, flags) < 0 ? -1 : 0;
    zmq_msg_t m;
    fm_blob_ref(f->blob);
    if (zmq_msg_init_data(&m, fm_blob_data(f->blob), fm_blob_len(f->blob), blob_free, f->blob) != 0) {
        fm_blob_unref(f->blob);
        return -1;
    }
    if (zmq_msg_send(&m, socket, flags) < 0) {
        zmq_msg_close(&m); /* (drops the reference) */
        return -1;
    }
    return 0;
}

fm_status fm_wire_send_frames(void *socket, const void *rid, size_t ridlen, const fm_frame_t *f, int n)
{
    fm_frame_t route = {rid, ridlen, NULL};
    /* once the first frame is queued, libzmq takes the rest of the message */
    for (int i = rid ? -1 : 0; i < n; i++)
        if (send_frame(socket, i < 0 ? &route : &f[i], ZMQ_DONTWAIT | (i < n - 1 ? ZMQ_SNDMORE : 0)) != 0) {
            fm_error_set("send: %s", zmq_strerror(zmq_errno()));
            return FM_ERR_IO;
        }
    return FM_OK;
}

fm_status fm_wire_send_bytes(void *socket, const char *identity, const uint8_t *buf, size_t len)
{
    fm_frame_t f = {buf, len, NULL};
    fm_status st = fm_wire_send_frames(socket, identity, identity ? strlen(identity) : 0, &f, 1);
    if (st != FM_OK && identity) {
        char why[256];
        snprintf(why, sizeof why, "%s", fm_error_last());
        fm_error_set("%s to %s", why, identity);
    }
    return st;
}

fm_status fm_wire_recv(void *socket, int flags, size_t max_len, uint8_t **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, socket, flags) < 0) {
        int e = zmq_errno();
        zmq_msg_close(&m);
        fm_error_set("receive: %s", zmq_strerror(e));
        return e == EAGAIN || e == EINTR ? FM_ERR_STATE : FM_ERR_IO;
    }
    size_t total = 0;
    bool over = false;
    for (;;) {
        size_t k = zmq_msg_size(&m);
        over |= k > max_len - total;
        if (!over) {
            uint8_t *grown = realloc(*buf, total + k + 1);
            if (!grown) {
                over = true;
            } else {
                *buf = grown;
                memcpy(*buf + total, zmq_msg_data(&m), k);
                total += k;
            }
        }
        bool more = zmq_msg_more(&m);
        zmq_msg_close(&m);
        if (!more)
            break;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, socket, 0) < 0) { /* (the rest of a message is there) */
            zmq_msg_close(&m);
            break;
        }
    }
    if (over) {
        free(*buf);
        *buf = NULL;
        fm_error_set("message over the limit of %zu bytes", max_len);
        return reject(FM_WIRE_TOO_LARGE);
    }
    *len = total;
    return FM_OK;
}

fm_status fm_wire_send(void *socket, const char *identity, Fedmoe__Envelope *env)
{
    uint8_t *buf;
    size_t len;
    fm_status st = fm_wire_encode(env, &buf, &len);
    if (st != FM_OK)
        return st;
    st = fm_wire_send_bytes(socket, identity, buf, len);
    free(buf);
    return st;
}

fm_status fm_wire_encode_error(fm_wire_code code, const char *text, uint8_t **buf, size_t *len)
{
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    Fedmoe__Error err = FEDMOE__ERROR__INIT;
    err.code = code;
    err.text = (char *)text;
    env.body_case = FEDMOE__ENVELOPE__BODY_ERROR;
    env.error = &err;
    return fm_wire_encode(&env, buf, len);
}

fm_status fm_wire_send_error(void *socket, const char *identity, fm_wire_code code, const char *text)
{
    uint8_t *buf;
    size_t len;
    fm_status st = fm_wire_encode_error(code, text, &buf, &len);
    if (st != FM_OK)
        return st;
    st = fm_wire_send_bytes(socket, identity, buf, len);
    free(buf);
    return st;
}
