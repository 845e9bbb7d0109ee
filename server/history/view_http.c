/* view_http.c - the browser view's HTTP server (view_http.h): one
 * libmicrohttpd thread answers requests one at a time from one read-only
 * store (SQLite in WAL mode: the coordinator goes on writing). */
#include "view_http.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fedmoe/log.h"
#include "fedmoe/store.h"
#include "view_api.h"
#include "view_assets.h"

#define MAX_CONNECTIONS 64
#define CONNECTION_TIMEOUT_S 10
#define TOKEN_MIN 16
#define TOKEN_MAX 256

/* What the request handler serves from. */
typedef struct {
    fm_store_t *store;
    char token[TOKEN_MAX + 1]; /* "" : none needed (loopback) */
} server_t;

/* Whether request c carries the token (in constant time). */
static bool token_ok(const server_t *sv, struct MHD_Connection *c)
{
    if (!sv->token[0])
        return true;
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    const char *given = auth && strncmp(auth, "Bearer ", 7) == 0 ? auth + 7
                                                                 : MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "token");
    size_t n = strlen(sv->token);
    return given && strlen(given) == n && CRYPTO_memcmp(given, sv->token, n) == 0;
}

static const char *query_arg(void *ctx, const char *name)
{
    return MHD_lookup_connection_value(ctx, MHD_GET_ARGUMENT_KIND, name);
}

#define JSON "application/json"

/* Queues status and body (len bytes; mode MHD_RESPMEM_MUST_FREE for a
 * malloc'd body, which is freed whatever happens, or MHD_RESPMEM_PERSISTENT);
 * JSON is never cached, the page's files carry the same-origin policy. */
static enum MHD_Result reply(struct MHD_Connection *c, int status, const void *body, size_t len,
                             enum MHD_ResponseMemoryMode mode, const char *type)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, mode);
    if (!r) {
        if (mode == MHD_RESPMEM_MUST_FREE)
            free((void *)body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    if (strcmp(type, JSON) == 0)
        MHD_add_response_header(r, "Cache-Control", "no-store");
    else
        MHD_add_response_header(r, "Content-Security-Policy",
                                "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:");
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_len, void **state)
{
    (void)version;
    (void)upload;
    if (!*state) { /* (called first for the headers: nothing to do yet) */
        *state = c;
        return MHD_YES;
    }
    if (*upload_len) { /* a body: read-only, nothing is taken */
        *upload_len = 0;
        return MHD_YES;
    }
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        static const char msg[] = "{\"error\":\"read-only: only GET and HEAD\"}";
        return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, msg, sizeof msg - 1, MHD_RESPMEM_PERSISTENT, JSON);
    }
    if (strncmp(url, "/api/", 5) != 0) { /* the page: built in, never a file */
        const char *want = strcmp(url, "/") == 0 ? "/index.html" : url;
        for (const fm_view_asset_t *a = fm_view_assets; a->path; a++)
            if (strcmp(a->path, want) == 0)
                return reply(c, MHD_HTTP_OK, a->data, a->len, MHD_RESPMEM_PERSISTENT, a->type);
    }
    const server_t *sv = cls;
    if (!token_ok(sv, c)) {
        static const char msg[] = "{\"error\":\"this view needs its token: Authorization: Bearer TOKEN, or ?token=TOKEN\"}";
        return reply(c, MHD_HTTP_UNAUTHORIZED, msg, sizeof msg - 1, MHD_RESPMEM_PERSISTENT, JSON);
    }
    fm_view_reply_t r;
    fm_view_api(sv->store, url, query_arg, c, &r);
    if (!r.body)
        return MHD_NO;
    return reply(c, r.status, r.body, r.len, MHD_RESPMEM_MUST_FREE, JSON);
}

/* listen "HOST:PORT" into a socket address: loopback, or with any_host any
 * IPv4 address (0.0.0.0: all). */
static fm_status listen_address(const char *listen, bool any_host, struct sockaddr_storage *sa)
{
    memset(sa, 0, sizeof *sa);
    const char *colon = strrchr(listen, ':');
    char host[64];
    if (!colon || colon == listen || (size_t)(colon - listen) >= sizeof host) {
        fm_error_set("--listen '%s': expected HOST:PORT (127.0.0.1:8080)", listen);
        return FM_ERR_ARG;
    }
    memcpy(host, listen, (size_t)(colon - listen));
    host[colon - listen] = 0;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (!colon[1] || *end || port < 1 || port > 65535) {
        fm_error_set("--listen '%s': the port must be 1..65535", listen);
        return FM_ERR_ARG;
    }
    struct sockaddr_in *v4 = (struct sockaddr_in *)sa;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)sa;
    if (!strcmp(host, "localhost") || !strcmp(host, "127.0.0.1")) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)port);
        v4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    } else if (!strcmp(host, "[::1]") || !strcmp(host, "::1")) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)port);
        v6->sin6_addr = in6addr_loopback;
    } else if (any_host && inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)port);
    } else {
        fm_error_set("--listen '%s': %s", listen,
                     any_host ? "expected an IPv4 address, ::1 or localhost"
                              : "without --token-file the view serves loopback only (127.0.0.1, ::1 or "
                                "localhost); give --token-file, or reach it through an SSH tunnel");
        return FM_ERR_ARG;
    }
    return FM_OK;
}

/* The token of file (its first line) into out: at least TOKEN_MIN printable
 * characters, the file readable by its owner alone. */
static fm_status read_token(const char *file, char *out)
{
    struct stat sb;
    FILE *f = fopen(file, "r");
    if (!f || fstat(fileno(f), &sb) != 0) {
        fm_error_set("--token-file %s: cannot read it", file);
        if (f)
            fclose(f);
        return FM_ERR_IO;
    }
    char line[TOKEN_MAX + 2] = "";
    bool got = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    line[strcspn(line, "\r\n")] = 0;
    size_t n = strlen(line);
    bool printable = true;
    for (size_t i = 0; i < n; i++)
        printable &= line[i] > ' ' && line[i] < 0x7f;
    if (sb.st_mode & 077) {
        fm_error_set("--token-file %s: readable by others (chmod 600 it)", file);
        return FM_ERR_ARG;
    }
    if (!got || n < TOKEN_MIN || n > TOKEN_MAX || !printable) {
        fm_error_set("--token-file %s: its first line must be a token of %d to %d printable characters without "
                     "spaces (e.g. openssl rand -hex 24)",
                     file, TOKEN_MIN, TOKEN_MAX);
        return FM_ERR_ARG;
    }
    memcpy(out, line, n + 1);
    return FM_OK;
}

fm_status fm_view_serve(const char *db, const char *listen, const char *token_file, volatile sig_atomic_t *stop)
{
    struct sockaddr_storage sa;
    static server_t sv; /* (the handler's, while the daemon runs) */
    memset(&sv, 0, sizeof sv);
    fm_status st = listen_address(listen, token_file != NULL, &sa);
    if (st == FM_OK && token_file)
        st = read_token(token_file, sv.token);
    if (st != FM_OK)
        return st;
    struct stat sb;
    if (stat(db, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fm_error_set("%s: no such database (fedmoe-server --db writes one)", db);
        return FM_ERR_IO;
    }
    if ((st = fm_store_open(&sv.store, db, true)) != FM_OK)
        return st;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG | (sa.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    struct MHD_Daemon *d = MHD_start_daemon(flags, 0, NULL, NULL, answer, &sv, MHD_OPTION_SOCK_ADDR, &sa,
                                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)MAX_CONNECTIONS,
                                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)CONNECTION_TIMEOUT_S,
                                            MHD_OPTION_END);
    if (!d) {
        fm_error_set("--listen %s: cannot serve there (the port taken?)", listen);
        fm_store_close(&sv.store);
        return FM_ERR_IO;
    }
    fm_info("serving %s on http://%s/ (read-only: the page, and its JSON API under /api/runs%s)", db, listen,
            sv.token[0] ? "; the API needs the token" : "");
    while (!*stop)
        pause();
    MHD_stop_daemon(d);
    fm_store_close(&sv.store);
    return FM_OK;
}
