#include "fedmoe/checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fedmoe/log.h"

#define HEADER 16

static void le_store(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t le_load(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void digest(const uint8_t *data, size_t len, uint8_t out[32])
{
    unsigned n = 32;
    EVP_Digest(data, len, out, &n, EVP_sha256(), NULL);
}

/* Room for n more bytes; returns where they go, or NULL (writer failed). */
static uint8_t *reserve(fm_ckpt_writer_t *w, size_t n)
{
    if (w->failed)
        return NULL;
    if (n > w->cap - w->len) {
        size_t cap = w->cap ? w->cap : 4096;
        while (cap - w->len < n) {
            if (cap > SIZE_MAX / 2) {
                w->failed = true;
                return NULL;
            }
            cap *= 2;
        }
        uint8_t *p = realloc(w->p, cap);
        if (!p) {
            w->failed = true;
            return NULL;
        }
        w->p = p;
        w->cap = cap;
    }
    uint8_t *at = w->p + w->len;
    w->len += n;
    return at;
}

void fm_ckpt_begin(fm_ckpt_writer_t *w, uint32_t magic, uint32_t version)
{
    memset(w, 0, sizeof *w);
    uint8_t *h = reserve(w, HEADER);
    if (h) {
        le_store(h, magic, 4);
        le_store(h + 4, version, 4);
        le_store(h + 8, 0, 8); /* payload length, set by fm_ckpt_finish */
    }
}

void fm_ckpt_put_u8(fm_ckpt_writer_t *w, uint8_t v)
{
    uint8_t *p = reserve(w, 1);
    if (p)
        *p = v;
}

void fm_ckpt_put_u32(fm_ckpt_writer_t *w, uint32_t v)
{
    uint8_t *p = reserve(w, 4);
    if (p)
        le_store(p, v, 4);
}

void fm_ckpt_put_u64(fm_ckpt_writer_t *w, uint64_t v)
{
    uint8_t *p = reserve(w, 8);
    if (p)
        le_store(p, v, 8);
}

void fm_ckpt_put_bytes(fm_ckpt_writer_t *w, const void *src, size_t n)
{
    uint8_t *p = reserve(w, n);
    if (p && n)
        memcpy(p, src, n);
}

void fm_ckpt_put_floats(fm_ckpt_writer_t *w, const float *x, size_t n)
{
    if (n > SIZE_MAX / 4) {
        w->failed = true;
        return;
    }
    uint8_t *p = reserve(w, 4 * n);
    for (size_t i = 0; p && i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &x[i], 4);
        le_store(p + 4 * i, bits, 4);
    }
}

fm_status fm_ckpt_finish(fm_ckpt_writer_t *w, uint8_t **out, size_t *len)
{
    uint8_t *d = reserve(w, 32);
    if (!d) {
        fm_ckpt_abandon(w);
        fm_error_set("out of memory encoding a checkpoint");
        return FM_ERR_NOMEM;
    }
    size_t body = w->len - 32;
    le_store(w->p + 8, body - HEADER, 8);
    digest(w->p, body, d);
    *out = w->p;
    *len = w->len;
    memset(w, 0, sizeof *w);
    return FM_OK;
}

void fm_ckpt_abandon(fm_ckpt_writer_t *w)
{
    free(w->p);
    memset(w, 0, sizeof *w);
}

fm_status fm_ckpt_open(fm_ckpt_reader_t *r, const uint8_t *blob, size_t len, uint32_t magic, uint32_t version,
                       const char *what)
{
    memset(r, 0, sizeof *r);
    r->failed = true;
    if (len < FM_CKPT_OVERHEAD) {
        fm_error_set("%s: %zu bytes, too short to be a fedmoe checkpoint", what, len);
        return FM_ERR_FORMAT;
    }
    uint64_t m = le_load(blob, 4), v = le_load(blob + 4, 4), n = le_load(blob + 8, 8);
    if (m != magic) {
        fm_error_set("%s: not a fedmoe %s (magic %08llx)", what, what, (unsigned long long)m);
        return FM_ERR_FORMAT;
    }
    if (v != version) {
        fm_error_set("%s: format version %llu, this build reads %u", what, (unsigned long long)v, version);
        return FM_ERR_FORMAT;
    }
    if (n != len - FM_CKPT_OVERHEAD) {
        fm_error_set("%s: %zu bytes, but its header says %llu of payload (truncated or extended)", what, len,
                     (unsigned long long)n);
        return FM_ERR_FORMAT;
    }
    uint8_t d[32];
    digest(blob, len - 32, d);
    if (memcmp(d, blob + len - 32, 32) != 0) {
        fm_error_set("%s: SHA-256 does not match its contents (corrupted)", what);
        return FM_ERR_FORMAT;
    }
    r->p = blob;
    r->pos = HEADER;
    r->end = len - 32;
    r->failed = false;
    return FM_OK;
}

/* The next n bytes of payload, or NULL (reader failed). */
static const uint8_t *take(fm_ckpt_reader_t *r, size_t n)
{
    if (r->failed || n > r->end - r->pos) {
        r->failed = true;
        return NULL;
    }
    const uint8_t *at = r->p + r->pos;
    r->pos += n;
    return at;
}

bool fm_ckpt_get_u8(fm_ckpt_reader_t *r, uint8_t *v)
{
    const uint8_t *p = take(r, 1);
    if (p)
        *v = *p;
    return p != NULL;
}

bool fm_ckpt_get_u32(fm_ckpt_reader_t *r, uint32_t *v)
{
    const uint8_t *p = take(r, 4);
    if (p)
        *v = (uint32_t)le_load(p, 4);
    return p != NULL;
}

bool fm_ckpt_get_u64(fm_ckpt_reader_t *r, uint64_t *v)
{
    const uint8_t *p = take(r, 8);
    if (p)
        *v = le_load(p, 8);
    return p != NULL;
}

bool fm_ckpt_get_bytes(fm_ckpt_reader_t *r, void *dst, size_t n)
{
    const uint8_t *p = take(r, n);
    if (p && n)
        memcpy(dst, p, n);
    return p != NULL;
}

bool fm_ckpt_get_floats(fm_ckpt_reader_t *r, float *x, size_t n)
{
    const uint8_t *p = n > SIZE_MAX / 4 ? NULL : take(r, 4 * n);
    if (!p) {
        r->failed = true;
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)le_load(p + 4 * i, 4);
        memcpy(&x[i], &bits, 4);
    }
    return true;
}

size_t fm_ckpt_left(const fm_ckpt_reader_t *r) { return r->failed ? 0 : r->end - r->pos; }

fm_status fm_ckpt_close(fm_ckpt_reader_t *r, const char *what)
{
    if (r->failed || r->pos != r->end) {
        fm_error_set("%s: contents do not match this model or run (%s)", what,
                     r->failed ? "fields missing" : "bytes left over");
        return FM_ERR_FORMAT;
    }
    return FM_OK;
}

/* Reads or writes all n bytes at fd (retrying short transfers and EINTR);
 * returns how many were moved. */
static size_t transfer(int fd, uint8_t *buf, size_t n, bool writing)
{
    size_t done = 0;
    while (done < n) {
        ssize_t k = writing ? write(fd, buf + done, n - done) : read(fd, buf + done, n - done);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        done += (size_t)k;
    }
    return done;
}

fm_status fm_ckpt_write_file(const char *path, const uint8_t *blob, size_t len)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        fm_error_set("%s: path too long", path);
        return FM_ERR_ARG;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        fm_error_set("cannot write %s: %s", tmp, strerror(errno));
        return FM_ERR_IO;
    }
    bool ok = transfer(fd, (uint8_t *)blob, len, true) == len && fsync(fd) == 0;
    int err = errno;
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        fm_error_set("cannot write %s: %s", path, strerror(ok ? errno : err));
        unlink(tmp);
        return FM_ERR_IO;
    }
    return FM_OK;
}

fm_status fm_ckpt_read_file(const char *path, size_t max_len, uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fm_error_set("cannot read %s: %s", path, strerror(errno));
        return FM_ERR_IO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        fm_error_set("%s is not a regular file", path);
        close(fd);
        return FM_ERR_FORMAT;
    }
    if ((uint64_t)st.st_size > max_len) {
        fm_error_set("%s holds %lld bytes, more than the %zu expected", path, (long long)st.st_size, max_len);
        close(fd);
        return FM_ERR_FORMAT;
    }
    size_t n = (size_t)st.st_size;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) {
        close(fd);
        return FM_ERR_NOMEM;
    }
    size_t done = transfer(fd, buf, n, false);
    close(fd);
    if (done != n) {
        free(buf);
        fm_error_set("cannot read %s: short read", path);
        return FM_ERR_IO;
    }
    *out = buf;
    *len = n;
    return FM_OK;
}
