/* keys.c - CURVE key files (read, write, generate) and the allow-list. */
#include "fedmoe/keys.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "fedmoe/dir.h"
#include "fedmoe/log.h"
#include "fedmoe/id.h"

#define KEY_FILE_MAX 4096
#define ALLOW_MAX 100000

fm_status fm_key_generate(fm_key_t *k, const char *id)
{
    memset(k, 0, sizeof *k);
    if (!fm_id_valid(id, strlen(id))) {
        fm_error_set("key id '%.63s' is not [A-Za-z0-9._-]{1,63}", id);
        return FM_ERR_ARG;
    }
    if (!zmq_has("curve")) {
        fm_error_set("this libzmq has no CURVE support");
        return FM_ERR_STATE;
    }
    if (zmq_curve_keypair(k->public_z85, k->secret_z85) != 0) {
        fm_error_set("cannot make a key pair: %s", zmq_strerror(zmq_errno()));
        return FM_ERR_STATE;
    }
    snprintf(k->id, sizeof k->id, "%s", id);
    return FM_OK;
}

/* Creates path (never overwriting) with mode and text, synced. */
static fm_status write_new(const char *path, mode_t mode, const char *text)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) {
        fm_error_set("cannot create %s: %s", path, strerror(errno));
        return FM_ERR_IO;
    }
    size_t len = strlen(text);
    bool ok = write(fd, text, len) == (ssize_t)len && fchmod(fd, mode) == 0 && fsync(fd) == 0;
    int err = errno;
    if (close(fd) != 0 && ok) {
        ok = false;
        err = errno;
    }
    if (!ok) {
        unlink(path);
        fm_error_set("cannot write %s: %s", path, strerror(err));
        return FM_ERR_IO;
    }
    return FM_OK;
}

fm_status fm_key_write(const fm_key_t *k, const char *dir)
{
    char path[1200], text[512];
    snprintf(path, sizeof path, "%s/%s.key", dir, k->id);
    snprintf(text, sizeof text,
             "# fedmoe CURVE key pair of %s: keep it secret (mode 0600)\nid = %s\npublic = %s\nsecret = %s\n",
             k->id, k->id, k->public_z85, k->secret_z85);
    fm_status st = write_new(path, 0600, text);
    if (st != FM_OK)
        return st;
    snprintf(path, sizeof path, "%s/%s.pub", dir, k->id);
    snprintf(text, sizeof text, "# fedmoe CURVE public key of %s\nid = %s\npublic = %s\n", k->id, k->id,
             k->public_z85);
    return write_new(path, 0644, text);
}

static bool valid_z85_key(const char *v)
{
    uint8_t bin[FM_KEY_BYTES];
    return strlen(v) == FM_KEY_Z85 && zmq_z85_decode(bin, v) != NULL;
}

void fm_key_binary(const char *z85, uint8_t out[FM_KEY_BYTES]) { zmq_z85_decode(out, z85); }

/* Trims spaces and tabs at both ends, in place. */
static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r'))
        s[--n] = 0;
    return s;
}

/* One "name = value" line into k; a reason on failure. */
static bool key_line(fm_key_t *k, char *line, const char *path, int lineno)
{
    char *s = trim(line);
    if (!*s || *s == '#')
        return true;
    char *eq = strchr(s, '=');
    if (!eq) {
        fm_error_set("%s:%d: expected name = value", path, lineno);
        return false;
    }
    *eq = 0;
    char *name = trim(s), *value = trim(eq + 1);
    if (!strcmp(name, "id")) {
        if (!fm_id_valid(value, strlen(value))) {
            fm_error_set("%s:%d: id is not [A-Za-z0-9._-]{1,63}", path, lineno);
            return false;
        }
        snprintf(k->id, sizeof k->id, "%s", value);
    } else if (!strcmp(name, "public") || !strcmp(name, "secret")) {
        if (!valid_z85_key(value)) {
            fm_error_set("%s:%d: the %s key is not %d characters of Z85", path, lineno, name, FM_KEY_Z85);
            return false;
        }
        memcpy(name[0] == 'p' ? k->public_z85 : k->secret_z85, value, FM_KEY_Z85 + 1);
    } else {
        fm_error_set("%s:%d: unknown name '%.32s' (id, public, secret)", path, lineno, name);
        return false;
    }
    return true;
}

/* The text of a key file, at most KEY_FILE_MAX bytes, into buf. */
static fm_status read_small(const char *path, char *buf, size_t cap, struct stat *sb)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        fm_error_set("cannot open key file %s: %s", path, strerror(errno));
        return FM_ERR_IO;
    }
    ssize_t n = -1;
    if (fstat(fd, sb) == 0 && S_ISREG(sb->st_mode) && sb->st_size < (off_t)cap)
        n = read(fd, buf, cap - 1);
    close(fd);
    if (n < 0 || (size_t)n >= cap - 1) {
        fm_error_set("%s is not a key file (not a regular file of at most %zu bytes)", path, cap - 2);
        return FM_ERR_FORMAT;
    }
    buf[n] = 0;
    return FM_OK;
}

fm_status fm_key_read(const char *path, bool need_secret, fm_key_t *k)
{
    memset(k, 0, sizeof *k);
    char buf[KEY_FILE_MAX + 2];
    struct stat sb;
    fm_status st = read_small(path, buf, sizeof buf, &sb);
    if (st != FM_OK)
        return st;
    int lineno = 0;
    for (char *line = buf, *next; line; line = next) { /* every line, blank ones too, so errors name the right one */
        next = strchr(line, '\n');
        if (next)
            *next++ = 0;
        if (!key_line(k, line, path, ++lineno))
            return FM_ERR_FORMAT;
    }
    if (!k->id[0] || !k->public_z85[0]) {
        fm_error_set("%s: a key file needs an id and a public key", path);
        return FM_ERR_FORMAT;
    }
    if (need_secret && !k->secret_z85[0]) {
        fm_error_set("%s holds no secret key (give the .key file of a pair, not the .pub)", path);
        return FM_ERR_FORMAT;
    }
    if (k->secret_z85[0]) {
        char derived[FM_KEY_Z85 + 1];
        if (zmq_curve_public(derived, k->secret_z85) != 0 || strcmp(derived, k->public_z85) != 0) {
            fm_error_set("%s: the secret key does not belong to the public key", path);
            return FM_ERR_FORMAT;
        }
        if (sb.st_mode & 077) {
            fm_error_set("%s holds a secret key but others may read it (mode %03o): chmod 600 it", path,
                         (unsigned)(sb.st_mode & 0777));
            return FM_ERR_ARG;
        }
    }
    return FM_OK;
}

static fm_status sockopt(void *sock, int opt, const void *v, size_t n, const char *what)
{
    if (zmq_setsockopt(sock, opt, v, n) != 0) {
        fm_error_set("cannot set %s: %s", what, zmq_strerror(zmq_errno()));
        return FM_ERR_STATE;
    }
    return FM_OK;
}

fm_status fm_key_apply_server(void *sock, const fm_key_t *own)
{
    int one = 1;
    fm_status st = sockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof one, "CURVE server");
    if (st == FM_OK)
        st = sockopt(sock, ZMQ_CURVE_SECRETKEY, own->secret_z85, FM_KEY_Z85, "the CURVE secret key");
    if (st == FM_OK)
        st = sockopt(sock, ZMQ_ZAP_DOMAIN, "fedmoe", 6, "the ZAP domain");
    return st;
}

fm_status fm_key_apply_client(void *sock, const fm_key_t *own, const char *server_public)
{
    fm_status st = sockopt(sock, ZMQ_CURVE_SERVERKEY, server_public, FM_KEY_Z85, "the coordinator's public key");
    if (st == FM_OK)
        st = sockopt(sock, ZMQ_CURVE_PUBLICKEY, own->public_z85, FM_KEY_Z85, "the CURVE public key");
    if (st == FM_OK)
        st = sockopt(sock, ZMQ_CURVE_SECRETKEY, own->secret_z85, FM_KEY_Z85, "the CURVE secret key");
    return st;
}

/* ---- the allow-list ------------------------------------------------------------ */

typedef struct {
    uint8_t key[FM_KEY_BYTES];
    char id[64];
} allow_entry_t;

struct fm_allowlist {
    allow_entry_t *by_key; /* sorted by key */
    allow_entry_t *by_id;  /* sorted by id */
    size_t n;
};

static int cmp_key(const void *a, const void *b)
{
    return memcmp(((const allow_entry_t *)a)->key, ((const allow_entry_t *)b)->key, FM_KEY_BYTES);
}

static int cmp_id(const void *a, const void *b)
{
    return strcmp(((const allow_entry_t *)a)->id, ((const allow_entry_t *)b)->id);
}

static bool ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), t = strlen(tail);
    return n > t && !strcmp(s + n - t, tail);
}

/* Reads dir's .pub files into a->by_key (unsorted). */
static fm_status read_dir(fm_allowlist_t *a, const char *dir)
{
    fm_names_t files;
    fm_status st = fm_dir_names(dir, FM_DIR_FILES | FM_DIR_FOLLOW, &files);
    if (st == FM_ERR_IO) {
        char why[1400];
        snprintf(why, sizeof why, "%s", fm_error_last());
        fm_error_set("the allow-list: %s", why);
    }
    size_t cap = 0;
    for (int i = 0; st == FM_OK && i < files.n; i++) {
        if (!ends_with(files.names[i], ".pub"))
            continue;
        if (a->n == ALLOW_MAX) {
            fm_error_set("%s: more than %d keys", dir, ALLOW_MAX);
            st = FM_ERR_FORMAT;
            break;
        }
        if (a->n == cap) {
            cap = cap ? cap * 2 : 64;
            allow_entry_t *p = realloc(a->by_key, sizeof *p * cap);
            if (!p) {
                st = FM_ERR_NOMEM;
                break;
            }
            a->by_key = p;
        }
        char path[1400];
        fm_key_t k;
        snprintf(path, sizeof path, "%s/%s", dir, files.names[i]);
        if ((st = fm_key_read(path, false, &k)) != FM_OK)
            break;
        fm_key_binary(k.public_z85, a->by_key[a->n].key);
        snprintf(a->by_key[a->n].id, sizeof a->by_key[a->n].id, "%s", k.id);
        a->n++;
    }
    fm_names_free(&files);
    return st;
}

fm_status fm_allowlist_load(fm_allowlist_t **out, const char *dir)
{
    *out = NULL;
    fm_allowlist_t *a = calloc(1, sizeof *a);
    if (!a)
        return FM_ERR_NOMEM;
    fm_status st = read_dir(a, dir);
    if (st == FM_OK && !(a->by_id = malloc(sizeof *a->by_id * (a->n ? a->n : 1))))
        st = FM_ERR_NOMEM;
    if (st == FM_OK && a->n > 0) { /* (an empty folder: nobody may join yet) */
        memcpy(a->by_id, a->by_key, sizeof *a->by_id * a->n);
        qsort(a->by_key, a->n, sizeof *a->by_key, cmp_key);
        qsort(a->by_id, a->n, sizeof *a->by_id, cmp_id);
        for (size_t i = 1; i < a->n && st == FM_OK; i++) {
            if (!cmp_key(&a->by_key[i - 1], &a->by_key[i])) {
                fm_error_set("%s: one key for two ids (%s, %s)", dir, a->by_key[i - 1].id, a->by_key[i].id);
                st = FM_ERR_FORMAT;
            } else if (!cmp_id(&a->by_id[i - 1], &a->by_id[i])) {
                fm_error_set("%s: two keys for id %s", dir, a->by_id[i].id);
                st = FM_ERR_FORMAT;
            }
        }
    }
    if (st == FM_ERR_NOMEM)
        fm_error_set("allow-list: out of memory");
    if (st != FM_OK) {
        fm_allowlist_free(&a);
        return st;
    }
    *out = a;
    return FM_OK;
}

const char *fm_allowlist_id(const fm_allowlist_t *a, const uint8_t key[FM_KEY_BYTES])
{
    allow_entry_t probe;
    memcpy(probe.key, key, FM_KEY_BYTES);
    const allow_entry_t *e = a && a->n ? bsearch(&probe, a->by_key, a->n, sizeof probe, cmp_key) : NULL;
    return e ? e->id : NULL;
}

bool fm_allowlist_has(const fm_allowlist_t *a, const char *id)
{
    allow_entry_t probe;
    snprintf(probe.id, sizeof probe.id, "%s", id);
    return a && a->n && bsearch(&probe, a->by_id, a->n, sizeof probe, cmp_id) != NULL;
}

size_t fm_allowlist_count(const fm_allowlist_t *a) { return a ? a->n : 0; }

void fm_allowlist_free(fm_allowlist_t **a)
{
    if (!a || !*a)
        return;
    free((*a)->by_key);
    free((*a)->by_id);
    free(*a);
    *a = NULL;
}
