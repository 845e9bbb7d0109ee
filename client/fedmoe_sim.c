/* fedmoe-sim: the main job on one machine. Starts a coordinator and N client
 * processes on loopback, prints one line per committed round (read from the
 * round log, which the coordinator writes), and ends with a summary table. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fedmoe/clock.h"
#include "fedmoe/keys.h"
#include "fedmoe/log.h"
#include "fedmoe/options.h"
#include "fedmoe/report.h"
#include "fedmoe/runspec.h"
#include "fedmoe/signals.h"
#include "fedmoe/spawn.h"
#include "fedmoe/store.h"
#include "host.h"


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

/* One job: its options, processes and what it has shown of the round log. */
typedef struct {
    fm_options_t o;
    fm_run_spec_t spec;
    char server[PATH_MAX], client[PATH_MAX], wd[PATH_MAX], endpoint[64];
    pid_t spid, *cpids;
    fm_report_t rep; /* the job's run, as the round log shows it */
    char keys[PATH_MAX + 16]; /* WORKDIR/keys, "" when insecure */
    bool hosted;              /* the clients in virtual hosts (fedmoe-client --virtual) */
    int nprocs;               /* client processes: one per client, or the hosts */
    int per_host, workers;    /* hosted: clients a host (the last may have fewer), trainings at once */
    int server_status;
    bool client_failed;
} sim_t;

/* The program, its work folder and its port. Returns 0, or the exit status. */
static int setup(sim_t *s)
{
    fm_run_spec_t check = s->spec; /* the coordinator's own check, before anything starts */
    if (fm_run_spec_finish(&check) != FM_OK) {
        fprintf(stderr, "fedmoe-sim: %s\n", fm_error_last());
        return 2;
    }
    if (find_program("fedmoe-server", s->server, sizeof s->server) ||
        find_program("fedmoe-client", s->client, sizeof s->client)) {
        fprintf(stderr, "fedmoe-sim: cannot find fedmoe-server and fedmoe-client next to this program\n");
        return 1;
    }
    if (s->o.workdir[0]) {
        snprintf(s->wd, sizeof s->wd, "%s", s->o.workdir);
        if (mkdir(s->wd, 0755) != 0 && errno != EEXIST) {
            fprintf(stderr, "fedmoe-sim: cannot create %s: %s\n", s->wd, strerror(errno));
            return 1;
        }
    } else {
        snprintf(s->wd, sizeof s->wd, "/tmp/fedmoe-sim-XXXXXX");
        if (!mkdtemp(s->wd)) {
            fprintf(stderr, "fedmoe-sim: cannot create a work folder in /tmp: %s\n", strerror(errno));
            return 1;
        }
    }
    if (!s->o.port && (s->o.port = free_port()) < 0) {
        fprintf(stderr, "fedmoe-sim: no free loopback port\n");
        return 1;
    }
    snprintf(s->endpoint, sizeof s->endpoint, "tcp://127.0.0.1:%d", s->o.port);
    fm_report_begin(&s->rep, s->o.db, NULL, false); /* (the latest run now is not the job's) */
    return 0;
}

/* Processes for a few clients, virtual hosts for many (--hosting): as many
 * hosts as the descriptor limit asks (fm_host_capacity), the cores shared
 * among them. Returns 0, or the exit status. */
static int choose_hosting(sim_t *s)
{
    int n = s->o.clients;
    s->hosted = s->o.hosting == FM_HOSTING_VIRTUAL || (s->o.hosting == FM_HOSTING_AUTO && n > FM_SIM_PROCESSES_MAX);
    s->nprocs = n;
    struct rlimit rl;
    long limit = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_max != RLIM_INFINITY ? (long)rl.rlim_max : 1L << 30;
    if ((long)n + 64 > limit) {
        fprintf(stderr, "fedmoe-sim: %d clients need %d file descriptors in the coordinator; the hard limit is "
                "%ld (ulimit -Hn)\n", n, n + 64, limit);
        return 1;
    }
    if (!s->hosted)
        return 0;
    int most = fm_host_capacity(limit);
    s->nprocs = (n + most - 1) / most;
    s->per_host = (n + s->nprocs - 1) / s->nprocs;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    s->workers = cores / s->nprocs > 0 ? (int)(cores / s->nprocs) : 1;
    return 0;
}

/* Client i's id: client-NNN as a process, client-NNNNN in a virtual host (the
 * host numbers its clients by partition). */
static void client_id(const sim_t *s, int i, char *out, size_t cap)
{
    snprintf(out, cap, s->hosted ? "client-%05d" : "client-%03d", i);
}

/* Client process i: its log, and what it is called in messages (a client, or
 * the host of client-NNNNN ...). */
static void proc_names(const sim_t *s, int i, char *log, size_t cap, char *name, size_t name_cap)
{
    char id[32];
    client_id(s, s->hosted ? i * s->per_host : i, id, sizeof id);
    if (s->hosted) {
        snprintf(log, cap, "%s/host-%d.log", s->wd, i);
        snprintf(name, name_cap, "the virtual host of %s", id);
    } else {
        snprintf(log, cap, "%s/%s.log", s->wd, id);
        snprintf(name, name_cap, "%s", id);
    }
}

/* dir/ID.key as it is, or a new pair written there. */
static fm_status ensure_key(const char *dir, const char *id)
{
    char path[PATH_MAX + 96];
    snprintf(path, sizeof path, "%s/%s.key", dir, id);
    fm_key_t k;
    if (access(path, F_OK) == 0)
        return fm_key_read(path, true, &k);
    fm_status st = fm_key_generate(&k, id);
    return st == FM_OK ? fm_key_write(&k, dir) : st;
}

/* The run's keys (unless --insecure): WORKDIR/keys/coordinator.key and .pub,
 * and one pair per client in WORKDIR/keys/clients, which is the coordinator's
 * allow-list (it reads only the .pub files). Kept when they exist, so a work
 * folder reused keeps its keys. Returns 0, or the exit status. */
static int make_keys(sim_t *s)
{
    if (s->o.insecure)
        return 0;
    snprintf(s->keys, sizeof s->keys, "%s/keys", s->wd);
    char clients[PATH_MAX + 32];
    snprintf(clients, sizeof clients, "%s/clients", s->keys);
    if ((mkdir(s->keys, 0700) != 0 && errno != EEXIST) || (mkdir(clients, 0700) != 0 && errno != EEXIST)) {
        fprintf(stderr, "fedmoe-sim: cannot create %s: %s\n", clients, strerror(errno));
        return 1;
    }
    fm_status st = ensure_key(s->keys, "coordinator");
    for (int i = 0; i < s->o.clients && st == FM_OK; i++) {
        char id[32];
        client_id(s, i, id, sizeof id);
        st = ensure_key(clients, id);
    }
    if (st != FM_OK) {
        fprintf(stderr, "fedmoe-sim: %s\n", fm_error_last());
        return 1;
    }
    return 0;
}

/* Starts the coordinator, with the options it accepts that were given here,
 * and the clients. Returns 0, or the exit status. */
static int start(sim_t *s)
{
    char nclients[16], nrounds[16], log[PATH_MAX + 32];
    snprintf(nclients, sizeof nclients, "%d", s->o.clients);
    /* a round needs the fraction it selects (all clients by default); a round
     * may open before every client has connected */
    int quorum = fm_options_given(&s->o, "min-clients") ? s->o.min_clients
                                                         : (int)ceil(s->o.fraction * s->o.clients - 1e-9);
    if (quorum > s->o.clients) {
        fprintf(stderr, "fedmoe-sim: --min-clients %d is more than the %d clients\n", quorum, s->o.clients);
        return 2;
    }
    char nquorum[16];
    snprintf(nquorum, sizeof nquorum, "%d", quorum > 0 ? quorum : 1);
    snprintf(nrounds, sizeof nrounds, "%d", s->o.rounds);
    char skey[PATH_MAX + 32], allow[PATH_MAX + 32], spub[PATH_MAX + 32];
    snprintf(skey, sizeof skey, "%s/coordinator.key", s->keys);
    snprintf(spub, sizeof spub, "%s/coordinator.pub", s->keys);
    snprintf(allow, sizeof allow, "%s/clients", s->keys);
    char *sargv[128] = {s->server, "--bind", s->endpoint, "--db", s->o.db, "--rounds", nrounds, "--min-clients",
                        nquorum, "--partitions", nclients, "--new-run", "--key", skey, "--allow", allow};
    int sn = s->o.insecure ? 12 : 16, k = fm_options_forward(&s->o, FM_PROG_SERVER, sargv + sn, 128 - sn - 1);
    if (k < 0) {
        fprintf(stderr, "fedmoe-sim: too many options to pass on\n");
        return 2;
    }
    sargv[sn + k] = NULL;
    snprintf(log, sizeof log, "%s/server.log", s->wd);
    s->rep.t0 = fm_clock_seconds();
    if ((s->spid = fm_spawn_logged(sargv, log, false)) < 0) {
        fprintf(stderr, "fedmoe-sim: %s\n", fm_error_last());
        return 1;
    }
    s->cpids = calloc(s->nprocs, sizeof(pid_t));
    for (int i = 0; i < s->nprocs && s->cpids; i++) {
        char id[32], ilog[PATH_MAX + 64], name[64], spec[16], ckey[2 * PATH_MAX], count[16], part[32], workers[16];
        client_id(s, i, id, sizeof id);
        proc_names(s, i, ilog, sizeof ilog, name, sizeof name);
        snprintf(spec, sizeof spec, "%d", s->spec.model.specialists);
        snprintf(ckey, sizeof ckey, "%s/%s.key", allow, id);
        int first = i * s->per_host, left = s->o.clients - first;
        snprintf(count, sizeof count, "%d", left < s->per_host ? left : s->per_host);
        snprintf(part, sizeof part, "%d/%d", first, s->o.clients);
        snprintf(workers, sizeof workers, "%d", s->workers);
        /* the run's data, chosen on this machine, so the clients may read its files */
        char *cargv[24] = {s->client, "--connect", s->endpoint, "--state-dir", s->wd, "--specialists", spec,
                           "--dataset", s->spec.dataset, "--server-key", spub, "--id", s->hosted ? "client" : id};
        int a = 13;
        if (s->hosted) {
            cargv[a++] = "--virtual", cargv[a++] = count, cargv[a++] = "--partition", cargv[a++] = part;
            cargv[a++] = "--workers", cargv[a++] = workers;
        }
        if (s->o.insecure)
            cargv[a++] = "--insecure";
        else
            cargv[a++] = s->hosted ? "--keys" : "--key", cargv[a++] = s->hosted ? allow : ckey;
        s->cpids[i] = fm_spawn_logged(cargv, ilog, false);
    }
    if (s->hosted)
        printf("fedmoe-sim: coordinator on %s, %d clients in %d virtual host%s of up to %d, %d training at once "
               "in each (%s), %d rounds; logs in %s\n",
               s->endpoint, s->o.clients, s->nprocs, s->nprocs > 1 ? "s" : "", s->per_host, s->workers,
               s->o.hosting == FM_HOSTING_AUTO ? "more than " FM_XSTR(FM_SIM_PROCESSES_MAX) " clients; --hosting processes "
                                                 "for a process each"
                                               : "--hosting virtual",
               s->o.rounds, s->wd);
    else
        printf("fedmoe-sim: coordinator on %s, %d client processes, %d rounds; logs in %s\n", s->endpoint,
               s->o.clients, s->o.rounds, s->wd);
    fflush(stdout);
    return 0;
}

/* A client that fails (no data, rejected, crashed) stops the job with its reason. */
static void check_clients(sim_t *s, bool server_done)
{
    for (int i = 0; i < s->nprocs && !s->client_failed; i++) {
        int status;
        if (s->cpids[i] > 0 && waitpid(s->cpids[i], &status, WNOHANG) == s->cpids[i]) {
            int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            s->cpids[i] = 0;
            if (code != 0 && !server_done) {
                char clog[PATH_MAX + 64], name[64];
                proc_names(s, i, clog, sizeof clog, name, sizeof name);
                fprintf(stderr, "fedmoe-sim: %s exited with status %d; the end of %s:\n", name, code, clog);
                tail_file(clog, 4);
                s->client_failed = true;
                kill(s->spid, SIGTERM);
            }
        }
    }
}

/* Until the coordinator exits; Ctrl-C stops everyone. */
static void watch(sim_t *s)
{
    bool server_done = false;
    while (!server_done) {
        if (fm_stop_requested) {
            kill(s->spid, SIGTERM);
            for (int i = 0; i < s->nprocs; i++)
                if (s->cpids[i] > 0)
                    kill(s->cpids[i], SIGTERM);
            fm_stop_requested = 0;
        }
        usleep(300000);
        check_clients(s, server_done);
        int status;
        if (waitpid(s->spid, &status, WNOHANG) == s->spid) {
            server_done = true;
            s->server_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
        fm_report_progress(&s->rep);
    }
}

/* Clients leave on the coordinator's Shutdown at the run's end; after 3 s the
 * rest (waiting for a coordinator that stopped mid-run) are asked to stop,
 * after 15 s killed. */
static void reap_clients(sim_t *s)
{
    double start = fm_clock_seconds();
    bool asked = false;
    int left = s->nprocs;
    while (left > 0 && fm_clock_seconds() < start + 15.0) {
        if (!asked && fm_clock_seconds() > start + 3.0) {
            for (int i = 0; i < s->nprocs; i++)
                if (s->cpids[i] > 0)
                    kill(s->cpids[i], SIGTERM);
            asked = true;
        }
        left = 0;
        for (int i = 0; i < s->nprocs; i++) {
            if (s->cpids[i] <= 0)
                continue;
            int status;
            if (waitpid(s->cpids[i], &status, WNOHANG) == s->cpids[i])
                s->cpids[i] = 0;
            else
                left++;
        }
        if (left)
            usleep(100000);
    }
    for (int i = 0; i < s->nprocs; i++)
        if (s->cpids[i] > 0) {
            kill(s->cpids[i], SIGKILL);
            waitpid(s->cpids[i], NULL, 0);
        }
}

/* The last rounds, the summary table and where to look further; returns the
 * exit status. */
static int summary(sim_t *s)
{
    int rc = fm_report_summary(&s->rep);
    if (rc == 0)
        printf("\ndatabase: %s   (fedmoe-history --db %s rounds %s)\nlogs: %s\n", s->o.db, s->o.db, s->rep.run_id,
               s->wd);
    return rc;
}

static void defaults(fm_options_t *o, struct fm_run_spec *spec) { fm_options_default(o, FM_PROG_SIM, spec); }

static const fm_program_t program = {
    "fedmoe-sim",
    "usage: fedmoe-sim [options]\n"
    "\n"
    "Runs a federated training job on this machine: a fedmoe-server and N clients on\n"
    "loopback (a fedmoe-client process each, or, for more than " FM_XSTR(FM_SIM_PROCESSES_MAX) ", virtual hosts: see\n"
    "--hosting), Fashion-MNIST split over the clients (with --task text: the fortunes,\n"
    "one language a client). Prints one line per round\n"
    "and a summary; the round log stays in the database for fedmoe-history (every sim adds\n"
    "a new run). The coordinator gets the options below that it knows. Every connection is\n"
    "encrypted and authenticated with CURVE keys made for the run in WORKDIR/keys (kept when\n"
    "the folder is reused); --insecure runs without.\n"
    "\n",
    NULL,
    defaults,
};

int main(int argc, char **argv)
{
    static sim_t s; /* large; one per process */
    defaults(&s.o, &s.spec);
    int rc = fm_options_main(&s.o, argc, argv, &program);
    if (rc >= 0)
        return rc;
    rc = setup(&s);
    fm_signals_install();
    if (rc != 0 || (rc = choose_hosting(&s)) != 0 || (rc = make_keys(&s)) != 0 || (rc = start(&s)) != 0)
        return rc;
    s.server_status = -1;
    watch(&s);
    reap_clients(&s);
    free(s.cpids);
    if (s.client_failed) {
        fm_report_end(&s.rep);
        return 1;
    }
    if (s.server_status != 0) {
        char log[PATH_MAX + 32];
        fprintf(stderr, "fedmoe-sim: the coordinator exited with status %d; the end of %s/server.log:\n",
                s.server_status, s.wd);
        snprintf(log, sizeof log, "%s/server.log", s.wd);
        tail_file(log, 8);
        fm_report_end(&s.rep);
        return 1;
    }
    rc = summary(&s);
    fm_report_end(&s.rep);
    return rc;
}
