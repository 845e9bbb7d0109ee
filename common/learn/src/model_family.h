/* model_family.h - what a model family provides, and what every model starts with.
 *
 * A family is one kind of network (today the image classifier of
 * model_image.c; the byte-level text model next). The public fm_model_*
 * functions (model.c) check arguments that do not depend on the family and
 * dispatch through the family's table, so the trainer, the client session and
 * the coordinator never know which family runs. What travels between them is
 * the parameter registry (fm_params_t: groups and roles), which every family
 * fills through fm_model_add_param.
 *
 * A family's model struct starts with an fm_model_t named base; the family
 * converts the fm_model_t * it is given back to its own type. */
#ifndef FEDMOE_MODEL_FAMILY_H
#define FEDMOE_MODEL_FAMILY_H

#include <stdbool.h>
#include <stdint.h>

#include "fedmoe/dataset.h"
#include "fedmoe/model.h"
#include "fedmoe/log.h"
#include "fedmoe/params.h"

typedef struct fm_model_family fm_model_family_t;

struct fm_model {
    const fm_model_family_t *family;
    fm_model_config_t cfg;
    fm_params_t ps;               /* the model's parameters; registered by the family */
    fm_level gate_level;          /* the level of FM_ROLE_GATING parameters */
};

/* The operations of a prompt-expert head (model.h: fm_model_prompt ...). */
typedef struct {
    float *(*prompt)(fm_model_t *m);
    size_t (*prompt_size)(const fm_model_t *m);
    fm_status (*set_nonlocal)(fm_model_t *m, const float *prompts, int K);
    const float *(*text_features)(fm_model_t *m);
} fm_prompt_head_ops_t;

struct fm_model_family {
    const char *name;
    /* Family-specific configuration checks, after the common ones of
     * fm_model_config_check; a reason in fm_error_last on FM_ERR_ARG. */
    fm_status (*check)(const fm_model_config_t *c);
    /* Parameters a model of c would have, from the sizes alone (double: absurd
     * sizes cannot overflow). */
    double (*parameters)(const fm_model_config_t *c);
    /* Allocates the model, registers and allocates its parameters and draws
     * their initial values with fm_model_init_params. cfg is checked. */
    fm_status (*create)(fm_model_t **out, const fm_model_config_t *cfg, uint64_t seed, uint64_t local_stream);
    /* Frees everything the model owns and the model; m is never NULL. */
    void (*destroy)(fm_model_t *m);
    /* FM_OK when ds has the shape a model of c reads, else FM_ERR_ARG and a
     * reason naming `who`. */
    fm_status (*accepts)(const fm_model_config_t *c, const fm_dataset_t *ds, const char *who);
    /* Predictions a model of c makes for one example: 1 for a class, one a
     * position for text. */
    int (*predictions)(const fm_model_config_t *c);
    /* Bytes of the activation and gradient workspace for a batch of B
     * (measured, nothing allocated). */
    double (*workspace)(const fm_model_t *m, int B);
    float (*forward)(fm_model_t *m, const fm_batch_t *b, bool with_lb, float *logits, fm_batch_stats_t *stats);
    void (*backward)(fm_model_t *m, int levels);
    uint64_t (*signature)(const fm_model_t *m);
    void (*anchor)(fm_model_t *m, float rate);
    /* The prompt head; NULL in a family that has none. */
    const fm_prompt_head_ops_t *head;
};

/* In a configuration check: unless cond, records the formatted reason and
 * returns FM_ERR_ARG. */
#define FM_MODEL_REQUIRE(cond, ...)    \
    do {                               \
        if (!(cond)) {                 \
            fm_error_set(__VA_ARGS__); \
            return FM_ERR_ARG;         \
        }                              \
    } while (0)

/* Registers a parameter of m; its group, level and weight decay follow from role
 * and kind (one place for every family). The name is printf-formatted. */
fm_status fm_model_add_param(fm_model_t *m, fm_view_t *view, fm_role role, fm_param_kind kind, int block,
                             int unit, int rows, int cols, const char *fmt, ...)
    __attribute__((format(printf, 9, 10)));

/* Draws every registered parameter's initial value by role and kind, in
 * registration order: the local group from (seed, local_stream), the others
 * from the run's shared init stream. */
void fm_model_init_params(fm_model_t *m, uint64_t seed, uint64_t local_stream);

#endif
