/* The whole model's hand-written backward against central finite differences,
 * for every parameter view: stem (mlp, cnn), LayerNorms, top-k router and the
 * load-balancing term, generalist and specialist experts, the prompt through the
 * frozen class-text encoder, and the attention gating. Also: the frozen parts
 * stay frozen, BLAS and naive products give the same gradients, setting the
 * non-local prompts between a forward and its backward changes no gradient, and
 * parameter roles agree with groups, levels and the strategies. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/kernels.h"
#include "fedmoe/log.h"
#include "fedmoe/model.h"
#include "fedmoe/rng.h"
#include "fedmoe/runspec.h"
#include "fedmoe/train.h"
#include "gradcheck.h"

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
    fm_dataset_t ds; /* set by fwd: a view of x and y */
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

/* The whole of b as one fm_batch_t. */
static fm_batch_t whole(const fm_model_t *m, batch_t *b)
{
    const fm_model_config_t *c = fm_model_config(m);
    b->ds = (fm_dataset_t){.n = BATCH, .dim = c->in_dim, .classes = c->classes, .x = b->x, .y = b->y};
    return (fm_batch_t){.ds = &b->ds, .n = BATCH};
}

/* fm_model_forward on the whole of b. */
static float fwd(fm_model_t *m, batch_t *b, bool with_lb, float *logits)
{
    fm_batch_t fb = whole(m, b);
    return fm_model_forward(m, &fb, with_lb, logits, NULL);
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

/* A model of c made with run seed `seed`, its local group randomized, K random
 * non-local prompts set; *b a random batch from batch_seed. */
static fm_model_t *ready_model(const fm_model_config_t *c, uint64_t seed, int K, uint64_t batch_seed, batch_t *b)
{
    fm_model_t *m = NULL;
    assert_int_equal(fm_model_new(&m, c, seed, fm_rng_stream(FM_STREAM_LOCAL, 0)), FM_OK);
    fm_test_unsettle(m, 3);
    set_random_nonlocal(m, K, 4);
    *b = make_batch(c, batch_seed);
    return m;
}

/* Checks every parameter view (gradcheck.h); returns how many coordinates were compared. */
static int gradcheck(fm_model_t *m, batch_t *b, bool with_lb)
{
    fm_batch_t fb = whole(m, b);
    return fm_test_gradcheck(m, &fb, with_lb, 1e-2f, 12, 2e-3f);
}

/* The gradient of the parameters with one of the roles in `roles` (a bit mask of
 * 1 << role) in block `block` (-1: any) over the last backward, summed in
 * absolute value. */
static double grad_mass(fm_model_t *m, unsigned roles, int block)
{
    fm_params_t *ps = fm_model_params(m);
    double s = 0;
    for (int i = 0; i < ps->count; i++) {
        const fm_param_t *p = &ps->params[i];
        if ((roles & (1u << p->role)) && (block < 0 || p->block == block))
            for (size_t j = 0; j < p->size; j++)
                s += fabs(p->view->g[j]);
    }
    return s;
}

#define ROLE(r) (1u << (r))

static void run_gradcheck(fm_stem_kind stem, int K, bool gating, int G, int S, int top_k)
{
    fm_model_config_t c;
    small_config(&c, stem);
    c.gating = gating;
    c.generalists = G;
    c.specialists = S;
    c.top_k = top_k;
    batch_t b;
    fm_model_t *m = ready_model(&c, 7, K, 5, &b);
    gradcheck(m, &b, true);
    gradcheck(m, &b, false);
    /* every part of the model received gradient */
    fm_params_zero_grad(fm_model_params(m));
    fwd(m, &b, true, NULL);
    fm_model_backward(m, FM_LEVEL_LOWER | FM_LEVEL_UPPER);
    assert_true(grad_mass(m, ROLE(FM_ROLE_STEM), -1) > 0);
    assert_true(grad_mass(m, ROLE(FM_ROLE_NORM), 0) > 0);
    assert_true(grad_mass(m, ROLE(FM_ROLE_GENERALIST) | ROLE(FM_ROLE_SPECIALIST), 1) > 0);
    assert_true(grad_mass(m, ROLE(FM_ROLE_PROMPT), -1) > 0);
    if (G + S > 1)
        assert_true(grad_mass(m, ROLE(FM_ROLE_ROUTER), 0) > 0);
    if (K > 0 && gating)
        assert_true(grad_mass(m, ROLE(FM_ROLE_GATING), -1) > 0);
    else
        assert_true(grad_mass(m, ROLE(FM_ROLE_GATING), -1) == 0);
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
    assert_int_equal(fm_model_new(&m, &c, 7, fm_rng_stream(FM_STREAM_LOCAL, 0)), FM_OK);
    set_random_nonlocal(m, 2, 4);
    batch_t b = make_batch(&c, 5);
    size_t ptsz = (size_t)c.classes * c.d;
    fm_params_t *ps = fm_model_params(m);
    float *prompt = fm_model_prompt(m);
    size_t psz = fm_model_prompt_size(m);
    assert_int_equal(psz, (size_t)c.prompt_len * c.prompt_dim);
    float *prompt0 = malloc(sizeof(float) * psz), *t0 = malloc(sizeof(float) * ptsz);
    memcpy(prompt0, prompt, sizeof(float) * psz);
    memcpy(t0, fm_model_text_features(m), sizeof(float) * ptsz);
    float logits0[BATCH * 4], logits1[BATCH * 4];

    fm_train_config_t tc;
    fm_train_config_default(&tc);
    tc.lower.lr = 0.05f;
    fm_trainer_t *t = NULL;
    assert_int_equal(fm_trainer_new(&t, m, &tc, 1, 1), FM_OK);
    fm_batch_t fb = whole(m, &b);
    for (int i = 0; i < 5; i++)
        fm_trainer_step(t, FM_LEVEL_LOWER, &fb);
    /* the local prompt moved */
    assert_true(memcmp(prompt0, prompt, sizeof(float) * psz) != 0);
    /* the cached non-local features are as set: re-setting them changes no logit */
    fwd(m, &b, false, logits0);
    set_random_nonlocal(m, 2, 4);
    fwd(m, &b, false, logits1);
    assert_memory_equal(logits0, logits1, sizeof logits0);
    /* the encoder is unchanged: the old prompt gives the old text features */
    memcpy(prompt, prompt0, sizeof(float) * psz);
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
    batch_t b;
    fm_model_t *m = ready_model(&c, 9, 4, 6, &b);
    fm_params_t *ps = fm_model_params(m);
    float *g[2][FM_GROUP_COUNT], loss[2];
    for (int naive = 0; naive < 2; naive++) {
        fm_kernels_use_naive(naive);
        fm_params_zero_grad(ps);
        loss[naive] = fwd(m, &b, true, NULL);
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
    assert_int_equal(fm_model_new(&a, &c, 7, fm_rng_stream(FM_STREAM_LOCAL, 0)), FM_OK);
    assert_int_equal(fm_model_new(&b, &c, 7, fm_rng_stream(FM_STREAM_LOCAL, 1)), FM_OK);
    assert_int_equal(fm_model_new(&d, &c, 8, fm_rng_stream(FM_STREAM_LOCAL, 0)), FM_OK);
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

/* Forward, then something between it and its backward: the backward's gradients
 * are those of forward + backward alone, bit for bit. Setting the non-local
 * prompts used to overwrite activations the prompt's backward reads. */
static void run_between(fm_stem_kind stem)
{
    fm_model_config_t c;
    small_config(&c, stem);
    batch_t b;
    fm_model_t *m = ready_model(&c, 7, 3, 5, &b);
    fm_params_t *ps = fm_model_params(m);
    float *want[FM_GROUP_COUNT];
    fm_params_zero_grad(ps);
    fwd(m, &b, true, NULL);
    fm_model_backward(m, FM_LEVEL_LOWER | FM_LEVEL_UPPER);
    for (int g = 0; g < FM_GROUP_COUNT; g++) {
        want[g] = malloc(sizeof(float) * (ps->groups[g].size + 1));
        memcpy(want[g], ps->groups[g].g, sizeof(float) * ps->groups[g].size);
    }
    for (int variant = 0; variant < 4; variant++) {
        fm_params_zero_grad(ps);
        fwd(m, &b, true, NULL);
        if (variant == 0)
            set_random_nonlocal(m, 3, 4); /* the same prompts again */
        else if (variant == 1)
            assert_non_null(fm_model_text_features(m));
        else if (variant == 2)
            set_random_nonlocal(m, 1, 9); /* other prompts: they are the next forward's */
        else
            set_random_nonlocal(m, 0, 9);
        fm_model_backward(m, FM_LEVEL_LOWER | FM_LEVEL_UPPER);
        for (int g = 0; g < FM_GROUP_COUNT; g++)
            assert_memory_equal(ps->groups[g].g, want[g], sizeof(float) * ps->groups[g].size);
        set_random_nonlocal(m, 3, 4);
    }
    for (int g = 0; g < FM_GROUP_COUNT; g++)
        free(want[g]);
    free(b.x);
    fm_model_destroy(&m);
}

static void test_set_nonlocal_between_forward_and_backward(void **state)
{
    (void)state;
    run_between(FM_STEM_MLP);
    run_between(FM_STEM_CNN);
}

/* Every parameter's role and kind agree with its group, level and weight decay
 * (the table in docs/model.md), expert tensors know their block and unit, the
 * prompt is found by role, and the strategies federate by role. */
static void check_roles(bool gate_on_val)
{
    fm_model_config_t c;
    small_config(&c, FM_STEM_CNN);
    c.gating_on_validation = gate_on_val;
    fm_model_t *m = NULL;
    assert_int_equal(fm_model_new(&m, &c, 7, fm_rng_stream(FM_STREAM_LOCAL, 0)), FM_OK);
    fm_params_t *ps = fm_model_params(m);
    int count[FM_ROLE_COUNT] = {0};
    for (int i = 0; i < ps->count; i++) {
        const fm_param_t *p = &ps->params[i];
        assert_true(p->role >= 0 && p->role < FM_ROLE_COUNT);
        count[p->role]++;
        bool expert = p->role == FM_ROLE_GENERALIST || p->role == FM_ROLE_SPECIALIST;
        fm_group_id g = p->role == FM_ROLE_PROMPT ? FM_GROUP_PROMPT
                        : p->role == FM_ROLE_SPECIALIST || p->role == FM_ROLE_ROUTER || p->role == FM_ROLE_GATING
                            ? FM_GROUP_LOCAL
                            : FM_GROUP_SHARED;
        assert_int_equal(p->group, g);
        fm_level lvl = p->role == FM_ROLE_ROUTER || (p->role == FM_ROLE_GATING && gate_on_val) ? FM_LEVEL_UPPER
                                                                                               : FM_LEVEL_LOWER;
        assert_int_equal(p->level, lvl);
        assert_int_equal(p->decay, p->kind == FM_KIND_WEIGHT && p->role != FM_ROLE_ROUTER && p->role != FM_ROLE_PROMPT);
        assert_int_equal(p->unit >= 0, expert);
        if (expert)
            assert_int_equal(p->unit < c.generalists, p->role == FM_ROLE_GENERALIST);
        if (expert || p->role == FM_ROLE_ROUTER)
            assert_true(p->block >= 0 && p->block < c.blocks);
        if (p->kind == FM_KIND_NORM_GAIN || p->kind == FM_KIND_NORM_BIAS)
            assert_int_equal(p->role, FM_ROLE_NORM);
        assert_true(fm_strategy_federates(FM_STRATEGY_COMIGS, p) == (g == FM_GROUP_SHARED));
        assert_true(fm_strategy_federates(FM_STRATEGY_FULL, p) == (g == FM_GROUP_SHARED));
        assert_true(fm_strategy_federates(FM_STRATEGY_FEDAVG, p) ==
                    (g != FM_GROUP_PROMPT && p->role != FM_ROLE_GATING));
        assert_false(fm_strategy_federates(FM_STRATEGY_LOCAL, p));
    }
    int E = c.generalists + c.specialists;
    assert_int_equal(count[FM_ROLE_STEM], 6);
    assert_int_equal(count[FM_ROLE_NORM], 2 * c.blocks + 2);
    assert_int_equal(count[FM_ROLE_ROUTER], c.blocks);
    assert_int_equal(count[FM_ROLE_GENERALIST], 4 * c.blocks * c.generalists);
    assert_int_equal(count[FM_ROLE_SPECIALIST], 4 * c.blocks * c.specialists);
    assert_int_equal(count[FM_ROLE_PROMPT], 1);
    assert_int_equal(count[FM_ROLE_GATING], 8);
    assert_int_equal(ps->count, 6 + 3 * c.blocks + 4 * c.blocks * E + 2 + 1 + 8);
    /* the prompt: by role, by name, by accessor, all the same floats */
    const fm_param_t *pr = fm_params_find_role(ps, FM_ROLE_PROMPT);
    assert_non_null(pr);
    assert_ptr_equal(pr, fm_params_find(ps, "prompt"));
    assert_ptr_equal(pr->view->w, fm_model_prompt(m));
    assert_ptr_equal(fm_model_prompt(m), ps->groups[FM_GROUP_PROMPT].w);
    assert_int_equal(fm_model_prompt_size(m), pr->size);
    assert_null(fm_params_find(ps, "no such parameter"));
    assert_string_equal(fm_role_name(FM_ROLE_SPECIALIST), "specialist");
    assert_string_equal(fm_role_name(FM_ROLE_COUNT), "?");
    fm_model_destroy(&m);
}

static void test_roles(void **state)
{
    (void)state;
    check_roles(false);
    check_roles(true);
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
    /* the count from the sizes is the registry's, for both stems */
    for (int stem = 0; stem < 2; stem++) {
        fm_model_config_default(&c);
        c.stem = stem ? FM_STEM_CNN : FM_STEM_MLP;
        fm_model_t *real = NULL;
        assert_int_equal(fm_model_new(&real, &c, 1, 1), FM_OK);
        assert_true(fm_model_config_parameters(&c) == (double)fm_params_total(fm_model_params(real)));
        fm_model_destroy(&real);
    }
    /* every size within its own range, together far too large: refused before
     * any allocation */
    fm_model_config_default(&c);
    c.d = 4096;
    c.blocks = 64;
    c.ffn_hidden = 65536;
    m = (fm_model_t *)0x1;
    assert_int_equal(fm_model_new(&m, &c, 1, 1), FM_ERR_ARG);
    assert_null(m);
    assert_non_null(strstr(fm_error_last(), "more than the"));
    /* a tiny model with a huge frozen encoder (it once overflowed an int) */
    fm_model_config_default(&c);
    c.classes = 256;
    c.prompt_len = 64;
    c.prompt_dim = 4096;
    c.text_hidden = 65536;
    assert_int_equal(fm_model_config_check(&c), FM_ERR_ARG);
    c.prompt_len = 4096; /* past its own range */
    c.text_hidden = 1;
    assert_int_equal(fm_model_config_check(&c), FM_ERR_ARG);
    fm_model_config_default(&c);
    c.family = (fm_model_family_kind)7; /* no such family */
    assert_int_equal(fm_model_config_check(&c), FM_ERR_ARG);
    assert_non_null(strstr(fm_error_last(), "family"));
}

/* Through the family interface: a batch read in place (first, n) and the same
 * examples gathered by index give the same objective and gradients; data of the
 * wrong shape is refused by the trainer and by evaluation with a reason. */
static void test_batch_paths_and_data_shape(void **state)
{
    (void)state;
    fm_model_config_t c;
    small_config(&c, FM_STEM_MLP);
    fm_model_t *m = NULL;
    assert_int_equal(fm_model_new(&m, &c, 3, 4), FM_OK);
    batch_t b = make_batch(&c, 8);
    fm_batch_t in_place = whole(m, &b);
    uint32_t idx[BATCH];
    for (int i = 0; i < BATCH; i++)
        idx[i] = (uint32_t)i;
    fm_batch_t gathered = {.ds = &b.ds, .idx = idx, .n = BATCH};
    fm_params_t *ps = fm_model_params(m);
    size_t n = ps->groups[FM_GROUP_SHARED].size;
    float *g0 = malloc(sizeof(float) * n);
    fm_params_zero_grad(ps);
    float l0 = fm_model_forward(m, &in_place, true, NULL, NULL);
    fm_model_backward(m, FM_LEVEL_LOWER | FM_LEVEL_UPPER);
    memcpy(g0, ps->groups[FM_GROUP_SHARED].g, sizeof(float) * n);
    fm_params_zero_grad(ps);
    float l1 = fm_model_forward(m, &gathered, true, NULL, NULL);
    fm_model_backward(m, FM_LEVEL_LOWER | FM_LEVEL_UPPER);
    assert_true(l0 == l1);
    assert_memory_equal(g0, ps->groups[FM_GROUP_SHARED].g, sizeof(float) * n);

    fm_dataset_t wrong = b.ds;
    wrong.dim = c.in_dim + 1;
    fm_eval_t ev;
    assert_int_equal(fm_evaluate(m, &wrong, &ev), FM_ERR_ARG);
    assert_non_null(strstr(fm_error_last(), "evaluate: data has 13 features, the model expects 12"));
    fm_train_config_t tc;
    fm_train_config_default(&tc);
    fm_trainer_t *t = NULL;
    fm_train_stats_t ts;
    assert_int_equal(fm_trainer_new(&t, m, &tc, 1, 1), FM_OK);
    wrong = b.ds;
    wrong.classes = c.classes + 1;
    assert_int_equal(fm_trainer_run(t, &wrong, NULL, 1, &ts), FM_ERR_ARG);
    assert_non_null(strstr(fm_error_last(), "train: data has 5 classes, the model has 4"));
    fm_trainer_destroy(&t);
    free(g0);
    free(b.x);
    fm_model_destroy(&m);
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
        cmocka_unit_test(test_set_nonlocal_between_forward_and_backward),
        cmocka_unit_test(test_roles),
        cmocka_unit_test(test_batch_paths_and_data_shape),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
