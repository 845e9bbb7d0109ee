#include "gradcheck.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/rng.h"

int fm_test_gradcheck(fm_model_t *m, const fm_batch_t *b, bool with_lb, float h, int per_view, float abs_tol)
{
    fm_params_t *ps = fm_model_params(m);
    fm_params_zero_grad(ps);
    fm_model_forward(m, b, with_lb, NULL, NULL);
    uint64_t sig = fm_model_branch_signature(m);
    fm_model_backward(m, FM_LEVEL_LOWER | FM_LEVEL_UPPER);
    float *ana[FM_GROUP_COUNT];
    for (int g = 0; g < FM_GROUP_COUNT; g++) {
        ana[g] = malloc(sizeof(float) * (ps->groups[g].size + 1));
        memcpy(ana[g], ps->groups[g].g, sizeof(float) * ps->groups[g].size);
    }
    int checked = 0, skipped = 0, failed = 0;
    for (int i = 0; i < ps->count; i++) {
        fm_param_t *p = &ps->params[i];
        size_t step = p->size > (size_t)per_view ? p->size / (size_t)per_view : 1;
        for (size_t j = 0; j < p->size; j += step) {
            float *w = p->view->w + j, keep = *w;
            *w = keep + h;
            float lp = fm_model_forward(m, b, with_lb, NULL, NULL);
            uint64_t sp = fm_model_branch_signature(m);
            *w = keep - h;
            float lm = fm_model_forward(m, b, with_lb, NULL, NULL);
            uint64_t sm = fm_model_branch_signature(m);
            *w = keep;
            if (sp != sig || sm != sig) {
                skipped++; /* a routing / pooling / ReLU choice flipped: not differentiable here */
                continue;
            }
            float num = (lp - lm) / (2 * h), an = ana[p->group][p->offset + j];
            float tol = abs_tol + 3e-2f * fmaxf(fabsf(num), fabsf(an));
            if (fabsf(num - an) > tol) {
                failed++;
                fprintf(stderr, "  %s[%zu]: analytic %.6g numeric %.6g\n", p->name, j, an, num);
            }
            checked++;
        }
    }
    for (int g = 0; g < FM_GROUP_COUNT; g++)
        free(ana[g]);
    fprintf(stderr, "  gradcheck: %d coordinates compared, %d skipped at branch points\n", checked, skipped);
    assert_int_equal(failed, 0);
    assert_true(skipped * 10 < checked);
    return checked;
}

void fm_test_unsettle(fm_model_t *m, uint64_t seed)
{
    fm_params_t *ps = fm_model_params(m);
    fm_rng_t r;
    fm_rng_init(&r, seed, 5);
    for (int i = 0; i < ps->count; i++) {
        fm_param_t *p = &ps->params[i];
        if (p->role == FM_ROLE_ROUTER || p->role == FM_ROLE_GATING || p->role == FM_ROLE_NORM ||
            p->kind == FM_KIND_BIAS)
            for (size_t j = 0; j < p->size; j++)
                p->view->w[j] += 0.5f * (2.0f * fm_rng_uniform(&r) - 1.0f);
    }
}
