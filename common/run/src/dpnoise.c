/* Gaussian noise from OpenSSL's generator (dpnoise.h): Box-Muller on 53-bit
 * uniforms, drawn a block at a time; all of it drawn before x is touched. */
#include "fedmoe/dpnoise.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <openssl/rand.h>

#include "fedmoe/log.h"

#define BLOCK 4096 /* uniforms drawn a call */

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
    size_t pairs = (n + 1) / 2;
    uint64_t *bits = malloc(sizeof *bits * 2 * pairs);
    if (!bits)
        return FM_ERR_NOMEM;
    for (size_t done = 0; done < 2 * pairs; done += BLOCK) {
        size_t k = 2 * pairs - done < BLOCK ? 2 * pairs - done : BLOCK;
        if (RAND_bytes((unsigned char *)(bits + done), (int)(k * sizeof *bits)) != 1) {
            free(bits);
            fm_error_set("the cryptographic generator failed: no noise drawn");
            return FM_ERR_IO;
        }
    }
    for (size_t p = 0; p < pairs; p++) {
        double r = sqrt(-2.0 * log(uniform(bits[2 * p]))), t = 6.283185307179586 * uniform(bits[2 * p + 1]);
        x[2 * p] += (float)(sd * r * cos(t));
        if (2 * p + 1 < n)
            x[2 * p + 1] += (float)(sd * r * sin(t));
    }
    free(bits);
    return FM_OK;
}
