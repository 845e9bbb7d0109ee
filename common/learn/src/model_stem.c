/* model_stem.c - the input stem: h = GELU(W x + b) (mlp), or two 5x5
 * convolutions with ReLU and 2x2 max-pooling then a linear map to d (cnn).
 * x (B, in_dim) -> h (B, d). */
#include <string.h>

#include "fedmoe/kernels.h"
#include "model_internal.h"

void fm_stem_geometry(fm_image_t *m)
{
    const fm_model_config_t *c = &m->base.cfg;
    fm_stem_t *s = &m->stem;
    if (c->stem != FM_STEM_CNN)
        return;
    s->c1h = c->img_h - CNN_K + 1;
    s->c1w = c->img_w - CNN_K + 1;
    s->p1h = s->c1h / 2;
    s->p1w = s->c1w / 2;
    s->c2h = s->p1h - CNN_K + 1;
    s->c2w = s->p1w - CNN_K + 1;
    s->p2h = s->c2h / 2;
    s->p2w = s->c2w / 2;
    s->flat = s->p2h * s->p2w * CNN_C2;
}

fm_status fm_stem_register(fm_image_t *m)
{
    const fm_model_config_t *c = &m->base.cfg;
    fm_stem_t *s = &m->stem;
    fm_status st;
#define ADD(view, kind, r, cl, name)                                                              \
    do {                                                                                          \
        if ((st = fm_model_add_param(&m->base, &(view), FM_ROLE_STEM, kind, -1, -1, r, cl, name)) != FM_OK) \
            return st;                                                                            \
    } while (0)
    if (c->stem == FM_STEM_MLP) {
        ADD(s->mlp_w, FM_KIND_WEIGHT, c->d, c->in_dim, "stem.w");
        ADD(s->mlp_b, FM_KIND_BIAS, 1, c->d, "stem.b");
    } else {
        ADD(s->c1_w, FM_KIND_WEIGHT, CNN_C1, CNN_K * CNN_K, "stem.conv1.w");
        ADD(s->c1_b, FM_KIND_BIAS, 1, CNN_C1, "stem.conv1.b");
        ADD(s->c2_w, FM_KIND_WEIGHT, CNN_C2, CNN_K * CNN_K * CNN_C1, "stem.conv2.w");
        ADD(s->c2_b, FM_KIND_BIAS, 1, CNN_C2, "stem.conv2.b");
        ADD(s->fc_w, FM_KIND_WEIGHT, c->d, s->flat, "stem.fc.w");
        ADD(s->fc_b, FM_KIND_BIAS, 1, c->d, "stem.fc.b");
    }
#undef ADD
    return FM_OK;
}

void fm_stem_layout(fm_image_t *m, int B, fm_layout_t *act, fm_layout_t *grad)
{
    const fm_model_config_t *c = &m->base.cfg;
    fm_stem_t *s = &m->stem;
    FM_TAKE(act, s->act.z0, float, (size_t)B * c->d);
    FM_TAKE(grad, s->grad.dz0, float, (size_t)B * c->d);
    if (c->stem != FM_STEM_CNN)
        return;
    size_t n1 = (size_t)B * s->c1h * s->c1w, n2 = (size_t)B * s->c2h * s->c2w;
    size_t np1 = (size_t)B * s->p1h * s->p1w * CNN_C1;
    FM_TAKE(act, s->act.cols1, float, n1 * CNN_K * CNN_K);
    FM_TAKE(act, s->act.cc1, float, n1 * CNN_C1);
    FM_TAKE(act, s->act.rr1, float, n1 * CNN_C1);
    FM_TAKE(act, s->act.pp1, float, np1);
    FM_TAKE(act, s->act.arg1, int32_t, np1);
    FM_TAKE(act, s->act.cols2, float, n2 * CNN_K * CNN_K * CNN_C1);
    FM_TAKE(act, s->act.cc2, float, n2 * CNN_C2);
    FM_TAKE(act, s->act.rr2, float, n2 * CNN_C2);
    FM_TAKE(act, s->act.pp2, float, (size_t)B * s->flat);
    FM_TAKE(act, s->act.arg2, int32_t, (size_t)B * s->flat);
    FM_TAKE(grad, s->grad.dcols2, float, n2 * CNN_K * CNN_K * CNN_C1);
    FM_TAKE(grad, s->grad.dpp1, float, np1);
    FM_TAKE(grad, s->grad.drr1, float, n1 * CNN_C1);
    FM_TAKE(grad, s->grad.dpp2, float, (size_t)B * s->flat);
    FM_TAKE(grad, s->grad.drr2, float, n2 * CNN_C2);
}

/* cnn: x (B, img_h*img_w) -> act.z0 (B,d) */
static void cnn_forward(fm_image_t *m, const float *x, int B)
{
    const fm_model_config_t *c = &m->base.cfg;
    fm_stem_t *s = &m->stem;
    size_t s1 = (size_t)s->c1h * s->c1w, sp1 = (size_t)s->p1h * s->p1w;
    size_t s2 = (size_t)s->c2h * s->c2w;
    int kk1 = CNN_K * CNN_K, kk2 = CNN_K * CNN_K * CNN_C1;
    for (int b = 0; b < B; b++)
        fm_im2col(s->act.cols1 + b * s1 * kk1, x + (size_t)b * c->in_dim, c->img_h, c->img_w, 1, CNN_K, CNN_K);
    fm_linear_forward(s->act.cc1, s->act.cols1, s->c1_w.w, s->c1_b.w, (int)(B * s1), kk1, CNN_C1);
    fm_relu_forward(s->act.rr1, s->act.cc1, B * s1 * CNN_C1);
    for (int b = 0; b < B; b++) {
        fm_maxpool2_forward(s->act.pp1 + b * sp1 * CNN_C1, s->act.arg1 + b * sp1 * CNN_C1,
                            s->act.rr1 + b * s1 * CNN_C1, s->c1h, s->c1w, CNN_C1);
        fm_im2col(s->act.cols2 + b * s2 * kk2, s->act.pp1 + b * sp1 * CNN_C1, s->p1h, s->p1w, CNN_C1, CNN_K,
                  CNN_K);
    }
    fm_linear_forward(s->act.cc2, s->act.cols2, s->c2_w.w, s->c2_b.w, (int)(B * s2), kk2, CNN_C2);
    fm_relu_forward(s->act.rr2, s->act.cc2, B * s2 * CNN_C2);
    for (int b = 0; b < B; b++)
        fm_maxpool2_forward(s->act.pp2 + (size_t)b * s->flat, s->act.arg2 + (size_t)b * s->flat,
                            s->act.rr2 + b * s2 * CNN_C2, s->c2h, s->c2w, CNN_C2);
    fm_linear_forward(s->act.z0, s->act.pp2, s->fc_w.w, s->fc_b.w, B, s->flat, c->d);
}

void fm_stem_forward(fm_image_t *m, const float *x, int B)
{
    const fm_model_config_t *c = &m->base.cfg;
    fm_stem_t *s = &m->stem;
    if (c->stem == FM_STEM_MLP)
        fm_linear_forward(s->act.z0, x, s->mlp_w.w, s->mlp_b.w, B, c->in_dim, c->d);
    else
        cnn_forward(m, x, B);
    fm_gelu_forward(m->h, s->act.z0, (size_t)B * c->d);
}

/* cnn: grad.dz0 (B,d) -> the convolutions' and fc's gradients */
static void cnn_backward(fm_image_t *m, int B)
{
    const fm_model_config_t *c = &m->base.cfg;
    fm_stem_t *s = &m->stem;
    size_t s1 = (size_t)s->c1h * s->c1w, sp1 = (size_t)s->p1h * s->p1w, s2 = (size_t)s->c2h * s->c2w;
    int kk1 = CNN_K * CNN_K, kk2 = CNN_K * CNN_K * CNN_C1;
    fm_linear_backward(s->grad.dpp2, s->fc_w.g, s->fc_b.g, s->grad.dz0, s->act.pp2, s->fc_w.w, B, s->flat, c->d,
                       false);
    memset(s->grad.drr2, 0, sizeof(float) * B * s2 * CNN_C2);
    for (int b = 0; b < B; b++)
        fm_maxpool2_backward(s->grad.drr2 + b * s2 * CNN_C2, s->grad.dpp2 + (size_t)b * s->flat,
                             s->act.arg2 + (size_t)b * s->flat, s->c2h, s->c2w, CNN_C2);
    fm_relu_backward(s->grad.drr2, s->grad.drr2, s->act.cc2, B * s2 * CNN_C2);
    fm_linear_backward(s->grad.dcols2, s->c2_w.g, s->c2_b.g, s->grad.drr2, s->act.cols2, s->c2_w.w, (int)(B * s2),
                       kk2, CNN_C2, false);
    memset(s->grad.dpp1, 0, sizeof(float) * B * sp1 * CNN_C1);
    memset(s->grad.drr1, 0, sizeof(float) * B * s1 * CNN_C1);
    for (int b = 0; b < B; b++) {
        fm_col2im(s->grad.dpp1 + b * sp1 * CNN_C1, s->grad.dcols2 + b * s2 * kk2, s->p1h, s->p1w, CNN_C1, CNN_K,
                  CNN_K);
        fm_maxpool2_backward(s->grad.drr1 + b * s1 * CNN_C1, s->grad.dpp1 + b * sp1 * CNN_C1,
                             s->act.arg1 + b * sp1 * CNN_C1, s->c1h, s->c1w, CNN_C1);
    }
    fm_relu_backward(s->grad.drr1, s->grad.drr1, s->act.cc1, B * s1 * CNN_C1);
    fm_linear_backward(NULL, s->c1_w.g, s->c1_b.g, s->grad.drr1, s->act.cols1, s->c1_w.w, (int)(B * s1), kk1,
                       CNN_C1, false);
}

void fm_stem_backward(fm_image_t *m, int B)
{
    const fm_model_config_t *c = &m->base.cfg;
    fm_stem_t *s = &m->stem;
    fm_gelu_backward(s->grad.dz0, m->dh, s->act.z0, (size_t)B * c->d);
    if (c->stem == FM_STEM_MLP)
        fm_linear_backward(NULL, s->mlp_w.g, s->mlp_b.g, s->grad.dz0, m->x, s->mlp_w.w, B, c->in_dim, c->d, false);
    else
        cnn_backward(m, B);
}

uint64_t fm_stem_signature(const fm_image_t *m, uint64_t h)
{
    const fm_stem_t *s = &m->stem;
    if (m->base.cfg.stem != FM_STEM_CNN)
        return h;
    int B = m->B;
    size_t n1 = (size_t)B * s->p1h * s->p1w * CNN_C1, n2 = (size_t)B * s->flat;
    size_t r1 = (size_t)B * s->c1h * s->c1w * CNN_C1, r2 = (size_t)B * s->c2h * s->c2w * CNN_C2;
    for (size_t i = 0; i < n1; i++)
        h = fm_sig_mix(h, (uint64_t)s->act.arg1[i]);
    for (size_t i = 0; i < n2; i++)
        h = fm_sig_mix(h, (uint64_t)s->act.arg2[i]);
    for (size_t i = 0; i < r1; i++)
        h = fm_sig_mix(h, s->act.cc1[i] > 0.0f);
    for (size_t i = 0; i < r2; i++)
        h = fm_sig_mix(h, s->act.cc2[i] > 0.0f);
    return h;
}
