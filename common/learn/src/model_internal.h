/* model_internal.h - the model's private layout, shared by its components:
 *
 *   model.c       configuration, create/destroy, the parameter registry and
 *                 initialisation, the batch workspace, forward/backward orchestration
 *   model_stem.c  the input stem (mlp or cnn)
 *   model_moe.c   the MoE blocks: LayerNorm, top-k router, experts, load balancing,
 *                 and the specialist anchor
 *   model_head.c  the prompt-expert head: feature LayerNorm, frozen class-text
 *                 encoder, cosine logits, attention gating
 *
 * Storage. Every batch buffer lives in one of two arenas sized for the largest
 * batch seen: `act` holds what a forward computes and its backward reads,
 * `grad` holds what only a backward writes and reads. Each component keeps its
 * pointers into them in sub-structs named act and grad, so a reader sees which is
 * which. Nothing outside forward and backward writes to either arena: setting the
 * non-local prompts and computing text features for a caller use storage of
 * their own (fm_head_t.enc), so they can run between a forward and its backward. */
#ifndef FEDMOE_MODEL_INTERNAL_H
#define FEDMOE_MODEL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fedmoe/model.h"
#include "fedmoe/params.h"
#include "model_family.h"

#define CNN_K 5    /* convolution kernel size */
#define CNN_C1 32  /* channels of the first convolution */
#define CNN_C2 64  /* channels of the second convolution */

/* ---- arenas ------------------------------------------------------------------ */

/* Carves 64-byte aligned buffers out of one arena; with base == NULL it only measures. */
typedef struct {
    char *base;
    size_t off;
} fm_layout_t;

/* The next `bytes` of the arena (64-byte aligned), or NULL when only measuring. */
void *fm_layout_take(fm_layout_t *L, size_t bytes);

/* ptr = the next count elements of type; left untouched when only measuring. */
#define FM_TAKE(L, ptr, type, count)                                           \
    do {                                                                       \
        void *take_ = fm_layout_take((L), sizeof(type) * (size_t)(count));     \
        if ((L)->base)                                                         \
            (ptr) = (type *)take_;                                             \
    } while (0)

/* A model's two arenas, sized for the largest batch seen (B inputs). layout
 * lays out every batch buffer of the model for a batch of B (measuring when the
 * bases are NULL), setting the model's pointers into the arenas. */
typedef void (*fm_layout_fn)(fm_model_t *m, int B, fm_layout_t *act, fm_layout_t *grad);
typedef struct {
    int B;
    void *act, *grad;
} fm_workspace_t;
/* Grows ws to hold a batch of B (nothing when it does). Out of memory it logs
 * and aborts: a forward has no error path, and the trainer checked the
 * workspace's size against FM_MODEL_MAX_WORKSPACE_BYTES before. */
void fm_workspace_ensure(fm_workspace_t *ws, fm_model_t *m, int B, fm_layout_fn layout);
/* Bytes of both arenas for a batch of B, without allocating (the model's
 * pointers are left pointing into ws). */
double fm_workspace_measure(fm_workspace_t *ws, fm_model_t *m, int B, fm_layout_fn layout);
void fm_workspace_free(fm_workspace_t *ws);

/* ---- components ---------------------------------------------------------------- */

typedef struct {
    fm_view_t mlp_w, mlp_b;             /* mlp: (d,in), (d) */
    fm_view_t c1_w, c1_b, c2_w, c2_b;   /* cnn: (32,25), (32), (64,800), (64) */
    fm_view_t fc_w, fc_b;               /* cnn: (d, flat), (d) */
    int c1h, c1w, p1h, p1w, c2h, c2w, p2h, p2w, flat; /* cnn geometry */
    struct {
        float *z0;                      /* pre-activation (B,d); h = GELU(z0) */
        float *cols1, *cc1, *rr1, *pp1; /* im2col, conv, ReLU, pool of the first convolution */
        float *cols2, *cc2, *rr2, *pp2; /* the same for the second; pp2 is (B, flat) */
        int32_t *arg1, *arg2;           /* max-pool winners */
    } act;
    struct {
        float *dz0, *dcols2, *dpp1, *drr1, *dpp2, *drr2;
    } grad;
} fm_stem_t;

typedef struct {
    fm_view_t w1, b1, w2, b2; /* w1 (H,d), b1 (H), w2 (d,H), b2 (d) */
} fm_expert_t;

typedef struct {
    fm_view_t ln_g, ln_b, router; /* router (E,d) */
    fm_expert_t *experts;         /* E = G + S, generalists first */
    struct {
        float *xhat, *rstd, *u;   /* LayerNorm: (B,d), (B), output (B,d) */
        float *rlog, *pfull;      /* router logits and their full softmax (B,E) */
        int *topi;                /* kept experts (B,k) */
        float *topw;              /* their weights (B,k) */
        int *off;                 /* (E+1): rows of expert e are off[e]..off[e+1] */
        int *row_b, *row_slot;    /* (B*k): input and slot of each expert row */
        float *ug, *a, *ga, *y;   /* gathered u (B*k,d), pre-act (B*k,H), GELU (B*k,H), out (B*k,d) */
        float *frac;              /* fraction of dispatches per expert (E) */
    } act;
} fm_block_t;

/* Backward scratch of the MoE blocks, reused block after block. */
typedef struct {
    float *du, *dr, *dw;          /* (B,d), (B,E), (B,k) */
    float *dyg, *dg, *dug;        /* (B*k,d), (B*k,H), (B*k,d) */
} fm_moe_grad_t;

/* The MoE blocks of a model (model_moe.c), whatever its family: a family
 * embeds one and hands it its residual stream, one row per input (an image)
 * or per position (a byte of text). */
typedef struct {
    const fm_model_config_t *cfg; /* the model's (sizes, experts, load balancing) */
    int E, k;                     /* experts per block, kept per row */
    bool with_lb;                 /* the last forward included the load-balancing term */
    fm_block_t *blocks;           /* cfg->blocks */
    fm_moe_grad_t grad;
} fm_moe_t;

/* A text block's causal self-attention (model_attention.c), before its MoE
 * layer: h += Wo Attention(LayerNorm(h)) + bo, over B windows of T positions
 * (rows = B * T, window after window). */
typedef struct {
    fm_view_t ln_g, ln_b;         /* (d) */
    fm_view_t wqkv, bqkv;         /* (3d,d), (3d): queries, keys, values stacked */
    fm_view_t wo, bo;             /* (d,d), (d) */
    struct {
        float *xhat, *rstd, *u;   /* LayerNorm (rows,d), (rows), (rows,d) */
        float *qkv;               /* (rows, 3d) */
        float *p;                 /* probabilities (B, heads, T, T); zero above the diagonal */
        float *o;                 /* the heads' outputs side by side (rows, d) */
    } act;
} fm_attn_t;

/* Backward scratch of the attention layers, reused block after block. */
typedef struct {
    float *dout, *du;             /* (rows, d) */
    float *dqkv;                  /* (rows, 3d) */
    float *dp;                    /* (T, T) */
} fm_attn_grad_t;

/* Activations of the class-text encoder for one prompt. */
typedef struct {
    float *v;                     /* inputs [P; e_c] (C, (M+1) dp) */
    float *za, *ga;               /* hidden pre-activation and GELU (C, Ht) */
    float *o, *onorm;             /* output (C,d) and its row norms (C) */
} fm_text_act_t;

typedef struct {
    fm_view_t lnf_g, lnf_b;                   /* feature LayerNorm (d) */
    fm_view_t prompt;                         /* (M, dp) */
    fm_view_t wq, bq, wk, bk, wv, bv, wo, bo; /* gating, (d,d) and (d) */
    /* frozen class-text encoder */
    float *emb;                   /* (C, dp) */
    float *wa, *ba;               /* (Ht, (M+1)dp), (Ht) */
    float *wb, *bb;               /* (d, Ht), (d) */
    /* non-local prompts and their text features, as set by fm_model_set_nonlocal */
    int K;
    float *nl_prompts;            /* (max_nonlocal, M*dp) */
    float *nl_t;                  /* (max_nonlocal*C, d): row j*C+c = t_c(P_{j+1}) */
    /* the encoder's own storage, for fm_model_set_nonlocal and fm_model_text_features */
    fm_text_act_t enc;            /* laid out in enc_block */
    void *enc_block;
    float *text_out;              /* (C,d): what fm_model_text_features returns */
    struct {
        int K;                    /* non-local prompts this forward used */
        bool gated;
        float *xhatf, *rstdf, *f; /* feature LayerNorm (B,d), (B), (B,d) */
        float *fnorm, *nf;        /* |f| (B), f/|f| (B,d) */
        fm_text_act_t text;       /* the local prompt's encoder pass */
        float *tall;              /* ((1+K)*C, d): row j*C+c = t_c(P_j), j = 0 local */
        float *c1, *logits, *dlogits; /* (B,C) */
        float *q, *gq, *kp, *vp;  /* (B,d), (B,d), (J*C,d), (J*C,d) */
        float *att, *vdot;        /* (heads, B, J*C): column j*C + c */
    } act;
    struct {
        float *df, *dnf, *dc1, *dtl;  /* (B,d), (B,d), (B,C), (C,d) */
        float *dq, *dgq, *dkp, *dvp;  /* (B,d), (B,d), (J*C,d), (J*C,d) */
        float *datt, *dvdot;          /* as att, vdot */
        float *dto, *dga, *dv;        /* the local prompt's encoder pass */
    } grad;
} fm_head_t;

/* The image classifier (family "image"): the base every family starts with
 * (model_family.h), then its components. */
typedef struct fm_image {
    fm_model_t base;              /* family, cfg, ps, gate_level */
    int hd;                       /* gating head width */
    fm_stem_t stem;
    fm_moe_t moe;
    fm_head_t head;
    fm_workspace_t ws;            /* batches of up to ws.B */
    /* the last forward */
    int B;
    const float *x;               /* the batch's inputs (B, in_dim): the data's rows or xbuf */
    const uint8_t *labels;        /* its labels: the data's or ybuf */
    float *xbuf;                  /* act: gathered inputs when the batch is not contiguous */
    uint8_t *ybuf;                /* act: gathered labels */
    float *h;                     /* act: residual stream (B,d) */
    float *dh;                    /* grad: its gradient (B,d) */
} fm_image_t;

/* The byte-level causal language model (family "text", model_text.c): byte
 * and position embeddings, then per block causal self-attention and an MoE
 * layer, a final LayerNorm and the output layer (the byte embedding, tied, or
 * its own), cross-entropy on the next byte at every position. */
typedef struct fm_text {
    fm_model_t base;              /* family, cfg, ps, gate_level */
    fm_view_t emb, pos;           /* (256,d) byte embedding, (T,d) position embedding */
    fm_view_t lnf_g, lnf_b;       /* final LayerNorm (d) */
    fm_view_t out;                /* untied: (256,d); tied: unused (emb is the output layer) */
    fm_attn_t *attn;              /* cfg.blocks */
    fm_moe_t moe;
    fm_attn_grad_t attn_grad;
    fm_workspace_t ws;            /* batches of up to ws.B windows */
    /* the last forward */
    int B;
    const uint8_t *tok;           /* its windows (B, T+1): the data's or tokbuf */
    uint8_t *tokbuf;              /* act: gathered windows */
    float *h, *xhatf, *rstdf, *hf;/* act: residual stream, final LayerNorm (B*T, d) */
    float *logits, *dlogits;      /* act: (B*T, 256) */
    uint8_t *next;                /* act: the byte to predict at each position (B*T) */
    float *dh, *dhf;              /* grad: (B*T, d) */
} fm_text_t;

/* The image family's operations (model_image.c). */
extern const fm_model_family_t fm_family_image;
/* The text family's (model_text.c). */
extern const fm_model_family_t fm_family_text;

/* One step of the branch-signature hash (fm_model_branch_signature). */
static inline uint64_t fm_sig_mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h;
}

/* stem (model_stem.c) */
void fm_stem_geometry(fm_image_t *m);
fm_status fm_stem_register(fm_image_t *m);
void fm_stem_layout(fm_image_t *m, int B, fm_layout_t *act, fm_layout_t *grad);
/* m->h (B,d) = stem(x) */
void fm_stem_forward(fm_image_t *m, const float *x, int B);
/* From m->dh into the stem's gradients. */
void fm_stem_backward(fm_image_t *m, int B);
uint64_t fm_stem_signature(const fm_image_t *m, uint64_t h);

/* MoE blocks (model_moe.c) */
/* Sets moe up for cfg (which must outlive it) and allocates its blocks. */
fm_status fm_moe_init(fm_moe_t *moe, const fm_model_config_t *cfg);
void fm_moe_free(fm_moe_t *moe);
/* Registers block l's parameters in m: its LayerNorm, router and experts. */
fm_status fm_moe_register(fm_model_t *m, fm_moe_t *moe, int l);
void fm_moe_layout(fm_moe_t *moe, int rows, fm_layout_t *act, fm_layout_t *grad);
/* Block bl in place on the residual stream h (rows,d): h += MoE(LayerNorm(h));
 * returns its load-balancing term and adds the routing weight on generalists
 * to *gen_mass. */
float fm_moe_forward(fm_moe_t *moe, fm_block_t *bl, float *h, int rows, double *gen_mass);
/* dh holds dL/dh_out and becomes dL/dh_in (when need_dx). */
void fm_moe_backward(fm_moe_t *moe, fm_block_t *bl, float *dh, int rows, bool lo, bool up, bool need_dx);
/* The specialist anchor (fm_model_anchor_specialists) on every block. */
void fm_moe_anchor(fm_moe_t *moe, float rate);
/* Mixes the last forward's expert choices (rows of it) into h. */
uint64_t fm_moe_signature(const fm_moe_t *moe, int rows, uint64_t h);

/* self-attention (model_attention.c) */
fm_status fm_attn_register(fm_model_t *m, fm_attn_t *a, int l);
void fm_attn_layout(fm_attn_t *a, const fm_model_config_t *c, int B, fm_layout_t *act);
void fm_attn_grad_layout(fm_attn_grad_t *g, const fm_model_config_t *c, int B, fm_layout_t *grad);
/* h (B*T, d) += the attention of a over it; T = c->context. */
void fm_attn_forward(fm_attn_t *a, const fm_model_config_t *c, float *h, int B);
/* dh holds dL/dh_out and, with need_dx, becomes dL/dh_in; parameter
 * gradients with lo. */
void fm_attn_backward(fm_attn_t *a, fm_attn_grad_t *g, const fm_model_config_t *c, float *dh, int B, bool lo,
                      bool need_dx);

/* prompt head (model_head.c) */
fm_status fm_head_register(fm_image_t *m);
fm_status fm_head_init_encoder(fm_image_t *m, uint64_t seed);
void fm_head_free(fm_image_t *m);
void fm_head_layout(fm_image_t *m, int B, fm_layout_t *act, fm_layout_t *grad);
/* From m->h to head.act.logits (B,C). */
void fm_head_forward(fm_image_t *m, int B);
/* From head.act.dlogits to m->dh (overwritten); gradients of the feature
 * LayerNorm with lo, of the gating with train_gate. */
void fm_head_backward(fm_image_t *m, int B, bool lo, bool train_gate);
/* The local prompt's gradient, from head.grad.dtl (after fm_head_backward with lo). */
void fm_head_prompt_backward(fm_image_t *m);
/* The image family's prompt-head operations (model_family.h; m is an fm_image_t). */
fm_status fm_head_set_nonlocal(fm_model_t *m, const float *prompts, int K);
const float *fm_head_text_features(fm_model_t *m);
float *fm_head_prompt(fm_model_t *m);
size_t fm_head_prompt_size(const fm_model_t *m);

#endif
