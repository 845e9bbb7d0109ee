#include "fedmoe/params.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/log.h"

fm_status fm_params_add(fm_params_t *ps, fm_view_t *view, const char *name, const fm_param_spec_t *spec)
{
    if (ps->count == ps->cap) {
        int cap = ps->cap ? ps->cap * 2 : 64;
        fm_param_t *p = realloc(ps->params, sizeof *p * cap);
        if (!p)
            return FM_ERR_NOMEM;
        ps->params = p;
        ps->cap = cap;
    }
    fm_param_t *p = &ps->params[ps->count];
    *p = (fm_param_t){.group = spec->group, .level = spec->level, .role = spec->role, .kind = spec->kind,
                      .block = spec->block, .unit = spec->unit, .rows = spec->rows, .cols = spec->cols,
                      .size = (size_t)spec->rows * spec->cols, .offset = ps->groups[spec->group].size,
                      .decay = spec->decay, .view = view};
    snprintf(p->name, sizeof p->name, "%s", name);
    view->id = ps->count;
    ps->groups[spec->group].size += p->size;
    ps->count++;
    return FM_OK;
}

fm_status fm_params_alloc(fm_params_t *ps)
{
    for (int g = 0; g < FM_GROUP_COUNT; g++) {
        fm_group_t *gr = &ps->groups[g];
        size_t n = gr->size ? gr->size : 1;
        gr->w = calloc(n, sizeof(float));
        gr->g = calloc(n, sizeof(float));
        gr->m = calloc(n, sizeof(float));
        gr->v = calloc(n, sizeof(float));
        if (!gr->w || !gr->g || !gr->m || !gr->v) {
            fm_error_set("cannot allocate %zu parameters", n);
            return FM_ERR_NOMEM;
        }
    }
    for (int i = 0; i < ps->count; i++) {
        fm_param_t *p = &ps->params[i];
        p->view->w = ps->groups[p->group].w + p->offset;
        p->view->g = ps->groups[p->group].g + p->offset;
    }
    return FM_OK;
}

void fm_params_free(fm_params_t *ps)
{
    for (int g = 0; g < FM_GROUP_COUNT; g++) {
        free(ps->groups[g].w);
        free(ps->groups[g].g);
        free(ps->groups[g].m);
        free(ps->groups[g].v);
    }
    free(ps->params);
    memset(ps, 0, sizeof *ps);
}

void fm_params_zero_grad(fm_params_t *ps)
{
    for (int g = 0; g < FM_GROUP_COUNT; g++)
        memset(ps->groups[g].g, 0, sizeof(float) * ps->groups[g].size);
}

const fm_param_t *fm_params_find(const fm_params_t *ps, const char *name)
{
    for (int i = 0; i < ps->count; i++)
        if (strcmp(ps->params[i].name, name) == 0)
            return &ps->params[i];
    return NULL;
}

const fm_param_t *fm_params_find_role(const fm_params_t *ps, fm_role role)
{
    for (int i = 0; i < ps->count; i++)
        if (ps->params[i].role == role)
            return &ps->params[i];
    return NULL;
}

size_t fm_params_total(const fm_params_t *ps)
{
    size_t n = 0;
    for (int g = 0; g < FM_GROUP_COUNT; g++)
        n += ps->groups[g].size;
    return n;
}

const char *fm_group_name(fm_group_id g)
{
    switch (g) {
    case FM_GROUP_SHARED: return "shared";
    case FM_GROUP_LOCAL: return "local";
    case FM_GROUP_PROMPT: return "prompt";
    default: return "?";
    }
}

const char *fm_role_name(fm_role r)
{
    switch (r) {
    case FM_ROLE_STEM: return "stem";
    case FM_ROLE_NORM: return "norm";
    case FM_ROLE_ROUTER: return "router";
    case FM_ROLE_GENERALIST: return "generalist";
    case FM_ROLE_SPECIALIST: return "specialist";
    case FM_ROLE_PROMPT: return "prompt";
    case FM_ROLE_GATING: return "gating";
    case FM_ROLE_EMBEDDING: return "embedding";
    case FM_ROLE_ATTENTION: return "attention";
    default: return "?";
    }
}
