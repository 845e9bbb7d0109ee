/* exchange.h - what a round exchanges: the one place that decides, per strategy,
 * what a Task and an Update carry and how each side reads them (docs/protocol.md). Adding a strategy or a round phase touches this module and the
 * coordinator's round module, nothing else.
 *
 *              Task (down)                          Update (up)
 *   local      lr scale                             metrics
 *   fedavg     federated vector, global prompt      vector, trained prompt, metrics
 *   comigs     federated vector, global prompt      vector, trained prompt, metrics
 *   pfedmoap   vector, global prompt, K nearest     vector, trained prompt, metrics
 *   full       vector, global prompt, K nearest     vector, trained prompt, metrics
 *
 * A model without a prompt head (the text task) exchanges no prompt.
 *
 * The federated vector is the strategy's parameters in registry order
 * (fm_federated_pack). Readers check every tensor (name, shape, digest, finite
 * values) and every count before the caller changes anything. */
#ifndef FEDMOE_EXCHANGE_H
#define FEDMOE_EXCHANGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fedmoe.pb-c.h"
#include "fedmoe/partition.h"
#include "fedmoe/runspec.h"
#include "fedmoe/status.h"
#include "fedmoe/wire.h"

typedef struct {
    bool model;  /* the federated vector, down and up */
    bool prompt; /* the global prompt down, the client's trained prompt up */
    bool pool;   /* the K nearest pool prompts down; the client gates over them */
} fm_exchange_t;

/* What travels in run s (its strategy and model). */
fm_exchange_t fm_exchange_of(const fm_run_spec_t *s);

/* Sizes both sides agree on: the federated vector and one prompt, in floats. */
typedef struct {
    size_t nmodel, nprompt;
    uint32_t prompt_rows, prompt_cols;
    int max_nonlocal; /* K */
} fm_exchange_dims_t;
/* The sizes of run s with a federated vector of nmodel floats (a value). */
fm_exchange_dims_t fm_exchange_dims(const fm_run_spec_t *s, size_t nmodel);

/* ---- Task: coordinator -> client ---- */

/* Bytes of the nonce that binds an Update to its Task: fresh random bytes for
 * each (round, client), echoed by the Update; an update that does not carry its
 * Task's nonce (a replay from another round, a relabelled capture) is refused. */
#define FM_NONCE_BYTES 16

/* Secure aggregation's place of a client in a round (Task.secagg): its
 * number who (1..n), the participants n, the threshold t (a majority) and
 * the weight of its update; who 0: not carried. */
typedef struct {
    uint32_t who, n, t;
    uint64_t weight;
} fm_sa_setup_t;

typedef struct {
    uint32_t round;
    float lr_scale;                /* this round's multiplier on both learning rates */
    uint32_t eval_sample;          /* > 0: evaluate that many examples of test and validation */
    const float *model;            /* nmodel floats (when carried) */
    const float *prompt;           /* the global prompt (when carried) */
    const float *const *nonlocal;  /* k pool prompts, nearest first (when carried) */
    int k;
    uint8_t nonce[FM_NONCE_BYTES];
    fm_sa_setup_t sa;              /* the client's own, under secure aggregation */
} fm_task_t;

/* A Task goes in three frames whose concatenation is the Task envelope
 * (docs/protocol.md): a head (the envelope's fields up to the Task's length),
 * the part every participant of the round shares (round, federated vector,
 * global prompt, lr scale; encoded once a round), and the client's own (its K
 * nearest pool prompts, its nonce). */
/* The shared part of t: the bytes of a Task message, in a blob (one reference,
 * the caller's). */
fm_status fm_exchange_encode_task_shared(const fm_run_spec_t *s, const fm_exchange_dims_t *d, const fm_task_t *t,
                                         fm_blob_t **out);
/* The head and the client's own part of t, for a shared part of shared_len
 * bytes: *buf (malloc'd, the caller frees it) holds the head (its first *head
 * bytes) then the own part, *len bytes in all. */
fm_status fm_exchange_encode_task_own(const fm_run_spec_t *s, const fm_exchange_dims_t *d, const fm_task_t *t,
                                      size_t shared_len, uint8_t **buf, size_t *len, size_t *head);
/* The Task's three frames, in order, from an own part (len bytes, its first
 * head the head) and the shared part. */
void fm_exchange_task_frames(const uint8_t *own, size_t len, size_t head, fm_blob_t *shared, fm_frame_t f[3]);

/* A Task as the client reads it; the buffers are malloc'd here (free with
 * fm_exchange_task_free). */
typedef struct {
    uint32_t round;
    float lr_scale;  /* 1 when the Task leaves it unset */
    uint32_t eval_sample; /* > 0: evaluate that many evenly spaced examples (fm_evaluate_sample) */
    float *model;    /* nmodel, or NULL when not carried */
    float *prompt;   /* nprompt, or NULL */
    float *nonlocal; /* k * nprompt, or NULL */
    int k;           /* 0 unless the pool travels */
    uint8_t nonce[FM_NONCE_BYTES]; /* to echo in the Update */
    fm_sa_setup_t sa;  /* under secure aggregation (checked: 1 <= who <= n <= FM_SA_MAX_CLIENTS, a majority
                          threshold, a weight the aggregator takes) */
} fm_task_in_t;

/* Reads and checks a Task; on error FM_ERR_FORMAT with fm_error_last() and the
 * wire code for the Error reply in *code. */
fm_status fm_exchange_read_task(const fm_run_spec_t *s, const fm_exchange_dims_t *d, const Fedmoe__Task *t,
                                fm_task_in_t *out, fm_wire_code *code);
/* Frees what a read Task owns (model, prompt, non-local prompts) and zeroes it. */
void fm_exchange_task_free(fm_task_in_t *t);

/* ---- Update: client -> coordinator ---- */

typedef struct {
    double train_loss, val_loss, test_loss, test_accuracy, generalist_share;
    uint64_t test_samples, test_correct, val_samples, val_correct;
    double seconds;
} fm_metrics_t;

typedef struct {
    uint32_t round;
    uint64_t train_samples;
    const float *model;  /* nmodel floats (when carried) */
    const float *prompt; /* the trained prompt (when carried) */
    const unsigned __int128 *masked; /* secure aggregation: nmasked values instead of model and prompt */
    size_t nmasked;
    fm_metrics_t metrics;
    uint8_t nonce[FM_NONCE_BYTES]; /* its Task's */
} fm_update_t;

/* The Update envelope, encoded; *buf is malloc'd, the caller frees it. */
fm_status fm_exchange_encode_update(const fm_run_spec_t *s, const fm_exchange_dims_t *d, const fm_update_t *u,
                                    uint8_t **buf, size_t *len);

/* What an Update evaluated in a round whose Task asked for eval_sample: the
 * declared split sizes, validation and test capped at eval_sample (when > 0). */
fm_split_sizes_t fm_exchange_evaluated(const fm_split_sizes_t *declared, uint32_t eval_sample);

/* Reads and checks an Update's counts, metrics and tensors into model (nmodel)
 * and prompt (nprompt) when the strategy carries them. The counts must be
 * what the round evaluated of the client's declared splits (expect,
 * fm_exchange_evaluated), its accuracy the
 * ratio of its counts. On error FM_ERR_FORMAT, a reason and *code. */
fm_status fm_exchange_read_update(const fm_run_spec_t *s, const fm_exchange_dims_t *d, const Fedmoe__Update *u,
                                  const fm_split_sizes_t *expect, float *model, float *prompt, fm_metrics_t *m,
                                  fm_wire_code *code);
/* The values secure aggregation masks of run s: the federated vector, the
 * prompt when carried, and the weight. */
size_t fm_exchange_masked_size(const fm_run_spec_t *s, const fm_exchange_dims_t *d);
/* The same checks for an Update under secure aggregation, its masked input
 * (fm_exchange_masked_size values) read into masked. */
fm_status fm_exchange_read_masked(const fm_run_spec_t *s, const fm_exchange_dims_t *d, const Fedmoe__Update *u,
                                  const fm_split_sizes_t *expect, unsigned __int128 *masked, fm_metrics_t *m,
                                  fm_wire_code *code);

#endif
