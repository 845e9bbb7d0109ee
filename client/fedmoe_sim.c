/* fedmoe-sim: the main job on one machine. Starts a coordinator and N client
 * processes on loopback, prints one line per committed round (read from the
 * round log, which the coordinator writes), and ends with a summary table. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fedmoe/args.h"
#include "fedmoe/clock.h"
#include "fedmoe/log.h"
#include "fedmoe/runspec.h"
#include "fedmoe/signals.h"
#include "fedmoe/store.h"

extern char **environ;


static void usage(FILE *f)
{
    fprintf(f,
            "usage: fedmoe-sim [options]\n"
            "\n"
            "Runs a federated training job on this machine: a fedmoe-server and N fedmoe-client\n"
            "processes on loopback, Fashion-MNIST split over the clients. Prints one line per round\n"
            "and a summary; the round log stays in the database for fedmoe-history.\n"
            "\n"
            "  --clients N           clients (default 10)\n"
            "  --rounds R            rounds (default 20)\n"
            "  --strategy S          local, fedavg, comigs, pfedmoap or full (default full)\n"
            "  --dirichlet ALPHA     Dirichlet label skew (default 0.3)\n"
            "  --pathological S      S classes per client instead\n"
            "  --iid                 uniform partition instead\n"
            "  --holdout             tuning run: accuracy on a held-out part of the clients' train\n"
            "                        and validation data, never on their test split\n"
            "  --fraction F          fraction of clients per round (default 1)\n"
            "  --db PATH             round log (default fedmoe-sim.db; every sim adds a new run)\n"
            "  --seed N              run seed (default 1)\n"
            "  --stem mlp|cnn        (default mlp)\n"
            "  --generalists G       shared experts per block (default 1)\n"
            "  --specialists S       specialists per client (default 2)\n"
            "  --local-epochs N      passes over a client's train split per round (default 1)\n"
            "  --lr-schedule S       constant, or cosine over the rounds (default cosine)\n"
            "  --tau T               logit scale of the prompt head (default 10)\n"
            "  --batch B             clients' batch size (default 32)\n"
            "  --weight-decay W      AdamW weight decay of the experts' matrices (default 1e-4)\n"
            "  --anchor A            pull of local specialists toward the generalist, per unit lr\n"
            "                        (local, comigs, full; default 20)\n"
            "  --dataset SPEC        fmnist (default), fmnist:DIR, idx:IMAGES,LABELS or csv:PATH\n"
            "  --round-timeout S     seconds a round waits for updates (default 600)\n"
            "  --port P              loopback port of the coordinator (default: a free one)\n"
            "  --workdir DIR         logs and client state (default: a new folder in /tmp)\n"
            "  -h, --help            this text\n");
}

/* The sibling program `name`: next to this one, or in ../server, ../client. */
static int find_program(const char *name, char *out, size_t cap)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return -1;
    self[n] = 0;
    char *dir = dirname(self);
    const char *subs[] = {"", "/../server", "/../client", "/../bin"};
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) {
        snprintf(out, cap, "%s%s/%s", dir, subs[i], name);
        if (access(out, X_OK) == 0)
            return 0;
    }
    return -1;
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static pid_t spawn(char *const argv[], const char *log)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
        fm_error_set("cannot start %s: %s", argv[0], strerror(rc));
        return -1;
    }
    return pid;
}

static void tail_file(const char *path, int lines)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    char buf[64][512];
    int n = 0;
    while (fgets(buf[n % 64], sizeof buf[0], f))
        n++;
    fclose(f);
    int from = n > lines ? n - lines : 0;
    for (int i = from; i < n; i++)
        fprintf(stderr, "  | %s", buf[i % 64]);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"clients", required_argument, 0, 'n'},      {"rounds", required_argument, 0, 'r'},
        {"strategy", required_argument, 0, 's'},     {"dirichlet", required_argument, 0, 'a'},
        {"pathological", required_argument, 0, 'p'}, {"iid", no_argument, 0, 'i'},
        {"fraction", required_argument, 0, 'f'},     {"db", required_argument, 0, 'd'},
        {"seed", required_argument, 0, 'S'},         {"stem", required_argument, 0, 'm'},
        {"specialists", required_argument, 0, 'x'},  {"local-epochs", required_argument, 0, 'e'},
        {"dataset", required_argument, 0, 'D'},      {"round-timeout", required_argument, 0, 't'},
        {"port", required_argument, 0, 'P'},         {"workdir", required_argument, 0, 'w'},
        {"lr-schedule", required_argument, 0, 'L'},  {"tau", required_argument, 0, 'T'},
        {"batch", required_argument, 0, 'B'},        {"weight-decay", required_argument, 0, 'W'},
        {"anchor", required_argument, 0, 'A'},       {"holdout", no_argument, 0, 'H'},       {"generalists", required_argument, 0, 'G'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    int clients = 10, rounds = 20, port = 0, specialists = 2, iv;
    double dv;
    unsigned long long uv, seed = 1;
    const char *db = "fedmoe-sim.db", *workdir = NULL;
    /* server arguments passed through, validated here first for one clear line */
    char *pass[64];
    int npass = 0;
    char partition_desc[64] = "Dirichlet 0.3";
    bool holdout = false; /* accuracies are then on the held-out part, not on test */
    opterr = 0;
    int c, idx = 0;
    while ((c = getopt_long(argc, argv, "h", opts, &idx)) != -1) {
        fm_status st = FM_OK;
        switch (c) {
        case 'n': st = fm_arg_int("--clients", optarg, 1, 1000, &clients); break;
        case 'r': st = fm_arg_int("--rounds", optarg, 1, 1000000, &rounds); break;
        case 'a':
            st = fm_arg_double("--dirichlet", optarg, 1e-4, 1e4, &dv);
            snprintf(partition_desc, sizeof partition_desc, "Dirichlet %g", dv);
            break;
        case 'p':
            st = fm_arg_int("--pathological", optarg, 1, 256, &iv);
            snprintf(partition_desc, sizeof partition_desc, "pathological %d", iv);
            break;
        case 'i': snprintf(partition_desc, sizeof partition_desc, "IID"); break;
        case 'H': holdout = true; break;
        case 'f': st = fm_arg_double("--fraction", optarg, 1e-6, 1.0, &dv); break;
        case 'S':
            st = fm_arg_u64("--seed", optarg, &uv);
            seed = uv;
            break;
        case 'x': st = fm_arg_int("--specialists", optarg, 0, 63, &specialists); break;
        case 'G': st = fm_arg_int("--generalists", optarg, 0, 64, &iv); break;
        case 'e': st = fm_arg_int("--local-epochs", optarg, 1, 1000, &iv); break;
        case 't': st = fm_arg_double("--round-timeout", optarg, 0.001, 1e7, &dv); break;
        case 'P': st = fm_arg_int("--port", optarg, 1, 65535, &port); break;
        case 'm': {
            fm_stem_kind stem;
            st = fm_stem_parse("--stem", optarg, &stem);
            break;
        }
        case 's': {
            fm_strategy strategy;
            st = fm_strategy_parse(optarg, &strategy);
            break;
        }
        case 'B': st = fm_arg_int("--batch", optarg, 1, 65536, &iv); break;
        case 'T': st = fm_arg_double("--tau", optarg, 0.01, 1000.0, &dv); break;
        case 'W': st = fm_arg_double("--weight-decay", optarg, 0.0, 1000.0, &dv); break;
        case 'A': st = fm_arg_double("--anchor", optarg, 0.0, 1e6, &dv); break;
        case 'L': {
            fm_lr_schedule sched;
            st = fm_lr_schedule_parse("--lr-schedule", optarg, &sched);
            break;
        }
        case 'd': db = optarg; break;
        case 'D': break;
        case 'w': workdir = optarg; break;
        case 'h': usage(stdout); return 0;
        default:
            fm_error_set("unknown or incomplete option '%s' (see --help)", argv[optind - 1]);
            st = FM_ERR_ARG;
        }
        if (st != FM_OK) {
            fprintf(stderr, "fedmoe-sim: %s\n", fm_error_last());
            return 2;
        }
        if (strchr("sapifSmxeDtLTBWAGH", c) && npass < 60) {
            char flag[64];
            snprintf(flag, sizeof flag, "--%s", opts[idx].name);
            pass[npass++] = strdup(flag);
            if (opts[idx].has_arg)
                pass[npass++] = strdup(optarg);
        }
    }
    if (optind < argc) {
        fprintf(stderr, "fedmoe-sim: unexpected argument '%s' (see --help)\n", argv[optind]);
        return 2;
    }
    char server[PATH_MAX], client[PATH_MAX];
    if (find_program("fedmoe-server", server, sizeof server) || find_program("fedmoe-client", client, sizeof client)) {
        fprintf(stderr, "fedmoe-sim: cannot find fedmoe-server and fedmoe-client next to this program\n");
        return 1;
    }
    char wd[PATH_MAX];
    if (workdir) {
        snprintf(wd, sizeof wd, "%s", workdir);
        if (mkdir(wd, 0755) != 0 && errno != EEXIST) {
            fprintf(stderr, "fedmoe-sim: cannot create %s: %s\n", wd, strerror(errno));
            return 1;
        }
    } else {
        snprintf(wd, sizeof wd, "/tmp/fedmoe-sim-XXXXXX");
        if (!mkdtemp(wd)) {
            fprintf(stderr, "fedmoe-sim: cannot create a work folder in /tmp: %s\n", strerror(errno));
            return 1;
        }
    }
    if (!port && (port = free_port()) < 0) {
        fprintf(stderr, "fedmoe-sim: no free loopback port\n");
        return 1;
    }
    char endpoint[64], nclients[16], nrounds[16], log[PATH_MAX + 32];
    snprintf(endpoint, sizeof endpoint, "tcp://127.0.0.1:%d", port);
    snprintf(nclients, sizeof nclients, "%d", clients);
    snprintf(nrounds, sizeof nrounds, "%d", rounds);
    fm_signals_install();

    /* the previous latest run, to recognise the new one */
    char before[64] = "";
    fm_store_t *store = NULL;
    if (access(db, F_OK) == 0 && fm_store_open(&store, db, true) == FM_OK) {
        fm_run_row_t r;
        bool found;
        if (fm_store_latest_run(store, &r, &found) == FM_OK && found) {
            snprintf(before, sizeof before, "%s", r.id);
            fm_store_run_clear(&r);
        }
        fm_store_close(&store);
    }
    char *sargv[96] = {server, "--bind", endpoint, "--db", (char *)db, "--rounds", nrounds, "--min-clients", nclients,
                       "--partitions", nclients, "--new-run"};
    int sn = 12;
    for (int i = 0; i < npass; i++)
        sargv[sn++] = pass[i];
    sargv[sn] = NULL;
    snprintf(log, sizeof log, "%s/server.log", wd);
    double t0 = fm_clock_seconds();
    pid_t spid = spawn(sargv, log);
    if (spid < 0) {
        fprintf(stderr, "fedmoe-sim: %s\n", fm_error_last());
        return 1;
    }
    pid_t *cpids = calloc(clients, sizeof(pid_t));
    for (int i = 0; i < clients && cpids; i++) {
        char id[32], ilog[PATH_MAX + 64];
        snprintf(id, sizeof id, "client-%03d", i);
        snprintf(ilog, sizeof ilog, "%s/%s.log", wd, id);
        char spec[16];
        snprintf(spec, sizeof spec, "%d", specialists);
        char *cargv[] = {client, "--connect", endpoint, "--id", id, "--state-dir", wd, "--specialists", spec, NULL};
        cpids[i] = spawn(cargv, ilog);
    }
    printf("fedmoe-sim: coordinator on %s, %d clients, %d rounds; logs in %s\n", endpoint, clients, rounds, wd);
    fflush(stdout);

    char run_id[64] = "";
    int shown = 0, server_status = -1;
    bool server_done = false, client_failed = false;
    while (!server_done) {
        if (fm_stop_requested) {
            kill(spid, SIGTERM);
            for (int i = 0; i < clients; i++)
                if (cpids[i] > 0)
                    kill(cpids[i], SIGTERM);
            fm_stop_requested = 0;
        }
        usleep(300000);
        int status;
        /* a client that fails (no data, rejected, crashed) stops the job with its reason */
        for (int i = 0; i < clients && !client_failed; i++) {
            if (cpids[i] > 0 && waitpid(cpids[i], &status, WNOHANG) == cpids[i]) {
                int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                cpids[i] = 0;
                if (code != 0 && !server_done) {
                    char clog[PATH_MAX + 64];
                    snprintf(clog, sizeof clog, "%s/client-%03d.log", wd, i);
                    fprintf(stderr, "fedmoe-sim: client-%03d exited with status %d; the end of %s:\n", i, code, clog);
                    tail_file(clog, 4);
                    client_failed = true;
                    kill(spid, SIGTERM);
                }
            }
        }
        if (waitpid(spid, &status, WNOHANG) == spid) {
            server_done = true;
            server_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
        if (!store && access(db, F_OK) == 0 && fm_store_open(&store, db, true) != FM_OK)
            store = NULL;
        if (!store)
            continue;
        if (!run_id[0]) {
            fm_run_row_t r;
            bool found;
            if (fm_store_latest_run(store, &r, &found) == FM_OK && found) {
                if (strcmp(r.id, before) != 0)
                    snprintf(run_id, sizeof run_id, "%s", r.id);
                fm_store_run_clear(&r);
            }
            if (run_id[0]) {
                printf("run %s\n%s%5s %9s %10s %9s %9s %8s\n", run_id,
                       holdout ? "holdout run: test_loss and test_acc are on held-out train/validation data\n" : "",
                       "round", "clients", "train_loss", "test_loss", "test_acc", "seconds");
                fflush(stdout);
            }
        }
        if (!run_id[0])
            continue;
        fm_round_row_t *rr;
        int n;
        if (fm_store_list_rounds(store, run_id, &rr, &n) == FM_OK) {
            for (; shown < n; shown++)
                printf("%5d %4d/%-4d %10.4f %9.4f %8.2f%% %8.2f\n", rr[shown].round, rr[shown].completed,
                       rr[shown].selected, rr[shown].train_loss, rr[shown].test_loss, 100.0 * rr[shown].test_accuracy,
                       rr[shown].seconds);
            fflush(stdout);
            free(rr);
        }
    }
    /* clients leave on the coordinator's Shutdown; give them a moment, then insist */
    double until = fm_clock_seconds() + 15.0;
    int left = clients;
    while (left > 0 && fm_clock_seconds() < until) {
        left = 0;
        for (int i = 0; i < clients; i++) {
            if (cpids[i] <= 0)
                continue;
            int status;
            if (waitpid(cpids[i], &status, WNOHANG) == cpids[i])
                cpids[i] = 0;
            else
                left++;
        }
        if (left)
            usleep(100000);
    }
    for (int i = 0; i < clients; i++)
        if (cpids[i] > 0) {
            kill(cpids[i], SIGKILL);
            waitpid(cpids[i], NULL, 0);
        }
    free(cpids);
    if (client_failed) {
        fm_store_close(&store);
        return 1;
    }
    if (server_status != 0) {
        fprintf(stderr, "fedmoe-sim: the coordinator exited with status %d; the end of %s/server.log:\n", server_status, wd);
        snprintf(log, sizeof log, "%s/server.log", wd);
        tail_file(log, 8);
        fm_store_close(&store);
        return 1;
    }
    /* summary */
    int rc = 0;
    if (!store || !run_id[0]) {
        fprintf(stderr, "fedmoe-sim: the coordinator logged no run in %s\n", db);
        rc = 1;
    } else {
        fm_round_row_t *rr;
        int n = 0;
        fm_run_row_t run;
        bool found = false;
        fm_store_get_run(store, run_id, &run, &found);
        if (fm_store_list_rounds(store, run_id, &rr, &n) == FM_OK && n > 0) {
            for (; shown < n; shown++)
                printf("%5d %4d/%-4d %10.4f %9.4f %8.2f%% %8.2f\n", rr[shown].round, rr[shown].completed,
                       rr[shown].selected, rr[shown].train_loss, rr[shown].test_loss, 100.0 * rr[shown].test_accuracy,
                       rr[shown].seconds);
            int best = 0;
            double secs = 0;
            long long up = 0, down = 0;
            for (int i = 0; i < n; i++) {
                if (rr[i].test_accuracy > rr[best].test_accuracy)
                    best = i;
                secs += rr[i].seconds;
                up += rr[i].bytes_up;
                down += rr[i].bytes_down;
            }
            printf("\nsummary: run %s, strategy %s, %s, %d clients, seed %llu\n", run_id,
                   found ? run.strategy : "?", partition_desc, clients, seed);
            printf("  %-26s %d of %d%s\n", "rounds", n, rounds, found && strcmp(run.status, "finished") ? " (stopped)" : "");
            printf("  %-26s %.2f%%%s\n", holdout ? "final holdout accuracy" : "final test accuracy",
                   100.0 * rr[n - 1].test_accuracy, holdout ? " (test splits unused)" : "");
            printf("  best %-21s %.2f%% (round %d)\n", holdout ? "holdout accuracy" : "test accuracy",
                   100.0 * rr[best].test_accuracy, rr[best].round);
            printf("  %-26s %.4f\n", "final mean train loss", rr[n - 1].train_loss);
            printf("  %-26s %.2f s\n", "mean round time", secs / n);
            printf("  %-26s %.1f s\n", "wall time", fm_clock_seconds() - t0);
            printf("  %-26s %.1f MB up, %.1f MB down\n", "traffic", up / 1e6, down / 1e6);
            fm_client_round_row_t *cr;
            int nc;
            if (fm_store_list_client_rounds(store, run_id, rr[n - 1].round, &cr, &nc) == FM_OK) {
                printf("\n  %-12s %-9s %8s %7s %9s %9s\n", "client", "status", "samples", "tested", "test_acc", "gen_share");
                for (int i = 0; i < nc; i++)
                    printf("  %-12s %-9s %8lld %7lld %8.2f%% %9.3f\n", cr[i].client_id, cr[i].status,
                           (long long)cr[i].train_samples, (long long)cr[i].test_samples, 100.0 * cr[i].test_accuracy,
                           cr[i].generalist_share);
                free(cr);
            }
            printf("\ndatabase: %s   (fedmoe-history --db %s rounds %s)\nlogs: %s\n", db, db, run_id, wd);
        } else {
            fprintf(stderr, "fedmoe-sim: run %s has no rounds\n", run_id);
            rc = 1;
        }
        free(n > 0 ? rr : NULL);
        if (found)
            fm_store_run_clear(&run);
    }
    fm_store_close(&store);
    for (int i = 0; i < npass; i++)
        free(pass[i]);
    return rc;
}
