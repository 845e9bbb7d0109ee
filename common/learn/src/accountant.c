/* The Rényi DP accountant (accountant.h). Everything in log space: the sums
 * reach exp(alpha^2 / z^2) long before their logarithm is large. */
#include "fedmoe/accountant.h"

#include <math.h>
#include <stddef.h>

#include "fedmoe/log.h"

static const double orders[FM_RDP_ORDERS] = {
    1.25, 1.5, 1.75, 2,  2.25, 2.5, 3,  3.5, 4,  4.5, 5,  6,  7,   8,   9,   10,  11,  12,  13,  14,  16,  18,
    20,   22,  24,   28, 32,   40,  48, 56,  64, 80,  96, 112, 128, 160, 192, 224, 256, 320, 384, 416, 448, 512};

const double *fm_rdp_orders(void) { return orders; }

/* log(e^a + e^b) and log(e^a - e^b) (a >= b), with -inf for log 0. */
static double log_add(double a, double b)
{
    if (a == -INFINITY)
        return b;
    if (b == -INFINITY)
        return a;
    double hi = a > b ? a : b, lo = a > b ? b : a;
    return hi + log1p(exp(lo - hi));
}

static double log_sub(double a, double b)
{
    if (b == -INFINITY)
        return a;
    if (a <= b)
        return -INFINITY; /* (rounding: the exact difference is >= 0) */
    return a + log1p(-exp(b - a));
}

/* log |binomial(alpha, i)| for real alpha, integer i >= 0. */
static double log_abs_binom(double alpha, double i)
{
    return lgamma(alpha + 1.0) - lgamma(i + 1.0) - lgamma(alpha - i + 1.0);
}

/* log A_alpha at an integer order: the binomial sum
 * sum_k C(alpha, k) (1-q)^(alpha-k) q^k exp((k^2 - k) / (2 z^2)). */
static double log_a_int(double q, double z, int alpha)
{
    double s = -INFINITY;
    for (int k = 0; k <= alpha; k++)
        s = log_add(s, log_abs_binom(alpha, k) + k * log(q) + (alpha - k) * log1p(-q) + (double)k * (k - 1) / (2 * z * z));
    return s;
}

/* log A_alpha at a fractional order: the two series of Mironov, Talwar and
 * Zhang (2019, section 3.3), summed until their terms are negligible. */
static double log_a_frac(double q, double z, double alpha)
{
    double a0 = -INFINITY, a1 = -INFINITY;
    double z0 = z * z * log(1.0 / q - 1.0) + 0.5;
    for (int i = 0; i < 100000; i++) {
        double j = alpha - i;
        double coef = log_abs_binom(alpha, i);
        /* binomial(alpha, i) is negative for every other i past ceil(alpha) */
        int negative = i > (int)ceil(alpha) && (i - (int)ceil(alpha)) % 2 == 1;
        double t0 = coef + i * log(q) + j * log1p(-q);
        double t1 = coef + j * log(q) + i * log1p(-q);
        double e0 = log(0.5) + log(erfc((i - z0) / (1.4142135623730951 * z)));
        double e1 = log(0.5) + log(erfc((z0 - j) / (1.4142135623730951 * z)));
        double s0 = t0 + (i * (double)i - i) / (2 * z * z) + e0;
        double s1 = t1 + (j * j - j) / (2 * z * z) + e1;
        if (negative) {
            a0 = log_sub(a0, s0);
            a1 = log_sub(a1, s1);
        } else {
            a0 = log_add(a0, s0);
            a1 = log_add(a1, s1);
        }
        if ((s0 > s1 ? s0 : s1) < -30.0)
            break;
    }
    return log_add(a0, a1);
}

double fm_rdp_sampled_gaussian(double q, double z, double alpha)
{
    if (q <= 0.0)
        return 0.0;
    if (z <= 0.0)
        return INFINITY;
    if (q >= 1.0)
        return alpha / (2 * z * z);
    if (isinf(alpha))
        return INFINITY;
    double log_a = alpha == floor(alpha) ? log_a_int(q, z, (int)alpha) : log_a_frac(q, z, alpha);
    return log_a / (alpha - 1.0);
}

double fm_rdp_epsilon(const double *ord, const double *rdp, int n, double delta, double *order)
{
    double best = INFINITY, at = 0.0;
    for (int i = 0; i < n; i++) {
        double a = ord[i], r = rdp[i], eps;
        if (delta * delta + expm1(-r) >= 0.0)
            eps = 0.0; /* (this little RDP gives delta outright) */
        else if (a > 1.01)
            eps = r + log1p(-1.0 / a) - log(delta * a) / (a - 1.0);
        else
            eps = INFINITY;
        if (eps < best) {
            best = eps;
            at = a;
        }
    }
    if (order)
        *order = at;
    return best > 0.0 ? best : 0.0;
}

void fm_accountant_init(fm_accountant_t *a)
{
    for (int i = 0; i < FM_RDP_ORDERS; i++)
        a->rdp[i] = 0.0;
}

fm_status fm_accountant_add(fm_accountant_t *a, double q, double z, uint64_t steps)
{
    if (!(q >= 0.0 && q <= 1.0) || !(z >= 0.0) || isinf(z)) {
        fm_error_set("privacy accountant: sampling rate %g (0..1) or noise multiplier %g (>= 0) out of range", q, z);
        return FM_ERR_ARG;
    }
    for (int i = 0; i < FM_RDP_ORDERS; i++)
        a->rdp[i] += (double)steps * fm_rdp_sampled_gaussian(q, z, orders[i]);
    return FM_OK;
}

double fm_accountant_epsilon(const fm_accountant_t *a, double delta)
{
    return fm_rdp_epsilon(orders, a->rdp, FM_RDP_ORDERS, delta, NULL);
}

double fm_accountant_noise_for(double q, uint64_t steps, double epsilon, double delta)
{
    if (!(epsilon > 0.0) || steps == 0)
        return 0.0;
    double lo = 0.0, hi = 1.0;
    for (;;) { /* doubling until hi is enough (at most 2^30: a noise no run needs) */
        fm_accountant_t a;
        fm_accountant_init(&a);
        if (fm_accountant_add(&a, q, hi, steps) == FM_OK && fm_accountant_epsilon(&a, delta) <= epsilon)
            break;
        lo = hi;
        if ((hi *= 2.0) > 1073741824.0)
            return 0.0;
    }
    while (hi - lo > 1e-6 * hi) { /* bisection: hi always enough */
        double mid = 0.5 * (lo + hi);
        fm_accountant_t a;
        fm_accountant_init(&a);
        if (fm_accountant_add(&a, q, mid, steps) == FM_OK && fm_accountant_epsilon(&a, delta) <= epsilon)
            hi = mid;
        else
            lo = mid;
    }
    return hi;
}
