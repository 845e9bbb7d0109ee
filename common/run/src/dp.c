/* dp.c - differential privacy's settings and its Gaussian noise (dp.h): the
 * noise from OpenSSL's generator, Box-Muller on 53-bit uniforms drawn and
 * added a block at a time. */
#include "fedmoe/dp.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "fedmoe/args.h"
#include "fedmoe/log.h"

#define BLOCK 4096 /* uniforms drawn a call */

void fm_dp_spec_default(fm_dp_spec_t *s)
{
    memset(s, 0, sizeof *s);
    s->delta = FM_DP_DELTA;
    s->mode = FM_DP_CENTRAL;
}

FM_ARG_ENUM_NAMES(fm_dp_mode, fm_dp_mode_name, fm_dp_mode_parse, "central", "distributed")

fm_status fm_dp_noise_parse(const char *flag, const char *text, double *out)
{
    if (strcmp(text, "auto") == 0) {
        *out = FM_DP_NOISE_AUTO;
        return FM_OK;
    }
    if (fm_arg_double(flag, text, 0.0, 1e6, out) == FM_OK)
        return FM_OK;
    fm_error_set("%s: '%s' is not auto or a number in 0..1e6", flag, text);
    return FM_ERR_ARG;
}

void fm_dp_noise_name(double noise, char *buf, size_t cap)
{
    if (noise == FM_DP_NOISE_AUTO)
        snprintf(buf, cap, "auto");
    else
        snprintf(buf, cap, "%.17g", noise);
}

fm_status fm_dp_spec_check(const fm_dp_spec_t *s)
{
    const char *why = NULL;
    if (!(s->noise >= 0.0 && s->noise <= 1e6) && s->noise != FM_DP_NOISE_AUTO)
        why = "--dp-noise must be auto or in 0..1e6 (0: off)";
    else if (s->noise == FM_DP_NOISE_AUTO && !(s->budget > 0.0))
        why = "--dp-noise auto needs --dp-epsilon-budget E: it picks the least noise that spends E over the "
              "run's rounds";
    else if (!(s->clip >= 0.0 && s->clip <= 1e9))
        why = "--dp-clip must be in 0..1e9";
    else if (!(s->delta > 0.0 && s->delta < 1.0))
        why = "--dp-delta must be in (0, 1) (1e-5 by default; below 1 / the number of clients)";
    else if (!(s->budget >= 0.0 && s->budget <= 1e6))
        why = "--dp-epsilon-budget must be in 0..1e6 (0: none)";
    else if (fm_dp_on(s) && s->clip == 0.0)
        why = "--dp-noise needs --dp-clip C, the bound on each client's update the noise is scaled to";
    else if (!fm_dp_on(s) && s->clip > 0.0)
        why = "--dp-clip bounds updates for --dp-noise; without noise it gives no privacy (to bound updates alone, "
              "--clip-norm)";
    else if (!fm_dp_on(s) && s->budget > 0.0)
        why = "--dp-epsilon-budget needs --dp-noise (without noise no epsilon is spent, or bounded)";
    if (why) {
        fm_error_set("%s", why);
        return FM_ERR_ARG;
    }
    return FM_OK;
}

double fm_dp_client_sd(double noise, double clip, uint32_t t)
{
    return t > 0 ? noise * clip / sqrt((double)t) : noise * clip;
}

/* A uniform in (0, 1] from 53 random bits. */
static double uniform(uint64_t bits) { return ((double)(bits >> 11) + 1.0) * 0x1.0p-53; }

fm_status fm_dp_add_noise(float *x, size_t n, double sd)
{
    if (!(sd >= 0.0) || isinf(sd)) {
        fm_error_set("noise standard deviation %g: must be finite and >= 0", sd);
        return FM_ERR_ARG;
    }
    if (sd == 0.0 || n == 0)
        return FM_OK;
    uint64_t bits[BLOCK]; /* the uniforms of BLOCK values: memory stays one block */
    for (size_t at = 0; at < n; at += BLOCK) {
        size_t k = n - at < BLOCK ? n - at : BLOCK, pairs = (k + 1) / 2;
        if (RAND_bytes((unsigned char *)bits, (int)(2 * pairs * sizeof *bits)) != 1) {
            fm_error_set("the cryptographic generator failed: the noise is incomplete");
            return FM_ERR_IO;
        }
        float *y = x + at;
        for (size_t p = 0; p < pairs; p++) {
            double r = sqrt(-2.0 * log(uniform(bits[2 * p]))), t = 6.283185307179586 * uniform(bits[2 * p + 1]);
            y[2 * p] += (float)(sd * r * cos(t));
            if (2 * p + 1 < k)
                y[2 * p + 1] += (float)(sd * r * sin(t));
        }
    }
    OPENSSL_cleanse(bits, sizeof bits);
    return FM_OK;
}
