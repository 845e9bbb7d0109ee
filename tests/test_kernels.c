/* Kernels: BLAS paths against their naive twins, elementwise kernels against
 * finite differences, im2col/col2im and max-pool as adjoints. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/kernels.h"
#include "fedmoe/rng.h"

static fm_rng_t R;

static float *randv(size_t n, float bound)
{
    float *x = malloc(sizeof(float) * n);
    fm_rng_fill_uniform(&R, x, n, bound);
    return x;
}

static void test_gemm_matches_naive(void **state)
{
    (void)state;
    const int shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {33, 17, 65}, {128, 10, 128}, {7, 300, 2}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
                float *A = randv((size_t)M * K, 1), *B = randv((size_t)K * N, 1);
                float *C1 = randv((size_t)M * N, 1), *C2 = malloc(sizeof(float) * M * N);
                memcpy(C2, C1, sizeof(float) * M * N);
                int lda = ta ? M : K, ldb = tb ? K : N;
                fm_gemm(ta, tb, M, N, K, 0.7f, A, lda, B, ldb, 0.3f, C1, N);
                fm_gemm_naive(ta, tb, M, N, K, 0.7f, A, lda, B, ldb, 0.3f, C2, N);
                for (int i = 0; i < M * N; i++)
                    assert_float_equal(C1[i], C2[i], 1e-4f * (1.0f + sqrtf((float)K)));
                free(A);
                free(B);
                free(C1);
                free(C2);
            }
}

static void test_linear_backward_matches_finite_differences(void **state)
{
    (void)state;
    int B = 4, K = 6, N = 5;
    float *x = randv(B * K, 1), *w = randv(N * K, 1), *b = randv(N, 1), *up = randv(B * N, 1);
    float y[20], dx[24], dw[30] = {0}, db[5] = {0};
    fm_linear_backward(dx, dw, db, up, x, w, B, K, N, false);
    /* L = <up, x w^T + b> */
    float *targets[3] = {x, w, b}, *grads[3] = {dx, dw, db};
    int sizes[3] = {B * K, N * K, N};
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < sizes[t]; i++) {
            float keep = targets[t][i], h = 1e-2f, lp = 0, lm = 0;
            targets[t][i] = keep + h;
            fm_linear_forward(y, x, w, b, B, K, N);
            for (int j = 0; j < B * N; j++)
                lp += up[j] * y[j];
            targets[t][i] = keep - h;
            fm_linear_forward(y, x, w, b, B, K, N);
            for (int j = 0; j < B * N; j++)
                lm += up[j] * y[j];
            targets[t][i] = keep;
            assert_float_equal(grads[t][i], (lp - lm) / (2 * h), 2e-3f);
        }
    free(x);
    free(w);
    free(b);
    free(up);
}

static void test_tanh_and_gelu(void **state)
{
    (void)state;
    for (float x = -12.0f; x <= 12.0f; x += 0.01f)
        assert_float_equal(fm_tanh(x), tanhf(x), 2e-6f);
    for (float x = -6.0f; x <= 6.0f; x += 0.05f) {
        float y, d, one = 1.0f, yp, ym, h = 1e-3f, xp = x + h, xm = x - h;
        fm_gelu_forward(&y, &x, 1);
        float exact = 0.5f * x * (1.0f + erff(x / sqrtf(2.0f)));
        assert_float_equal(y, exact, 2e-3f); /* the tanh form is close to the erf form */
        fm_gelu_backward(&d, &one, &x, 1);
        fm_gelu_forward(&yp, &xp, 1);
        fm_gelu_forward(&ym, &xm, 1);
        assert_float_equal(d, (yp - ym) / (2 * h), 2e-3f);
    }
}

static void test_layernorm_backward(void **state)
{
    (void)state;
    int B = 3, D = 7;
    float *x = randv(B * D, 2), *g = randv(D, 1), *b = randv(D, 1), *up = randv(B * D, 1);
    float y[21], xh[21], rs[3], dx[21] = {0}, dg[7] = {0}, db[7] = {0};
    fm_layernorm_forward(y, xh, rs, x, g, b, B, D);
    fm_layernorm_backward(dx, dg, db, up, xh, rs, g, B, D);
    float *targets[3] = {x, g, b}, *grads[3] = {dx, dg, db};
    int sizes[3] = {B * D, D, D};
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < sizes[t]; i++) {
            float keep = targets[t][i], h = 1e-2f, lp = 0, lm = 0;
            targets[t][i] = keep + h;
            fm_layernorm_forward(y, xh, rs, x, g, b, B, D);
            for (int j = 0; j < B * D; j++)
                lp += up[j] * y[j];
            targets[t][i] = keep - h;
            fm_layernorm_forward(y, xh, rs, x, g, b, B, D);
            for (int j = 0; j < B * D; j++)
                lm += up[j] * y[j];
            targets[t][i] = keep;
            assert_float_equal(grads[t][i], (lp - lm) / (2 * h), 3e-3f);
        }
    free(x);
    free(g);
    free(b);
    free(up);
}

static void test_softmax_topk_cross_entropy(void **state)
{
    (void)state;
    float x[5] = {0.1f, 2.0f, -1.0f, 2.0f, 0.5f}, y[5];
    fm_softmax(y, x, 5);
    float s = 0;
    for (int i = 0; i < 5; i++)
        s += y[i];
    assert_float_equal(s, 1.0f, 1e-6f);
    int idx[3];
    fm_topk(idx, x, 5, 3);
    assert_int_equal(idx[0], 1); /* ties go to the lower index */
    assert_int_equal(idx[1], 3);
    assert_int_equal(idx[2], 4);
    /* softmax backward against finite differences of <up, softmax(x)> */
    float up[5] = {0.3f, -1.0f, 0.7f, 0.2f, -0.4f}, dx[5];
    fm_softmax_backward(dx, up, y, 5);
    for (int i = 0; i < 5; i++) {
        float keep = x[i], h = 1e-3f, lp = 0, lm = 0;
        x[i] = keep + h;
        fm_softmax(y, x, 5);
        for (int j = 0; j < 5; j++)
            lp += up[j] * y[j];
        x[i] = keep - h;
        fm_softmax(y, x, 5);
        for (int j = 0; j < 5; j++)
            lm += up[j] * y[j];
        x[i] = keep;
        assert_float_equal(dx[i], (lp - lm) / (2 * h), 1e-3f);
    }
    /* cross-entropy gradient */
    float logits[6] = {1.0f, -0.5f, 0.2f, 0.0f, 3.0f, -1.0f}, dl[6];
    uint8_t labels[2] = {2, 1};
    int correct;
    fm_cross_entropy(dl, &correct, logits, labels, 2, 3, 1.0f);
    assert_int_equal(correct, 1);
    for (int i = 0; i < 6; i++) {
        float keep = logits[i], h = 1e-3f;
        logits[i] = keep + h;
        float lp = fm_cross_entropy(NULL, NULL, logits, labels, 2, 3, 1.0f);
        logits[i] = keep - h;
        float lm = fm_cross_entropy(NULL, NULL, logits, labels, 2, 3, 1.0f);
        logits[i] = keep;
        assert_float_equal(dl[i], (lp - lm) / (2 * h), 1e-3f);
    }
}

static void test_adamw_first_step(void **state)
{
    (void)state;
    fm_adamw_config_t c = {.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.0f};
    float w[2] = {1.0f, -2.0f}, g[2] = {0.5f, -3.0f}, m[2] = {0}, v[2] = {0};
    fm_adamw_update(w, g, m, v, 2, &c, 0.1f, 1);
    /* the first bias-corrected step moves each weight by lr * sign(g), after decay */
    assert_float_equal(w[0], 1.0f * (1 - 0.01f) - 0.1f, 1e-5f);
    assert_float_equal(w[1], -2.0f * (1 - 0.01f) + 0.1f, 1e-5f);
}

static void test_im2col_col2im_are_adjoint(void **state)
{
    (void)state;
    int H = 9, W = 8, C = 3, K = 3, OH = H - K + 1, OW = W - K + 1;
    size_t ncol = (size_t)OH * OW * K * K * C;
    float *img = randv((size_t)H * W * C, 1), *dc = randv(ncol, 1), *cols = malloc(sizeof(float) * ncol);
    float *dimg = calloc((size_t)H * W * C, sizeof(float));
    fm_im2col(cols, img, H, W, C, K, K);
    fm_col2im(dimg, dc, H, W, C, K, K);
    double a = 0, b = 0;
    for (size_t i = 0; i < ncol; i++)
        a += (double)cols[i] * dc[i];
    for (int i = 0; i < H * W * C; i++)
        b += (double)img[i] * dimg[i];
    assert_true(fabs(a - b) < 1e-3);
    /* one entry by hand: output (1,2), kernel (2,1), channel 1 */
    assert_float_equal(cols[((1 * OW + 2) * K * K + 2 * K + 1) * C + 1], img[((1 + 2) * W + 2 + 1) * C + 1], 0);
    free(img);
    free(dc);
    free(cols);
    free(dimg);
}

static void test_maxpool(void **state)
{
    (void)state;
    float x[4 * 4 * 2], y[2 * 2 * 2], dy[8], dx[32] = {0};
    int32_t arg[8];
    for (int i = 0; i < 32; i++)
        x[i] = (float)((i * 7) % 13);
    fm_maxpool2_forward(y, arg, x, 4, 4, 2);
    for (int o = 0; o < 8; o++) {
        int oy = o / 4, ox = (o / 2) % 2, c = o % 2;
        float mx = -1;
        for (int dy2 = 0; dy2 < 2; dy2++)
            for (int dx2 = 0; dx2 < 2; dx2++) {
                float v = x[((2 * oy + dy2) * 4 + 2 * ox + dx2) * 2 + c];
                mx = v > mx ? v : mx;
            }
        assert_float_equal(y[o], mx, 0);
        dy[o] = (float)(o + 1);
    }
    fm_maxpool2_backward(dx, dy, arg, 4, 4, 2);
    float s = 0;
    for (int i = 0; i < 32; i++)
        s += dx[i];
    assert_float_equal(s, 36.0f, 0);
}

int main(void)
{
    fm_rng_init(&R, 11, 1);
    fm_kernels_set_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_matches_naive),
        cmocka_unit_test(test_linear_backward_matches_finite_differences),
        cmocka_unit_test(test_tanh_and_gelu),
        cmocka_unit_test(test_layernorm_backward),
        cmocka_unit_test(test_softmax_topk_cross_entropy),
        cmocka_unit_test(test_adamw_first_step),
        cmocka_unit_test(test_im2col_col2im_are_adjoint),
        cmocka_unit_test(test_maxpool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
