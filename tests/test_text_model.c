/* The text family (a byte-level causal language model): its hand-written
 * backward against central finite differences for every parameter view (byte
 * and position embeddings, causal self-attention, LayerNorms, routers with the
 * load-balancing term, generalist and specialist experts, the tied or untied
 * output layer); the causal mask (a later byte never changes an earlier
 * position's logits); the router-only backward; roles, groups and the data it
 * accepts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/model.h"
#include "fedmoe/rng.h"
#include "fedmoe/runspec.h"
#include "gradcheck.h"

#define WINDOWS 3
#define T 5

static void small_config(fm_model_config_t *c, bool untied)
{
    fm_model_config_default(c);
    c->family = FM_FAMILY_TEXT;
    c->context = T;
    c->d = 8;
    c->heads = 2;
    c->blocks = 2;
    c->generalists = 1;
    c->specialists = 2;
    c->ffn_hidden = 6;
    c->top_k = 2;
    c->untied = untied;
    c->lb_weight = 0.5f; /* large, so its gradient is visible next to the cross-entropy */
}

typedef struct {
    uint8_t tok[WINDOWS * (T + 1)], y[WINDOWS];
    fm_dataset_t ds;
    fm_batch_t b;
} text_batch_t;

/* WINDOWS random windows of T + 1 bytes (a few distinct bytes, so that
 * embedding rows repeat), as one batch. */
static void make_batch(text_batch_t *tb, uint64_t seed)
{
    fm_rng_t r;
    fm_rng_init(&r, seed, 99);
    for (size_t i = 0; i < sizeof tb->tok; i++)
        tb->tok[i] = (uint8_t)(97 + fm_rng_below(&r, 6));
    memset(tb->y, 0, sizeof tb->y);
    tb->ds = (fm_dataset_t){.n = WINDOWS, .dim = T, .classes = 1, .tok = tb->tok, .y = tb->y};
    tb->b = (fm_batch_t){.ds = &tb->ds, .n = WINDOWS};
}

static fm_model_t *ready_model(const fm_model_config_t *c)
{
    fm_model_t *m = NULL;
    assert_int_equal(fm_model_new(&m, c, 7, fm_rng_stream(FM_STREAM_LOCAL, 0)), FM_OK);
    fm_test_unsettle(m, 3);
    return m;
}

static void run_gradcheck(bool untied, bool with_lb)
{
    fm_model_config_t c;
    small_config(&c, untied);
    fm_model_t *m = ready_model(&c);
    text_batch_t tb;
    make_batch(&tb, 11);
    int n = fm_test_gradcheck(m, &tb.b, with_lb, 1e-2f, 16, 2e-4f);
    assert_true(n > 200);
    fm_model_destroy(&m);
}

static void test_gradients_tied(void **state)
{
    (void)state;
    run_gradcheck(false, true);
}

static void test_gradients_untied(void **state)
{
    (void)state;
    run_gradcheck(true, true);
    run_gradcheck(true, false);
}

/* Every parameter view gets gradient from a batch (nothing is disconnected),
 * and a position's logits depend on no later byte. */
static void test_causal_mask(void **state)
{
    (void)state;
    fm_model_config_t c;
    small_config(&c, false);
    fm_model_t *m = ready_model(&c);
    text_batch_t tb;
    make_batch(&tb, 12);
    size_t rows = WINDOWS * T;
    float *a = malloc(sizeof(float) * rows * 256), *b = malloc(sizeof(float) * rows * 256);
    fm_model_forward(m, &tb.b, true, a, NULL);
    for (int t = 1; t < T; t++) {
        uint8_t keep = tb.tok[t]; /* window 0, input position t */
        tb.tok[t] = (uint8_t)(keep ^ 0x55);
        fm_model_forward(m, &tb.b, true, b, NULL);
        tb.tok[t] = keep;
        for (size_t r = 0; r < rows; r++) {
            bool same = memcmp(a + r * 256, b + r * 256, sizeof(float) * 256) == 0;
            /* window 0 at positions >= t sees the change; nothing else does */
            bool sees = r >= (size_t)t && r < T;
            if (same == sees)
                fail_msg("byte %d of window 0: the logits of row %zu %s", t, r, sees ? "did not change" : "changed");
        }
    }
    /* the last byte of a window is only a target: no logits change */
    uint8_t keep = tb.tok[T];
    tb.tok[T] = (uint8_t)(keep ^ 0x55);
    fm_model_forward(m, &tb.b, true, b, NULL);
    tb.tok[T] = keep;
    assert_memory_equal(a, b, sizeof(float) * rows * 256);
    free(a);
    free(b);
    fm_model_destroy(&m);
}

/* The upper level (routers on validation text) gets the same router
 * gradients alone as with the lower level, and nothing else moves. */
static void test_router_level(void **state)
{
    (void)state;
    fm_model_config_t c;
    small_config(&c, false);
    fm_model_t *m = ready_model(&c);
    fm_params_t *ps = fm_model_params(m);
    text_batch_t tb;
    make_batch(&tb, 13);
    fm_params_zero_grad(ps);
    fm_model_forward(m, &tb.b, false, NULL, NULL);
    fm_model_backward(m, FM_LEVEL_LOWER | FM_LEVEL_UPPER);
    size_t nl = ps->groups[FM_GROUP_LOCAL].size;
    float *both = malloc(sizeof(float) * nl);
    memcpy(both, ps->groups[FM_GROUP_LOCAL].g, sizeof(float) * nl);
    fm_params_zero_grad(ps);
    fm_model_forward(m, &tb.b, false, NULL, NULL);
    fm_model_backward(m, FM_LEVEL_UPPER);
    int routers = 0;
    for (int i = 0; i < ps->count; i++) {
        fm_param_t *p = &ps->params[i];
        for (size_t j = 0; j < p->size; j++) {
            if (p->role != FM_ROLE_ROUTER) {
                assert_true(p->view->g[j] == 0.0f);
                continue;
            }
            float want = both[p->offset + j];
            assert_true(fabsf(p->view->g[j] - want) <= 1e-6f + 1e-5f * fabsf(want));
        }
        routers += p->role == FM_ROLE_ROUTER;
    }
    assert_int_equal(routers, c.blocks);
    free(both);
    fm_model_destroy(&m);
}

/* CoMiGS's parameter groups: embeddings, attention, norms and generalists
 * shared; specialists and routers local; no prompt. */
static void test_groups(void **state)
{
    (void)state;
    fm_model_config_t c;
    small_config(&c, true);
    fm_model_t *m = ready_model(&c);
    fm_params_t *ps = fm_model_params(m);
    int seen[FM_ROLE_COUNT] = {0};
    for (int i = 0; i < ps->count; i++) {
        const fm_param_t *p = &ps->params[i];
        seen[p->role]++;
        bool local = p->role == FM_ROLE_SPECIALIST || p->role == FM_ROLE_ROUTER;
        assert_int_equal(p->group, local ? FM_GROUP_LOCAL : FM_GROUP_SHARED);
        assert_int_equal(p->level, p->role == FM_ROLE_ROUTER ? FM_LEVEL_UPPER : FM_LEVEL_LOWER);
    }
    assert_int_equal(seen[FM_ROLE_EMBEDDING], 3); /* bytes, positions, output */
    assert_int_equal(seen[FM_ROLE_ATTENTION], 4 * c.blocks);
    assert_int_equal(seen[FM_ROLE_NORM], 4 * c.blocks + 2);
    assert_int_equal(seen[FM_ROLE_GENERALIST], 4 * c.blocks * c.generalists);
    assert_int_equal(seen[FM_ROLE_SPECIALIST], 4 * c.blocks * c.specialists);
    assert_int_equal(ps->groups[FM_GROUP_PROMPT].size, 0);
    assert_null(fm_model_prompt(m));
    assert_int_equal(fm_params_total(ps), (size_t)fm_model_config_parameters(&c));
    /* image rows, or windows of another length, are refused */
    float x[4] = {0};
    uint8_t y[1] = {0};
    fm_dataset_t img = {.n = 1, .dim = 4, .classes = 1, .x = x, .y = y};
    assert_int_equal(fm_model_accepts(m, &img, "data"), FM_ERR_ARG);
    uint8_t tok[9] = {0};
    fm_dataset_t longer = {.n = 1, .dim = 8, .classes = 1, .tok = tok, .y = y};
    assert_int_equal(fm_model_accepts(m, &longer, "data"), FM_ERR_ARG);
    fm_dataset_t right = {.n = 1, .dim = T, .classes = 1, .tok = tok, .y = y};
    assert_int_equal(fm_model_accepts(m, &right, "data"), FM_OK);
    fm_model_destroy(&m);
}

/* --shared experts: only the generalist experts are shared (what comigs
 * averages); embeddings, attention and norms join the client's local group,
 * drawn from its own stream; fedavg still averages all but the gating. */
static void test_groups_experts_only(void **state)
{
    (void)state;
    fm_model_config_t c;
    small_config(&c, true);
    c.shared = FM_SHARED_EXPERTS;
    fm_model_t *a = NULL, *b = NULL;
    assert_int_equal(fm_model_new(&a, &c, 7, fm_rng_stream(FM_STREAM_LOCAL, 0)), FM_OK);
    assert_int_equal(fm_model_new(&b, &c, 7, fm_rng_stream(FM_STREAM_LOCAL, 1)), FM_OK);
    fm_params_t *pa = fm_model_params(a), *pb = fm_model_params(b);
    size_t generalist = 0;
    for (int i = 0; i < pa->count; i++) {
        const fm_param_t *p = &pa->params[i];
        bool shared = p->role == FM_ROLE_GENERALIST;
        assert_int_equal(p->group, shared ? FM_GROUP_SHARED : FM_GROUP_LOCAL);
        assert_int_equal(fm_strategy_federates(FM_STRATEGY_COMIGS, p), shared);
        assert_true(fm_strategy_federates(FM_STRATEGY_FEDAVG, p));
        generalist += shared ? p->size : 0;
        /* the same start for what is averaged, each client's own for the rest */
        bool same = !memcmp(p->view->w, pb->params[i].view->w, sizeof(float) * p->size);
        if (p->kind == FM_KIND_WEIGHT)
            assert_int_equal(same, shared);
    }
    assert_int_equal(pa->groups[FM_GROUP_SHARED].size, generalist);
    assert_int_equal(fm_federated_size(a, FM_STRATEGY_COMIGS), generalist);
    assert_int_equal(fm_params_total(pa), (size_t)fm_model_config_parameters(&c));
    fm_model_destroy(&a);
    fm_model_destroy(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradients_tied), cmocka_unit_test(test_gradients_untied),
        cmocka_unit_test(test_causal_mask),    cmocka_unit_test(test_router_level),
        cmocka_unit_test(test_groups),
        cmocka_unit_test(test_groups_experts_only),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
