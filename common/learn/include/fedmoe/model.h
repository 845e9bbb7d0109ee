/* model.h - the personalized mixture-of-experts model of one client.
 *
 * x -> stem (MLP or CNN) -> L MoE blocks (G generalists + S specialists, top-k
 * router, residual) -> LayerNorm image feature f -> prompt-expert head: a frozen
 * class-text encoder turns the local prompt (and K frozen non-local prompts) into
 * class text features; an attention gating network mixes them per input; logits
 * are tau * (lambda * cos(f, t_c(P_L)) + <f/|f|, T_moe,c>), or tau * cos(f, t_c(P_L))
 * when there are no non-local prompts (or gating is off).
 *
 * Forward and backward are written by hand. Parameters live in an fm_params_t
 * (groups shared / local / prompt). The frozen encoder and non-local prompts are
 * generated from the run seed / set by the caller and are not parameters.
 *
 * This is the image family. The functions below are the model-family interface:
 * they dispatch on fm_model_config_t.family (common/learn/src/model_family.h says what a
 * family provides), so a second family plugs in without its callers (trainer,
 * client session, coordinator) knowing which one runs. */
#ifndef FEDMOE_MODEL_H
#define FEDMOE_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fedmoe/dataset.h"
#include "fedmoe/params.h"
#include "fedmoe/status.h"

typedef enum { FM_STEM_MLP = 0, FM_STEM_CNN = 1 } fm_stem_kind;

/* Model families: which network the configuration describes. Each family
 * implements the operations below (common/learn/src/model_family.h); callers use these
 * functions and never ask which family runs. */
typedef enum { FM_FAMILY_IMAGE = 0, FM_FAMILY_TEXT = 1 } fm_model_family_kind;

/* What the shared group (the part comigs and full average) holds besides the
 * generalist experts: everything but the specialists, routers, gating and
 * prompt (stem or embeddings, attention, norms: CoMiGS's grouping, the
 * default), or nothing (the rest stays on the client, as in CoMiGS's LoRA
 * experts over a frozen base). */
typedef enum { FM_SHARED_ALL = 0, FM_SHARED_EXPERTS = 1 } fm_shared_kind;

typedef struct {
    fm_model_family_kind family; /* image, or text (a byte-level causal language model) */
    int in_dim;            /* input features (784); for cnn, img_h * img_w */
    int img_h, img_w;      /* image size for the cnn stem (28 x 28, one channel) */
    int classes;           /* 10 */
    fm_stem_kind stem;     /* mlp (default) or cnn */
    int d;                 /* model width (128) */
    int blocks;            /* L (2) */
    int generalists;       /* G (1) */
    int specialists;       /* S (2), per client */
    int ffn_hidden;        /* expert hidden width (256) */
    int top_k;             /* experts kept per input (2) */
    float lb_weight;       /* load-balancing weight (0.01) */
    float generalist_importance; /* target routing mass on generalists (0.5) */
    int prompt_len;        /* M context vectors (4) */
    int prompt_dim;        /* d_p (64) */
    int text_hidden;       /* hidden width of the class-text encoder MLP (256) */
    int heads;             /* gating attention heads (8); text: self-attention heads (4) */
    int context;           /* text: bytes of context T (128) */
    bool untied;           /* text: an output layer of its own instead of the byte embedding */
    fm_shared_kind shared; /* what the shared group holds (all) */
    int max_nonlocal;      /* K (4): non-local prompt experts at most */
    float attn_scale;      /* gating attention logit scale (10) */
    float lambda;          /* weight of the local cosine term (0.5) */
    float tau;             /* logit scale */
    bool gating;           /* use the attention gating when non-local prompts exist */
    bool gating_on_validation; /* train the gating in the upper level instead of the lower */
    bool gating_shared;    /* the gating joins the shared group (averaged) instead of the local one */
} fm_model_config_t;

/* "image" or "text", and the inverse (FM_ERR_ARG with a reason naming flag). */
const char *fm_family_name(fm_model_family_kind k);
fm_status fm_family_parse(const char *flag, const char *name, fm_model_family_kind *out);
/* The text model's bytes of context and attention heads by default (chosen
 * on holdout runs: docs/model.md). */
#define FM_TEXT_CONTEXT 32
#define FM_TEXT_HEADS 4
/* ... and the image model's heads (its prompt gating). */
#define FM_IMAGE_HEADS 8
/* Sets c's family to text with the text model's defaults (docs/model.md):
 * d 128, 4 attention heads, 2 blocks, context FM_TEXT_CONTEXT, tied output;
 * the expert settings as for images. */
void fm_model_config_text(fm_model_config_t *c);

/* "all" or "experts", and the inverse (FM_ERR_ARG with a reason naming flag). */
const char *fm_shared_name(fm_shared_kind k);
fm_status fm_shared_parse(const char *flag, const char *name, fm_shared_kind *out);

/* Parses a stem name into *out: "mlp" or "cnn"; FM_ERR_ARG with a reason naming
 * flag (fm_error_last) otherwise. */
fm_status fm_stem_parse(const char *flag, const char *name, fm_stem_kind *out);
/* "mlp" or "cnn". */
const char *fm_stem_name(fm_stem_kind k);

/* The most floats a model may hold in parameters and frozen values (the image
 * family's class-text encoder, non-local prompts) together: 64 Mi floats, 256 MiB
 * of weights, about 1 GiB with gradients and moments; the default model has
 * 563,840 parameters. Checked from the sizes before anything is allocated, so a
 * configuration from the network cannot make a client allocate without bound. */
#define FM_MODEL_MAX_PARAMETERS (64 * 1024 * 1024)

/* The most bytes a model's activation and gradient workspace may take for one
 * batch (the training batch or the evaluation batch, whichever is larger):
 * 1 GiB. Checked when a trainer is made, before the workspace is allocated, so
 * a batch size from the network cannot make a client allocate without bound
 * (the default model at batch 64 takes a few MiB). */
#define FM_MODEL_MAX_WORKSPACE_BYTES (1024.0 * 1024 * 1024)

/* How many parameters a model of c would have, counted from its sizes alone
 * (nothing is allocated; 0 for an unknown family). */
double fm_model_config_parameters(const fm_model_config_t *c);

/* Fills c with the defaults of docs/model.md. */
void fm_model_config_default(fm_model_config_t *c);
/* Checks sizes; on error records a reason (fm_error_last) and returns FM_ERR_ARG. */
fm_status fm_model_config_check(const fm_model_config_t *c);

typedef struct fm_model fm_model_t;

/* Creates a model with parameters initialised from seed: the shared and prompt
 * groups and the frozen encoder from the run seed alone (identical on every
 * client), the local group from (seed, local_stream). Caller frees with
 * fm_model_destroy. */
fm_status fm_model_new(fm_model_t **out, const fm_model_config_t *cfg, uint64_t seed,
                       uint64_t local_stream);
/* Frees the model and everything it owns and sets *m to NULL; safe on NULL or *m NULL. */
void fm_model_destroy(fm_model_t **m);

/* The model's configuration (owned by the model, valid while it lives). */
const fm_model_config_t *fm_model_config(const fm_model_t *m);
/* The model's parameters (owned by the model, valid while it lives): callers may
 * read and write weights, gradients and moments, but not register parameters.
 * Each parameter carries its role and kind (params.h); select by those, not by name. */
fm_params_t *fm_model_params(fm_model_t *m);
/* The local prompt P_L, fm_model_prompt_size floats (prompt_len x prompt_dim, row
 * major) inside the prompt group; owned by the model, valid while it lives.
 * Writing it sets the prompt. NULL when the family has no prompt head. */
float *fm_model_prompt(fm_model_t *m);
/* Floats in the local prompt: prompt_len * prompt_dim; 0 without a prompt head. */
size_t fm_model_prompt_size(const fm_model_t *m);
/* FM_OK when ds has the shape this model reads (features, classes); otherwise
 * FM_ERR_ARG with a reason beginning with who (fm_error_last). */
fm_status fm_model_accepts(const fm_model_t *m, const fm_dataset_t *ds, const char *who);
/* Whether a model of c has the prompt-expert head (the image family): what
 * prompts, pools and gating need. */
bool fm_model_config_has_head(const fm_model_config_t *c);
/* Predictions m makes for one example: 1 (a class), or one a position (text). */
int fm_model_predictions(const fm_model_t *m);
/* The same for a model of c (checked sizes; 1 for an unknown family). */
int fm_model_config_predictions(const fm_model_config_t *c);
/* fm_model_accepts for a model of c (checked), before it is made. */
fm_status fm_model_config_accepts(const fm_model_config_t *c, const fm_dataset_t *ds, const char *who);
/* Bytes of m's activation and gradient workspace for a batch of B, measured
 * without allocating (compare FM_MODEL_MAX_WORKSPACE_BYTES). */
double fm_model_workspace_bytes(const fm_model_t *m, int B);
/* Pulls every specialist expert toward the mean of its block's generalists:
 * w_s -= rate * (w_s - mean_g w_g) for each weight and bias (the generalists do
 * not move). No effect without generalists or specialists, or with rate 0. */
void fm_model_anchor_specialists(fm_model_t *m, float rate);

/* Sets the K frozen non-local prompts, K * prompt_len * prompt_dim floats
 * (copied; the caller keeps its buffer); K = 0 clears them. Their class text
 * features are computed here once, in storage of their own: calling this between
 * a forward and its backward does not change that backward, which uses the
 * prompts of its forward. FM_ERR_ARG when K is not in 0..max_nonlocal, or K > 0
 * and the family has no prompt head. */
fm_status fm_model_set_nonlocal(fm_model_t *m, const float *prompts, int K);

typedef struct {
    float loss;          /* mean cross-entropy over the predictions, in nats (text: / ln 2 = bits per byte) */
    float lb_loss;       /* load-balancing term (unweighted, summed over blocks) */
    int predictions;     /* what was predicted: one per example (image), one per position (text) */
    int correct;         /* argmax hits among them */
    float generalist_share; /* mean routing weight on generalists over blocks and inputs */
} fm_batch_stats_t;

/* A batch: examples idx[0..n) of ds, or, with idx NULL, examples first..first+n
 * (read in place). The batch does not own ds or idx. */
typedef struct {
    const fm_dataset_t *ds;
    const uint32_t *idx;
    size_t first;
    int n;
} fm_batch_t;

/* Forward pass on batch b (1 <= b->n; ds accepted by fm_model_accepts). Keeps
 * what backward needs; b->ds must stay valid and unchanged until
 * fm_model_backward. Returns the objective: cross-entropy, plus lb_weight *
 * load-balancing term when with_lb. logits (n, classes) may be NULL. */
float fm_model_forward(fm_model_t *m, const fm_batch_t *b, bool with_lb, float *logits, fm_batch_stats_t *stats);
/* Backward of the last forward: accumulates into the gradients of the parameters
 * whose level is in `levels` (FM_LEVEL_LOWER | FM_LEVEL_UPPER), skipping work that
 * only other levels need. */
void fm_model_backward(fm_model_t *m, int levels);

/* A hash of the discrete choices of the last forward (top-k experts, max-pool
 * winners, ReLU signs): finite-difference tests skip points where it changes. */
uint64_t fm_model_branch_signature(const fm_model_t *m);

/* Computes the class text features of the local prompt as it is now: (classes,
 * d), unit rows. The buffer is the model's, overwritten by the next call and
 * valid while the model lives; computing it leaves the last forward's
 * activations alone. NULL when the family has no prompt head. */
const float *fm_model_text_features(fm_model_t *m);

#endif
