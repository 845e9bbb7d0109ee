/* checkpoint.h - the one binary format for saved state: the coordinator's
 * checkpoint (in the round log) and a client's state file.
 *
 * A blob is: magic (u32), version (u32), payload length (u64), the payload, and
 * the SHA-256 of everything before it (32 bytes). Every number is little-endian,
 * whatever the host. The payload is a sequence of fields written with the
 * fm_ckpt_put_* functions and read back, in the same order, with fm_ckpt_get_*.
 * A reader refuses a blob that is truncated, longer than it says, of another
 * magic or version, or whose digest does not match, before any field is read;
 * reading past the payload or leaving part of it unread is an error too. */
#ifndef FEDMOE_CHECKPOINT_H
#define FEDMOE_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fedmoe/status.h"

#define FM_CKPT_MAGIC_COORDINATOR 0x4B434D46u /* "FMCK" */
#define FM_CKPT_MAGIC_CLIENT 0x53434D46u      /* "FMCS" */
#define FM_CKPT_OVERHEAD 48                   /* header (16) + digest (32) */

/* A blob being written. Zero-initialise, then fm_ckpt_begin. An allocation
 * failure is remembered and reported by fm_ckpt_finish. */
typedef struct {
    uint8_t *p;
    size_t len, cap;
    bool failed;
} fm_ckpt_writer_t;

/* Starts a blob of format magic, version in w (zeroed by the caller), then
 * appends little-endian fields; an allocation failure sets w->failed and makes
 * the rest no-ops (fm_ckpt_finish reports it). w owns its buffer. */
void fm_ckpt_begin(fm_ckpt_writer_t *w, uint32_t magic, uint32_t version);
void fm_ckpt_put_u8(fm_ckpt_writer_t *w, uint8_t v);
void fm_ckpt_put_u32(fm_ckpt_writer_t *w, uint32_t v);
void fm_ckpt_put_u64(fm_ckpt_writer_t *w, uint64_t v);
void fm_ckpt_put_bytes(fm_ckpt_writer_t *w, const void *p, size_t n);
/* n floats, each as its little-endian IEEE-754 bits. */
void fm_ckpt_put_floats(fm_ckpt_writer_t *w, const float *x, size_t n);
/* Seals the blob (length and digest) and hands it over: *out is malloc'd and the
 * caller frees it. On failure (out of memory) nothing is handed over and the
 * writer is released. */
fm_status fm_ckpt_finish(fm_ckpt_writer_t *w, uint8_t **out, size_t *len);
/* Releases an unfinished writer. */
void fm_ckpt_abandon(fm_ckpt_writer_t *w);

/* A blob being read; points into the caller's buffer, which must outlive it. */
typedef struct {
    const uint8_t *p;
    size_t end, pos; /* payload bounds within p */
    bool failed;
} fm_ckpt_reader_t;

/* Checks framing, magic, version and digest. FM_ERR_FORMAT with a reason naming
 * what (e.g. "client state") on any mismatch. */
fm_status fm_ckpt_open(fm_ckpt_reader_t *r, const uint8_t *blob, size_t len, uint32_t magic, uint32_t version,
                       const char *what);
/* Each get returns false (and marks the reader failed) when the payload has too
 * few bytes left; the destination is then left unchanged. */
bool fm_ckpt_get_u8(fm_ckpt_reader_t *r, uint8_t *v);
bool fm_ckpt_get_u32(fm_ckpt_reader_t *r, uint32_t *v);
bool fm_ckpt_get_u64(fm_ckpt_reader_t *r, uint64_t *v);
bool fm_ckpt_get_bytes(fm_ckpt_reader_t *r, void *p, size_t n);
bool fm_ckpt_get_floats(fm_ckpt_reader_t *r, float *x, size_t n);
/* Bytes of payload not yet read. */
size_t fm_ckpt_left(const fm_ckpt_reader_t *r);
/* FM_OK when every get succeeded and the payload was read to its end. */
fm_status fm_ckpt_close(fm_ckpt_reader_t *r, const char *what);

/* Writes blob to path atomically (a temporary file, fsync, rename). */
fm_status fm_ckpt_write_file(const char *path, const uint8_t *blob, size_t len);
/* Reads a whole file of at most max_len bytes into a malloc'd buffer (caller
 * frees). FM_ERR_IO when it cannot be read (missing, no permission),
 * FM_ERR_FORMAT when it is not a regular file or is larger than max_len. */
fm_status fm_ckpt_read_file(const char *path, size_t max_len, uint8_t **out, size_t *len);

#endif
