/* train.h - the bi-level client step of CoMiGS, and evaluation.
 *
 * Lower level: AdamW on the parameters of level FM_LEVEL_LOWER (stem, norms,
 * experts, prompt, gating) over train batches. Upper level: AdamW on the
 * parameters of level FM_LEVEL_UPPER (routers; the gating with
 * gating_on_validation) over validation batches. They alternate: after every
 * expert_steps lower steps come router_steps upper steps. The two levels keep
 * separate AdamW step counts; moments are per parameter, kept in the groups. */
#ifndef FEDMOE_TRAIN_H
#define FEDMOE_TRAIN_H

#include <stdbool.h>
#include <stdint.h>

#include "fedmoe/dataset.h"
#include "fedmoe/kernels.h"
#include "fedmoe/model.h"
#include "fedmoe/rng.h"
#include "fedmoe/status.h"

typedef struct {
    int batch;                  /* 32 */
    int expert_steps;           /* T_e: lower steps per cycle */
    int router_steps;           /* T_r: upper steps per cycle (0: no upper level) */
    fm_adamw_config_t lower;    /* experts' optimizer */
    fm_adamw_config_t upper;    /* routers' optimizer */
    bool lb_in_upper;           /* the load-balancing term is part of the router objective too */
    float anchor;               /* after each lower step, specialists move lr * anchor of the way
                                 * toward their block's mean generalist (0: off) */
    int local_steps;            /* > 0: fm_trainer_run trains exactly this many lower steps,
                                 * passes after passes, whatever its epochs (0: the epochs) */
} fm_train_config_t;

/* Batch 32, T_e 30, T_r 10, AdamW 1e-3 on both levels (decay 1e-4 lower, 0 upper). */
void fm_train_config_default(fm_train_config_t *c);

typedef struct fm_trainer fm_trainer_t;

/* A trainer for model m (not owned). Shuffles from (seed, stream). */
fm_status fm_trainer_new(fm_trainer_t **out, fm_model_t *m, const fm_train_config_t *cfg, uint64_t seed,
                         uint64_t stream);
/* Frees the trainer (not its model), sets *t to NULL; safe on NULL. */
void fm_trainer_destroy(fm_trainer_t **t);

typedef struct {
    double train_loss;     /* mean cross-entropy over the lower steps' batches */
    double val_loss;       /* mean cross-entropy over the upper steps' batches */
    long lower_steps, upper_steps;
    long samples;          /* train examples processed */
    double seconds;
} fm_train_stats_t;

/* Trains `epochs` passes over train (or local_steps steps), alternating with val. */
fm_status fm_trainer_run(fm_trainer_t *t, const fm_dataset_t *train, const fm_dataset_t *val, int epochs,
                         fm_train_stats_t *out);
/* One step of one level on batch b (exposed for tests and benchmarks).
 * Returns the batch's cross-entropy. */
float fm_trainer_step(fm_trainer_t *t, fm_level level, const fm_batch_t *b);
/* Multiplies both levels' learning rates by scale from now on (schedules). */
void fm_trainer_set_lr_scale(fm_trainer_t *t, float scale);
/* Cosine decay from 1 at step 1 toward min_scale at step total + 1:
 * min_scale + (1 - min_scale) (1 + cos(pi (step - 1) / total)) / 2. */
float fm_lr_cosine(int step, int total, float min_scale);
/* The trainer's shuffling generator, to save and restore with the model state. */
fm_rng_t *fm_trainer_rng(fm_trainer_t *t);
/* Called every `every` lower-level steps during fm_trainer_run (e.g. to send a
 * heartbeat while a long local step runs); NULL to clear. When it returns false,
 * fm_trainer_run stops there and returns FM_ERR_STATE ("training stopped"), the
 * model part-way through the pass (a client being shut down). */
void fm_trainer_set_progress(fm_trainer_t *t, bool (*fn)(void *user), void *user, int every);
/* Sets the AdamW step counts (restoring a saved state). */
void fm_trainer_set_steps(fm_trainer_t *t, long lower, long upper);
/* AdamW step counts of the two levels. */
long fm_trainer_steps(const fm_trainer_t *t, fm_level level);

typedef struct {
    double loss;             /* mean cross-entropy of a prediction (nats) */
    double accuracy;         /* correct / predictions */
    double generalist_share;
    size_t n;                /* examples */
    size_t predictions, correct; /* one prediction an example (image), one a byte (text) */
} fm_eval_t;

/* Loss, accuracy and generalist routing share of m on ds. */
fm_status fm_evaluate(fm_model_t *m, const fm_dataset_t *ds, fm_eval_t *out);
/* The same on `sample` evenly spaced examples of ds (the one at (2j + 1) n /
 * (2 sample) for j < sample; all of them when sample is 0 or >= n), calling
 * progress(user) between batches (a long evaluation of text sends heartbeats);
 * when it returns false, stops with FM_ERR_STATE. */
fm_status fm_evaluate_sample(fm_model_t *m, const fm_dataset_t *ds, size_t sample, fm_eval_t *out,
                             bool (*progress)(void *user), void *user);

#endif
