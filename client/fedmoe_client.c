/* fedmoe-client: one client. By default it joins a coordinator (--connect) and
 * trains every round it is given; --standalone trains one partition (or all the
 * data centrally) on its own and prints per-epoch loss and accuracy. */
#include <signal.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/clientdata.h"
#include "fedmoe/kernels.h"
#include "fedmoe/log.h"
#include "fedmoe/model.h"
#include "fedmoe/options.h"
#include "fedmoe/keys.h"
#include "fedmoe/runspec.h"
#include "fedmoe/signals.h"
#include "fedmoe/rng.h"
#include "fedmoe/train.h"
#include "fedmoe/wire.h"
#include "session.h"
#include "host.h"

/* The options' defaults: the run spec's model and training settings, the
 * session's endpoint and id. Standalone training has no anchor. */
static void defaults(fm_options_t *o, struct fm_run_spec *spec)
{
    fm_session_config_t sc;
    fm_session_config_default(&sc);
    fm_options_default(o, FM_PROG_CLIENT, spec);
    spec->train.anchor = 0.0f;
    snprintf(o->connect, sizeof o->connect, "%s", sc.connect);
    snprintf(o->id, sizeof o->id, "%s", sc.id);
}

static const char *const titles[FM_OPT_GROUPS] = {
    [FM_OPT_G_FEDERATED] = "federated:",
    [FM_OPT_G_DATA] = "data:",
    [FM_OPT_G_MODEL] = "model (standalone; a coordinator sends its own):",
    [FM_OPT_G_TRAIN] = "training (standalone):",
};

static const fm_program_t program = {
    "fedmoe-client",
    "usage: fedmoe-client [--connect ENDPOINT] [--id ID] [options]\n"
    "       fedmoe-client --standalone [options]\n"
    "\n"
    "Joins a fedmoe coordinator and trains every round it is given, until the run is\n"
    "finished (a coordinator that stops or restarts mid-run is waited for; --connect-timeout\n"
    "bounds the wait) or the coordinator says shut down. The coordinator sends the model, training settings and (unless\n"
    "--partition is given) the partition of the data to train; --dataset overrides where\n"
    "the run's data is read from.\n"
    "With --standalone, trains on one client's data, or on all the data centrally, with\n"
    "no coordinator, and prints loss and accuracy after every epoch.\n"
    "\n",
    titles,
    defaults,
};

static int fail(void)
{
    fprintf(stderr, "fedmoe-client: %s\n", fm_error_last());
    return 2;
}

/* Joins the coordinator with the session settings of o. */
static int federated(const fm_options_t *o)
{
    fm_session_config_t sc;
    fm_session_config_default(&sc);
    snprintf(sc.connect, sizeof sc.connect, "%s", o->connect);
    snprintf(sc.id, sizeof sc.id, "%s", o->id);
    snprintf(sc.state_dir, sizeof sc.state_dir, "%s", o->state_dir);
    sc.connect_timeout = o->connect_timeout;
    snprintf(sc.key, sizeof sc.key, "%s", o->key);
    snprintf(sc.server_key, sizeof sc.server_key, "%s", o->server_key);
    sc.insecure = o->insecure;
    if (o->virtual_clients > 0 && !o->insecure && !o->keys[0]) {
        fm_error_set("--virtual needs --keys DIR with the clients' key pairs (ID-NNNNN.key), or --insecure");
        return fail();
    }
    if (o->key[0] && !o->insecure && o->virtual_clients == 0) { /* the id is the key's */
        fm_key_t k;
        if (fm_key_read(o->key, true, &k) != FM_OK)
            return fail();
        if (fm_options_given(o, "id") && strcmp(o->id, k.id) != 0) {
            fm_error_set("--id %s, but the key %s belongs to %s", o->id, o->key, k.id);
            return fail();
        }
        snprintf(sc.id, sizeof sc.id, "%s", k.id);
    }
    sc.specialists = o->spec->model.specialists;
    if (o->partition_count) {
        sc.partition_index = o->partition_index;
        sc.partition_count = o->partition_count;
    }
    if (fm_options_given(o, "dataset"))
        snprintf(sc.dataset, sizeof sc.dataset, "%s", o->spec->dataset);
    fm_signals_install();
    fm_host_config_t hc = {.clients = o->virtual_clients, .workers = o->workers,
                           .first_partition = o->partition_count ? o->partition_index : -1};
    if (o->virtual_clients > 0) {
        snprintf(hc.keys, sizeof hc.keys, "%s", o->keys);
        if (o->partition_count && o->partition_index + o->virtual_clients > o->partition_count) {
            fm_error_set("--virtual %d from --partition %d/%d: past the last partition", o->virtual_clients,
                         o->partition_index, o->partition_count);
            return fail();
        }
        sc.spill = true; /* (with --state-dir) */
    }
    return fm_host_run(&sc, &hc, &fm_stop_requested) == FM_OK ? 0 : fail();
}

int main(int argc, char **argv)
{
    fm_run_spec_t spec;
    static fm_options_t o;
    defaults(&o, &spec);
    int rc = fm_options_main(&o, argc, argv, &program);
    if (rc >= 0)
        return rc;
    fm_kernels_set_threads(o.threads);
    if (!o.standalone)
        return federated(&o);
    fm_model_config_t mc = spec.model;
    fm_train_config_t tc = spec.train;
    tc.local_steps = 0; /* (standalone: --epochs passes) */
    fm_data_spec_t ds;
    fm_data_spec_default(&ds);
    ds.dataset = spec.dataset;
    ds.part = spec.part;
    if (o.partition_count) {
        ds.index = o.partition_index;
        ds.count = o.partition_count;
    }
    ds.seed = fm_run_spec_data_seed(&spec);
    ds.context = mc.context;
    ds.regime = spec.regime;
    if (fm_regime_check(&ds.regime, mc.family == FM_FAMILY_TEXT) != FM_OK)
        return fail();
    const uint64_t seed = spec.seed;
    const int epochs = o.epochs;
    const bool cosine = spec.lr_schedule == FM_LR_COSINE;

    fm_client_data_t data;
    if (fm_client_data_load(&data, &ds) != FM_OK)
        return fail();
    const bool text = mc.family == FM_FAMILY_TEXT;
    if (!text) {
        mc.in_dim = data.dim;
        mc.classes = data.classes;
        mc.img_h = data.img_h;
        mc.img_w = data.img_w;
    }
    if (fm_model_config_accepts(&mc, &data.train, "data") != FM_OK) {
        fm_client_data_free(&data);
        return fail();
    }
    fm_model_t *m = NULL;
    fm_trainer_t *t = NULL;
    rc = 0;
    if (fm_model_new(&m, &mc, seed, fm_rng_stream(FM_STREAM_LOCAL, (uint64_t)ds.index)) != FM_OK ||
        fm_trainer_new(&t, m, &tc, seed, fm_rng_stream(FM_STREAM_SHUFFLE, (uint64_t)ds.index)) != FM_OK) {
        rc = fail();
        goto out;
    }
    if (ds.count)
        fm_info("client %d/%d: %zu train, %zu validation, %zu test %s", ds.index, ds.count, data.train.n,
                data.val.n, data.test.n, text ? "windows" : "examples");
    else
        fm_info("centralized: %zu train, %zu validation, %zu test %s", data.train.n, data.val.n, data.test.n,
                text ? "windows" : "examples");
    /* text: losses in bits per byte, accuracy of the next byte */
    const double unit = text ? 1.0 / log(2.0) : 1.0;
    printf("%5s %10s %10s %9s %10s %9s %9s %8s\n", "epoch", text ? "train_bpb" : "train_loss",
           text ? "val_bpb" : "val_loss", "val_acc", text ? "test_bpb" : "test_loss", "test_acc", "gen_share",
           "seconds");
    for (int ep = 1; ep <= epochs; ep++) {
        fm_train_stats_t ts;
        fm_eval_t ev, vv;
        if (cosine)
            fm_trainer_set_lr_scale(t, fm_lr_cosine(ep, epochs, 0.0f));
        if (fm_trainer_run(t, &data.train, &data.val, 1, &ts) != FM_OK || fm_evaluate(m, &data.val, &vv) != FM_OK ||
            fm_evaluate(m, &data.test, &ev) != FM_OK) {
            rc = fail();
            goto out;
        }
        printf("%5d %10.4f %10.4f %8.2f%% %10.4f %8.2f%% %9.3f %8.2f\n", ep, ts.train_loss * unit, vv.loss * unit,
               100.0 * vv.accuracy, ev.loss * unit, 100.0 * ev.accuracy, ev.generalist_share, ts.seconds);
        fflush(stdout);
    }
out:
    fm_trainer_destroy(&t);
    fm_model_destroy(&m);
    fm_client_data_free(&data);
    return rc;
}
