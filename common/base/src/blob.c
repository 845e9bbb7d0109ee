#include "fedmoe/blob.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct fm_blob {
    atomic_size_t refs;
    size_t len;
    uint8_t data[];
};

fm_blob_t *fm_blob_new(size_t len)
{
    fm_blob_t *b = malloc(sizeof *b + (len ? len : 1));
    if (!b)
        return NULL;
    atomic_init(&b->refs, 1);
    b->len = len;
    return b;
}

uint8_t *fm_blob_data(fm_blob_t *b) { return b->data; }
size_t fm_blob_len(const fm_blob_t *b) { return b->len; }

fm_blob_t *fm_blob_ref(fm_blob_t *b)
{
    atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
    return b;
}

void fm_blob_unref(fm_blob_t *b)
{
    if (b && atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1)
        free(b);
}

size_t fm_frames_len(const fm_frame_t *f, int n)
{
    size_t len = 0;
    for (int i = 0; i < n; i++)
        len += f[i].blob ? fm_blob_len(f[i].blob) : f[i].len;
    return len;
}

uint8_t *fm_frames_join(const fm_frame_t *f, int n, size_t *len)
{
    *len = fm_frames_len(f, n);
    uint8_t *buf = malloc(*len ? *len : 1), *p = buf;
    for (int i = 0; buf && i < n; i++) {
        size_t k = f[i].blob ? fm_blob_len(f[i].blob) : f[i].len;
        if (k)
            memcpy(p, f[i].blob ? fm_blob_data(f[i].blob) : f[i].data, k);
        p += k;
    }
    return buf;
}
