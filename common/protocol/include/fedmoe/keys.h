/* keys.h - CURVE key files and the coordinator's allow-list.
 *
 * A key file is text, one "name = value" a line ('#' starts a comment):
 *
 *   id = client-007                                  (who the key belongs to)
 *   public = <40 characters of Z85>                  (the CURVE public key)
 *   secret = <40 characters of Z85>                  (key pair files only)
 *
 * fedmoe-keygen writes ID.key (the pair, mode 0600) and ID.pub (the public
 * half, 0644). The coordinator's allow-list is a folder of .pub files: a peer
 * whose public key is not among them is refused at the handshake, and a peer
 * that is admitted is the id its .pub file names, nothing else. */
#ifndef FEDMOE_KEYS_H
#define FEDMOE_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fedmoe/status.h"

#define FM_KEY_Z85 40    /* characters of a Z85 key */
#define FM_KEY_BYTES 32  /* bytes of a CURVE key */

typedef struct {
    char id[64];                   /* a valid client id ([A-Za-z0-9._-]{1,63}) */
    char public_z85[FM_KEY_Z85 + 1];
    char secret_z85[FM_KEY_Z85 + 1]; /* "" in a public key file */
} fm_key_t;

/* A fresh key pair for id (libzmq's CURVE keypair). FM_ERR_ARG when id is not a
 * valid client id, FM_ERR_STATE when libzmq was built without CURVE. */
fm_status fm_key_generate(fm_key_t *k, const char *id);
/* Writes dir/ID.key (id, public, secret; mode 0600) and dir/ID.pub (id,
 * public; 0644), each created anew and synced: an existing file is never
 * overwritten (FM_ERR_IO naming it). */
fm_status fm_key_write(const fm_key_t *k, const char *dir);
/* Reads a key file. With need_secret, a file without a secret key is refused.
 * Refused with FM_ERR_FORMAT and a reason naming the file and line: an unknown
 * name, a value that is not 40 Z85 characters, a missing id or public key, a
 * secret key that does not match the public one, a file over 4 KiB; and a key
 * pair file that others may read (mode & 077), with FM_ERR_ARG. */
fm_status fm_key_read(const char *path, bool need_secret, fm_key_t *k);
/* The 32 bytes of a checked Z85 key. */
void fm_key_binary(const char *z85, uint8_t out[FM_KEY_BYTES]);

/* Makes sock (a ROUTER, before it binds) a CURVE server with key pair own;
 * peers are checked by the ZAP handler (domain "fedmoe"). */
fm_status fm_key_apply_server(void *sock, const fm_key_t *own);
/* Makes sock (before it connects) a CURVE client with key pair own that talks
 * only to the server whose public key is server_public (Z85). */
fm_status fm_key_apply_client(void *sock, const fm_key_t *own, const char *server_public);

typedef struct fm_allowlist fm_allowlist_t;

/* Reads every *.pub file in dir (other files are ignored). Refused with a reason:
 * a file that does not read (fm_key_read), two files with one id, two ids with
 * one key, more than 100,000 files. An empty folder is allowed (nobody may join
 * yet). Caller frees with fm_allowlist_free. */
fm_status fm_allowlist_load(fm_allowlist_t **out, const char *dir);
/* The id that public key key belongs to, or NULL. Owned by the list. */
const char *fm_allowlist_id(const fm_allowlist_t *a, const uint8_t key[FM_KEY_BYTES]);
/* Whether id has a key in the list. */
bool fm_allowlist_has(const fm_allowlist_t *a, const char *id);
/* Keys in the list. */
size_t fm_allowlist_count(const fm_allowlist_t *a);
/* Frees the list, sets *a to NULL; safe on NULL. */
void fm_allowlist_free(fm_allowlist_t **a);

#endif
