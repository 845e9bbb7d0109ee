/* runspec.h - what a federated run is: strategy, model, training and data specs,
 * which parameters the strategy federates, and their wire / JSON forms.
 *
 * Strategies (README, docs/architecture.md), all on the same model:
 *   local     nothing shared; no gating
 *   fedavg    one global model: every expert, router and prompt averaged; no gating
 *   comigs    shared group (stem, norms, generalists) + prompt averaged; no gating
 *   pfedmoap  everything but the gating averaged; prompt pool, K nearest, gating
 *   full      comigs + pfedmoap: shared group + prompt, pool, K nearest, gating */
#ifndef FEDMOE_RUNSPEC_H
#define FEDMOE_RUNSPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fedmoe/aggregate.h"
#include "fedmoe/clientdata.h"
#include "fedmoe/dp.h"
#include "fedmoe/model.h"
#include "fedmoe/params.h"
#include "fedmoe/status.h"
#include "fedmoe/train.h"

typedef enum {
    FM_STRATEGY_LOCAL = 0,
    FM_STRATEGY_FEDAVG,
    FM_STRATEGY_COMIGS,
    FM_STRATEGY_PFEDMOAP,
    FM_STRATEGY_FULL,
} fm_strategy;

/* The text task's training defaults (--task text): windows a batch, and lower
 * steps a round (a round's budget: 50 x 64 windows x 32 bytes, about 100,000
 * bytes a client; the windows of the default context, fm_model_config_text). */
#define FM_TEXT_BATCH 64
#define FM_TEXT_LOCAL_STEPS 50
/* ... and the windows of each split evaluated in a round before the last (a
 * client's whole test split took longer than its training): 32 KiB of text. */
#define FM_TEXT_EVAL_SAMPLE 1024

/* How the coordinator scales the learning rates over the rounds. */
typedef enum {
    FM_LR_CONSTANT = 0,
    FM_LR_COSINE, /* fm_lr_cosine(round, rounds, FM_LR_COSINE_FLOOR) */
} fm_lr_schedule;
#define FM_LR_COSINE_FLOOR 0.05f
/* Name (static) and parse of a schedule, as for strategies below (FM_ARG_ENUM_NAMES). */
const char *fm_lr_schedule_name(fm_lr_schedule s);
fm_status fm_lr_schedule_parse(const char *flag, const char *name, fm_lr_schedule *out);
/* The multiplier of round (1-based) out of rounds. */
float fm_lr_schedule_scale(fm_lr_schedule s, int round, int rounds);

/* A strategy's name (static storage; "?" out of range) and its inverse
 * (FM_ERR_ARG with a reason naming flag and the five names). */
const char *fm_strategy_name(fm_strategy s);
fm_status fm_strategy_parse(const char *flag, const char *name, fm_strategy *out);
/* What a strategy is, in one row of one table (runspec.c); every question
 * about a strategy is asked of its row. Adding a strategy is a value of
 * fm_strategy, its name in FM_ARG_ENUM_NAMES and its row. */
typedef struct {
    bool model;          /* a model vector travels: the shared group (at least) is averaged */
    bool averages_local; /* ... and the local group too but the gating (specialists and
                            routers): every client needs the run's count of specialists */
    bool shares_prompt;  /* clients upload prompts and receive the global prompt */
    bool uses_pool;      /* the coordinator keeps a prompt pool and sends each client its K
                            nearest; clients gate them (needs the image task's prompt head) */
} fm_strategy_traits_t;
const fm_strategy_traits_t *fm_strategy_traits(fm_strategy s);
bool fm_strategy_shares_prompt(fm_strategy s);
bool fm_strategy_uses_pool(fm_strategy s);
bool fm_strategy_averages_local(fm_strategy s);
/* Whether parameter p is part of the federated vector under s: the shared
 * group where a model travels, and the local group's non-gating parameters
 * where the strategy averages them. */
bool fm_strategy_federates(fm_strategy s, const fm_param_t *p);

typedef struct fm_run_spec {
    fm_strategy strategy;
    uint64_t seed;
    uint64_t data_seed;        /* keys which examples a client holds (partition, splits, caps,
                                  domains, label maps); 0: seed. seed keys the rest */
    fm_model_config_t model;
    fm_train_config_t train;
    int local_epochs;          /* passes over the train split per round (1) */
    fm_lr_schedule lr_schedule; /* the coordinator's (cosine); travels as Task.lr_scale */
    char dataset[256];         /* "fmnist", ... */
    fm_partition_config_t part;
    int partition_count;       /* clients the data is split over */
    bool holdout;              /* clients evaluate on a held-out part of their train and
                                * validation data; the test split is not used (tuning) */
    fm_regime_t regime;        /* caps on each client's data, its image domain, its label map */
    /* the coordinator's, never sent: how it combines the averaged groups */
    fm_agg_spec_t aggregate;   /* mean */
    double clip_norm;          /* bound on each update's L2 distance from the state it was sent:
                                * > 0 fixed, 0 none, FM_CLIP_AUTO (the default; off under
                                * differential privacy, whose dp.clip bounds the updates, and
                                * under secure aggregation, where a number given is the
                                * clients' own bound: fm_run_client_clip) */
    fm_dp_spec_t dp;           /* client-level differential privacy (off by default) */
    bool secure_aggregation;   /* updates travel masked: the coordinator learns only their sum
                                * (docs/secure-aggregation.md; off by default) */
    int eval_sample;           /* > 0: rounds before the last evaluate only this many evenly
                                * spaced examples of each test and validation split (travels
                                * as Task.eval_sample); 0: every round evaluates them whole */
} fm_run_spec_t;

/* The Task.eval_sample of round (1-based) out of rounds: the last round
 * evaluates everything (0). */
uint32_t fm_run_eval_sample(const fm_run_spec_t *s, int round, int rounds);

/* Under secure aggregation the clients bound their own updates (the
 * coordinator cannot see them): the L2 distance of what a client masks
 * (model and prompt together) from the state its Task sent, at most this
 * (--dp-clip under differential privacy, else --clip-norm C; 0: no bound).
 * Travels as Welcome.client_clip. 0 without secure aggregation. */
double fm_run_client_clip(const fm_run_spec_t *s);
/* Under secure aggregation with --dp-mode distributed: the noise multiplier
 * z each client adds its share of (fm_dp_client_sd); 0 otherwise. Travels as
 * Welcome.client_noise. */
double fm_run_client_noise(const fm_run_spec_t *s);

/* The run sends each client its nearest peers' prompts: a pool strategy with
 * the prompt head and non-local slots (--prompt-pool on). The one place this
 * is decided (fm_exchange_of asks it). */
bool fm_run_uses_pool(const fm_run_spec_t *s);

/* clip_norm FM_CLIP_AUTO: FM_CLIP_AUTO_FACTOR x the lower median distance of
 * the previous round's accepted updates; before a round has committed, of the
 * round's own first FM_CLIP_SAMPLE (the coordinator keeps those, then clips
 * them and every later one of the round by that bound as it comes: a round
 * never holds more than FM_CLIP_SAMPLE updates to learn its bound). */
#define FM_CLIP_AUTO (-1.0)
#define FM_CLIP_AUTO_FACTOR 2.0
#define FM_CLIP_SAMPLE 32 /* (up to 32 updates: the old rule, whatever their order) */
/* "auto", "off" or the number into buf; and the inverse. */
void fm_clip_norm_name(double clip, char *buf, size_t cap);
fm_status fm_clip_norm_parse(const char *flag, const char *text, double *out);

/* Defaults: strategy full, seed 1, the default model / training, fmnist with
 * Dirichlet 0.3 over 10 clients, one local epoch, cosine learning-rate schedule. */
void fm_run_spec_default(fm_run_spec_t *s);
/* Sets the model's gating from the strategy and checks everything; FM_ERR_ARG with
 * a reason. */
fm_status fm_run_spec_finish(fm_run_spec_t *s);

/* The data spec of the run: its dataset, partitions (count, scheme, seed) and
 * holdout, partition index 0 and the default split fractions. What clients
 * load and the coordinator sizes. */
void fm_run_spec_data(const fm_run_spec_t *s, fm_data_spec_t *out);
/* The seed of the run's data: data_seed, or the run seed when that is 0. */
uint64_t fm_run_spec_data_seed(const fm_run_spec_t *s);

/* The spec as one JSON object (for the runs table); returns bytes written. */
size_t fm_run_spec_json(const fm_run_spec_t *s, char *buf, size_t cap);

/* Size of the federated vector of m under s, and packing it to / from a flat array
 * (parameters in registry order). */
size_t fm_federated_size(fm_model_t *m, fm_strategy s);
/* Copies the federated parameters of m (those strategy s shares) into out, which
 * holds fm_federated_size floats; unpack writes them back. Nothing is kept. */
void fm_federated_pack(fm_model_t *m, fm_strategy s, float *out);
void fm_federated_unpack(fm_model_t *m, fm_strategy s, const float *in);

#endif
