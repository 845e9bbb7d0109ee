/* The bi-level step: routers move only in the upper level, experts (and the rest)
 * only in the lower; the alternation schedule; and training that learns. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/dataset.h"
#include "fedmoe/log.h"
#include "fedmoe/model.h"
#include "fedmoe/rng.h"
#include "fedmoe/runspec.h"
#include "fedmoe/train.h"

#define DIM 12
#define CLASSES 4

static void config(fm_model_config_t *c, bool gate_on_val)
{
    fm_model_config_default(c);
    c->in_dim = DIM;
    c->classes = CLASSES;
    c->d = 16;
    c->ffn_hidden = 16;
    c->prompt_len = 2;
    c->prompt_dim = 8;
    c->text_hidden = 16;
    c->heads = 2;
    c->max_nonlocal = 2;
    c->gating_on_validation = gate_on_val;
}

/* Gaussian blobs: class c is centred at a random point; separable. */
static void blobs(fm_dataset_t *ds, size_t n, uint64_t seed)
{
    static float centres[CLASSES][DIM];
    fm_rng_t r;
    fm_rng_init(&r, 1234, 1);
    for (int c = 0; c < CLASSES; c++)
        for (int j = 0; j < DIM; j++)
            centres[c][j] = 2.0f * (float)fm_rng_normal(&r);
    fm_rng_init(&r, seed, 2);
    memset(ds, 0, sizeof *ds);
    ds->n = n;
    ds->dim = DIM;
    ds->classes = CLASSES;
    ds->x = malloc(sizeof(float) * n * DIM);
    ds->y = malloc(n);
    for (size_t i = 0; i < n; i++) {
        int c = (int)fm_rng_below(&r, CLASSES);
        ds->y[i] = (uint8_t)c;
        for (int j = 0; j < DIM; j++)
            ds->x[i * DIM + j] = centres[c][j] + (float)fm_rng_normal(&r);
    }
}

typedef struct {
    float *w[FM_GROUP_COUNT];
} snapshot_t;

static snapshot_t snap(fm_model_t *m)
{
    snapshot_t s;
    fm_params_t *ps = fm_model_params(m);
    for (int g = 0; g < FM_GROUP_COUNT; g++) {
        s.w[g] = malloc(sizeof(float) * ps->groups[g].size);
        memcpy(s.w[g], ps->groups[g].w, sizeof(float) * ps->groups[g].size);
    }
    return s;
}

static void unsnap(snapshot_t *s)
{
    for (int g = 0; g < FM_GROUP_COUNT; g++)
        free(s->w[g]);
}

static bool changed(fm_model_t *m, const snapshot_t *s, const fm_param_t *p)
{
    (void)m;
    return memcmp(p->view->w, s->w[p->group] + p->offset, sizeof(float) * p->size) != 0;
}

/* After one step of `level`, exactly the parameters of that level have moved. */
static void check_step_moves_only(fm_model_t *m, fm_trainer_t *t, fm_level level, const fm_dataset_t *d)
{
    snapshot_t s = snap(m);
    fm_batch_t b = {.ds = d, .n = 32};
    fm_trainer_step(t, level, &b);
    fm_params_t *ps = fm_model_params(m);
    for (int i = 0; i < ps->count; i++) {
        const fm_param_t *p = &ps->params[i];
        if (p->level == level)
            assert_true(changed(m, &s, p));
        else
            assert_false(changed(m, &s, p));
    }
    unsnap(&s);
}

static void run_levels(bool gate_on_val)
{
    fm_model_config_t c;
    config(&c, gate_on_val);
    fm_model_t *m = NULL;
    assert_int_equal(fm_model_new(&m, &c, 3, fm_rng_stream(FM_STREAM_LOCAL, 0)), FM_OK);
    float nl[2 * 2 * 8];
    fm_rng_t r;
    fm_rng_init(&r, 5, 5);
    fm_rng_fill_uniform(&r, nl, 32, 0.5f);
    assert_int_equal(fm_model_set_nonlocal(m, nl, 2), FM_OK);
    fm_dataset_t d;
    blobs(&d, 64, 1);
    fm_train_config_t tc;
    fm_train_config_default(&tc);
    fm_trainer_t *t = NULL;
    assert_int_equal(fm_trainer_new(&t, m, &tc, 1, 1), FM_OK);
    fm_params_t *ps = fm_model_params(m);
    /* the levels are as docs/model.md "Client step" says */
    for (int i = 0; i < ps->count; i++) {
        const fm_param_t *p = &ps->params[i];
        bool router = p->role == FM_ROLE_ROUTER, gate = p->role == FM_ROLE_GATING;
        fm_level want = router || (gate && gate_on_val) ? FM_LEVEL_UPPER : FM_LEVEL_LOWER;
        assert_int_equal(p->level, want);
    }
    for (int rep = 0; rep < 3; rep++) {
        check_step_moves_only(m, t, FM_LEVEL_LOWER, &d);
        check_step_moves_only(m, t, FM_LEVEL_UPPER, &d);
    }
    assert_int_equal(fm_trainer_steps(t, FM_LEVEL_LOWER), 3);
    assert_int_equal(fm_trainer_steps(t, FM_LEVEL_UPPER), 3);
    fm_trainer_destroy(&t);
    fm_dataset_free(&d);
    fm_model_destroy(&m);
}

static void test_levels_move_their_own_parameters(void **state) { (void)state; run_levels(false); }
static void test_levels_with_gating_on_validation(void **state) { (void)state; run_levels(true); }

static void test_alternation_schedule(void **state)
{
    (void)state;
    fm_model_config_t c;
    config(&c, false);
    fm_model_t *m = NULL;
    assert_int_equal(fm_model_new(&m, &c, 3, fm_rng_stream(FM_STREAM_LOCAL, 0)), FM_OK);
    fm_dataset_t train, val;
    blobs(&train, 320, 1); /* 10 batches of 32 */
    blobs(&val, 50, 2);
    fm_train_config_t tc;
    fm_train_config_default(&tc);
    tc.expert_steps = 3;
    tc.router_steps = 2;
    fm_trainer_t *t = NULL;
    assert_int_equal(fm_trainer_new(&t, m, &tc, 1, 1), FM_OK);
    fm_train_stats_t st;
    assert_int_equal(fm_trainer_run(t, &train, &val, 2, &st), FM_OK);
    assert_int_equal(st.lower_steps, 20);
    /* after lower steps 3, 6, 9, 12, 15, 18, then round(2 * 2 / 3) for the last two */
    assert_int_equal(st.upper_steps, 6 * 2 + 1);
    assert_int_equal(st.samples, 640);
    /* fewer lower steps than T_e: the routers still get their share */
    fm_trainer_destroy(&t);
    tc.expert_steps = 30;
    tc.router_steps = 10;
    assert_int_equal(fm_trainer_new(&t, m, &tc, 1, 1), FM_OK);
    assert_int_equal(fm_trainer_run(t, &train, &val, 1, &st), FM_OK);
    assert_int_equal(st.lower_steps, 10);
    assert_int_equal(st.upper_steps, 3); /* round(10 * 10 / 30) */
    /* without validation data there is no upper level */
    fm_dataset_t empty = {0};
    empty.dim = DIM;
    assert_int_equal(fm_trainer_run(t, &train, &empty, 1, &st), FM_OK);
    assert_int_equal(st.upper_steps, 0);
    /* a budget in steps: exactly 23 lower steps (two passes of 10 and three
     * more), whatever the epochs; and fewer than a pass */
    fm_trainer_destroy(&t);
    tc.expert_steps = 3;
    tc.router_steps = 2;
    tc.local_steps = 23;
    assert_int_equal(fm_trainer_new(&t, m, &tc, 1, 1), FM_OK);
    assert_int_equal(fm_trainer_run(t, &train, &val, 1, &st), FM_OK);
    assert_int_equal(st.lower_steps, 23);
    assert_int_equal(st.samples, 23 * 32);
    assert_int_equal(st.upper_steps, 7 * 2 + 1); /* after 3, ..., 21, then round(2 * 2 / 3) */
    fm_trainer_destroy(&t);
    tc.local_steps = 4;
    assert_int_equal(fm_trainer_new(&t, m, &tc, 1, 1), FM_OK);
    assert_int_equal(fm_trainer_run(t, &train, &val, 5, &st), FM_OK);
    assert_int_equal(st.lower_steps, 4);
    /* wrong feature count is an error, not a crash */
    fm_dataset_t wrong = train;
    wrong.dim = DIM + 1;
    assert_int_equal(fm_trainer_run(t, &wrong, &val, 1, &st), FM_ERR_ARG);
    fm_trainer_destroy(&t);
    fm_dataset_free(&train);
    fm_dataset_free(&val);
    fm_model_destroy(&m);
}

/* The learning-rate schedules: cosine from 1 down toward its floor, constant 1. */
static void test_lr_schedules(void **state)
{
    (void)state;
    assert_float_equal(fm_lr_cosine(1, 10, 0.0f), 1.0f, 1e-7f);
    assert_float_equal(fm_lr_cosine(6, 10, 0.0f), 0.5f, 1e-6f);  /* half way */
    assert_float_equal(fm_lr_cosine(11, 10, 0.2f), 0.2f, 1e-6f); /* the floor, one past the end */
    assert_float_equal(fm_lr_cosine(99, 10, 0.2f), 0.2f, 1e-6f); /* clamped */
    float prev = 2.0f;
    for (int r = 1; r <= 100; r++) {
        float c = fm_lr_schedule_scale(FM_LR_COSINE, r, 100);
        assert_true(c < prev && c > FM_LR_COSINE_FLOOR && c <= 1.0f);
        prev = c;
        assert_true(fm_lr_schedule_scale(FM_LR_CONSTANT, r, 100) == 1.0f);
    }
    fm_lr_schedule s;
    assert_int_equal(fm_lr_schedule_parse("--x", "cosine", &s), FM_OK);
    assert_int_equal(s, FM_LR_COSINE);
    assert_string_equal(fm_lr_schedule_name(s), "cosine");
    assert_int_equal(fm_lr_schedule_parse("--x", "Cosine", &s), FM_ERR_ARG);
}

static void test_training_learns(void **state)
{
    (void)state;
    fm_model_config_t c;
    config(&c, false);
    fm_model_t *m = NULL;
    assert_int_equal(fm_model_new(&m, &c, 3, fm_rng_stream(FM_STREAM_LOCAL, 0)), FM_OK);
    fm_dataset_t train, val, test;
    blobs(&train, 2000, 1);
    blobs(&val, 400, 2);
    blobs(&test, 1000, 3);
    fm_train_config_t tc;
    fm_train_config_default(&tc);
    fm_trainer_t *t = NULL;
    assert_int_equal(fm_trainer_new(&t, m, &tc, 1, 1), FM_OK);
    fm_eval_t before, after;
    assert_int_equal(fm_evaluate(m, &test, &before), FM_OK);
    fm_train_stats_t st;
    assert_int_equal(fm_trainer_run(t, &train, &val, 3, &st), FM_OK);
    assert_int_equal(fm_evaluate(m, &test, &after), FM_OK);
    assert_true(after.loss < before.loss * 0.5);
    assert_true(after.accuracy > 0.95);
    assert_true(after.generalist_share > 0.0 && after.generalist_share < 1.0);
    assert_int_equal(after.n, 1000);
    fm_trainer_destroy(&t);
    fm_dataset_free(&train);
    fm_dataset_free(&val);
    fm_dataset_free(&test);
    fm_model_destroy(&m);
}

/* Position of parameter i among the tensors of its expert (same block and unit). */
static int tensor_index(const fm_params_t *ps, int i)
{
    const fm_param_t *p = &ps->params[i];
    int t = 0;
    for (int j = 0; j < i; j++)
        t += ps->params[j].block == p->block && ps->params[j].unit == p->unit;
    return t;
}

/* The same tensor of generalist g in the same block as specialist parameter i:
 * every expert registers the same tensors in the same order. */
static const float *generalist_twin(const fm_params_t *ps, int i, int g)
{
    const fm_param_t *p = &ps->params[i];
    int t = tensor_index(ps, i);
    for (int j = 0; j < ps->count; j++) {
        const fm_param_t *q = &ps->params[j];
        if (q->role == FM_ROLE_GENERALIST && q->block == p->block && q->unit == g && tensor_index(ps, j) == t) {
            assert_int_equal(q->size, p->size);
            return q->view->w;
        }
    }
    fail_msg("no generalist %d twin of %s", g, p->name);
    return NULL;
}

/* The anchor pulls each specialist toward its block's mean generalist by the
 * given fraction, and touches nothing else. */
static void test_anchor_pulls_specialists(void **state)
{
    (void)state;
    fm_model_config_t c;
    config(&c, false);
    c.generalists = 2;
    c.specialists = 2;
    fm_model_t *m = NULL;
    assert_int_equal(fm_model_new(&m, &c, 3, fm_rng_stream(FM_STREAM_LOCAL, 0)), FM_OK);
    fm_params_t *ps = fm_model_params(m);
    snapshot_t s = snap(m);
    fm_model_anchor_specialists(m, 0.25f);
    int pulled = 0;
    for (int i = 0; i < ps->count; i++) {
        const fm_param_t *p = &ps->params[i];
        if (p->role != FM_ROLE_SPECIALIST) {
            assert_false(changed(m, &s, p));
            continue;
        }
        const float *g0 = generalist_twin(ps, i, 0), *g1 = generalist_twin(ps, i, 1);
        const float *before = s.w[p->group] + p->offset;
        for (size_t j = 0; j < p->size; j++) {
            float mean = 0.5f * (g0[j] + g1[j]);
            assert_float_equal(p->view->w[j], before[j] - 0.25f * (before[j] - mean), 1e-6);
        }
        if (p->rows > 1) /* biases start at zero everywhere, so they stay */
            assert_true(changed(m, &s, p));
        pulled++;
    }
    assert_int_equal(pulled, c.blocks * c.specialists * 4);
    unsnap(&s);

    /* in training: with lr x anchor = 1 every lower step ends with the specialists
     * on the mean generalist, and upper steps do not move experts */
    fm_dataset_t train, val;
    blobs(&train, 200, 1);
    blobs(&val, 64, 2);
    fm_train_config_t tc;
    fm_train_config_default(&tc);
    tc.anchor = 1.0f / tc.lower.lr;
    fm_trainer_t *t = NULL;
    assert_int_equal(fm_trainer_new(&t, m, &tc, 1, 1), FM_OK);
    fm_train_stats_t st;
    assert_int_equal(fm_trainer_run(t, &train, &val, 1, &st), FM_OK);
    assert_true(st.upper_steps > 0);
    for (int i = 0; i < ps->count; i++) {
        const fm_param_t *p = &ps->params[i];
        if (p->role != FM_ROLE_SPECIALIST)
            continue;
        const float *g0 = generalist_twin(ps, i, 0), *g1 = generalist_twin(ps, i, 1);
        for (size_t j = 0; j < p->size; j++)
            assert_float_equal(p->view->w[j], 0.5f * (g0[j] + g1[j]), 1e-6);
    }
    fm_trainer_destroy(&t);
    fm_dataset_free(&train);
    fm_dataset_free(&val);
    fm_model_destroy(&m);
}

/* A batch size from the network cannot make a client allocate without bound:
 * the workspace is measured from the model before it is allocated, and a
 * trainer whose batch would need more than FM_MODEL_MAX_WORKSPACE_BYTES is
 * refused, naming the size. Measuring leaves a laid-out workspace as it was. */
static void test_workspace_measured_and_bounded(void **state)
{
    (void)state;
    fm_model_config_t c;
    config(&c, false);
    fm_model_t *m = NULL;
    assert_int_equal(fm_model_new(&m, &c, 3, 4), FM_OK);
    fm_dataset_t ds;
    blobs(&ds, 32, 5);
    fm_batch_t b = {.ds = &ds, .n = 32};
    fm_params_t *ps = fm_model_params(m);
    size_t n = ps->groups[FM_GROUP_SHARED].size;
    float *g0 = malloc(sizeof(float) * n);
    fm_params_zero_grad(ps);
    float l0 = fm_model_forward(m, &b, true, NULL, NULL);
    fm_model_backward(m, FM_LEVEL_LOWER | FM_LEVEL_UPPER);
    memcpy(g0, ps->groups[FM_GROUP_SHARED].g, sizeof(float) * n);
    double w1 = fm_model_workspace_bytes(m, 32), w2 = fm_model_workspace_bytes(m, 64);
    assert_true(w1 > 0 && w2 > w1 && w2 <= 2 * w1);
    assert_true(fm_model_workspace_bytes(m, 4096) > 100 * w1);
    fm_params_zero_grad(ps);
    assert_true(fm_model_forward(m, &b, true, NULL, NULL) == l0); /* the same buffers, the same numbers */
    fm_model_backward(m, FM_LEVEL_LOWER | FM_LEVEL_UPPER);
    assert_memory_equal(g0, ps->groups[FM_GROUP_SHARED].g, sizeof(float) * n);
    free(g0);
    fm_dataset_free(&ds);
    fm_model_destroy(&m);

    /* a model within the parameter limit, with a batch its workspace cannot take */
    fm_model_config_default(&c);
    c.ffn_hidden = 2048;
    assert_int_equal(fm_model_new(&m, &c, 3, 4), FM_OK);
    fm_train_config_t tc;
    fm_train_config_default(&tc);
    tc.batch = 65536;
    assert_true(fm_model_workspace_bytes(m, tc.batch) > FM_MODEL_MAX_WORKSPACE_BYTES);
    fm_trainer_t *t = NULL;
    assert_int_equal(fm_trainer_new(&t, m, &tc, 1, 1), FM_ERR_ARG);
    assert_null(t);
    assert_non_null(strstr(fm_error_last(), "MiB of workspace"));
    tc.batch = 64;
    assert_int_equal(fm_trainer_new(&t, m, &tc, 1, 1), FM_OK);
    fm_trainer_destroy(&t);
    fm_model_destroy(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_levels_move_their_own_parameters),
        cmocka_unit_test(test_levels_with_gating_on_validation),
        cmocka_unit_test(test_alternation_schedule),
        cmocka_unit_test(test_lr_schedules),
        cmocka_unit_test(test_training_learns),
        cmocka_unit_test(test_anchor_pulls_specialists),
        cmocka_unit_test(test_workspace_measured_and_bounded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
