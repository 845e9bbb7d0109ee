/* blob.h - an immutable byte buffer shared by reference count, and
 * the frames a message is sent in.
 *
 * The coordinator encodes the part of a Task every participant shares (the
 * global state) once per round into a blob and hands ZeroMQ a reference to it
 * for each client (zero copy): ZeroMQ drops its reference from its I/O thread
 * when the frame is written, hence the atomic count. */
#ifndef FEDMOE_BLOB_H
#define FEDMOE_BLOB_H

#include <stddef.h>
#include <stdint.h>

typedef struct fm_blob fm_blob_t;

/* A blob of len bytes (contents undefined) holding one reference, or NULL. */
fm_blob_t *fm_blob_new(size_t len);
uint8_t *fm_blob_data(fm_blob_t *b);
size_t fm_blob_len(const fm_blob_t *b);
/* Takes one more reference; returns b. */
fm_blob_t *fm_blob_ref(fm_blob_t *b);
/* Drops one reference (freeing the blob with the last); safe on NULL, from
 * any thread. */
void fm_blob_unref(fm_blob_t *b);

/* One frame of a message: len bytes at data, or, when blob is set, the whole
 * blob (zero copy; data and len are ignored). */
typedef struct {
    const uint8_t *data;
    size_t len;
    fm_blob_t *blob;
} fm_frame_t;

/* The bytes of n frames in all. */
size_t fm_frames_len(const fm_frame_t *f, int n);
/* The n frames concatenated into a malloc'd buffer (*len bytes), or NULL. */
uint8_t *fm_frames_join(const fm_frame_t *f, int n, size_t *len);

#endif
