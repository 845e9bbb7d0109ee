/* The coordinator's round logic, in-process (coord_harness.h): quorum,
 * deadlines, refused updates, restarts mid-round, silent workers, resume. No
 * child processes, no sockets: each case runs in milliseconds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord_harness.h"
#include "fanout.h"
#include "fedmoe/accountant.h"
#include "fedmoe/dp.h"
#include "fedmoe/clientdata.h"
#include "fedmoe/log.h"
#include "fedmoe/secagg.h"
#include "procs.h"

/* ---- cases ------------------------------------------------------------------- */

static void test_quorum_reached(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    const char *ids[] = {"a", "b", "c"};
    fm_coordinator_t *c = open_run(&cfg, ids, 3, 2, 100);
    assert_int_equal(count_sent(NULL, FEDMOE__ENVELOPE__BODY_TASK, NULL), 3);
    Fedmoe__Envelope *welcome = NULL; /* heartbeats every quarter of the client timeout (15 s) */
    count_sent("a", FEDMOE__ENVELOPE__BODY_WELCOME, &welcome);
    assert_int_equal(welcome->welcome->heartbeat_ms, 3750);
    assert_int_equal(fm_coord_heartbeat_ms(2.0), 1000);
    assert_int_equal(fm_coord_heartbeat_ms(600.0), 5000);
    updates(c, ids, 3, 1.0f, 100, 1.0);
    assert_int_equal(fm_coordinator_round(c), 1);
    expect_rounds(c, &cfg, 1.1, 1); /* all in: commits without waiting */
    /* round 2 opened at once, its task carries the mean: old model + 1 */
    assert_int_equal(count_sent("a", FEDMOE__ENVELOPE__BODY_TASK, NULL), 2);
    assert_int_equal(task_model("a", 1)->data.len, task_model("a", 2)->data.len);
    for (size_t i = 0; i < task_model("a", 1)->data.len / 4; i += 97)
        assert_float_equal(task_step("a", 1, i), 1.0f, 1e-5);
    finish(&c);
}

static void test_deadline_with_straggler(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    const char *ids[] = {"a", "b", "slow"};
    fm_coordinator_t *c = open_run(&cfg, ids, 3, 2, 100);
    updates(c, ids, 2, 0.5f, 100, 5.0);
    for (double t = 10.0; t < 100.0; t += 10.0) { /* the straggler is alive but never uploads */
        for (int i = 0; i < 3; i++)
            heartbeat(c, ids[i], t);
        expect_rounds(c, &cfg, t, 0);
    }
    expect_rounds(c, &cfg, 100.5, 1); /* the deadline */
    expect_status(&cfg, 1, "slow", "dropped");
    expect_status(&cfg, 1, "a", "completed");
    finish(&c);
}

/* An update refused for its contents (NaN, a short tensor) ends that client's
 * part: later updates are refused and the round does not wait for it. One
 * without its Task's nonce is refused too but ends nothing. */
static void test_refused_update_ends_its_part(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    const char *ids[] = {"a", "b", "bad", "nan"};
    fm_coordinator_t *c = open_run(&cfg, ids, 4, 2, 100);
    /* without its Task's nonce (a capture from another round relabelled with
     * this round's number): refused, changes nothing, a's part goes on */
    update(c, "a", 5.0f, 100, REPLAYED, 0.3);
    assert_int_equal(last_error_code("a"), FM_WIRE_WRONG_ROUND);
    update(c, "nan", 0.0f, 100, NOT_FINITE, 0.5);
    assert_int_equal(last_error_code("nan"), FM_WIRE_BAD_VALUE);
    update(c, "bad", 0.0f, 100, SHORT, 1.0); /* one value short */
    assert_int_equal(last_error_code("bad"), FM_WIRE_BAD_TENSOR);
    update(c, "bad", 0.0f, 100, HONEST, 1.5); /* too late: its part ended */
    assert_int_equal(last_error_code("bad"), FM_WIRE_WRONG_ROUND);
    updates(c, ids, 2, 0.0f, 100, 2.0);
    /* nobody is awaited any more: the round commits now, not at the deadline */
    expect_rounds(c, &cfg, 2.1, 1);
    expect_status(&cfg, 1, "bad", "rejected");
    expect_status(&cfg, 1, "nan", "rejected");
    expect_status(&cfg, 1, "a", "completed"); /* its real update, after the replay */
    finish(&c);
}

static void test_rehello_gets_task_again(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    const char *ids[] = {"a", "b"};
    fm_coordinator_t *c = open_run(&cfg, ids, 2, 2, 100);
    assert_int_equal(count_sent("b", FEDMOE__ENVELOPE__BODY_TASK, NULL), 1);
    update(c, "a", 0.0f, 100, HONEST, 1.0);
    /* b restarts mid-round, inside the client timeout: hello, then hello with its data */
    hello(c, "b", 0, 3.0);
    assert_int_equal(count_sent("b", FEDMOE__ENVELOPE__BODY_TASK, NULL), 1);
    hello(c, "b", 100, 4.0);
    assert_int_equal(count_sent("b", FEDMOE__ENVELOPE__BODY_TASK, NULL), 2);
    update(c, "b", 0.0f, 100, HONEST, 5.0);
    expect_rounds(c, &cfg, 5.1, 1);
    finish(&c);
}

/* A Task or an Update lost on the way (a connection replaced under load): the
 * client's heartbeats say it has no Task for the round, or that it sent an
 * Update that never came; 10 s after the Task went out it goes again, at most
 * once per 10 s. Heartbeats without progress (older clients) change nothing. */
static void test_lost_task_sent_again(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    const char *ids[] = {"a", "b"};
    fm_coordinator_t *c = open_run(&cfg, ids, 2, 2, 100);
    assert_int_equal(count_sent("b", FEDMOE__ENVELOPE__BODY_TASK, NULL), 1);
    heartbeat_progress(c, "b", 0, 0, 5.0); /* the Task may still be on its way */
    heartbeat(c, "b", 11.0);               /* no progress reported */
    assert_int_equal(count_sent("b", FEDMOE__ENVELOPE__BODY_TASK, NULL), 1);
    heartbeat_progress(c, "b", 0, 0, 11.5);
    assert_int_equal(count_sent("b", FEDMOE__ENVELOPE__BODY_TASK, NULL), 2);
    heartbeat_progress(c, "b", 0, 0, 12.5); /* just sent again */
    update(c, "a", 0.0f, 100, HONEST, 13.0);
    heartbeat_progress(c, "a", 1, 1, 24.0); /* a's update came: nothing to do */
    assert_int_equal(count_sent("a", FEDMOE__ENVELOPE__BODY_TASK, NULL), 1);
    assert_int_equal(count_sent("b", FEDMOE__ENVELOPE__BODY_TASK, NULL), 2);
    heartbeat_progress(c, "b", 1, 0, 24.0); /* training it */
    assert_int_equal(count_sent("b", FEDMOE__ENVELOPE__BODY_TASK, NULL), 2);
    heartbeat_progress(c, "b", 1, 1, 25.0); /* its update was lost */
    assert_int_equal(count_sent("b", FEDMOE__ENVELOPE__BODY_TASK, NULL), 3);
    update(c, "b", 0.0f, 100, HONEST, 26.0);
    expect_rounds(c, &cfg, 26.1, 1);
    finish(&c);
}

/* Quorum 3 of 3 with one client that heartbeats but never uploads: the deadline
 * is extended FM_ROUND_MAX_EXTENSIONS times, then the client is dropped and the
 * round abandoned; after failing twice it sits out (no round opens without it),
 * for as long as a round could last, whatever Hellos it sends, then it is tried
 * again. (With a fourth
 * client the run goes on without waiting for it: the next test.) */
static void test_silent_worker_capped(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    const char *ids[] = {"a", "b", "mute"};
    fm_coordinator_t *c = open_run(&cfg, ids, 3, 3, 100);
    double t = 0.0;
    for (int attempt = 0; attempt < 2; attempt++) {
        updates(c, ids, 2, 0.0f, 100, t + 1.0);
        double opened = t;
        while (fm_coordinator_round_open(c) && count_sent("mute", FEDMOE__ENVELOPE__BODY_TASK, NULL) == attempt + 1 &&
               t < opened + 1000.0) {
            t += 5.0;
            for (int i = 0; i < 3; i++)
                heartbeat(c, ids[i], t);
            expect_rounds(c, &cfg, t, 0);
        }
        /* each attempt took its timeout plus two extensions, not more */
        assert_true(t > opened + 3 * cfg.round_timeout - 10.0 && t <= opened + 3 * cfg.round_timeout + 5.0);
    }
    /* benched: only a and b are ready, short of the quorum, so no round opens */
    assert_false(fm_coordinator_round_open(c));
    assert_int_equal(count_sent("mute", FEDMOE__ENVELOPE__BODY_TASK, NULL), 2);
    /* ... for as long as one round could last (its timeout and extensions), not
     * for ever: the round number does not advance while no round commits, so a
     * bench counted in rounds alone never ended (every client benched stalled
     * the run for good); then the round is run again with everyone */
    double benched = t, full = 3 * cfg.round_timeout;
    while (!fm_coordinator_round_open(c) && t < benched + full + 20.0) {
        t += 5.0;
        for (int i = 0; i < 3; i++)
            heartbeat(c, ids[i], t);
        hello(c, "mute", 100, t); /* a Hello does not end the bench */
        assert_int_equal(fm_coordinator_tick(c, t), FM_OK);
        assert_true(t >= benched + full - 5.0 || !fm_coordinator_round_open(c));
    }
    assert_true(fm_coordinator_round_open(c));
    assert_int_equal(count_sent("mute", FEDMOE__ENVELOPE__BODY_TASK, NULL), 3);
    finish(&c);
}

/* With a fourth client the run goes on without the one that never uploads. */
static void test_run_goes_on_without_silent_worker(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    const char *ids[] = {"a", "b", "d", "mute"};
    fm_coordinator_t *c = open_run(&cfg, ids, 4, 3, 100);
    double t = 0.0;
    for (int round = 1; round <= 3; round++) {
        updates(c, ids, 3, 0.0f, 100, t + 1.0);
        double opened = t;
        while (rounds_logged(cfg.db) < round && t < opened + 1000.0) {
            t += 5.0;
            for (int i = 0; i < 4; i++)
                heartbeat(c, ids[i], t);
            assert_int_equal(fm_coordinator_tick(c, t), FM_OK);
        }
        /* the first two rounds wait for it until their deadline; then it sits out */
        if (round <= 2)
            assert_true(t - opened >= cfg.round_timeout && t - opened < cfg.round_timeout + 10.0);
        else
            assert_true(t - opened <= 5.0);
    }
    expect_status(&cfg, 2, "mute", "dropped");
    expect_status(&cfg, 3, "mute", ""); /* not selected: no row */
    /* it sat out one round and is tried again in round 4 */
    Fedmoe__Envelope *last = NULL;
    assert_int_equal(count_sent("mute", FEDMOE__ENVELOPE__BODY_TASK, &last), 3);
    assert_int_equal(last->task->round, 4);
    finish(&c);
}

static void test_resume_from_checkpoint(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    const char *ids[] = {"a", "b"};
    fm_coordinator_t *c = open_run(&cfg, ids, 2, 2, 100);
    update(c, "a", 1.0f, 100, HONEST, 1.0);
    update(c, "b", 2.0f, 100, HONEST, 1.0);
    expect_rounds(c, &cfg, 1.0, 1);
    const Fedmoe__Tensor *t2 = task_model("a", 2);
    size_t n = t2->data.len;
    uint8_t *expect = malloc(n);
    memcpy(expect, t2->data.data, n);
    char run[64];
    snprintf(run, sizeof run, "%s", fm_coordinator_run_id(c));
    assert_int_equal(fm_coordinator_stop(c), FM_OK);
    assert_int_equal(count_sent("a", FEDMOE__ENVELOPE__BODY_SHUTDOWN, NULL), 1);
    finish(&c);
    /* a new coordinator on the same database resumes at round 2 with the same state */
    c = start(&cfg);
    assert_string_equal(fm_coordinator_run_id(c), run);
    assert_int_equal(fm_coordinator_round(c), 2);
    for (int i = 0; i < 2; i++)
        hello(c, ids[i], 100, 0.0);
    fm_coordinator_tick(c, 0.0);
    assert_int_equal(task_model("a", 1)->data.len, n);
    assert_memory_equal(task_model("a", 1)->data.data, expect, n);
    free(expect);
    finish(&c);
}

/* ids c000, c001, ... in names, pointed to by ids. */
static void numbered_ids(char (*names)[16], const char **ids, int n)
{
    for (int i = 0; i < n; i++) {
        snprintf(names[i], sizeof names[i], "c%03d", i);
        ids[i] = names[i];
    }
}

/* Tasks go out through the fan-out window (server/fanout.h): with more
 * participants than the window, the first `window` go at the opening, one more
 * for each taken (a progress heartbeat for the round, or an update), and the
 * rest when the places of Tasks not taken run out (FM_FANOUT_ACK_S). */
static void test_tasks_through_window(void **state)
{
    (void)state;
    enum { N = FM_FANOUT_MAX + 16 };
    char names[N][16];
    const char *ids[N];
    numbered_ids(names, ids, N);
    fm_server_config_t cfg;
    fm_coordinator_t *c = open_run(&cfg, ids, N, N, 100); /* (a tiny model: the window is FM_FANOUT_MAX) */
    assert_int_equal(count_sent(NULL, FEDMOE__ENVELOPE__BODY_TASK, NULL), FM_FANOUT_MAX);
    for (int i = 0; i < 10; i++) /* taken: ten more go */
        heartbeat_progress(c, ids[i], 1, 0, 0.1);
    heartbeat_progress(c, ids[10], 0, 0, 0.1); /* (a heartbeat without the task frees nothing) */
    assert_int_equal(count_sent(NULL, FEDMOE__ENVELOPE__BODY_TASK, NULL), FM_FANOUT_MAX + 10);
    update(c, ids[11], 1.0f, 100, HONEST, 0.2); /* an update takes its task too */
    assert_int_equal(count_sent(NULL, FEDMOE__ENVELOPE__BODY_TASK, NULL), FM_FANOUT_MAX + 11);
    assert_int_equal(fm_coordinator_tick(c, 1.0), FM_OK);
    assert_int_equal(count_sent(NULL, FEDMOE__ENVELOPE__BODY_TASK, NULL), FM_FANOUT_MAX + 11);
    assert_int_equal(fm_coordinator_tick(c, 0.1 + FM_FANOUT_ACK_S), FM_OK); /* places run out */
    assert_int_equal(count_sent(NULL, FEDMOE__ENVELOPE__BODY_TASK, NULL), N);
    for (int i = 0; i < N; i++) /* each once, whole (joined from its frames and decoded by the capture) */
        assert_int_equal(count_sent(ids[i], FEDMOE__ENVELOPE__BODY_TASK, NULL), 1);
    for (int i = 0; i < N; i++)
        if (i != 11)
            update(c, ids[i], 1.0f, 100, HONEST, 3.0);
    expect_rounds(c, &cfg, 3.0, 1);
    finish(&c);
}

/* A client that joins while Tasks wait in the window (10,000 virtual clients
 * starting did this) moves the id order of the pool: the Tasks sent after it
 * still carry each participant's K nearest prompts as chosen at the opening
 * (a coordinator that kept pool positions sent another client's prompt, or
 * none: a crash). Every prompt of the pool differs here, so the test sees
 * which one was sent. */
static void test_pool_holds_while_clients_join(void **state)
{
    (void)state;
    enum { N = FM_FANOUT_MAX + 8 };
    char names[N][16];
    const char *ids[N];
    numbered_ids(names, ids, N);
    fm_server_config_t cfg;
    small_config(&cfg, N + 1, N); /* (a partition left for the late client) */
    cfg.spec.clip_norm = 0.0; /* (prompts i apart: clipping would draw the far ones in) */
    fm_coordinator_t *c = start(&cfg);
    for (int i = 0; i < N; i++)
        hello(c, ids[i], 100, 0.0);
    assert_int_equal(fm_coordinator_tick(c, 0.0), FM_OK);
    for (int i = 0; i < N; i++) /* round 1: all taken, all in, distinct prompts */
        heartbeat_progress(c, ids[i], 1, 0, 0.1);
    for (int i = 0; i < N; i++)
        update_prompt(c, ids[i], (float)i, 0.2);
    expect_rounds(c, &cfg, 0.3, 1);
    assert_int_equal(fm_coordinator_round(c), 2);
    int early = count_sent(NULL, FEDMOE__ENVELOPE__BODY_TASK, NULL);
    hello(c, "a-late", 100, 0.4); /* sorts first, no pool entry */
    assert_int_equal(count_sent("a-late", FEDMOE__ENVELOPE__BODY_WELCOME, NULL), 1);
    for (int i = 0; i < N; i++)
        heartbeat_progress(c, ids[i], 2, 1, 0.5);
    assert_int_equal(count_sent(NULL, FEDMOE__ENVELOPE__BODY_TASK, NULL), early + N - FM_FANOUT_MAX);
    for (int i = 0; i < N; i++) {
        /* client i's prompt is i in every value: its nearest are its
         * neighbours in number, never itself */
        Fedmoe__Envelope *task = NULL;
        assert_int_equal(count_sent(ids[i], FEDMOE__ENVELOPE__BODY_TASK, &task), 2);
        assert_int_equal(task->task->n_nonlocal_prompts, (size_t)cfg.spec.model.max_nonlocal);
        for (size_t j = 0; j < task->task->n_nonlocal_prompts; j++) {
            float v;
            memcpy(&v, task->task->nonlocal_prompts[j]->data.data, 4);
            int from = (int)lroundf(v);
            assert_true(from >= 0 && from < N && from != i && abs(from - i) <= cfg.spec.model.max_nonlocal);
        }
    }
    finish(&c);
}

/* A partition that cannot be made is the run's error, said as such: 1,000
 * clients under the default Dirichlet(0.3) with 40 examples each (no draw
 * gives them all 40), 3,000 (more than the dataset holds). It used to be
 * logged as "cannot read the run's dataset" and every client weighed 1. A
 * dataset this machine cannot read still only warns (its clients may have it). */
static void test_partition_that_cannot_be_made(void **state)
{
    (void)state;
    const int counts[] = {1000, 3000};
    const char *why[] = {"no Dirichlet(0.3) draw in 1000 tries gives every one of 1000 clients 40 examples "
                         "(--min-examples)",
                         "3000 clients of 40 examples (--min-examples) need 120000, the dataset has 70000"};
    for (int i = 0; i < 2; i++) {
        fm_server_config_t cfg;
        small_config(&cfg, counts[i], 2);
        cfg.spec.part.kind = FM_PARTITION_DIRICHLET;
        cfg.spec.part.alpha = 0.3;
        fm_coordinator_t *c = NULL;
        assert_int_equal(fm_coordinator_new(&c, &cfg, NULL, NULL), FM_ERR_ARG);
        assert_null(c);
        assert_non_null(strstr(fm_error_last(), why[i]));
    }
    fm_server_config_t cfg;
    small_config(&cfg, 3, 2);
    snprintf(cfg.spec.dataset, sizeof cfg.spec.dataset, "fmnist:/nonexistent");
    fm_coordinator_t *c = NULL;
    assert_int_equal(fm_coordinator_new(&c, &cfg, NULL, NULL), FM_OK);
    fm_coordinator_destroy(&c);
}

/* A participant that cannot read its Task answers it with an Error: its part
 * ends at once (status rejected) and the round commits with the others
 * without waiting for the deadline (it waited the whole round timeout). An
 * Error from a client outside the round changes nothing. */
static void test_error_ends_own_part(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    const char *ids[] = {"a", "b", "c"};
    fm_coordinator_t *c = open_run(&cfg, ids, 3, 2, 100);
    Fedmoe__Envelope env;
    Fedmoe__Error err;
    fedmoe__envelope__init(&env);
    fedmoe__error__init(&err);
    err.code = FM_WIRE_BAD_TENSOR;
    err.text = "task: tensor model: digest mismatch";
    env.body_case = FEDMOE__ENVELOPE__BODY_ERROR;
    env.error = &err;
    inject(c, "c", &env, 0.5);
    updates(c, ids, 2, 1.0f, 100, 1.0);
    expect_rounds(c, &cfg, 1.0, 1); /* (the deadline is at 100 s) */
    expect_status(&cfg, 1, "c", "rejected");
    expect_status(&cfg, 1, "a", "completed");
    /* round 2: c is selected again and takes part */
    updates(c, ids, 3, 1.0f, 100, 2.0);
    expect_rounds(c, &cfg, 2.0, 2);
    expect_status(&cfg, 2, "c", "completed");
    finish(&c);
}

/* ---- client-level differential privacy (--dp-noise) ------------------------- */

/* A comigs run of the four clients a..d, quorum 3, with noise multiplier z,
 * clip C and epsilon budget; the first round opened. */
static fm_coordinator_t *dp_run(fm_server_config_t *cfg, double z, double C, double budget)
{
    small_config(cfg, 4, 3);
    cfg->spec.strategy = FM_STRATEGY_COMIGS;
    cfg->spec.dp.noise = z;
    cfg->spec.dp.clip = C;
    cfg->spec.dp.budget = budget;
    run_spec = cfg->spec;
    fm_coordinator_t *c = start(cfg);
    const char *ids[] = {"a", "b", "c", "d"};
    for (int i = 0; i < 4; i++)
        hello(c, ids[i], 100 * (i + 1), 0.0); /* unequal samples: equal weights all the same */
    assert_int_equal(fm_coordinator_tick(c, 0.0), FM_OK);
    return c;
}

/* Every client of dp_run's sends its Update (its own samples), each value moved by delta. */
static void dp_updates(fm_coordinator_t *c, float delta, double now)
{
    const char *ids[] = {"a", "b", "c", "d"};
    for (int i = 0; i < 4; i++)
        update(c, ids[i], delta, 100 * (uint64_t)(i + 1), HONEST, now);
}

/* The mean and standard deviation of a's first round step over the model. */
static void dp_step(double *mean, double *sd, size_t *n)
{
    *n = task_model("a", 1)->data.len / 4;
    double s = 0.0, ss = 0.0;
    for (size_t i = 0; i < *n; i++) {
        double v = task_step("a", 1, i);
        s += v;
        ss += v * v;
    }
    *mean = s / (double)*n;
    *sd = sqrt(ss / (double)*n - *mean * *mean);
}

static double epsilon_of(double z, int rounds)
{
    fm_accountant_t a;
    fm_accountant_init(&a);
    assert_int_equal(fm_accountant_add(&a, 1.0, z, (uint64_t)rounds), FM_OK);
    return fm_accountant_epsilon(&a, FM_DP_DELTA);
}

/* Updates far beyond C are clipped to C (model and prompt together), weigh
 * the same whatever their samples, and the client that sent nothing counts
 * as unchanged: with 3 of 4 answering, every value moves 3/4 x C / sqrt(n)
 * (noise negligible here); the round log holds the accountant's epsilon. */
static void test_dp_clips_with_fixed_denominator(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    fm_coordinator_t *c = dp_run(&cfg, 1e-9, 0.5, 0.0);
    update(c, "a", 3.0f, 100, HONEST, 1.0);
    update(c, "b", 3.0f, 200, HONEST, 1.0);
    update(c, "c", 3.0f, 300, HONEST, 1.0); /* d stays silent: the deadline commits */
    for (double t = 10.0; t < 100.0; t += 10.0)
        heartbeat(c, "a", t), heartbeat(c, "b", t), heartbeat(c, "c", t), heartbeat(c, "d", t);
    expect_rounds(c, &cfg, 100.5, 1);
    double mean, sd;
    size_t n;
    dp_step(&mean, &sd, &n);
    double want = 0.75 * 0.5 / sqrt((double)n);
    assert_true(fabs(mean - want) < 1e-3 * want);
    assert_true(sd < 1e-4 * want);
    fm_round_row_t r = logged_round(cfg.db, 1);
    assert_float_equal(r.epsilon, epsilon_of(1e-9, 1), 1e-9 * r.epsilon);
    assert_true(r.epsilon > 1e6); /* (that little noise protects nothing, and says so) */
    finish(&c);
}

/* The noise on the mean has standard deviation z C / m (m = 4 selected):
 * measured over the model's values, within 5%; epsilon grows by the
 * accountant's steps. A run without --dp-noise logs no epsilon (NULL). */
static void test_dp_noise_and_epsilon(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    const double z = 2.0, C = 0.5;
    fm_coordinator_t *c = dp_run(&cfg, z, C, 0.0);
    dp_updates(c, 0.01f, 1.0);
    expect_rounds(c, &cfg, 1.1, 1);
    double mean, sd;
    size_t n;
    dp_step(&mean, &sd, &n);
    assert_true(n > 1000);
    assert_true(fabs(sd / (z * C / 4) - 1.0) < 0.05);
    dp_updates(c, 0.01f, 2.0);
    expect_rounds(c, &cfg, 2.1, 2);
    assert_float_equal(logged_round(cfg.db, 1).epsilon, epsilon_of(z, 1), 1e-9);
    assert_float_equal(logged_round(cfg.db, 2).epsilon, epsilon_of(z, 2), 1e-9);
    assert_true(logged_round(cfg.db, 2).epsilon > logged_round(cfg.db, 1).epsilon);
    finish(&c);
    const char *plain[] = {"a", "b"};
    c = open_run(&cfg, plain, 2, 2, 100);
    updates(c, plain, 2, 0.5f, 100, 1.0);
    expect_rounds(c, &cfg, 1.1, 1);
    assert_true(isnan(logged_round(cfg.db, 1).epsilon));
    finish(&c);
}

/* --dp-epsilon-budget between the first round's epsilon and the second's:
 * the run ends cleanly after one round, its clients told, its status
 * finished. */
static void test_dp_budget_ends_run(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    const double z = 1.0, budget = 0.5 * (epsilon_of(z, 1) + epsilon_of(z, 2));
    fm_coordinator_t *c = dp_run(&cfg, z, 0.5, budget);
    dp_updates(c, 0.01f, 1.0);
    assert_int_equal(fm_coordinator_tick(c, 1.1), FM_OK);
    assert_true(fm_coordinator_finished(c));
    assert_int_equal(rounds_logged(cfg.db), 1);
    assert_int_equal(count_sent("a", FEDMOE__ENVELOPE__BODY_TASK, NULL), 1); /* no second round's Task */
    assert_true(count_sent("a", FEDMOE__ENVELOPE__BODY_SHUTDOWN, NULL) >= 1);
    fm_store_t *s;
    fm_run_row_t run;
    procs_open_latest(cfg.db, &s, &run);
    assert_string_equal(run.status, "finished");
    fm_store_run_clear(&run);
    fm_store_close(&s);
    finish(&c);
    /* --dp-noise auto: the least noise that spends the budget over the 5
     * rounds; every round runs */
    c = dp_run(&cfg, FM_DP_NOISE_AUTO, 0.5, 8.0);
    double za = fm_accountant_noise_for(1.0, 5, 8.0, FM_DP_DELTA);
    for (int r = 1; r <= 5; r++) {
        dp_updates(c, 0.01f, r);
        expect_rounds(c, &cfg, r + 0.1, r);
        assert_float_equal(logged_round(cfg.db, r).epsilon, epsilon_of(za, r), 1e-9);
    }
    assert_true(logged_round(cfg.db, 5).epsilon <= 8.0 && logged_round(cfg.db, 5).epsilon > 7.99);
    assert_true(fm_coordinator_finished(c));
    finish(&c);
    /* a budget no round fits is refused at the start, never run without noise:
     * a fixed noise whose first round passes it; auto where no noise is enough
     * (below delta 1e-10 epsilon has a floor near 0.03) */
    const struct { double z, delta, budget; } refused[] = {{0.1, FM_DP_DELTA, 1.0}, {FM_DP_NOISE_AUTO, 1e-10, 0.02}};
    for (int i = 0; i < 2; i++) {
        small_config(&cfg, 4, 3);
        cfg.spec.strategy = FM_STRATEGY_COMIGS;
        cfg.spec.dp.noise = refused[i].z;
        cfg.spec.dp.clip = 0.5;
        cfg.spec.dp.delta = refused[i].delta;
        cfg.spec.dp.budget = refused[i].budget;
        fm_coordinator_t *no = NULL;
        assert_int_equal(fm_coordinator_new(&no, &cfg, NULL, NULL), FM_ERR_ARG);
        assert_null(no);
        assert_non_null(strstr(fm_error_last(), "epsilon"));
    }
}

/* ---- secure aggregation: what the coordinator takes, and when ---------------- */

/* A SecAgg message of phase 0 from id: its keys, claiming number who, echoing
 * nonce (16 bytes). */
static void sa_keys(fm_coordinator_t *c, const char *id, uint32_t round, uint32_t phase, uint32_t who,
                    const uint8_t *nonce, double now)
{
    uint8_t priv[32], record[FM_SA_KEYS_RECORD];
    fm_sa_keys_t k = {.who = who, .b_commit = {1}};
    assert_int_equal(fm_x25519_keypair(priv, k.c_pk), FM_OK);
    assert_int_equal(fm_x25519_keypair(priv, k.s_pk), FM_OK);
    fm_sa_keys_put(&k, record);
    Fedmoe__SecAgg m = FEDMOE__SEC_AGG__INIT;
    m.round = round;
    m.phase = phase;
    m.nonce = (ProtobufCBinaryData){16, (uint8_t *)nonce};
    m.keys = (ProtobufCBinaryData){sizeof record, record};
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    env.body_case = FEDMOE__ENVELOPE__BODY_SECAGG;
    env.secagg = &m;
    inject(c, id, &env, now);
}

/* Secure aggregation's phases take each client's answer once, in its phase,
 * under its own number and its task's nonce: a replayed message, one with
 * another nonce, one claiming another's number, one of the wrong phase and an
 * Update before its phase are refused (the last two end the sender's part),
 * and the round goes on with the others: phase 1 sends the keys of the four
 * that advertised to those four. */
static void test_secagg_takes_each_answer_once(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    small_config(&cfg, 5, 2);
    cfg.spec.strategy = FM_STRATEGY_FEDAVG;
    cfg.spec.secure_aggregation = true;
    fm_coordinator_t *two = NULL; /* (a sum of two tells each its peer's update) */
    assert_int_equal(fm_coordinator_new(&two, &cfg, NULL, NULL), FM_ERR_ARG);
    assert_non_null(strstr(fm_error_last(), "at least three"));
    cfg.min_clients = 3;
    run_spec = cfg.spec;
    assert_int_equal(fm_run_spec_finish(&run_spec), FM_OK);
    fm_coordinator_t *c = start(&cfg);
    const char *ids[] = {"a", "b", "c", "d", "e"};
    for (int i = 0; i < 5; i++)
        hello(c, ids[i], 100, 0.0);
    assert_int_equal(fm_coordinator_tick(c, 0.0), FM_OK);
    uint8_t nonce[5][16];
    uint32_t who[5];
    for (int i = 0; i < 5; i++) {
        Fedmoe__Envelope *t = NULL;
        assert_int_equal(count_sent(ids[i], FEDMOE__ENVELOPE__BODY_TASK, &t), 1);
        assert_non_null(t->task->secagg);
        assert_int_equal(t->task->secagg->n, 5);
        assert_int_equal(t->task->secagg->t, 3);
        assert_int_equal(t->task->secagg->weight, 100);
        who[i] = t->task->secagg->who;
        memcpy(nonce[i], t->task->nonce.data, 16);
    }
    uint8_t other[16] = {0};
    sa_keys(c, "a", 1, 0, who[0], other, 1.0); /* another task's nonce */
    assert_int_equal(last_error_code("a"), FM_WIRE_WRONG_ROUND);
    sa_keys(c, "a", 1, 0, who[0], nonce[0], 1.0);
    int errors = count_sent("a", FEDMOE__ENVELOPE__BODY_ERROR, NULL);
    sa_keys(c, "a", 1, 0, who[0], nonce[0], 1.0); /* replayed */
    assert_int_equal(count_sent("a", FEDMOE__ENVELOPE__BODY_ERROR, NULL), errors + 1);
    assert_int_equal(last_error_code("a"), FM_WIRE_WRONG_ROUND);
    sa_keys(c, "b", 1, 0, who[0], nonce[1], 1.0); /* a's number */
    assert_int_equal(last_error_code("b"), FM_WIRE_BAD_VALUE);
    sa_keys(c, "c", 1, 1, who[2], nonce[2], 1.0); /* phase 1 in phase 0 */
    assert_int_equal(last_error_code("c"), FM_WIRE_WRONG_ROUND);
    for (int i = 2; i < 5; i++)
        sa_keys(c, ids[i], 1, 0, who[i], nonce[i], 2.0);
    assert_int_equal(fm_coordinator_tick(c, 2.0), FM_OK); /* every one still expected answered: phase 1 */
    for (int i = 0; i < 5; i++) {
        Fedmoe__Envelope *m = NULL;
        assert_int_equal(count_sent(ids[i], FEDMOE__ENVELOPE__BODY_SECAGG, &m), i == 1 ? 0 : 1);
        if (m) {
            assert_int_equal(m->secagg->phase, 1);
            assert_int_equal(m->secagg->keys.len, 4 * FM_SA_KEYS_RECORD);
        }
    }
    sa_keys(c, "d", 1, 0, who[3], nonce[3], 3.0); /* phase 0's answer again, in phase 1 */
    assert_int_equal(last_error_code("d"), FM_WIRE_WRONG_ROUND);
    update(c, "e", 0.1f, 100, HONEST, 3.0); /* a plain Update: not in phase 2, not masked */
    assert_int_equal(last_error_code("e"), FM_WIRE_WRONG_ROUND);
    finish(&c);
}

int main(void)
{
    fm_log_set_level(FM_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_secagg_takes_each_answer_once),
        cmocka_unit_test(test_quorum_reached),
        cmocka_unit_test(test_deadline_with_straggler),
        cmocka_unit_test(test_refused_update_ends_its_part),
        cmocka_unit_test(test_rehello_gets_task_again),
        cmocka_unit_test(test_lost_task_sent_again),
        cmocka_unit_test(test_silent_worker_capped),
        cmocka_unit_test(test_run_goes_on_without_silent_worker),
        cmocka_unit_test(test_resume_from_checkpoint),
        cmocka_unit_test(test_tasks_through_window),
        cmocka_unit_test(test_pool_holds_while_clients_join),
        cmocka_unit_test(test_partition_that_cannot_be_made),
        cmocka_unit_test(test_error_ends_own_part),
        cmocka_unit_test(test_dp_clips_with_fixed_denominator),
        cmocka_unit_test(test_dp_noise_and_epsilon),
        cmocka_unit_test(test_dp_budget_ends_run),
    };
    return procs_run_tests("coordinator", tests, sizeof tests / sizeof tests[0], coord_dir, sizeof coord_dir);
}
