/* kernels.h - the numeric kernels of the model, row-major float32.
 *
 * Matrix products go through OpenBLAS's cblas_sgemm; every BLAS path has a naive
 * twin (fm_gemm_naive) that the tests use as the oracle. Elementwise kernels are
 * plain loops the compiler vectorizes. Shapes are written (rows, cols). */
#ifndef FEDMOE_KERNELS_H
#define FEDMOE_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Sets the OpenBLAS thread count (default 1: many clients share a machine). */
void fm_kernels_set_threads(int threads);
/* Routes fm_gemm to the naive twin (for tests that compare whole models). */
void fm_kernels_use_naive(bool naive);

/* C (M,N) = alpha * op(A) op(B) + beta * C, op(X) = X or X^T.
 * op(A) is (M,K), op(B) is (K,N); lda/ldb/ldc are row strides. */
void fm_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A, int lda,
             const float *B, int ldb, float beta, float *C, int ldc);
/* Floating-point operations (2*M*N*K) done by fm_gemm since the start (for benchmarks). */
uint64_t fm_gemm_flops(void);
void fm_gemm_naive(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A,
                   int lda, const float *B, int ldb, float beta, float *C, int ldc);
/* A profile of fm_gemm by shape, for benchmarks (fedmoe-bench train
 * --gemm-shapes): on, it times every call, single-threaded callers only;
 * turning it on clears it. Up to 4,095 shapes, in the order first seen;
 * *lost counts the calls of shapes beyond them. */
typedef struct {
    bool trans_a, trans_b;
    int M, N, K;
    uint64_t calls;
    double seconds;
} fm_gemm_shape_t;
void fm_gemm_profile(bool on);
int fm_gemm_profile_shapes(const fm_gemm_shape_t **out, int *lost);

/* x (B,K), w (N,K), b (N) or NULL -> y (B,N) = x w^T + b */
void fm_linear_forward(float *y, const float *x, const float *w, const float *b, int B, int K, int N);
/* Given dy (B,N): dw (N,K) += dy^T x, db (N) += sum_rows dy, and
 * dx (B,K) = dy w (or += when dx_accumulate). Any of dx, dw, db may be NULL. */
void fm_linear_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
                        const float *w, int B, int K, int N, bool dx_accumulate);

/* A fast tanh (rational approximation, |error| < 1e-6), vectorizable. */
float fm_tanh(float x);
/* GELU, tanh form: y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
void fm_gelu_forward(float *y, const float *x, size_t n);
/* dx = dy * gelu'(x) (dx may alias dy). */
void fm_gelu_backward(float *dx, const float *dy, const float *x, size_t n);
/* ReLU and its backward (dx = dy where x > 0). */
void fm_relu_forward(float *y, const float *x, size_t n);
void fm_relu_backward(float *dx, const float *dy, const float *x, size_t n);

/* LayerNorm over rows: x (B,D) -> y = g * xhat + b; saves xhat (B,D) and rstd (B). */
void fm_layernorm_forward(float *y, float *xhat, float *rstd, const float *x, const float *g,
                          const float *b, int B, int D);
/* dx (B,D) += d/dx; dg, db (D) += (either may be NULL). */
void fm_layernorm_backward(float *dx, float *dg, float *db, const float *dy, const float *xhat,
                           const float *rstd, const float *g, int B, int D);

/* y (n) = softmax(x (n)); y may alias x. */
void fm_softmax(float *y, const float *x, int n);
/* dx (n) = y * (dy - <y, dy>) for y = softmax(x). dx may alias dy. */
void fm_softmax_backward(float *dx, const float *dy, const float *y, int n);
/* idx (k) = indices of the k largest of x (n), largest first; ties go to the lower index. */
void fm_topk(int *idx, const float *x, int n, int k);

/* Mean cross-entropy of logits (B,C) against labels (B). If dlogits is not NULL it
 * receives scale * (softmax - onehot) / B. Optionally counts correct argmax. */
float fm_cross_entropy(float *dlogits, int *correct, const float *logits, const uint8_t *labels,
                       int B, int C, float scale);

/* One AdamW step on n values; step counts from 1. Weight decay is decoupled. */
typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
} fm_adamw_config_t;
void fm_adamw_update(float *w, const float *g, float *m, float *v, size_t n,
                     const fm_adamw_config_t *c, float weight_decay, long step);

/* im2col for a valid (no padding), stride-1 convolution of one channel-last image.
 * img (H,W,C) -> cols (OH*OW, KH*KW*C), OH = H-KH+1, OW = W-KW+1. */
void fm_im2col(float *cols, const float *img, int H, int W, int C, int KH, int KW);
/* The adjoint: dimg (H,W,C) += scatter of dcols (OH*OW, KH*KW*C). */
void fm_col2im(float *dimg, const float *dcols, int H, int W, int C, int KH, int KW);
/* 2x2 max pooling, stride 2, channel-last: x (H,W,C) -> y (H/2,W/2,C); arg keeps the
 * index into x of each maximum. */
void fm_maxpool2_forward(float *y, int32_t *arg, const float *x, int H, int W, int C);
void fm_maxpool2_backward(float *dx, const float *dy, const int32_t *arg, int H, int W, int C);

#endif
