/* forward_dump: a model's forward pass, written out for a second
 * implementation to reproduce (tests/forward_reference.py, against NumPy
 * models written from the docs alone). In OUTDIR, for every family:
 *   spec.json    the run spec as the round log keeps it (fm_run_spec_json: its
 *                "model" has the ModelSpec field names), and client_partition
 *   init.bin     every parameter as initialised from (seed, partition), registry order
 *   params.bin   the same parameters moved off their initial values (seeded), used below
 *   names.txt    the parameters' names, rows and cols, registry order
 * image (the default family):
 *   x.bin        N inputs (N x in_dim), y.bin their labels (N bytes)
 *   nonlocal.bin K non-local prompts (K x prompt_len x prompt_dim)
 *   logits0.bin  the logits (N x classes) without non-local prompts,
 *   logitsK.bin  and with the K prompts (through the attention gating);
 *   loss0.bin, lossK.bin  their mean cross-entropy against y and the
 *                load-balancing term (2 floats)
 * text, text-untied (the text model with its output layer tied to the byte
 * embedding, or one of its own):
 *   tok.bin      N windows of context + 1 bytes
 *   logits.bin   the logits (N x context x 256) of every position's next byte
 *   loss.bin     their mean cross-entropy and the load-balancing term (2 floats)
 * All floats little-endian float32.
 *   forward_dump OUTDIR [image|text|text-untied] */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/log.h"
#include "fedmoe/model.h"
#include "fedmoe/rng.h"
#include "fedmoe/runspec.h"

enum { N = 24, K = 3, SEED = 11, PARTITION = 5 };

static int write_file(const char *dir, const char *name, const void *data, size_t len)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        fprintf(stderr, "forward_dump: cannot write %s\n", path);
        return -1;
    }
    return 0;
}

/* A forward pass's cross-entropy and load-balancing term. */
static int write_loss(const char *dir, const char *name, const fm_batch_stats_t *st)
{
    float v[2] = {st->loss, st->lb_loss};
    return write_file(dir, name, v, sizeof v);
}

/* Every parameter's values in registry order into one buffer. */
static float *all_params(fm_params_t *ps, size_t *n)
{
    size_t total = 0;
    for (int i = 0; i < ps->count; i++)
        total += ps->params[i].size;
    float *out = malloc(total * sizeof *out), *p = out;
    for (int i = 0; out && i < ps->count; i++) {
        const fm_param_t *q = &ps->params[i];
        memcpy(p, ps->groups[q->group].w + q->offset, q->size * sizeof *p);
        p += q->size;
    }
    *n = total;
    return out;
}

/* The image model's inputs and its logits without and with non-local prompts. */
static int dump_image(const char *dir, fm_model_t *m, const fm_model_config_t *c, fm_rng_t *r)
{
    fm_dataset_t ds = {.n = N, .dim = c->in_dim, .classes = c->classes};
    ds.x = malloc((size_t)N * c->in_dim * sizeof *ds.x);
    ds.y = malloc(N);
    float *nl = malloc((size_t)K * c->prompt_len * c->prompt_dim * sizeof *nl);
    float *logits = malloc((size_t)N * c->classes * sizeof *logits);
    int rc = 1;
    if (!ds.x || !ds.y || !nl || !logits)
        goto out;
    for (size_t j = 0; j < (size_t)N * c->in_dim; j++)
        ds.x[j] = (float)fm_rng_normal(r);
    for (int j = 0; j < N; j++)
        ds.y[j] = (uint8_t)(fm_rng_u32(r) % (uint32_t)c->classes);
    for (size_t j = 0; j < (size_t)K * c->prompt_len * c->prompt_dim; j++)
        nl[j] = 0.1f * (float)fm_rng_normal(r);
    fm_batch_t b = {.ds = &ds, .idx = NULL, .first = 0, .n = N};
    fm_batch_stats_t st;
    if (write_file(dir, "x.bin", ds.x, (size_t)N * c->in_dim * sizeof *ds.x) != 0 ||
        write_file(dir, "y.bin", ds.y, N) != 0 ||
        write_file(dir, "nonlocal.bin", nl, (size_t)K * c->prompt_len * c->prompt_dim * sizeof *nl) != 0)
        goto out;
    fm_model_forward(m, &b, true, logits, &st);
    if (write_file(dir, "logits0.bin", logits, (size_t)N * c->classes * sizeof *logits) != 0 ||
        write_loss(dir, "loss0.bin", &st) != 0)
        goto out;
    if (fm_model_set_nonlocal(m, nl, K) != FM_OK)
        goto out;
    fm_model_forward(m, &b, true, logits, &st);
    if (write_file(dir, "logitsK.bin", logits, (size_t)N * c->classes * sizeof *logits) != 0 ||
        write_loss(dir, "lossK.bin", &st) != 0)
        goto out;
    printf("forward_dump: image, %d inputs, %d non-local prompts\n", N, K);
    rc = 0;
out:
    free(ds.x);
    free(ds.y);
    free(nl);
    free(logits);
    return rc;
}

/* The text model's windows (random bytes) and every position's logits. */
static int dump_text(const char *dir, fm_model_t *m, const fm_model_config_t *c, fm_rng_t *r)
{
    enum { WINDOWS = 3 };
    size_t T = (size_t)c->context, rows = WINDOWS * T;
    fm_dataset_t ds = {.n = WINDOWS, .dim = c->context, .classes = 256};
    ds.tok = malloc(WINDOWS * (T + 1));
    float *logits = malloc(rows * 256 * sizeof *logits);
    int rc = 1;
    if (!ds.tok || !logits)
        goto out;
    for (size_t j = 0; j < WINDOWS * (T + 1); j++)
        ds.tok[j] = (uint8_t)(fm_rng_u32(r) & 0xff);
    fm_batch_t b = {.ds = &ds, .idx = NULL, .first = 0, .n = WINDOWS};
    fm_batch_stats_t st;
    fm_model_forward(m, &b, true, logits, &st);
    if (write_file(dir, "tok.bin", ds.tok, WINDOWS * (T + 1)) != 0 ||
        write_file(dir, "logits.bin", logits, rows * 256 * sizeof *logits) != 0 || write_loss(dir, "loss.bin", &st) != 0)
        goto out;
    printf("forward_dump: text (%s output), %d windows of %zu bytes, loss %.4f nats a byte\n",
           c->untied ? "untied" : "tied", WINDOWS, T, (double)st.loss);
    rc = 0;
out:
    free(ds.tok);
    free(logits);
    return rc;
}

int main(int argc, char **argv)
{
    const char *family = argc == 3 ? argv[2] : "image";
    bool text = strncmp(family, "text", 4) == 0;
    if ((argc != 2 && argc != 3) ||
        (strcmp(family, "image") != 0 && strcmp(family, "text") != 0 && strcmp(family, "text-untied") != 0)) {
        fprintf(stderr, "usage: forward_dump OUTDIR [image|text|text-untied]\n");
        return 2;
    }
    const char *dir = argv[1];
    fm_run_spec_t spec;
    fm_run_spec_default(&spec);
    spec.seed = SEED;
    if (text) {
        fm_model_config_text(&spec.model);
        spec.model.untied = strcmp(family, "text-untied") == 0;
        spec.strategy = FM_STRATEGY_COMIGS;
        snprintf(spec.dataset, sizeof spec.dataset, "fortunes");
    }
    if (fm_run_spec_finish(&spec) != FM_OK) {
        fprintf(stderr, "forward_dump: %s\n", fm_error_last());
        return 1;
    }
    spec.model.gating = !text;
    const fm_model_config_t c = spec.model;
    fm_model_t *m = NULL;
    if (fm_model_new(&m, &c, SEED, fm_rng_stream(FM_STREAM_LOCAL, PARTITION)) != FM_OK)
        return 1;
    fm_params_t *ps = fm_model_params(m);
    char path[1024];
    snprintf(path, sizeof path, "%s/names.txt", dir);
    FILE *nf = fopen(path, "w");
    if (!nf)
        return 1;
    for (int i = 0; i < ps->count; i++)
        fprintf(nf, "%s %d %d\n", ps->params[i].name, ps->params[i].rows, ps->params[i].cols);
    fclose(nf);
    char json[4096];
    size_t jn = fm_run_spec_json(&spec, json, sizeof json);
    if (jn == 0 || jn >= sizeof json - 32)
        return 1;
    jn += (size_t)snprintf(json + jn - 1, sizeof json - jn + 1, ",\"client_partition\":%d}\n", PARTITION) - 1;
    if (write_file(dir, "spec.json", json, jn) != 0)
        return 1;
    size_t np;
    float *p0 = all_params(ps, &np);
    if (!p0 || write_file(dir, "init.bin", p0, np * sizeof *p0) != 0)
        return 1;
    free(p0);
    /* off the initial values (zero biases, unit gains), so that every term of
     * the forward pass counts */
    fm_rng_t r;
    fm_rng_init(&r, 99, 1);
    for (int i = 0; i < ps->count; i++) {
        const fm_param_t *q = &ps->params[i];
        float *w = ps->groups[q->group].w + q->offset;
        for (size_t j = 0; j < q->size; j++)
            w[j] += 0.2f * (fm_rng_uniform(&r) - 0.5f);
    }
    float *p1 = all_params(ps, &np);
    if (!p1 || write_file(dir, "params.bin", p1, np * sizeof *p1) != 0)
        return 1;
    free(p1);
    int rc = text ? dump_text(dir, m, &c, &r) : dump_image(dir, m, &c, &r);
    printf("forward_dump: %d parameters (%zu floats)\n", ps->count, np);
    fm_model_destroy(&m);
    return rc;
}
