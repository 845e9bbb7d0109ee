/* fedmoe-bench: performance measurements that print one JSON line each.
 *
 *   fedmoe-bench train [--task image|text] [--stem mlp|cnn] [--batch B] [--context T] [--steps N] [--repeats R]
 *                      [--threads T]
 *
 * train: local training throughput of the default model (lower-level steps, the
 * full backward, with K non-local prompts so the gating runs) on synthetic
 * standardized inputs; the median over R repeats of N steps. With --task text,
 * the default text model on windows of random bytes, in tokens (bytes
 * predicted) a second. Also the GEMM GFLOP/s the step reaches and the
 * single-thread cblas_sgemm peak (1024^3) for the fraction of peak. */
#include <cblas.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fedmoe/args.h"
#include "fedmoe/clock.h"
#include "fedmoe/kernels.h"
#include "fedmoe/log.h"
#include "fedmoe/model.h"
#include "fedmoe/rng.h"
#include "fedmoe/train.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Single-thread SGEMM GFLOP/s on n x n x n, median of 5. */
static double sgemm_peak(int n)
{
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n), *c = malloc(sizeof(float) * n * n);
    fm_rng_t r;
    fm_rng_init(&r, 1, 1);
    fm_rng_fill_uniform(&r, a, (size_t)n * n, 1);
    fm_rng_fill_uniform(&r, b, (size_t)n * n, 1);
    double g[5];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
    for (int i = 0; i < 5; i++) {
        double t0 = fm_clock_seconds();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
        g[i] = 2.0 * n * n * n / (fm_clock_seconds() - t0) / 1e9;
    }
    free(a);
    free(b);
    free(c);
    return median(g, 5);
}

/* n synthetic examples for a model of mc: standardized inputs and labels, or
 * windows of random bytes (the caller frees it with fm_dataset_free). */
static fm_dataset_t synthetic(const fm_model_config_t *mc, size_t n, fm_rng_t *r)
{
    const bool text = mc->family == FM_FAMILY_TEXT;
    size_t per = text ? (size_t)mc->context + 1 : (size_t)mc->in_dim;
    fm_dataset_t ds = {.n = n, .dim = text ? mc->context : mc->in_dim, .classes = text ? 1 : mc->classes};
    ds.y = calloc(n, 1);
    if (text)
        ds.tok = malloc(n * per);
    else
        ds.x = malloc(sizeof(float) * n * per);
    for (size_t i = 0; i < n * per; i++) {
        if (text)
            ds.tok[i] = (uint8_t)fm_rng_below(r, 256);
        else
            ds.x[i] = (float)fm_rng_normal(r);
    }
    for (size_t i = 0; i < n && !text; i++)
        ds.y[i] = (uint8_t)fm_rng_below(r, (uint32_t)mc->classes);
    return ds;
}

typedef struct {
    fm_model_config_t mc;
    int batch, steps, repeats, threads;
    bool shapes; /* --gemm-shapes: then a table of the step's matrix products by shape */
} train_args_t;

/* fedmoe-bench train's flags into a: -1 to go on, else the exit code (0 after --help). */
static int train_args(int argc, char **argv, train_args_t *a)
{
    static const struct option opts[] = {{"stem", required_argument, 0, 's'}, {"batch", required_argument, 0, 'b'},
                                         {"task", required_argument, 0, 'k'}, {"context", required_argument, 0, 'c'},
                                         {"steps", required_argument, 0, 'n'}, {"repeats", required_argument, 0, 'r'},
                                         {"threads", required_argument, 0, 't'}, {"help", no_argument, 0, 'h'},
                                         {"gemm-shapes", no_argument, 0, 'g'}, {0, 0, 0, 0}};
    *a = (train_args_t){.batch = 32, .steps = 200, .repeats = 5, .threads = 1};
    fm_model_config_default(&a->mc);
    int context = 0, c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        fm_status st = FM_OK;
        switch (c) {
        case 's': st = fm_stem_parse("--stem", optarg, &a->mc.stem); break;
        case 'k':
            if ((st = fm_family_parse("--task", optarg, &a->mc.family)) == FM_OK && a->mc.family == FM_FAMILY_TEXT)
                fm_model_config_text(&a->mc);
            break;
        case 'b': st = fm_arg_int("--batch", optarg, 1, 4096, &a->batch); break;
        case 'c': st = fm_arg_int("--context", optarg, 1, 4096, &context); break;
        case 'n': st = fm_arg_int("--steps", optarg, 1, 1000000, &a->steps); break;
        case 'r': st = fm_arg_int("--repeats", optarg, 1, 1000, &a->repeats); break;
        case 't': st = fm_arg_int("--threads", optarg, 1, 256, &a->threads); break;
        case 'g': a->shapes = true; break;
        case 'h':
            printf("usage: fedmoe-bench train [--task image|text] [--stem mlp|cnn] [--batch 32] [--context T (text)] "
                   "[--steps 200] [--repeats 5] [--threads 1] [--gemm-shapes]\n"
                   "  --gemm-shapes  after the JSON line, the lower-level step's matrix products by\n"
                   "                 shape (calls a step, time, GFLOP/s, share of the step)\n");
            return 0;
        default:
            fm_error_set("unknown or incomplete option '%s'", argv[optind - 1]);
            st = FM_ERR_ARG;
        }
        if (st != FM_OK) {
            fprintf(stderr, "fedmoe-bench: %s\n", fm_error_last());
            return 2;
        }
    }
    if (context && a->mc.family != FM_FAMILY_TEXT) {
        fprintf(stderr, "fedmoe-bench: --context is for --task text\n");
        return 2;
    }
    if (context)
        a->mc.context = context;
    return -1;
}

typedef struct {
    bool ta, tb;
    int m0, m1, N, k0, k1; /* M in m0..m1, K in k0..k1: an expert's products take the tokens routed to it, as
                              M, or as K in its weights' gradient (op TN) */
    double calls, seconds, flop;
} shape_row_t;

static int by_seconds(const void *x, const void *y)
{
    double a = ((const shape_row_t *)x)->seconds, b = ((const shape_row_t *)y)->seconds;
    return (a < b) - (a > b);
}

/* steps more lower-level steps with every matrix product timed: a table of
 * the shapes, the slowest first (op: N or T for each operand as fm_gemm
 * takes it, row-major; C (M,N) = op(A) (M,K) op(B) (K,N)); products that
 * differ only in the tokens routed to an expert (M; K for a weight gradient,
 * op TN) are one row. */
static void print_shapes(fm_trainer_t *t, fm_batch_t *b, int pool, int steps)
{
    fm_gemm_profile(true);
    double t0 = fm_clock_seconds();
    for (int i = 0; i < steps; i++)
        fm_trainer_step(t, FM_LEVEL_LOWER, &b[i % pool]);
    double step = (fm_clock_seconds() - t0) / steps, gemm = 0.0;
    fm_gemm_profile(false);
    const fm_gemm_shape_t *v;
    int lost, n = fm_gemm_profile_shapes(&v, &lost), k = 0;
    shape_row_t *rows = calloc((size_t)(n ? n : 1), sizeof *rows);
    if (!rows)
        return;
    for (int i = 0; i < n; i++) {
        const fm_gemm_shape_t *g = &v[i];
        int j = 0;
        bool tn = g->trans_a && !g->trans_b; /* (then K varies, else M) */
        while (j < k && !(rows[j].ta == g->trans_a && rows[j].tb == g->trans_b && rows[j].N == g->N &&
                          (tn ? rows[j].m0 == g->M : rows[j].k0 == g->K)))
            j++;
        if (j == k)
            rows[k++] = (shape_row_t){g->trans_a, g->trans_b, g->M, g->M, g->N, g->K, g->K, 0, 0, 0};
        shape_row_t *r = &rows[j];
        r->m0 = g->M < r->m0 ? g->M : r->m0;
        r->m1 = g->M > r->m1 ? g->M : r->m1;
        r->k0 = g->K < r->k0 ? g->K : r->k0;
        r->k1 = g->K > r->k1 ? g->K : r->k1;
        r->calls += (double)g->calls / steps;
        r->seconds += g->seconds / steps;
        r->flop += 2.0 * g->M * g->N * g->K * (double)g->calls / steps;
    }
    qsort(rows, (size_t)k, sizeof *rows, by_seconds);
    printf("| op | M | N | K | calls a step | us a step | GFLOP/s | share of the step |\n"
           "|---|--:|--:|--:|--:|--:|--:|--:|\n");
    for (int i = 0; i < k; i++) {
        const shape_row_t *r = &rows[i];
        char m[32], kk[32];
        snprintf(m, sizeof m, r->m0 == r->m1 ? "%d" : "%d-%d", r->m0, r->m1);
        snprintf(kk, sizeof kk, r->k0 == r->k1 ? "%d" : "%d-%d", r->k0, r->k1);
        gemm += r->seconds;
        printf("| %c%c | %s | %d | %s | %.2f | %.1f | %.1f | %.1f%% |\n", r->ta ? 'T' : 'N', r->tb ? 'T' : 'N', m, r->N,
               kk, r->calls, 1e6 * r->seconds, r->flop / r->seconds / 1e9, 100.0 * r->seconds / step);
    }
    printf("step %.1f us: matrix products %.1f%%, the rest (elementwise passes, gathers, optimizer) %.1f%%%s\n",
           1e6 * step, 100.0 * gemm / step, 100.0 * (1.0 - gemm / step),
           lost ? " (some products' shapes did not fit the profile: not counted)" : "");
    free(rows);
}

static int bench_train(int argc, char **argv)
{
    train_args_t a;
    int code = train_args(argc, argv, &a);
    if (code >= 0)
        return code;
    fm_kernels_set_threads(a.threads);
    fm_model_t *m = NULL;
    fm_trainer_t *t = NULL;
    fm_train_config_t tc;
    fm_train_config_default(&tc);
    tc.batch = a.batch;
    if (fm_model_new(&m, &a.mc, 1, fm_rng_stream(FM_STREAM_LOCAL, 0)) != FM_OK ||
        fm_trainer_new(&t, m, &tc, 1, fm_rng_stream(FM_STREAM_SHUFFLE, 0)) != FM_OK) {
        fprintf(stderr, "fedmoe-bench: %s\n", fm_error_last());
        return 1;
    }
    fm_rng_t r;
    fm_rng_init(&r, 2, 2);
    const bool text = a.mc.family == FM_FAMILY_TEXT;
    size_t psz = (size_t)a.mc.prompt_len * a.mc.prompt_dim;
    float *nl = malloc(sizeof(float) * (psz * a.mc.max_nonlocal + 1));
    fm_rng_fill_uniform(&r, nl, psz * a.mc.max_nonlocal, 0.05f);
    if (!text)
        fm_model_set_nonlocal(m, nl, a.mc.max_nonlocal);
    const int pool = 16;
    fm_dataset_t ds = synthetic(&a.mc, (size_t)pool * a.batch, &r);
    fm_batch_t b[pool];
    for (int i = 0; i < pool; i++)
        b[i] = (fm_batch_t){.ds = &ds, .first = (size_t)i * a.batch, .n = a.batch};
    for (int i = 0; i < 20; i++) /* warm-up */
        fm_trainer_step(t, FM_LEVEL_LOWER, &b[i % pool]);
    double *sps = malloc(sizeof(double) * a.repeats), *gfl = malloc(sizeof(double) * a.repeats);
    double *usps = malloc(sizeof(double) * a.repeats);
    for (int rep = 0; rep < a.repeats; rep++) {
        uint64_t f0 = fm_gemm_flops();
        double t0 = fm_clock_seconds();
        for (int i = 0; i < a.steps; i++)
            fm_trainer_step(t, FM_LEVEL_LOWER, &b[i % pool]);
        double dt = fm_clock_seconds() - t0;
        sps[rep] = (double)a.steps * a.batch * fm_model_predictions(m) / dt;
        gfl[rep] = (double)(fm_gemm_flops() - f0) / dt / 1e9;
        t0 = fm_clock_seconds();
        for (int i = 0; i < a.steps; i++)
            fm_trainer_step(t, FM_LEVEL_UPPER, &b[i % pool]);
        usps[rep] = (double)a.steps * a.batch * fm_model_predictions(m) / (fm_clock_seconds() - t0);
    }
    double peak = sgemm_peak(1024);
    double s = median(sps, a.repeats), g = median(gfl, a.repeats), u = median(usps, a.repeats);
    /* (text: per token, a byte predicted; image: per sample) */
    const char *unit = text ? "tokens" : "samples";
    printf("{\"bench\":\"train\",\"impl\":\"fedmoe\",\"task\":\"%s\",\"stem\":\"%s\",\"batch\":%d,"
           "\"context\":%d,\"threads\":%d,\"steps\":%d,\"repeats\":%d,\"%s_per_s\":%.1f,\"upper_%s_per_s\":%.1f,"
           "\"gemm_gflops\":%.2f,\"sgemm_peak_gflops\":%.2f,\"peak_fraction\":%.3f,\"params\":%zu}\n",
           fm_family_name(a.mc.family), fm_stem_name(a.mc.stem), a.batch, text ? a.mc.context : 0, a.threads, a.steps,
           a.repeats, unit, s, unit, u, g, peak, g / peak, fm_params_total(fm_model_params(m)));
    if (a.shapes)
        print_shapes(t, b, pool, a.steps);
    free(sps);
    free(gfl);
    free(usps);
    fm_dataset_free(&ds);
    free(nl);
    fm_trainer_destroy(&t);
    fm_model_destroy(&m);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        FILE *f = argc < 2 ? stderr : stdout;
        fprintf(f, "usage: fedmoe-bench train [options]   (fedmoe-bench train --help)\n");
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "train") == 0)
        return bench_train(argc - 1, argv + 1);
    fprintf(stderr, "fedmoe-bench: unknown benchmark '%s' (try: train)\n", argv[1]);
    return 2;
}
