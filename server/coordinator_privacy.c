/* coordinator_privacy.c - client-level differential privacy in the
 * coordinator (DP-FedAvg, McMahan et al. 2018; --dp-noise, docs/security.md).
 *
 * A round's released result is
 *     global + (sum over the clients that answered of clip_C(x_i - global)
 *               + N(0, (z C)^2 I)) / m
 * with m the round's selected clients, fixed when the round opened: one
 * client's data moves the sum by at most C whatever the others do, and the
 * noise's standard deviation is z times that. The aggregator's exact mean
 * computes it: each update added with weight 1, the clients that sent
 * nothing as the unchanged state with weight m - answered. The sampling is
 * not secret (the selection follows the run's seed), so the accountant takes
 * no amplification from it: q = 1 every round.
 *
 * Distributed (--dp-mode distributed, under secure aggregation): each client
 * clips its own update and adds its share of the noise before masking
 * (fm_dp_client_sd); the coordinator unmasks the sum of the k clients that
 * sent masked inputs, each with weight 1 (fm_coord_sa_setup), pads it with
 * the unchanged state for the m - k others and adds no noise of its own. */
#include <math.h>

#include "coordinator_internal.h"
#include "fedmoe/accountant.h"
#include "fedmoe/dp.h"

fm_status fm_coord_dp_start(fm_coordinator_t *c)
{
    fm_dp_spec_t *dp = &c->spec.dp;
    if (dp->noise == FM_DP_NOISE_AUTO) {
        dp->noise = fm_accountant_noise_for(1.0, (uint64_t)c->cfg.rounds, dp->budget, dp->delta);
        if (!(dp->noise > 0.0)) { /* (never run without the noise asked for) */
            fm_error_set("--dp-noise auto: no noise multiplier keeps %d rounds within epsilon %g at delta %g; "
                         "give a larger --dp-epsilon-budget or --dp-delta",
                         c->cfg.rounds, dp->budget, dp->delta);
            return FM_ERR_ARG;
        }
        fm_info("--dp-noise auto: noise multiplier %.6g spends epsilon %.4g (delta %g) over the %d rounds", dp->noise,
                fm_coord_dp_epsilon(c, c->cfg.rounds), dp->delta, c->cfg.rounds);
    }
    if (fm_dp_on(dp) && dp->budget > 0.0 && fm_coord_dp_epsilon(c, 1) > dp->budget) {
        fm_error_set("--dp-noise %g spends epsilon %.4g in its first round, more than --dp-epsilon-budget %g: "
                     "no round could run",
                     dp->noise, fm_coord_dp_epsilon(c, 1), dp->budget);
        return FM_ERR_ARG;
    }
    return FM_OK;
}

uint64_t fm_coord_dp_clip(fm_coordinator_t *c, fm_participant_t *p, float *model, float *prompt)
{
    fm_exchange_t e = fm_exchange_of(&c->spec);
    double C = c->spec.dp.clip;
    p->norm[0] = e.model ? fm_distance(model, c->global, c->dims.nmodel) : 0.0;
    p->norm[1] = e.prompt ? fm_distance(prompt, c->gprompt, c->dims.nprompt) : 0.0;
    double norm = sqrt(p->norm[0] * p->norm[0] + p->norm[1] * p->norm[1]);
    if (norm > C) { /* both groups scaled by one factor: the joint distance becomes C */
        if (e.model)
            fm_scale_toward(model, c->global, c->dims.nmodel, C / norm);
        if (e.prompt)
            fm_scale_toward(prompt, c->gprompt, c->dims.nprompt, C / norm);
        c->clipped++;
    }
    return 1;
}

fm_status fm_coord_dp_pad(fm_coordinator_t *c)
{
    fm_exchange_t e = fm_exchange_of(&c->spec);
    int answered = fm_round_count(&c->round, FM_PART_COMPLETED), missing = c->round.nparts - answered;
    if (missing <= 0)
        return FM_OK;
    fm_status st = FM_OK;
    if (e.model)
        st = fm_aggregator_add(c->agg_model, c->global, (uint64_t)missing);
    if (st == FM_OK && e.prompt)
        st = fm_aggregator_add(c->agg_prompt, c->gprompt, (uint64_t)missing);
    return st;
}

fm_status fm_coord_dp_noise(fm_coordinator_t *c)
{
    if (c->spec.dp.mode == FM_DP_DISTRIBUTED) /* (the clients added theirs before masking) */
        return FM_OK;
    fm_exchange_t e = fm_exchange_of(&c->spec);
    double sd = c->spec.dp.noise * c->spec.dp.clip / c->round.nparts;
    fm_status st = FM_OK;
    if (e.model)
        st = fm_dp_add_noise(c->global, c->dims.nmodel, sd);
    if (st == FM_OK && e.prompt)
        st = fm_dp_add_noise(c->gprompt, c->dims.nprompt, sd);
    return st;
}

double fm_coord_dp_epsilon(const fm_coordinator_t *c, int rounds)
{
    if (!fm_dp_on(&c->spec.dp))
        return NAN;
    fm_accountant_t a;
    fm_accountant_init(&a);
    if (rounds > 0 && fm_accountant_add(&a, 1.0, c->spec.dp.noise, (uint64_t)rounds) != FM_OK)
        return INFINITY;
    return fm_accountant_epsilon(&a, c->spec.dp.delta);
}
