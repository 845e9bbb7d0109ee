/* Prints the parameter layout of the default model (the run defaults of
 * fedmoe-server: fm_run_spec_default; `layout text`: of --task text) as the
 * markdown tables in docs/protocol.md, which the ctests protocol_layout and
 * protocol_layout_text compare with it, so the page cannot drift from the
 * code. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "fedmoe/model.h"
#include "fedmoe/rng.h"
#include "fedmoe/runspec.h"

int main(int argc, char **argv)
{
    bool text = argc == 2 && strcmp(argv[1], "text") == 0;
    if (argc > 2 || (argc == 2 && !text)) {
        fprintf(stderr, "usage: layout [text]\n");
        return 2;
    }
    fm_run_spec_t spec;
    fm_run_spec_default(&spec);
    spec.strategy = FM_STRATEGY_FEDAVG;
    if (text)
        fm_model_config_text(&spec.model);
    if (fm_run_spec_finish(&spec) != FM_OK)
        return 1;
    spec.model.gating = !text; /* the registry of the pool strategies: gating registered too */
    fm_model_t *m = NULL;
    if (fm_model_new(&m, &spec.model, spec.seed, fm_rng_stream(FM_STREAM_INIT, 1)) != FM_OK)
        return 1;
    fm_params_t *ps = fm_model_params(m);
    /* text runs refuse the prompt strategies: its columns are fedavg and comigs */
    printf("| # | name | rows x cols | group | role | level | `model` offset, %s | `model` offset, %s |\n"
           "|--:|---|---|---|---|---|--:|--:|\n",
           text ? "fedavg" : "fedavg / pfedmoap", text ? "comigs" : "comigs / full");
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
