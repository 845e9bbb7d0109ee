/* gemm_backends.c - OpenBLAS's sgemm against libxsmm's JIT kernels on the
 * shapes of the model's matrix products (issue 33: adopt libxsmm only where
 * it measurably wins). Not part of the build: bench/gemm_backends.sh
 * compiles it where Debian's libxsmm-dev is installed. Row-major
 * C (M,N) = A (M,K) B (K,N), beta 0, each product timed over enough calls
 * for 50 ms, the median of 5 such; libxsmm's column-major kernel is called on
 * the transposed problem (C^T = B^T A^T: the same arithmetic). */
#include <cblas.h>
#include <libxsmm.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

typedef struct {
    const char *what;
    int M, N, K;
} shape_t;

/* seconds a call of one backend (0 OpenBLAS, 1 libxsmm) */
static double time_calls(int backend, libxsmm_smmfunction k, const shape_t *s, const float *A, const float *B,
                         float *C)
{
    double v[5];
    for (int rep = 0; rep < 5; rep++) {
        long calls = 0;
        double t0 = now(), t;
        do {
            for (int i = 0; i < 16; i++) {
                if (backend == 0)
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s->M, s->N, s->K, 1.0f, A, s->K, B, s->N,
                                0.0f, C, s->N);
                else
                    k(B, A, C);
            }
            calls += 16;
        } while ((t = now() - t0) < 0.05);
        v[rep] = t / (double)calls;
    }
    qsort(v, 5, sizeof v[0], cmp);
    return v[2];
}

int main(void)
{
    static const shape_t shapes[] = {
        {"mlp: an expert's first layer (21 of 32 rows routed)", 21, 256, 128},
        {"mlp: an expert's second layer", 21, 128, 256},
        {"mlp: an expert's layer, all 32 rows", 32, 256, 128},
        {"mlp: the stem", 32, 128, 784},
        {"mlp: the gating head (one head)", 32, 50, 16},
        {"text: an attention head, scores", 32, 32, 32},
        {"text: an expert of 4096 tokens (1365 rows)", 1365, 256, 128},
        {"text: the qkv projection", 4096, 384, 128},
        {"cnn: the second convolution (im2col)", 2048, 64, 800},
    };
    libxsmm_init();
    printf("| product | M | N | K | OpenBLAS us | GFLOP/s | libxsmm us | GFLOP/s | libxsmm / OpenBLAS speed | max diff |\n"
           "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const shape_t *s = &shapes[i];
        float *A = malloc(sizeof(float) * s->M * s->K), *B = malloc(sizeof(float) * s->K * s->N);
        float *C0 = malloc(sizeof(float) * s->M * s->N), *C1 = malloc(sizeof(float) * s->M * s->N);
        srand(7);
        for (int j = 0; j < s->M * s->K; j++)
            A[j] = (float)rand() / RAND_MAX - 0.5f;
        for (int j = 0; j < s->K * s->N; j++)
            B[j] = (float)rand() / RAND_MAX - 0.5f;
        float alpha = 1.0f, beta = 0.0f;
        int flags = LIBXSMM_GEMM_FLAG_NONE;
        libxsmm_blasint m = s->N, n = s->M, k = s->K, lda = s->N, ldb = s->K, ldc = s->N;
        libxsmm_smmfunction kern = libxsmm_smmdispatch(m, n, k, &lda, &ldb, &ldc, &alpha, &beta, &flags, NULL);
        double flop = 2.0 * s->M * s->N * s->K, t0 = time_calls(0, NULL, s, A, B, C0);
        if (!kern) {
            printf("| %s | %d | %d | %d | %.2f | %.1f | no kernel | | | |\n", s->what, s->M, s->N, s->K, 1e6 * t0,
                   flop / t0 / 1e9);
        } else {
            double t1 = time_calls(1, kern, s, A, B, C1), diff = 0.0;
            for (int j = 0; j < s->M * s->N; j++)
                diff = fmax(diff, fabs((double)C0[j] - C1[j]));
            printf("| %s | %d | %d | %d | %.2f | %.1f | %.2f | %.1f | %.2fx | %.1e |\n", s->what, s->M, s->N, s->K,
                   1e6 * t0, flop / t0 / 1e9, 1e6 * t1, flop / t1 / 1e9, t0 / t1, diff);
        }
        free(A);
        free(B);
        free(C0);
        free(C1);
    }
    libxsmm_finalize();
    return 0;
}
