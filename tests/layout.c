/* Prints the parameter layout of the default model (the run defaults of
 * fedmoe-server: fm_run_spec_default) as the markdown table in
 * docs/protocol.md, which the ctest protocol_layout compares with it, so the
 * page cannot drift from the code. */
#include <stdio.h>

#include "fedmoe/model.h"
#include "fedmoe/rng.h"
#include "fedmoe/runspec.h"

int main(void)
{
    fm_run_spec_t spec;
    fm_run_spec_default(&spec);
    spec.strategy = FM_STRATEGY_FEDAVG;
    if (fm_run_spec_finish(&spec) != FM_OK)
        return 1;
    spec.model.gating = true; /* the registry of the pool strategies: gating registered too */
    fm_model_t *m = NULL;
    if (fm_model_new(&m, &spec.model, spec.seed, fm_rng_stream(FM_STREAM_INIT, 1)) != FM_OK)
        return 1;
    fm_params_t *ps = fm_model_params(m);
    printf("| # | name | rows x cols | group | role | level | `model` offset, fedavg / pfedmoap | `model` offset, "
           "comigs / full |\n|--:|---|---|---|---|---|--:|--:|\n");
    size_t off[2] = {0, 0};
    const fm_strategy by[2] = {FM_STRATEGY_PFEDMOAP, FM_STRATEGY_FULL};
    for (int i = 0; i < ps->count; i++) {
        const fm_param_t *p = &ps->params[i];
        char col[2][32];
        for (int s = 0; s < 2; s++) {
            if (fm_strategy_federates(by[s], p)) {
                snprintf(col[s], sizeof col[s], "%zu", off[s]);
                off[s] += p->size;
            } else {
                snprintf(col[s], sizeof col[s], "-");
            }
        }
        printf("| %d | `%s` | %d x %d | %s | %s | %s | %s | %s |\n", i, p->name, p->rows, p->cols,
               fm_group_name(p->group), fm_role_name(p->role), p->level == FM_LEVEL_UPPER ? "upper" : "lower", col[0],
               col[1]);
    }
    printf("| | total F | | | | | %zu | %zu |\n", off[0], off[1]);
    fm_model_destroy(&m);
    return 0;
}
