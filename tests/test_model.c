/* The whole model's hand-written backward against central finite differences,
 * for every parameter view: stem (mlp, cnn), LayerNorms, top-k router and the
 * load-balancing term, generalist and specialist experts, the prompt through the
 * frozen class-text encoder, and the attention gating. Also: the frozen parts
 * stay frozen, and BLAS and naive products give the same gradients. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/kernels.h"
#include "fedmoe/model.h"
#include "fedmoe/rng.h"
#include "fedmoe/train.h"

#define BATCH 6

static void small_config(fm_model_config_t *c, fm_stem_kind stem)
{
    fm_model_config_default(c);
    c->stem = stem;
    if (stem == FM_STEM_CNN) {
        c->img_h = c->img_w = 16;
        c->in_dim = 256;
    } else {
        c->in_dim = 12;
    }
    c->classes = 4;
    c->d = 8;
    c->blocks = 2;
    c->generalists = 1;
    c->specialists = 2;
    c->ffn_hidden = 6;
    c->top_k = 2;
    c->prompt_len = 2;
    c->prompt_dim = 3;
    c->text_hidden = 5;
    c->heads = 2;
    c->max_nonlocal = 3;
    c->tau = 3.0f;
    c->attn_scale = 2.0f;
    c->lb_weight = 0.5f; /* large, so its gradient is visible next to the cross-entropy */
}

typedef struct {
    float *x;
    uint8_t y[BATCH];
} batch_t;

static batch_t make_batch(const fm_model_config_t *c, uint64_t seed)
{
    batch_t b;
    fm_rng_t r;
    fm_rng_init(&r, seed, 99);
    b.x = malloc(sizeof(float) * BATCH * c->in_dim);
    fm_rng_fill_uniform(&r, b.x, (size_t)BATCH * c->in_dim, 1.5f);
    for (int i = 0; i < BATCH; i++)
        b.y[i] = (uint8_t)fm_rng_below(&r, (uint32_t)c->classes);
    return b;
}

static void set_random_nonlocal(fm_model_t *m, int K, uint64_t seed)
{
    const fm_model_config_t *c = fm_model_config(m);
    size_t n = (size_t)K * c->prompt_len * c->prompt_dim;
    float *p = malloc(sizeof(float) * (n ? n : 1));
    fm_rng_t r;
    fm_rng_init(&r, seed, 77);
    fm_rng_fill_uniform(&r, p, n, 0.5f);
    assert_int_equal(fm_model_set_nonlocal(m, p, K), FM_OK);
    free(p);
}

/* Perturbs the gating and router weights away from their small initial values so
 * every term carries gradient. */
static void randomize_local(fm_model_t *m, uint64_t seed)
{
    fm_params_t *ps = fm_model_params(m);
    fm_rng_t r;
    fm_rng_init(&r, seed, 5);
    for (int i = 0; i < ps->count; i++) {
        fm_param_t *p = &ps->params[i];
        if (strstr(p->name, "router") || strstr(p->name, "gating") || strstr(p->name, ".b") || strstr(p->name, ".ln."))
            for (size_t j = 0; j < p->size; j++)
                p->view->w[j] += 0.5f * (2.0f * fm_rng_uniform(&r) - 1.0f);
    }
}

/* Checks every parameter view; returns how many coordinates were compared. */
static int gradcheck(fm_model_t *m, const batch_t *b, bool with_lb)
{
    fm_params_t *ps = fm_model_params(m);
    fm_params_zero_grad(ps);
    fm_model_forward(m, b->x, b->y, BATCH, with_lb, NULL, NULL);
    uint64_t sig = fm_model_branch_signature(m);
    fm_model_backward(m, FM_LEVEL_LOWER | FM_LEVEL_UPPER);
    float *ana[FM_GROUP_COUNT];
    for (int g = 0; g < FM_GROUP_COUNT; g++) {
        ana[g] = malloc(sizeof(float) * (ps->groups[g].size + 1));
        memcpy(ana[g], ps->groups[g].g, sizeof(float) * ps->groups[g].size);
    }
    int checked = 0, skipped = 0, failed = 0;
    const float h = 1e-2f;
    for (int i = 0; i < ps->count; i++) {
        fm_param_t *p = &ps->params[i];
        size_t step = p->size > 12 ? p->size / 12 : 1;
        int nonzero = 0;
        for (size_t j = 0; j < p->size; j += step) {
            float *w = p->view->w + j, keep = *w;
            *w = keep + h;
            float lp = fm_model_forward(m, b->x, b->y, BATCH, with_lb, NULL, NULL);
            uint64_t sp = fm_model_branch_signature(m);
            *w = keep - h;
            float lm = fm_model_forward(m, b->x, b->y, BATCH, with_lb, NULL, NULL);
            uint64_t sm = fm_model_branch_signature(m);
            *w = keep;
            if (sp != sig || sm != sig) {
                skipped++; /* a routing / pooling / ReLU choice flipped: not differentiable here */
                continue;
            }
            float num = (lp - lm) / (2 * h), an = ana[p->group][p->offset + j];
            float tol = 2e-3f + 3e-2f * fmaxf(fabsf(num), fabsf(an));
            if (fabsf(num - an) > tol) {
                failed++;
                fprintf(stderr, "  %s[%zu]: analytic %.6g numeric %.6g\n", p->name, j, an, num);
            }
            nonzero += fabsf(an) > 1e-7f;
            checked++;
        }
        (void)nonzero;
    }
    for (int g = 0; g < FM_GROUP_COUNT; g++)
        free(ana[g]);
    fprintf(stderr, "  gradcheck: %d coordinates compared, %d skipped at branch points\n", checked, skipped);
    assert_int_equal(failed, 0);
    assert_true(skipped * 10 < checked);
    return checked;
}

/* The gradient of a named view over the last backward, summed in absolute value. */
static double grad_mass(fm_model_t *m, const char *prefix)
{
    fm_params_t *ps = fm_model_params(m);
    double s = 0;
    for (int i = 0; i < ps->count; i++)
        if (strncmp(ps->params[i].name, prefix, strlen(prefix)) == 0)
            for (size_t j = 0; j < ps->params[i].size; j++)
                s += fabs(ps->params[i].view->g[j]);
    return s;
}

static void run_gradcheck(fm_stem_kind stem, int K, bool gating, int G, int S, int top_k)
{
    fm_model_config_t c;
    small_config(&c, stem);
    c.gating = gating;
    c.generalists = G;
    c.specialists = S;
    c.top_k = top_k;
    fm_model_t *m = NULL;
    assert_int_equal(fm_model_new(&m, &c, 7, FM_STREAM_LOCAL), FM_OK);
    randomize_local(m, 3);
    set_random_nonlocal(m, K, 4);
    batch_t b = make_batch(&c, 5);
    gradcheck(m, &b, true);
    gradcheck(m, &b, false);
    /* every part of the model received gradient */
    fm_params_zero_grad(fm_model_params(m));
    fm_model_forward(m, b.x, b.y, BATCH, true, NULL, NULL);
    fm_model_backward(m, FM_LEVEL_LOWER | FM_LEVEL_UPPER);
    assert_true(grad_mass(m, "stem") > 0);
    assert_true(grad_mass(m, "block0.ln") > 0);
    assert_true(grad_mass(m, "block1.expert") > 0);
    assert_true(grad_mass(m, "prompt") > 0);
    if (G + S > 1)
        assert_true(grad_mass(m, "block0.router") > 0);
    if (K > 0 && gating)
        assert_true(grad_mass(m, "gating") > 0);
    else
        assert_true(grad_mass(m, "gating") == 0);
    free(b.x);
    fm_model_destroy(&m);
    assert_null(m);
}

static void test_gradcheck_mlp_gated(void **state) { (void)state; run_gradcheck(FM_STEM_MLP, 3, true, 1, 2, 2); }
static void test_gradcheck_mlp_first_round(void **state) { (void)state; run_gradcheck(FM_STEM_MLP, 0, true, 1, 2, 2); }
static void test_gradcheck_mlp_no_gating(void **state) { (void)state; run_gradcheck(FM_STEM_MLP, 2, false, 1, 2, 2); }
static void test_gradcheck_cnn_gated(void **state) { (void)state; run_gradcheck(FM_STEM_CNN, 2, true, 1, 2, 2); }
static void test_gradcheck_top1_many_specialists(void **state) { (void)state; run_gradcheck(FM_STEM_MLP, 1, true, 2, 3, 1); }
static void test_gradcheck_generalist_only(void **state) { (void)state; run_gradcheck(FM_STEM_MLP, 1, true, 1, 0, 2); }

/* Training moves the local prompt, never the frozen encoder or the non-local prompts. */
static void test_frozen_parts_stay_frozen(void **state)
{
    (void)state;
    fm_model_config_t c;
    small_config(&c, FM_STEM_MLP);
    fm_model_t *m = NULL;
    assert_int_equal(fm_model_new(&m, &c, 7, FM_STREAM_LOCAL), FM_OK);
    set_random_nonlocal(m, 2, 4);
    batch_t b = make_batch(&c, 5);
    size_t ptsz = (size_t)c.classes * c.d;
    fm_params_t *ps = fm_model_params(m);
    const fm_param_t *pp = fm_params_find(ps, "prompt");
    assert_non_null(pp);
    float *prompt0 = malloc(sizeof(float) * pp->size), *t0 = malloc(sizeof(float) * ptsz);
    memcpy(prompt0, pp->view->w, sizeof(float) * pp->size);
    memcpy(t0, fm_model_text_features(m), sizeof(float) * ptsz);
    float logits0[BATCH * 4], logits1[BATCH * 4];

    fm_train_config_t tc;
    fm_train_config_default(&tc);
    tc.lower.lr = 0.05f;
    fm_trainer_t *t = NULL;
    assert_int_equal(fm_trainer_new(&t, m, &tc, 1, 1), FM_OK);
    for (int i = 0; i < 5; i++)
        fm_trainer_step(t, FM_LEVEL_LOWER, b.x, b.y, BATCH);
    /* the local prompt moved */
    assert_true(memcmp(prompt0, pp->view->w, sizeof(float) * pp->size) != 0);
    /* the cached non-local features are as set: re-setting them changes no logit */
    fm_model_forward(m, b.x, b.y, BATCH, false, logits0, NULL);
    set_random_nonlocal(m, 2, 4);
    fm_model_forward(m, b.x, b.y, BATCH, false, logits1, NULL);
    assert_memory_equal(logits0, logits1, sizeof logits0);
    /* the encoder is unchanged: the old prompt gives the old text features */
    memcpy(pp->view->w, prompt0, sizeof(float) * pp->size);
    assert_memory_equal(fm_model_text_features(m), t0, sizeof(float) * ptsz);
    /* and no parameter group holds the encoder or non-local prompts */
    for (int i = 0; i < ps->count; i++)
        assert_null(strstr(ps->params[i].name, "encoder"));
    assert_int_equal(ps->groups[FM_GROUP_PROMPT].size, (size_t)c.prompt_len * c.prompt_dim);
    fm_trainer_destroy(&t);
    free(prompt0);
    free(t0);
    free(b.x);
    fm_model_destroy(&m);
}

/* The default-size model gives the same gradients through BLAS and the naive twin. */
static void test_blas_and_naive_agree(void **state)
{
    (void)state;
    fm_model_config_t c;
    fm_model_config_default(&c);
    c.d = 32;
    c.ffn_hidden = 48;
    c.text_hidden = 40;
    fm_model_t *m = NULL;
    assert_int_equal(fm_model_new(&m, &c, 9, FM_STREAM_LOCAL), FM_OK);
    randomize_local(m, 3);
    set_random_nonlocal(m, 4, 4);
    batch_t b = make_batch(&c, 6);
    fm_params_t *ps = fm_model_params(m);
    float *g[2][FM_GROUP_COUNT], loss[2];
    for (int naive = 0; naive < 2; naive++) {
        fm_kernels_use_naive(naive);
        fm_params_zero_grad(ps);
        loss[naive] = fm_model_forward(m, b.x, b.y, BATCH, true, NULL, NULL);
        fm_model_backward(m, FM_LEVEL_LOWER | FM_LEVEL_UPPER);
        for (int k = 0; k < FM_GROUP_COUNT; k++) {
            g[naive][k] = malloc(sizeof(float) * ps->groups[k].size);
            memcpy(g[naive][k], ps->groups[k].g, sizeof(float) * ps->groups[k].size);
        }
    }
    fm_kernels_use_naive(false);
    assert_float_equal(loss[0], loss[1], 1e-4f);
    for (int k = 0; k < FM_GROUP_COUNT; k++) {
        double scale = 0;
        for (size_t i = 0; i < ps->groups[k].size; i++)
            scale = fmax(scale, fabs(g[1][k][i]));
        for (size_t i = 0; i < ps->groups[k].size; i++)
            assert_true(fabs(g[0][k][i] - g[1][k][i]) <= 1e-4 * scale + 1e-7);
        free(g[0][k]);
        free(g[1][k]);
    }
    free(b.x);
    fm_model_destroy(&m);
}

/* Every client builds the identical shared group and encoder from the seed; the
 * local group depends on the client's stream. */
static void test_initialisation_is_agreed(void **state)
{
    (void)state;
    fm_model_config_t c;
    small_config(&c, FM_STEM_MLP);
    fm_model_t *a = NULL, *b = NULL, *d = NULL;
    assert_int_equal(fm_model_new(&a, &c, 7, FM_STREAM_LOCAL + 0), FM_OK);
    assert_int_equal(fm_model_new(&b, &c, 7, FM_STREAM_LOCAL + 1), FM_OK);
    assert_int_equal(fm_model_new(&d, &c, 8, FM_STREAM_LOCAL + 0), FM_OK);
    fm_params_t *pa = fm_model_params(a), *pb = fm_model_params(b), *pd = fm_model_params(d);
    assert_memory_equal(pa->groups[FM_GROUP_SHARED].w, pb->groups[FM_GROUP_SHARED].w,
                        sizeof(float) * pa->groups[FM_GROUP_SHARED].size);
    assert_memory_equal(fm_model_text_features(a), fm_model_text_features(b), sizeof(float) * c.classes * c.d);
    assert_true(memcmp(pa->groups[FM_GROUP_LOCAL].w, pb->groups[FM_GROUP_LOCAL].w,
                       sizeof(float) * pa->groups[FM_GROUP_LOCAL].size) != 0);
    assert_true(memcmp(pa->groups[FM_GROUP_SHARED].w, pd->groups[FM_GROUP_SHARED].w,
                       sizeof(float) * pa->groups[FM_GROUP_SHARED].size) != 0);
    fm_model_destroy(&a);
    fm_model_destroy(&b);
    fm_model_destroy(&d);
    fm_model_destroy(&d); /* safe on NULL */
}

static void test_config_errors(void **state)
{
    (void)state;
    fm_model_config_t c;
    fm_model_config_default(&c);
    c.heads = 7; /* does not divide 128 */
    fm_model_t *m = (fm_model_t *)0x1;
    assert_int_equal(fm_model_new(&m, &c, 1, 1), FM_ERR_ARG);
    assert_null(m);
    fm_model_config_default(&c);
    c.stem = FM_STEM_CNN;
    c.img_h = 10;
    c.img_w = 10;
    c.in_dim = 100;
    assert_int_equal(fm_model_config_check(&c), FM_ERR_ARG);
    fm_model_config_default(&c);
    c.generalists = 0;
    c.specialists = 0;
    assert_int_equal(fm_model_config_check(&c), FM_ERR_ARG);
}

int main(void)
{
    fm_kernels_set_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradcheck_mlp_gated),
        cmocka_unit_test(test_gradcheck_mlp_first_round),
        cmocka_unit_test(test_gradcheck_mlp_no_gating),
        cmocka_unit_test(test_gradcheck_cnn_gated),
        cmocka_unit_test(test_gradcheck_top1_many_specialists),
        cmocka_unit_test(test_gradcheck_generalist_only),
        cmocka_unit_test(test_frozen_parts_stay_frozen),
        cmocka_unit_test(test_blas_and_naive_agree),
        cmocka_unit_test(test_initialisation_is_agreed),
        cmocka_unit_test(test_config_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
