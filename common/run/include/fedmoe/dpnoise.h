/* dpnoise.h - the Gaussian noise of differential privacy (DP-FedAvg: standard
 * deviation z * C on a sum of updates each clipped to norm C, with
 * fm_clip_to_norm of aggregate.h). Drawn from OpenSSL's cryptographic
 * generator, never from the reproducible training streams (fedmoe/rng.h):
 * noise that could be replayed from a seed would protect nothing. */
#ifndef FEDMOE_DPNOISE_H
#define FEDMOE_DPNOISE_H

#include <stddef.h>

#include "fedmoe/status.h"

/* Adds independent Gaussian noise of standard deviation sd (>= 0) to each of
 * x[0..n). FM_ERR_ARG for a bad sd, FM_ERR_IO when the generator fails (x is
 * then unchanged: no update goes out without its noise). */
fm_status fm_dp_add_noise(float *x, size_t n, double sd);

#endif
