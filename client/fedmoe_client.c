/* fedmoe-client: one client. By default it joins a coordinator (--connect) and
 * trains every round it is given; --standalone trains one partition (or all the
 * data centrally) on its own and prints per-epoch loss and accuracy. */
#include <getopt.h>
#include <signal.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/args.h"
#include "fedmoe/clientdata.h"
#include "fedmoe/kernels.h"
#include "fedmoe/log.h"
#include "fedmoe/model.h"
#include "fedmoe/signals.h"
#include "fedmoe/rng.h"
#include "fedmoe/train.h"
#include "fedmoe/wire.h"
#include "session.h"


static void usage(FILE *f)
{
    fprintf(f,
            "usage: fedmoe-client [--connect ENDPOINT] [--id ID] [options]\n"
            "       fedmoe-client --standalone [options]\n"
            "\n"
            "Joins a fedmoe coordinator and trains every round it is given, until the coordinator\n"
            "says shut down. The coordinator sends the model, training settings and (unless\n"
            "--partition is given) the partition of the data to train.\n"
            "With --standalone, trains on one client's data, or on all the data centrally, with\n"
            "no coordinator, and prints loss and accuracy after every epoch.\n"
            "\n"
            "federated:\n"
            "  --connect ENDPOINT    coordinator (default tcp://127.0.0.1:5555)\n"
            "  --id ID               client id, [A-Za-z0-9._-]{1,63} (default HOST-PID)\n"
            "  --state-dir DIR       keep local state there, to continue after a restart\n"
            "  --connect-timeout S   give up if no welcome within S seconds (default: wait)\n"
            "data:\n"
            "  --dataset SPEC        fmnist (default), fmnist:DIR, idx:IMAGES,LABELS or csv:PATH\n"
            "                        (federated: overrides where the run's data is read from)\n"
            "  --partition I/N       train partition I of N (standalone default: all data;\n"
            "                        federated default: the coordinator assigns one)\n"
            "  --dirichlet ALPHA     Dirichlet label skew for --partition (default 0.3)\n"
            "  --pathological S      S classes per client instead\n"
            "  --iid                 uniform random partition instead\n"
            "  --min-samples N       Dirichlet: at least N examples per client (default 40)\n"
            "model (standalone; a coordinator sends its own):\n"
            "  --stem mlp|cnn        the stem (default mlp)\n"
            "  --specialists S       specialist experts per block (default 2)\n"
            "  --generalists G       generalist experts per block (default 1)\n"
            "  --blocks L            MoE blocks (default 2)\n"
            "  --tau T               logit scale (default 10)\n"
            "  --no-gating           no attention gating (plain local logits)\n"
            "  --gating-on-validation  train the gating in the upper (validation) level\n"
            "training (standalone):\n"
            "  --epochs N            passes over the train split (default 10)\n"
            "  --batch B             batch size (default 32)\n"
            "  --lr LR               expert learning rate (default 1e-3)\n"
            "  --router-lr LR        router learning rate (default 1e-3)\n"
            "  --schedule S          cosine (default) or constant learning rate over the epochs\n"
            "  --expert-steps N      T_e, lower-level steps per cycle (default 30)\n"
            "  --router-steps N      T_r, upper-level steps per cycle (default 10; 0 = none)\n"
            "  --seed N              run seed (default 1)\n"
            "  --threads N           OpenBLAS threads (default 1)\n"
            "  -v, --verbose         debug logging\n"
            "  -h, --help            this text\n");
}

static int fail(void)
{
    fprintf(stderr, "fedmoe-client: %s\n", fm_error_last());
    return 2;
}

int main(int argc, char **argv)
{
    enum {
        O_STANDALONE = 256, O_DATASET, O_PARTITION, O_DIRICHLET, O_PATHO, O_IID, O_MINS, O_STEM, O_SPEC,
        O_GEN, O_BLOCKS, O_TAU, O_NOGATE, O_GATEVAL, O_EPOCHS, O_BATCH, O_LR, O_RLR, O_TE, O_TR, O_SEED,
        O_THREADS, O_SCHED, O_CONNECT, O_ID, O_STATE, O_CTIMEOUT
    };
    static const struct option opts[] = {
        {"standalone", no_argument, 0, O_STANDALONE}, {"dataset", required_argument, 0, O_DATASET},
        {"partition", required_argument, 0, O_PARTITION}, {"dirichlet", required_argument, 0, O_DIRICHLET},
        {"pathological", required_argument, 0, O_PATHO}, {"iid", no_argument, 0, O_IID},
        {"min-samples", required_argument, 0, O_MINS}, {"stem", required_argument, 0, O_STEM},
        {"specialists", required_argument, 0, O_SPEC}, {"generalists", required_argument, 0, O_GEN},
        {"blocks", required_argument, 0, O_BLOCKS}, {"tau", required_argument, 0, O_TAU},
        {"no-gating", no_argument, 0, O_NOGATE}, {"gating-on-validation", no_argument, 0, O_GATEVAL},
        {"epochs", required_argument, 0, O_EPOCHS}, {"batch", required_argument, 0, O_BATCH},
        {"lr", required_argument, 0, O_LR}, {"router-lr", required_argument, 0, O_RLR},
        {"expert-steps", required_argument, 0, O_TE}, {"router-steps", required_argument, 0, O_TR},
        {"seed", required_argument, 0, O_SEED}, {"threads", required_argument, 0, O_THREADS},
        {"schedule", required_argument, 0, O_SCHED}, {"connect", required_argument, 0, O_CONNECT},
        {"id", required_argument, 0, O_ID}, {"state-dir", required_argument, 0, O_STATE},
        {"connect-timeout", required_argument, 0, O_CTIMEOUT},
        {"verbose", no_argument, 0, 'v'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    fm_model_config_t mc;
    fm_train_config_t tc;
    fm_data_spec_t ds;
    fm_model_config_default(&mc);
    fm_train_config_default(&tc);
    fm_data_spec_default(&ds);
    bool standalone = false, cosine = true, dataset_given = false;
    fm_session_config_t sc;
    fm_session_config_default(&sc);
    int epochs = 10, threads = 1, iv;
    double dv;
    unsigned long long seed = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "vh", opts, NULL)) != -1) {
        fm_status st = FM_OK;
        switch (c) {
        case O_STANDALONE: standalone = true; break;
        case O_DATASET:
            ds.dataset = optarg;
            dataset_given = true;
            break;
        case O_CONNECT: snprintf(sc.connect, sizeof sc.connect, "%s", optarg); break;
        case O_ID:
            if (!fm_wire_valid_id(optarg, strlen(optarg))) {
                fm_error_set("--id: '%s' must be 1 to 63 of [A-Za-z0-9._-]", optarg);
                st = FM_ERR_ARG;
            } else {
                snprintf(sc.id, sizeof sc.id, "%s", optarg);
            }
            break;
        case O_STATE: snprintf(sc.state_dir, sizeof sc.state_dir, "%s", optarg); break;
        case O_CTIMEOUT: st = fm_arg_double("--connect-timeout", optarg, 0.0, 1e7, &sc.connect_timeout); break;
        case O_PARTITION: st = fm_arg_fraction("--partition", optarg, 100000, &ds.index, &ds.count); break;
        case O_DIRICHLET:
            st = fm_arg_double("--dirichlet", optarg, 1e-4, 1e4, &ds.part.alpha);
            ds.part.kind = FM_PARTITION_DIRICHLET;
            break;
        case O_PATHO:
            st = fm_arg_int("--pathological", optarg, 1, 256, &ds.part.classes_per_client);
            ds.part.kind = FM_PARTITION_PATHOLOGICAL;
            break;
        case O_IID: ds.part.kind = FM_PARTITION_IID; break;
        case O_MINS:
            st = fm_arg_int("--min-samples", optarg, 0, 1 << 30, &iv);
            ds.part.min_samples = (size_t)iv;
            break;
        case O_STEM: st = fm_stem_parse("--stem", optarg, &mc.stem); break;
        case O_SPEC: st = fm_arg_int("--specialists", optarg, 0, 63, &mc.specialists); break;
        case O_GEN: st = fm_arg_int("--generalists", optarg, 0, 63, &mc.generalists); break;
        case O_BLOCKS: st = fm_arg_int("--blocks", optarg, 0, 64, &mc.blocks); break;
        case O_TAU:
            st = fm_arg_double("--tau", optarg, 1e-3, 1e4, &dv);
            mc.tau = (float)dv;
            break;
        case O_NOGATE: mc.gating = false; break;
        case O_GATEVAL: mc.gating_on_validation = true; break;
        case O_EPOCHS: st = fm_arg_int("--epochs", optarg, 0, 1000000, &epochs); break;
        case O_BATCH: st = fm_arg_int("--batch", optarg, 1, 65536, &tc.batch); break;
        case O_LR:
            st = fm_arg_double("--lr", optarg, 0.0, 10.0, &dv);
            tc.lower.lr = (float)dv;
            break;
        case O_RLR:
            st = fm_arg_double("--router-lr", optarg, 0.0, 10.0, &dv);
            tc.upper.lr = (float)dv;
            break;
        case O_TE: st = fm_arg_int("--expert-steps", optarg, 1, 1 << 30, &tc.expert_steps); break;
        case O_TR: st = fm_arg_int("--router-steps", optarg, 0, 1 << 30, &tc.router_steps); break;
        case O_SEED: st = fm_arg_u64("--seed", optarg, &seed); break;
        case O_THREADS: st = fm_arg_int("--threads", optarg, 1, 256, &threads); break;
        case O_SCHED:
            if (strcmp(optarg, "cosine") == 0 || strcmp(optarg, "constant") == 0)
                cosine = strcmp(optarg, "cosine") == 0;
            else {
                fm_error_set("--schedule: '%s' is not cosine or constant", optarg);
                st = FM_ERR_ARG;
            }
            break;
        case 'v': fm_log_set_level(FM_LOG_DEBUG); break;
        case 'h': usage(stdout); return 0;
        default:
            fm_error_set("unknown or incomplete option '%s' (see --help)", argv[optind - 1]);
            st = FM_ERR_ARG;
        }
        if (st != FM_OK)
            return fail();
    }
    if (optind < argc) {
        fm_error_set("unexpected argument '%s' (see --help)", argv[optind]);
        return fail();
    }
    fm_kernels_set_threads(threads);
    if (!standalone) {
        sc.specialists = mc.specialists;
        if (ds.count) {
            sc.partition_index = ds.index;
            sc.partition_count = ds.count;
        }
        if (dataset_given)
            snprintf(sc.dataset, sizeof sc.dataset, "%s", ds.dataset);
        fm_signals_install();
        if (fm_session_run(&sc, &fm_stop_requested) != FM_OK)
            return fail();
        return 0;
    }
    ds.seed = seed;

    fm_client_data_t data;
    if (fm_client_data_load(&data, &ds) != FM_OK)
        return fail();
    mc.in_dim = data.dim;
    mc.classes = data.classes;
    mc.img_h = data.img_h;
    mc.img_w = data.img_w;
    fm_model_t *m = NULL;
    fm_trainer_t *t = NULL;
    int rc = 0;
    if (fm_model_new(&m, &mc, seed, fm_rng_stream(FM_STREAM_LOCAL, (uint64_t)ds.index)) != FM_OK ||
        fm_trainer_new(&t, m, &tc, seed, fm_rng_stream(FM_STREAM_SHUFFLE, (uint64_t)ds.index)) != FM_OK) {
        rc = fail();
        goto out;
    }
    if (ds.count)
        fm_info("client %d/%d: %zu train, %zu validation, %zu test examples", ds.index, ds.count, data.train.n,
                data.val.n, data.test.n);
    else
        fm_info("centralized: %zu train, %zu validation, %zu test examples", data.train.n, data.val.n, data.test.n);
    printf("%5s %10s %10s %9s %10s %9s %9s %8s\n", "epoch", "train_loss", "val_loss", "val_acc", "test_loss",
           "test_acc", "gen_share", "seconds");
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
        printf("%5d %10.4f %10.4f %8.2f%% %10.4f %8.2f%% %9.3f %8.2f\n", ep, ts.train_loss, vv.loss,
               100.0 * vv.accuracy, ev.loss, 100.0 * ev.accuracy, ev.generalist_share, ts.seconds);
        fflush(stdout);
    }
out:
    fm_trainer_destroy(&t);
    fm_model_destroy(&m);
    fm_client_data_free(&data);
    return rc;
}
