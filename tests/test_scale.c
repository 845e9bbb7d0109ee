/* The coordinator under load, for real: fedmoe-server with CURVE and 500
 * protocol-correct clients of bench/fedmoe-loadgen that answer every Task at
 * once (a burst of 500 uploads of the whole model). The rounds finish, and the
 * global state is bit-identical to the same run with 5 clients: the 500
 * upload the same 5 updates 100 times each, and the aggregation is exact and
 * order-independent, so at scale too. The coordinator's peak memory stays
 * under a bound of a few models plus a fixed base plus libzmq's own memory per
 * connection: no copy of the model per client (before the fan-out window, the
 * shared Task part and the spilled first-round updates it held 1.07 models per
 * client, 500 MB here). (Before heartbeats reported progress, a
 * burst could lose Tasks with replaced connections and leave a round waiting
 * for ever.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coordinator.h"
#include "fanout.h"
#include "fedmoe/aggregate.h"
#include "fedmoe/store.h"
#include "procs.h"

static char dir[256];

/* The bound on the coordinator's peak resident memory: a fixed base (the
 * program, SQLite, libzmq's threads), the kept-updates budget, a few copies of
 * the model (global state, accumulator at 16 bytes a value, the shared Task
 * part, a decoded update, the Tasks in the fan-out window) and libzmq's
 * memory per connection (its queues' 16 KB chunks, buffers, CURVE state:
 * about 45 KB measured idle). */
static long peak_bound_kb(int clients, size_t model_bytes)
{
    return 48 * 1024 + (long)(FM_AGG_MEMORY >> 10) + (long)(12 * model_bytes + FM_FANOUT_BYTES) / 1024 +
           64L * clients;
}

/* The peak memory the coordinator logged as it ended (KB). */
static long logged_peak_kb(const char *log)
{
    FILE *f = fopen(log, "r");
    assert_non_null(f);
    char line[512];
    long kb = -1;
    while (fgets(line, sizeof line, f)) {
        const char *at = strstr(line, "peak memory ");
        if (at)
            kb = strtol(at + 12, NULL, 10);
    }
    fclose(f);
    return kb;
}

/* The final global vector and prompt of a run of `clients` loadgen clients
 * (2 rounds, full strategy), as bytes (malloc'd) and their length. */
static uint8_t *run_with(int clients, size_t *len)
{
    char key[512], pub[512], allow[512], db[600], log[600], lglog[600], ep[64], n[16], parts[16];
    procs_server_keys(key, pub, allow);
    snprintf(n, sizeof n, "%d", clients);
    char *mk[] = {BIN("bench/fedmoe-loadgen"), "--keys", allow, "--clients", n, "--make-keys", NULL};
    snprintf(lglog, sizeof lglog, "%s/keys-%d.log", dir, clients);
    assert_int_equal(procs_wait(procs_spawn(mk, lglog), 60), 0);
    snprintf(db, sizeof db, "%s/scale-%d.db", dir, clients);
    snprintf(log, sizeof log, "%s/server-%d.log", dir, clients);
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", procs_free_port());
    snprintf(parts, sizeof parts, "%d", clients);
    char *sargv[] = {BIN("server/fedmoe-server"), "--bind", ep, "--db", db, "--rounds", "2", "--min-clients", n,
                     "--partitions", parts, "--client-dirichlet", "0.3", "--round-timeout", "300", "--max-connections",
                     "1000", NULL};
    pid_t server = procs_spawn_server(sargv, log);
    char *largv[] = {BIN("bench/fedmoe-loadgen"), "--connect", ep, "--clients", n, "--keys", allow, "--server-key",
                     pub, NULL};
    snprintf(lglog, sizeof lglog, "%s/loadgen-%d.log", dir, clients);
    pid_t lg = procs_spawn(largv, lglog);
    assert_int_equal(procs_wait(server, 400), 0);
    assert_int_equal(procs_wait(lg, 60), 0);
    assert_int_equal(procs_committed_rounds(db), 2);
    fm_checkpoint_t ck;
    int round;
    procs_latest_checkpoint(db, &ck, &round);
    assert_int_equal(round, 2);
    assert_int_equal(ck.pool_count, clients); /* everyone's prompt is in the pool */
    long peak = logged_peak_kb(log), bound = peak_bound_kb(clients, sizeof(float) * ck.nglobal);
    fprintf(stderr, "%d clients: coordinator peak %ld KB, bound %ld KB\n", clients, peak, bound);
    assert_true(peak > 0 && peak <= bound);
    fm_checkpoint_free(&ck);
    return procs_final_state(db, len);
}

static void test_500_clients_as_5(void **state)
{
    (void)state;
    size_t n5, n500;
    uint8_t *five = run_with(5, &n5);
    uint8_t *many = run_with(500, &n500);
    assert_int_equal(n5, n500);
    assert_memory_equal(five, many, n5);
    free(five);
    free(many);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_500_clients_as_5),
    };
    return procs_run_tests("scale", tests, sizeof tests / sizeof tests[0], dir, sizeof dir);
}
