/* accountant.h - how much privacy a run of the subsampled Gaussian mechanism
 * spends: client-level differential privacy (DP-FedAvg, McMahan et al. 2018),
 * where each round samples clients at rate q, clips each update to norm C and
 * adds Gaussian noise of standard deviation z * C to the sum.
 *
 * The accountant keeps the Rényi DP of the rounds so far at a fixed set of
 * orders (RDP composes by addition), from the exact expression for the
 * sampled Gaussian mechanism (Mironov, Talwar and Zhang 2019: the binomial
 * sum at integer orders, its two-sided series at fractional ones), and turns
 * it into (epsilon, delta) with the conversion of Balle et al. 2020 (the one
 * TensorFlow Privacy and Opacus use), taking the best order. */
#ifndef FEDMOE_ACCOUNTANT_H
#define FEDMOE_ACCOUNTANT_H

#include <stdint.h>

#include "fedmoe/status.h"

#define FM_RDP_ORDERS 44

typedef struct {
    double rdp[FM_RDP_ORDERS]; /* the Rényi DP at each of fm_rdp_orders(), summed over rounds */
} fm_accountant_t;

/* The orders the accountant tracks (FM_RDP_ORDERS of them, 1.25 to 512). */
const double *fm_rdp_orders(void);
/* The Rényi DP of one step of the Gaussian mechanism with noise multiplier z
 * on a sample taken with probability q, at order alpha > 1: +inf where it is
 * unbounded (z = 0 with q > 0); 0 for q = 0. */
double fm_rdp_sampled_gaussian(double q, double z, double alpha);
/* The (epsilon, delta) conversion of the RDP values rdp[i] at orders[i]: the
 * smallest epsilon over the orders (and that order into *order when given). */
double fm_rdp_epsilon(const double *orders, const double *rdp, int n, double delta, double *order);

void fm_accountant_init(fm_accountant_t *a);
/* `steps` more rounds at sampling rate q (0..1) and noise multiplier z (>= 0).
 * FM_ERR_ARG for values outside those ranges. */
fm_status fm_accountant_add(fm_accountant_t *a, double q, double z, uint64_t steps);
/* The epsilon spent so far at delta (0 < delta < 1). */
double fm_accountant_epsilon(const fm_accountant_t *a, double delta);
/* The least noise multiplier (to 1e-6 relative) whose `steps` steps at rate q
 * spend at most epsilon at delta; 0 when epsilon <= 0, steps is 0 or no noise
 * up to 2^30 is enough. */
double fm_accountant_noise_for(double q, uint64_t steps, double epsilon, double delta);

#endif
