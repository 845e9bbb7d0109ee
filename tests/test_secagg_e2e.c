/* Secure aggregation through the real coordinator and client processes
 * (--secure-aggregation, docs/secure-aggregation.md): ten clients of
 * fedmoe-secagg-client (fedmoe-client with tests/secagg_client.c's hook,
 * which writes the values each is about to mask and can leave at a phase)
 * train two rounds of fedavg on real Fashion-MNIST with real CURVE keys. In
 * round 2 none, one (10%) or three (30%) of them leave at each phase in turn:
 * the coordinator's result, read from its checkpoint, must be bit for bit the
 * plaintext weighted mean of the clients whose masked input it summed (its
 * round log's completed rows), computed here from their own values with the
 * aggregator. Five leaving (below the threshold of six): the round is
 * abandoned, said in the log, and the coordinator stays up. And the
 * coordinator's memory, read through /proc while it waits in the unmasking
 * phase, holds none of the clients' values. Then what the clients do before
 * masking: their own bound (--clip-norm C), full with its prompt pool off,
 * and distributed differential privacy (each client's noise share, the
 * padded mean, bit for bit). */
#define _GNU_SOURCE /* memmem */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coordinator.h"
#include "fedmoe/aggregate.h"
#include "fedmoe/clock.h"
#include "fedmoe/store.h"
#include "procs.h"

static char dir[256];

#define N 10
#define ROUNDS 2

/* The values client id was about to mask in round r (count floats, malloc'd)
 * and their weight, from its dump; NULL when it wrote none. */
static float *read_dump_ref(const char *tag, const char *id, int r, size_t *count, uint64_t *weight, float **ref);
static float *read_dump(const char *tag, const char *id, int r, size_t *count, uint64_t *weight)
{
    return read_dump_ref(tag, id, r, count, weight, NULL);
}

/* The same, and (ref not NULL) the state its Task sent, malloc'd. */
static float *read_dump_ref(const char *tag, const char *id, int r, size_t *count, uint64_t *weight, float **ref)
{
    char path[768];
    snprintf(path, sizeof path, "%s/%s-dump/%s-r%d.bin", dir, tag, id, r);
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    uint64_t n = 0;
    float *x = NULL;
    bool ok = fread(&n, sizeof n, 1, f) == 1 && n > 0 && n < (1u << 28) && (x = malloc(sizeof *x * n)) &&
              fread(x, sizeof *x, n, f) == n && fread(weight, sizeof *weight, 1, f) == 1;
    if (ok && ref)
        ok = (*ref = malloc(sizeof **ref * n)) && fread(*ref, sizeof **ref, n, f) == n;
    fclose(f);
    if (!ok) {
        free(x);
        if (ref)
            free(*ref);
        return NULL;
    }
    *count = n;
    return x;
}

/* Starts the coordinator (with secure aggregation or without) and the N
 * clients of run `tag`; the last `drop` clients leave at drop_at
 * (FEDMOE_SA_DROP). */
static const char *tamper_last; /* FEDMOE_SA_TAMPER of the last client (NULL: an honest one) */
static const char *clip_norm = "off"; /* the coordinator's --clip-norm */
static const char *strategy = "fedavg";
static const char *privacy[8];        /* more flags for the coordinator (NULL-terminated) */

static pid_t start(const char *tag, bool secagg, const char *drop_at, int drop, pid_t *c, char *db, char *log)
{
    char ep[64], dumps[600];
    procs_files(tag, db, log);
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", procs_free_port());
    snprintf(dumps, sizeof dumps, "%s/%s-dump", dir, tag);
    mkdir(dumps, 0700);
    procs_client_keys("c", N);
    char *sargv[] = {BIN("server/fedmoe-server"), "--bind", ep, "--db", db, "--rounds", FM_STR(ROUNDS),
                     "--min-clients", "6", "--partitions", FM_STR(N), "--strategy", (char *)strategy, "--client-examples",
                     "40", "--local-steps", "3", "--round-timeout", "60", "--client-timeout", "4", "--clip-norm",
                     (char *)clip_norm, secagg ? "--secure-aggregation" : NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                     NULL, NULL, NULL};
    int at = 0;
    while (sargv[at])
        at++;
    for (int i = 0; privacy[i]; i++)
        sargv[at++] = (char *)privacy[i];
    pid_t server = procs_spawn_server(sargv, log);
    assert_true(server > 0);
    for (int i = 0; i < N; i++) {
        char id[16], clog[600];
        snprintf(id, sizeof id, "c%d", i);
        snprintf(clog, sizeof clog, "%s/%s-c%d.log", dir, tag, i);
        setenv("FEDMOE_SA_DUMP", dumps, 1);
        setenv("FEDMOE_SA_ID", id, 1);
        if (i >= N - drop)
            setenv("FEDMOE_SA_DROP", drop_at, 1);
        else
            unsetenv("FEDMOE_SA_DROP");
        if (i == N - 1 && tamper_last)
            setenv("FEDMOE_SA_TAMPER", tamper_last, 1);
        else
            unsetenv("FEDMOE_SA_TAMPER");
        char *cargv[] = {BIN("tests/fedmoe-secagg-client"), "--connect", ep, "--id", id, "--state-dir", dir, NULL};
        c[i] = procs_spawn_client(cargv, clog);
        assert_true(c[i] > 0);
    }
    unsetenv("FEDMOE_SA_DROP");
    unsetenv("FEDMOE_SA_TAMPER");
    return server;
}

/* The plaintext weighted mean of round r's completed clients (rows), from
 * their dumps, leaving out client `skip` (-1: none), into out (n floats). */
static void plain_mean(const char *tag, const fm_client_round_row_t *rows, int nrows, int r, int skip, float *out,
                       size_t n)
{
    fm_aggregator_t *a;
    assert_int_equal(fm_aggregator_new(&a, n), FM_OK);
    int added = 0;
    for (int i = 0; i < nrows; i++) {
        if (rows[i].round != r || strcmp(rows[i].status, "completed") != 0 || i == skip)
            continue;
        size_t count;
        uint64_t weight;
        float *x = read_dump(tag, rows[i].client_id, r, &count, &weight);
        assert_non_null(x);
        assert_int_equal(count, n);
        assert_int_equal(weight, (uint64_t)rows[i].train_samples);
        assert_int_equal(fm_aggregator_add(a, x, weight), FM_OK);
        free(x);
        added++;
    }
    assert_true(added > 0);
    assert_int_equal(fm_aggregator_result(a, out), FM_OK);
    fm_aggregator_destroy(&a);
}

/* Run `tag` finished: round 2 selected `selected` clients and summed the
 * masked inputs of `expect`, and its result is the plaintext mean of those,
 * bit for bit. */
/* The run's coordinator and N clients ended well (the dropped ones left
 * with 0 too) after ROUNDS rounds; their round log, round 2 having summed
 * `expect` masked inputs. */
static void finished(const char *db, pid_t server, const pid_t *c, int expect, fm_round_row_t **rounds,
                     fm_client_round_row_t **rows, int *nc)
{
    assert_int_equal(procs_wait(server, 300), 0);
    for (int i = 0; i < N; i++)
        assert_int_equal(procs_wait(c[i], 30), 0);
    int nr;
    procs_finished_run(db, rounds, &nr, rows, nc);
    assert_int_equal(nr, ROUNDS);
    assert_int_equal((*rounds)[ROUNDS - 1].completed, expect);
}

static void check_run(const char *tag, const char *db, pid_t server, const pid_t *c, int selected, int expect)
{
    fm_round_row_t *rounds;
    fm_client_round_row_t *rows;
    int nc;
    finished(db, server, c, expect, &rounds, &rows, &nc);
    assert_int_equal(rounds[ROUNDS - 1].selected, selected);
    fm_checkpoint_t ck;
    int round;
    procs_latest_checkpoint(db, &ck, &round);
    assert_int_equal(round, ROUNDS);
    size_t n = ck.nglobal + ck.nprompt;
    float *want = malloc(sizeof *want * n), *got = malloc(sizeof *got * n);
    assert_non_null(want);
    assert_non_null(got);
    memcpy(got, ck.global, sizeof *got * ck.nglobal);
    memcpy(got + ck.nglobal, ck.prompt, sizeof *got * ck.nprompt);
    plain_mean(tag, rows, nc, ROUNDS, -1, want, n);
    assert_memory_equal(want, got, sizeof *want * n);
    /* (the check can tell: the mean without one of them is not the result) */
    int first = -1;
    for (int i = 0; i < nc && first < 0; i++)
        if (rows[i].round == ROUNDS && strcmp(rows[i].status, "completed") == 0)
            first = i;
    plain_mean(tag, rows, nc, ROUNDS, first, want, n);
    assert_memory_not_equal(want, got, sizeof *want * n);
    fprintf(stderr, "  %s: %d of %d inputs summed in round %d, result bit-identical to their plaintext mean (%zu "
            "values)\n", tag, expect, selected, ROUNDS, n);
    fm_checkpoint_free(&ck);
    free(want);
    free(got);
    free(rounds);
    free(rows);
}

/* A run where `drop` clients leave at `phase` of round 2: it finishes, round
 * 2 (every client in it) completes N - drop updates (N for a drop at
 * unmasking: their inputs were summed), its result their plaintext mean. */
static void run_with_drops(int phase, int drop)
{
    char tag[32], db[512], log[512], drop_at[32];
    snprintf(tag, sizeof tag, "p%d-d%d", phase, drop);
    snprintf(drop_at, sizeof drop_at, "%d:%d", phase, ROUNDS);
    pid_t c[N];
    pid_t server = start(tag, true, drop_at, drop, c, db, log);
    check_run(tag, db, server, c, N, phase == 3 ? N : N - drop);
}

static void test_no_drops(void **state)
{
    (void)state;
    run_with_drops(0, 0);
}

static void test_drops_advertise(void **state)
{
    (void)state;
    run_with_drops(0, 1);
    run_with_drops(0, 3);
}

static void test_drops_share(void **state)
{
    (void)state;
    run_with_drops(1, 1);
    run_with_drops(1, 3);
}

static void test_drops_masked_input(void **state)
{
    (void)state;
    run_with_drops(2, 1);
    run_with_drops(2, 3);
}

static void test_drops_unmask(void **state)
{
    (void)state;
    run_with_drops(3, 1);
    run_with_drops(3, 3);
}

/* A malicious client spoiling every unmasking share it sends: the
 * coordinator rebuilds every secret from other choices of the threshold
 * (each checked against what its owner advertised), and round 2 sums all
 * ten inputs, exactly. */
static void test_malicious_unmask_shares(void **state)
{
    (void)state;
    char db[512], log[512];
    pid_t c[N];
    tamper_last = "3:" FM_STR(ROUNDS);
    pid_t server = start("liar", true, "", 0, c, db, log);
    tamper_last = NULL;
    check_run("liar", db, server, c, N, N);
}

/* A malicious client sealing every share it sends wrong: its receivers find
 * it (GCM), name it and mask all the same; its secret cannot be rebuilt, so
 * round 2 is abandoned, never unmasked wrong; after two such rounds it sits
 * out, and round 2 runs again with the other nine, their sum exact. */
static void test_malicious_sealed_shares(void **state)
{
    (void)state;
    char db[512], log[512];
    pid_t c[N];
    tamper_last = "1:" FM_STR(ROUNDS);
    pid_t server = start("sealer", true, "", 0, c, db, log);
    tamper_last = NULL;
    check_run("sealer", db, server, c, N - 1, N - 1);
    assert_true(procs_log_has(log, "the secret of client c9 cannot be rebuilt"));
    assert_true(procs_log_has(log, "client c9: no usable update in 2 rounds in a row"));
}

/* Five of ten leave before their masked input: fewer than the threshold of
 * six are left, so round 2 is abandoned (said in the log), never unmasked
 * wrong or waited on for good; the coordinator stays up for the run again. */
static void test_below_threshold_abandoned(void **state)
{
    (void)state;
    char db[512], log[512];
    pid_t c[N];
    pid_t server = start("below", true, "2:" FM_STR(ROUNDS), 5, c, db, log);
    double until = fm_clock_seconds() + 180.0;
    while (fm_clock_seconds() < until && !procs_log_has(log, "the round is abandoned"))
        usleep(200000);
    assert_true(procs_log_has(log, "phase 'masked input' ended with 5 of 10 clients, fewer than the threshold 6"));
    assert_int_equal(procs_committed_rounds(db), 1);
    assert_int_equal(kill(server, 0), 0); /* (up) */
    kill(server, SIGTERM);
    assert_int_equal(procs_wait(server, 30), 0);
    for (int i = 0; i < N; i++) {
        kill(c[i], SIGTERM);
        procs_wait(c[i], 30);
    }
}

/* ---- the clients' own bound, and distributed differential privacy -------------- */

/* The largest distance from its Task's state a client's log reports before
 * its bound ("update at distance D ..."); 0 when none. */
static double farthest(const char *clog)
{
    FILE *f = fopen(clog, "r");
    char line[1024];
    double most = 0.0, d;
    while (f && fgets(line, sizeof line, f)) {
        const char *at = strstr(line, "update at distance ");
        if (at && sscanf(at, "update at distance %lf", &d) == 1 && d > most)
            most = d;
    }
    if (f)
        fclose(f);
    return most;
}

/* --clip-norm C under secure aggregation: every client moves what it masks to
 * within C of the state its Task sent (the coordinator cannot), at least one
 * of them had to (its log says so), and the result is still the plaintext
 * mean of what they masked, bit for bit. */
static void test_clients_bound_their_updates(void **state)
{
    (void)state;
    char db[512], log[512];
    pid_t c[N];
    const double C = 0.05;
    clip_norm = "0.05";
    pid_t server = start("bound", true, "", 0, c, db, log);
    clip_norm = "off";
    check_run("bound", db, server, c, N, N);
    int moved = 0;
    for (int i = 0; i < N; i++) {
        char id[16], clog[600];
        snprintf(id, sizeof id, "c%d", i);
        size_t n;
        uint64_t w;
        float *ref = NULL, *x = read_dump_ref("bound", id, ROUNDS, &n, &w, &ref);
        assert_non_null(x);
        assert_true(fm_distance(x, ref, n) <= C * (1.0 + 1e-4));
        snprintf(clog, sizeof clog, "%s/bound-c%d.log", dir, i);
        moved += farthest(clog) > C;
        free(x);
        free(ref);
    }
    assert_true(moved > 0); /* (the bound did something) */
}

/* full with --prompt-pool off: the prompts are averaged with the model and
 * masked with it (the pool, which would send each client's prompt to its
 * peers, is off); the result, model and global prompt, is the plaintext mean
 * of what the clients masked, bit for bit, with one of ten leaving before
 * its masked input. */
static void test_full_without_pool(void **state)
{
    (void)state;
    char db[512], log[512];
    pid_t c[N];
    const char *flags[] = {"--prompt-pool", "off", NULL};
    memcpy(privacy, flags, sizeof flags);
    strategy = "full";
    pid_t server = start("full", true, "2:" FM_STR(ROUNDS), 1, c, db, log);
    strategy = "fedavg";
    privacy[0] = NULL;
    check_run("full", db, server, c, N, N - 1);
}

/* --dp-mode distributed: each client clips its update to --dp-clip C and adds
 * Gaussian noise of standard deviation z C / sqrt(t) to each value before
 * masking (its dump is what it masked: the noise's spread read off it), with
 * weight 1; one of ten leaves before its masked input, and the coordinator's
 * result is, bit for bit, the sum of the nine it summed plus the unchanged
 * state for the tenth, over ten (the central mode's fixed denominator), with
 * no noise of its own on top; epsilon logged each round. */
static void test_distributed_dp(void **state)
{
    (void)state;
    char db[512], log[512];
    pid_t c[N];
    const double z = 1.0, C = 0.05, sd = z * C / sqrt(6.0); /* (t: 6 of 10) */
    const char *flags[] = {"--dp-noise", "1", "--dp-clip", "0.05", "--dp-mode", "distributed", NULL};
    memcpy(privacy, flags, sizeof flags);
    pid_t server = start("ddp", true, "2:" FM_STR(ROUNDS), 1, c, db, log);
    privacy[0] = NULL;
    fm_round_row_t *rounds;
    fm_client_round_row_t *rows;
    int nc;
    finished(db, server, c, N - 1, &rounds, &rows, &nc);
    for (int r = 0; r < ROUNDS; r++)
        assert_true(rounds[r].epsilon > 0.0 && (r == 0 || rounds[r].epsilon > rounds[r - 1].epsilon));
    fm_checkpoint_t ck;
    int round;
    procs_latest_checkpoint(db, &ck, &round);
    size_t n = ck.nglobal + ck.nprompt;
    float *got = malloc(sizeof *got * n), *want = malloc(sizeof *want * n), *ref = NULL;
    assert_non_null(got);
    assert_non_null(want);
    memcpy(got, ck.global, sizeof *got * ck.nglobal);
    memcpy(got + ck.nglobal, ck.prompt, sizeof *got * ck.nprompt);
    fm_aggregator_t *a;
    assert_int_equal(fm_aggregator_new(&a, n), FM_OK);
    int summed = 0;
    for (int i = 0; i < nc; i++) {
        if (rows[i].round != ROUNDS || strcmp(rows[i].status, "completed") != 0)
            continue;
        size_t count;
        uint64_t w;
        free(ref);
        ref = NULL;
        float *x = read_dump_ref("ddp", rows[i].client_id, ROUNDS, &count, &w, &ref);
        assert_non_null(x);
        assert_int_equal(count, n);
        assert_int_equal(w, 1);
        double m = 0.0, v = 0.0; /* the noise: x - ref, less than C of it the update */
        for (size_t j = 0; j < n; j++)
            m += (double)x[j] - ref[j];
        m /= (double)n;
        for (size_t j = 0; j < n; j++)
            v += ((double)x[j] - ref[j] - m) * ((double)x[j] - ref[j] - m);
        double spread = sqrt(v / (double)(n - 1));
        if (fabs(spread / sd - 1.0) > 0.03 || fabs(m) > 5.0 * sd / sqrt((double)n) + C / sqrt((double)n))
            fail_msg("client %s: noise mean %g spread %g, want 0 and %g", rows[i].client_id, m, spread, sd);
        assert_int_equal(fm_aggregator_add(a, x, 1), FM_OK);
        free(x);
        summed++;
    }
    assert_int_equal(summed, N - 1);
    assert_int_equal(fm_aggregator_add(a, ref, N - summed), FM_OK); /* (the one that left: unchanged) */
    assert_int_equal(fm_aggregator_result(a, want), FM_OK);
    assert_memory_equal(want, got, sizeof *want * n);
    fprintf(stderr, "  ddp: %d noised inputs (spread %.4g each) and 1 unchanged state over %d: the result, bit for "
            "bit\n", summed, sd, N);
    fm_aggregator_destroy(&a);
    fm_checkpoint_free(&ck);
    free(ref);
    free(want);
    free(got);
    free(rounds);
    free(rows);
}

/* ---- what the coordinator holds ------------------------------------------------ */

#define NEEDLE 8 /* floats: 32 bytes of one client's values */

/* A needle of client id's values of round r (its .plain dump: the model
 * vector it trained) where every value differs from the state it was sent
 * (g, n floats): copied into out; false when it has none. */
static bool needle_of(const char *tag, const char *id, int r, const float *g, size_t n, float *out)
{
    char path[768];
    snprintf(path, sizeof path, "%s/%s-dump/%s-r%d.plain", dir, tag, id, r);
    FILE *f = fopen(path, "rb");
    float *x = malloc(sizeof *x * n);
    bool ok = f && x && fread(x, sizeof *x, n, f) == n;
    if (f)
        fclose(f);
    bool found = false;
    for (size_t at = n / 3; ok && !found && at + NEEDLE < n; at++) {
        found = true;
        for (int k = 0; k < NEEDLE && found; k++)
            found = x[at + (size_t)k] != g[at + (size_t)k];
        if (found)
            memcpy(out, x + at, sizeof *out * NEEDLE);
    }
    free(x);
    return found;
}

/* How many of the k needles occur anywhere in process pid's memory (its
 * writable and readable mappings, read through /proc). */
static int needles_in_memory(pid_t pid, float (*needles)[NEEDLE], int k)
{
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
    FILE *maps = fopen(path, "r");
    snprintf(path, sizeof path, "/proc/%d/mem", (int)pid);
    FILE *mem = fopen(path, "rb");
    assert_non_null(maps);
    assert_non_null(mem);
    bool *hit = calloc((size_t)k, sizeof *hit);
    while (fgets(line, sizeof line, maps)) {
        unsigned long lo, hi;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3 || perms[0] != 'r' || hi - lo > (1ul << 32))
            continue;
        size_t len = hi - lo;
        uint8_t *buf = malloc(len);
        if (buf && fseeko(mem, (off_t)lo, SEEK_SET) == 0 && fread(buf, 1, len, mem) == len)
            for (int j = 0; j < k; j++)
                hit[j] |= memmem(buf, len, needles[j], sizeof needles[j]) != NULL;
        clearerr(mem);
        free(buf);
    }
    fclose(maps);
    fclose(mem);
    int found = 0;
    for (int j = 0; j < k; j++)
        found += hit[j];
    free(hit);
    return found;
}

/* Scans the coordinator of run `tag` for its clients' round-2 values while
 * it waits for the last client, which left at drop_at: returns how many
 * clients' values it holds (the most seen over the scans, until round 2
 * commits). */
static int held_while_waiting(const char *tag, bool secagg, const char *drop_at)
{
    char db[512], log[512];
    pid_t c[N];
    pid_t server = start(tag, secagg, drop_at, 1, c, db, log);
    assert_int_equal(procs_wait(c[N - 1], 180), 0); /* it left (in round 2: the coordinator waits for it) */
    fm_checkpoint_t ck; /* round 1's: the state round 2 was sent */
    int round;
    procs_latest_checkpoint(db, &ck, &round);
    assert_int_equal(round, 1);
    float needles[N - 1][NEEDLE];
    int most = 0, scans = 0;
    while (procs_committed_rounds(db) < ROUNDS) {
        int k = 0;
        for (int i = 0; i < N - 1; i++) {
            char id[16];
            snprintf(id, sizeof id, "c%d", i);
            k += needle_of(tag, id, ROUNDS, ck.global, ck.nglobal, needles[k]);
        }
        int found = k ? needles_in_memory(server, needles, k) : 0;
        most = found > most ? found : most;
        scans += k > 0;
        usleep(300000);
    }
    assert_true(scans > 0);
    assert_int_equal(procs_wait(server, 120), 0);
    for (int i = 0; i < N - 1; i++)
        assert_int_equal(procs_wait(c[i], 30), 0);
    fm_checkpoint_free(&ck);
    return most;
}

/* While it waits for a client that left at unmasking, every other client's
 * masked input already summed, the coordinator's memory holds none of their
 * values; the same scan of a coordinator without secure aggregation, waiting
 * for a client that left before uploading, finds the updates it was sent (so
 * the scan can tell). */
static void test_memory_holds_no_update(void **state)
{
    (void)state;
    int masked = held_while_waiting("mem-secagg", true, "3:" FM_STR(ROUNDS));
    int plain = held_while_waiting("mem-plain", false, "upload:" FM_STR(ROUNDS));
    fprintf(stderr, "  clients whose round-%d values the coordinator's memory holds while it waits: %d of %d with "
            "secure aggregation, %d of %d without\n", ROUNDS, masked, N - 1, plain, N - 1);
    assert_int_equal(masked, 0);
    assert_true(plain > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_drops),
        cmocka_unit_test(test_drops_advertise),
        cmocka_unit_test(test_drops_share),
        cmocka_unit_test(test_drops_masked_input),
        cmocka_unit_test(test_drops_unmask),
        cmocka_unit_test(test_below_threshold_abandoned),
        cmocka_unit_test(test_malicious_unmask_shares),
        cmocka_unit_test(test_malicious_sealed_shares),
        cmocka_unit_test(test_memory_holds_no_update),
        cmocka_unit_test(test_clients_bound_their_updates),
        cmocka_unit_test(test_full_without_pool),
        cmocka_unit_test(test_distributed_dp),
    };
    return procs_run_tests("secagg_e2e", tests, sizeof tests / sizeof tests[0], dir, sizeof dir);
}
