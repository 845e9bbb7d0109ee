/* dp.h - client-level differential privacy (DP-FedAvg, McMahan et al. 2018):
 * the run's settings and the Gaussian noise.
 *
 * Each client's update (its distance from the state it was sent, the model
 * and the global prompt together) is clipped to L2 norm C; the coordinator
 * sums the clipped updates with equal weights, counts the selected clients
 * that sent nothing as unchanged (a fixed denominator: the round's selected
 * clients), adds Gaussian noise of standard deviation z C to the sum and
 * divides. The accountant (fedmoe/accountant.h) turns z, the sampling rate
 * and the rounds into (epsilon, delta). In distributed mode (with secure
 * aggregation) the clients clip their own updates and each adds its share of
 * the noise before masking: fm_dp_client_sd. The noise is drawn from OpenSSL's
 * cryptographic generator, never from the reproducible training streams
 * (fedmoe/rng.h): noise that could be replayed from a seed would protect
 * nothing. */
#ifndef FEDMOE_DP_H
#define FEDMOE_DP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fedmoe/status.h"

typedef enum {
    FM_DP_CENTRAL = 0, /* the coordinator adds the noise to the sum */
    FM_DP_DISTRIBUTED, /* each client adds its share before masking (needs secure aggregation) */
} fm_dp_mode;

typedef struct {
    double noise;    /* z, the noise multiplier (--dp-noise); 0: no differential privacy;
                      * FM_DP_NOISE_AUTO: chosen from the budget */
    double clip;     /* C, the bound on each client's update (--dp-clip) */
    double delta;    /* the delta of (epsilon, delta) (--dp-delta, 1e-5) */
    fm_dp_mode mode; /* --dp-mode */
    double budget;   /* --dp-epsilon-budget: the run stops before a round that would pass it; 0: none */
} fm_dp_spec_t;

#define FM_DP_DELTA 1e-5
/* noise: the least that spends the budget over the run's rounds (the
 * coordinator sets it at the start: fm_accountant_noise_for) */
#define FM_DP_NOISE_AUTO (-1.0)

/* Off (noise 0), delta FM_DP_DELTA, central, no budget. */
void fm_dp_spec_default(fm_dp_spec_t *s);
static inline bool fm_dp_on(const fm_dp_spec_t *s) { return s->noise > 0.0 || s->noise == FM_DP_NOISE_AUTO; }
/* --dp-noise as given: a number, or "auto"; and the inverse. */
fm_status fm_dp_noise_parse(const char *flag, const char *text, double *out);
void fm_dp_noise_name(double noise, char *buf, size_t cap);
/* Checks the settings among themselves; FM_ERR_ARG with a reason naming the flags. */
fm_status fm_dp_spec_check(const fm_dp_spec_t *s);
/* "central" or "distributed", and the inverse (FM_ERR_ARG with a reason naming flag). */
const char *fm_dp_mode_name(fm_dp_mode m);
fm_status fm_dp_mode_parse(const char *flag, const char *name, fm_dp_mode *out);

/* Distributed mode: the standard deviation of the noise each client of a
 * round with threshold t adds to each value, z C / sqrt(t). The coordinator
 * sums k >= t of them (a round with fewer is abandoned), so the sum carries
 * noise of standard deviation z C sqrt(k / t) >= z C: at least the central
 * mode's, whoever drops, and at most sqrt(n / t) of it (about 1.4 at a
 * majority threshold) when nobody does. */
double fm_dp_client_sd(double noise, double clip, uint32_t t);

/* Adds independent Gaussian noise of standard deviation sd (>= 0) to each of
 * x[0..n), a block at a time (memory: one block). FM_ERR_ARG for a bad sd;
 * FM_ERR_IO when the generator fails, x then partly noised: the caller must
 * not release it (the coordinator stops). */
fm_status fm_dp_add_noise(float *x, size_t n, double sd);

#endif
