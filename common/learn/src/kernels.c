#include "fedmoe/kernels.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#include "fedmoe/clock.h"

static bool g_naive = false;
static _Thread_local uint64_t g_flops = 0;

uint64_t fm_gemm_flops(void) { return g_flops; }

/* The shape profile (benchmarks only): off unless asked, then one thread's;
 * shapes found through an open-addressed table (a text step has a thousand:
 * its experts' rows vary), listed in the order first seen. */
#define PROFILE_SHAPES 4096 /* (a power of two) */
static bool g_profile = false;
static fm_gemm_shape_t g_shapes[PROFILE_SHAPES];
static int g_slot[PROFILE_SHAPES]; /* index + 1 into g_shapes; 0: empty */
static int g_nshapes = 0, g_lost = 0;

void fm_gemm_profile(bool on)
{
    if (on && !g_profile) {
        g_nshapes = g_lost = 0;
        memset(g_slot, 0, sizeof g_slot);
    }
    g_profile = on;
}

int fm_gemm_profile_shapes(const fm_gemm_shape_t **out, int *lost)
{
    *out = g_shapes;
    *lost = g_lost;
    return g_nshapes;
}

static void profile_add(bool ta, bool tb, int M, int N, int K, double seconds)
{
    uint64_t h = ((uint64_t)(unsigned)M * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)(unsigned)N * 0xC2B2AE3D27D4EB4Full) ^
                 ((uint64_t)(unsigned)K * 0x165667B19E3779F9ull) ^ (uint64_t)(ta * 2 + tb);
    for (unsigned probe = 0, at = (unsigned)(h >> 40) & (PROFILE_SHAPES - 1); probe < PROFILE_SHAPES;
         probe++, at = (at + 1) & (PROFILE_SHAPES - 1)) {
        int i = g_slot[at] - 1;
        if (i < 0) {
            if (g_nshapes == PROFILE_SHAPES - 1) /* (kept below full: a probe always ends) */
                break;
            i = g_nshapes++;
            g_slot[at] = i + 1;
            g_shapes[i] = (fm_gemm_shape_t){.trans_a = ta, .trans_b = tb, .M = M, .N = N, .K = K};
        } else if (!(g_shapes[i].trans_a == ta && g_shapes[i].trans_b == tb && g_shapes[i].M == M &&
                     g_shapes[i].N == N && g_shapes[i].K == K)) {
            continue;
        }
        g_shapes[i].calls++;
        g_shapes[i].seconds += seconds;
        return;
    }
    g_lost++;
}

void fm_kernels_set_threads(int threads) { openblas_set_num_threads(threads > 0 ? threads : 1); }

void fm_kernels_use_naive(bool naive) { g_naive = naive; }

void fm_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A, int lda,
             const float *B, int ldb, float beta, float *C, int ldc)
{
    if (M == 0 || N == 0)
        return;
    g_flops += 2ull * (uint64_t)M * N * K;
    if (g_naive || K == 0) {
        fm_gemm_naive(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    double t0 = g_profile ? fm_clock_seconds() : 0.0;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (g_profile)
        profile_add(trans_a, trans_b, M, N, K, fm_clock_seconds() - t0);
}

void fm_gemm_naive(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A,
                   int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double acc = 0.0;
            for (int p = 0; p < K; p++) {
                float a = trans_a ? A[(size_t)p * lda + i] : A[(size_t)i * lda + p];
                float b = trans_b ? B[(size_t)j * ldb + p] : B[(size_t)p * ldb + j];
                acc += (double)a * b;
            }
            float *c = &C[(size_t)i * ldc + j];
            *c = (float)(alpha * acc + (beta == 0.0f ? 0.0 : (double)beta * *c));
        }
}

void fm_linear_forward(float *y, const float *x, const float *w, const float *b, int B, int K, int N)
{
    if (b) {
        for (int i = 0; i < B; i++)
            memcpy(y + (size_t)i * N, b, sizeof(float) * N);
    }
    fm_gemm(false, true, B, N, K, 1.0f, x, K, w, K, b ? 1.0f : 0.0f, y, N);
}

void fm_linear_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
                        const float *w, int B, int K, int N, bool dx_accumulate)
{
    if (dw)
        fm_gemm(true, false, N, K, B, 1.0f, dy, N, x, K, 1.0f, dw, K);
    if (db)
        for (int i = 0; i < B; i++) {
            const float *r = dy + (size_t)i * N;
            for (int j = 0; j < N; j++)
                db[j] += r[j];
        }
    if (dx)
        fm_gemm(false, false, B, K, N, 1.0f, dy, N, w, K, dx_accumulate ? 1.0f : 0.0f, dx, K);
}

float fm_tanh(float x)
{
    /* Rational approximation tanh(x) = x P(x^2) / Q(x^2) on [-7.9, 7.9] (as in Eigen). */
    const float clamp = 7.90531110763549805f;
    x = x > clamp ? clamp : (x < -clamp ? -clamp : x);
    float x2 = x * x;
    float p = -2.76076847742355e-16f;
    p = p * x2 + 2.00018790482477e-13f;
    p = p * x2 + -8.60467152213735e-11f;
    p = p * x2 + 5.12229709037114e-08f;
    p = p * x2 + 1.48572235717979e-05f;
    p = p * x2 + 6.37261928875436e-04f;
    p = p * x2 + 4.89352455891786e-03f;
    p = p * x;
    float q = 1.19825839466702e-06f;
    q = q * x2 + 1.18534705686654e-04f;
    q = q * x2 + 2.26843463243900e-03f;
    q = q * x2 + 4.89352518554385e-03f;
    return p / q;
}

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f

void fm_gelu_forward(float *y, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        float t = fm_tanh(GELU_K * (v + GELU_C * v * v * v));
        y[i] = 0.5f * v * (1.0f + t);
    }
}

void fm_gelu_backward(float *dx, const float *dy, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        float t = fm_tanh(GELU_K * (v + GELU_C * v * v * v));
        float d = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_C * v * v);
        dx[i] = dy[i] * d;
    }
}

void fm_relu_forward(float *y, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void fm_relu_backward(float *dx, const float *dy, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
}

#define LN_EPS 1e-5f

void fm_layernorm_forward(float *y, float *xhat, float *rstd, const float *x, const float *g,
                          const float *b, int B, int D)
{
    for (int i = 0; i < B; i++) {
        const float *xi = x + (size_t)i * D;
        float mean = 0.0f, var = 0.0f;
        for (int j = 0; j < D; j++)
            mean += xi[j];
        mean /= (float)D;
        for (int j = 0; j < D; j++) {
            float c = xi[j] - mean;
            var += c * c;
        }
        var /= (float)D;
        float r = 1.0f / sqrtf(var + LN_EPS);
        rstd[i] = r;
        float *hi = xhat + (size_t)i * D, *yi = y + (size_t)i * D;
        for (int j = 0; j < D; j++) {
            hi[j] = (xi[j] - mean) * r;
            yi[j] = g[j] * hi[j] + b[j];
        }
    }
}

void fm_layernorm_backward(float *dx, float *dg, float *db, const float *dy, const float *xhat,
                           const float *rstd, const float *g, int B, int D)
{
    for (int i = 0; i < B; i++) {
        const float *dyi = dy + (size_t)i * D, *hi = xhat + (size_t)i * D;
        float mean_d = 0.0f, mean_dh = 0.0f;
        for (int j = 0; j < D; j++) {
            float dh = dyi[j] * g[j];
            mean_d += dh;
            mean_dh += dh * hi[j];
        }
        mean_d /= (float)D;
        mean_dh /= (float)D;
        if (dx) {
            float *dxi = dx + (size_t)i * D;
            for (int j = 0; j < D; j++)
                dxi[j] += rstd[i] * (dyi[j] * g[j] - mean_d - hi[j] * mean_dh);
        }
        if (dg)
            for (int j = 0; j < D; j++)
                dg[j] += dyi[j] * hi[j];
        if (db)
            for (int j = 0; j < D; j++)
                db[j] += dyi[j];
    }
}

void fm_softmax(float *y, const float *x, int n)
{
    float mx = x[0];
    for (int i = 1; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    float s = 0.0f;
    for (int i = 0; i < n; i++) {
        y[i] = expf(x[i] - mx);
        s += y[i];
    }
    float inv = 1.0f / s;
    for (int i = 0; i < n; i++)
        y[i] *= inv;
}

void fm_softmax_backward(float *dx, const float *dy, const float *y, int n)
{
    float dot = 0.0f;
    for (int i = 0; i < n; i++)
        dot += y[i] * dy[i];
    for (int i = 0; i < n; i++)
        dx[i] = y[i] * (dy[i] - dot);
}

void fm_topk(int *idx, const float *x, int n, int k)
{
    for (int s = 0; s < k; s++) {
        int best = -1;
        for (int i = 0; i < n; i++) {
            bool taken = false;
            for (int t = 0; t < s; t++)
                taken |= idx[t] == i;
            if (!taken && (best < 0 || x[i] > x[best]))
                best = i;
        }
        idx[s] = best;
    }
}

#define CE_KEPT 512 /* (a byte model predicts 256 classes, an image model 10) */

float fm_cross_entropy(float *dlogits, int *correct, const float *logits, const uint8_t *labels,
                       int B, int C, float scale)
{
    double loss = 0.0, e[CE_KEPT]; /* a row's exponentials, computed once when it has at most CE_KEPT classes */
    int right = 0;
    const bool kept = C <= CE_KEPT;
    for (int i = 0; i < B; i++) {
        const float *z = logits + (size_t)i * C;
        int arg = 0;
        float mx = z[0];
        for (int c = 1; c < C; c++)
            if (z[c] > mx) {
                mx = z[c];
                arg = c;
            }
        right += arg == labels[i];
        double s = 0.0;
        for (int c = 0; c < C; c++) {
            double ec = exp((double)(z[c] - mx));
            s += ec;
            if (kept)
                e[c] = ec;
        }
        loss += log(s) - (double)(z[labels[i]] - mx);
        if (dlogits) {
            float *d = dlogits + (size_t)i * C;
            for (int c = 0; c < C; c++)
                d[c] = (float)((kept ? e[c] : exp((double)(z[c] - mx))) / s) * scale / (float)B;
            d[labels[i]] -= scale / (float)B;
        }
    }
    if (correct)
        *correct = right;
    return (float)(loss / B);
}

void fm_adamw_update(float *w, const float *g, float *m, float *v, size_t n,
                     const fm_adamw_config_t *c, float weight_decay, long step)
{
    float b1 = c->beta1, b2 = c->beta2;
    float bc1 = 1.0f - powf(b1, (float)step), bc2 = 1.0f - powf(b2, (float)step);
    float step_size = c->lr / bc1, inv_sqrt_bc2 = 1.0f / sqrtf(bc2);
    float decay = 1.0f - c->lr * weight_decay;
    for (size_t i = 0; i < n; i++) {
        m[i] = b1 * m[i] + (1.0f - b1) * g[i];
        v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
        w[i] = w[i] * decay - step_size * m[i] / (sqrtf(v[i]) * inv_sqrt_bc2 + c->eps);
    }
}

void fm_im2col(float *cols, const float *img, int H, int W, int C, int KH, int KW)
{
    int OH = H - KH + 1, OW = W - KW + 1;
    for (int oy = 0; oy < OH; oy++)
        for (int ox = 0; ox < OW; ox++) {
            float *row = cols + ((size_t)oy * OW + ox) * KH * KW * C;
            for (int ky = 0; ky < KH; ky++) {
                memcpy(row + (size_t)ky * KW * C, img + ((size_t)(oy + ky) * W + ox) * C,
                       sizeof(float) * KW * C);
            }
        }
}

void fm_col2im(float *dimg, const float *dcols, int H, int W, int C, int KH, int KW)
{
    int OH = H - KH + 1, OW = W - KW + 1;
    for (int oy = 0; oy < OH; oy++)
        for (int ox = 0; ox < OW; ox++) {
            const float *row = dcols + ((size_t)oy * OW + ox) * KH * KW * C;
            for (int ky = 0; ky < KH; ky++) {
                float *dst = dimg + ((size_t)(oy + ky) * W + ox) * C;
                const float *src = row + (size_t)ky * KW * C;
                for (int t = 0; t < KW * C; t++)
                    dst[t] += src[t];
            }
        }
}

void fm_maxpool2_forward(float *y, int32_t *arg, const float *x, int H, int W, int C)
{
    int OH = H / 2, OW = W / 2;
    for (int oy = 0; oy < OH; oy++)
        for (int ox = 0; ox < OW; ox++)
            for (int c = 0; c < C; c++) {
                int32_t best = (int32_t)(((2 * oy) * W + 2 * ox) * C + c);
                for (int dy = 0; dy < 2; dy++)
                    for (int dx = 0; dx < 2; dx++) {
                        int32_t i = (int32_t)(((2 * oy + dy) * W + 2 * ox + dx) * C + c);
                        if (x[i] > x[best])
                            best = i;
                    }
                size_t o = ((size_t)oy * OW + ox) * C + c;
                y[o] = x[best];
                arg[o] = best;
            }
}

void fm_maxpool2_backward(float *dx, const float *dy, const int32_t *arg, int H, int W, int C)
{
    size_t n = (size_t)(H / 2) * (W / 2) * C;
    for (size_t o = 0; o < n; o++)
        dx[arg[o]] += dy[o];
}
