/* The coordinator's pure decision modules on their own, without a coordinator,
 * sockets or a clock: the round state machine (round.c), the pace of Tasks and
 * upload grants (fanout.c), the registry of clients (registry.c) and the
 * per-key budgets and holds (budget.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "budget.h"
#include "fanout.h"
#include "registry.h"
#include "round.h"

/* ---- round.c --------------------------------------------------------------- */

static void open3(fm_round_t *r, double now)
{
    int slots[3] = {4, 0, 7};
    char ids[3][64] = {"c4", "c0", "c7"};
    assert_int_equal(fm_round_open(r, slots, ids, 3, now), FM_OK);
}

/* Participants are found by registry slot; every one is awaited at opening; a
 * round with all in commits before its deadline, and the number advances only
 * on a commit. */
static void test_round_all_in(void **state)
{
    (void)state;
    fm_round_t r;
    fm_round_init(&r, 5, 10.0);
    assert_int_equal(r.state, FM_ROUND_WAITING);
    assert_null(fm_round_find(&r, 0)); /* (nothing open) */
    open3(&r, 100.0);
    assert_int_equal(fm_round_open(&r, (int[]){1}, (char[][64]){"x"}, 1, 100.0), FM_ERR_STATE); /* already open */
    assert_int_equal(r.deadline, 110.0);
    assert_int_equal(fm_round_count(&r, FM_PART_AWAITED), 3);
    fm_participant_t *p7 = fm_round_find(&r, 7), *p0 = fm_round_find(&r, 0), *p4 = fm_round_find(&r, 4);
    assert_non_null(p7);
    assert_string_equal(p7->row.client_id, "c7");
    assert_int_equal(p7->row.round, 5);
    assert_null(fm_round_find(&r, 1));
    assert_null(fm_round_find(&r, 8));
    assert_int_equal(fm_round_decide(&r, 101.0, 2), FM_VERDICT_WAIT);
    float *prompt = malloc(4 * sizeof(float));
    fm_round_complete(&r, p7, &prompt);
    assert_null(prompt); /* the round owns it now */
    assert_non_null(p7->prompt);
    fm_round_complete(&r, p0, NULL);
    assert_int_equal(fm_round_decide(&r, 102.0, 2), FM_VERDICT_WAIT); /* c4 still awaited, before the deadline */
    fm_round_complete(&r, p4, NULL);
    assert_int_equal(fm_round_decide(&r, 103.0, 3), FM_VERDICT_COMMIT); /* nobody awaited: no need to wait */
    fm_round_close(&r, false);
    assert_int_equal(r.number, 5); /* abandoned: the number stays */
    open3(&r, 200.0);
    assert_int_equal(fm_round_find(&r, 7)->row.round, 5);
    fm_round_close(&r, true);
    assert_int_equal(r.number, 6);
    assert_int_equal(r.state, FM_ROUND_WAITING);
    fm_round_free(&r);
}

/* Only awaited participants move: a completed one cannot be refused or lost,
 * a refused one cannot complete; a gone one that says hello again is awaited
 * again (its Task must go again), others are not. */
static void test_round_transitions(void **state)
{
    (void)state;
    fm_round_t r;
    fm_round_init(&r, 1, 10.0);
    open3(&r, 0.0);
    fm_participant_t *a = fm_round_find(&r, 4), *b = fm_round_find(&r, 0), *c = fm_round_find(&r, 7);
    fm_round_complete(&r, a, NULL);
    fm_round_refuse(&r, a);
    fm_round_lose(&r, a);
    assert_int_equal(a->state, FM_PART_COMPLETED);
    assert_false(fm_round_rejoin(&r, a));
    fm_round_refuse(&r, b);
    fm_round_complete(&r, b, NULL);
    assert_int_equal(b->state, FM_PART_REFUSED);
    assert_false(fm_round_rejoin(&r, b));
    fm_round_lose(&r, c);
    assert_int_equal(c->state, FM_PART_GONE);
    assert_int_equal(fm_round_count(&r, FM_PART_AWAITED), 0);
    assert_true(fm_round_rejoin(&r, c));
    assert_int_equal(c->state, FM_PART_AWAITED);
    assert_true(fm_round_rejoin(&r, c)); /* still awaited: true again */
    assert_string_equal(fm_part_state_name(FM_PART_REFUSED), "rejected");
    assert_string_equal(fm_part_state_name(FM_PART_GONE), "dropped");
    assert_string_equal(fm_part_state_name(FM_PART_DROPPED), "dropped");
    assert_string_equal(fm_part_state_name((fm_part_state)9), "?");
    fm_round_free(&r);
}

/* Short of the quorum at the deadline with participants still working: the
 * deadline moves on, at most FM_ROUND_MAX_EXTENSIONS times; then the awaited
 * are dropped and the round commits with its quorum or is abandoned. Nobody
 * left who could reach the quorum: no extension. */
static void test_round_deadlines(void **state)
{
    (void)state;
    fm_round_t r;
    fm_round_init(&r, 1, 10.0);
    open3(&r, 0.0);
    fm_round_complete(&r, fm_round_find(&r, 4), NULL);
    assert_int_equal(fm_round_decide(&r, 9.9, 2), FM_VERDICT_WAIT);
    for (int e = 1; e <= FM_ROUND_MAX_EXTENSIONS; e++) {
        assert_int_equal(fm_round_decide(&r, 10.0 * e, 2), FM_VERDICT_EXTEND);
        assert_int_equal(r.extensions, e);
        assert_int_equal(r.deadline, 10.0 * e + 10.0);
    }
    assert_int_equal(fm_round_decide(&r, 30.0, 2), FM_VERDICT_ABANDON);
    assert_int_equal(fm_round_count(&r, FM_PART_DROPPED), 2);
    fm_round_close(&r, false);

    /* the quorum reached by the deadline: commit, the late one dropped */
    open3(&r, 0.0);
    fm_round_complete(&r, fm_round_find(&r, 4), NULL);
    fm_round_complete(&r, fm_round_find(&r, 0), NULL);
    assert_int_equal(fm_round_decide(&r, 10.0, 2), FM_VERDICT_COMMIT);
    assert_int_equal(fm_round_find(&r, 7)->state, FM_PART_DROPPED);
    fm_round_close(&r, true);

    /* one completed, one refused, one awaited, quorum 3: it cannot be reached */
    open3(&r, 0.0);
    fm_round_complete(&r, fm_round_find(&r, 4), NULL);
    fm_round_refuse(&r, fm_round_find(&r, 0));
    assert_int_equal(fm_round_decide(&r, 10.0, 3), FM_VERDICT_ABANDON);
    fm_round_close(&r, false);
    assert_int_equal(r.number, 2);
    fm_round_free(&r);
}

/* ---- fanout.c -------------------------------------------------------------- */

/* The window is 8 MiB of Tasks, within FM_FANOUT_MIN..FM_FANOUT_MAX. */
static void test_fanout_window(void **state)
{
    (void)state;
    fm_fanout_t f = {0};
    assert_int_equal(fm_fanout_reset(&f, 10, 1 << 20), FM_OK);
    assert_int_equal(f.window, 8);
    assert_int_equal(fm_fanout_reset(&f, 10, 100), FM_OK);
    assert_int_equal(f.window, FM_FANOUT_MAX);
    assert_int_equal(fm_fanout_reset(&f, 10, (size_t)100 << 20), FM_OK);
    assert_int_equal(f.window, FM_FANOUT_MIN);
    assert_int_equal(fm_fanout_reset(&f, 0, 0), FM_OK); /* (no participants: nothing to send) */
    assert_int_equal(fm_fanout_next(&f, 0.0), -1);
    fm_fanout_free(&f);
}

/* Tasks go in the order asked, a window at a time; a place frees when its
 * client takes its Task, or FM_FANOUT_ACK_S after it went. */
static void test_fanout_order_and_places(void **state)
{
    (void)state;
    fm_fanout_t f = {0};
    assert_int_equal(fm_fanout_reset(&f, 12, 1 << 20), FM_OK); /* window 8 */
    for (int i = 11; i >= 0; i--)
        fm_fanout_push(&f, i);
    for (int k = 0; k < 8; k++)
        assert_int_equal(fm_fanout_next(&f, 1.0), 11 - k);
    assert_int_equal(fm_fanout_next(&f, 1.0), -1); /* the window is full */
    assert_true(fm_fanout_queued(&f, 3));
    assert_false(fm_fanout_queued(&f, 11));
    assert_true(fm_fanout_sent_at(&f, 11) == 1.0);
    assert_true(fm_fanout_sent_at(&f, 3) < 0.0);
    fm_fanout_done(&f, 9);
    assert_int_equal(fm_fanout_next(&f, 2.0), 3);
    assert_int_equal(fm_fanout_next(&f, 2.0), -1);
    /* nobody takes anything: after FM_FANOUT_ACK_S the places held since 1.0 free */
    assert_int_equal(fm_fanout_next(&f, 1.0 + FM_FANOUT_ACK_S - 0.01), -1);
    assert_int_equal(fm_fanout_next(&f, 1.0 + FM_FANOUT_ACK_S), 2);
    assert_int_equal(fm_fanout_next(&f, 1.0 + FM_FANOUT_ACK_S), 1);
    assert_int_equal(fm_fanout_next(&f, 1.0 + FM_FANOUT_ACK_S), 0);
    assert_int_equal(fm_fanout_next(&f, 1.0 + FM_FANOUT_ACK_S), -1); /* the queue is empty */
    fm_fanout_free(&f);
}

/* A participant is queued or in flight once at most: pushed twice it is sent
 * once; pushed while in flight it gives up its place and queues at the end; one
 * that leaves the round while queued is skipped when its turn comes, and
 * queues again when pushed again. */
static void test_fanout_once(void **state)
{
    (void)state;
    fm_fanout_t f = {0};
    assert_int_equal(fm_fanout_reset(&f, 5, (size_t)100 << 20), FM_OK); /* window 2 */
    fm_fanout_push(&f, 0);
    fm_fanout_push(&f, 0);
    fm_fanout_push(&f, 1);
    fm_fanout_push(&f, 2);
    fm_fanout_push(&f, 3);
    fm_fanout_push(&f, 7);  /* out of range: ignored */
    fm_fanout_push(&f, -1); /* ditto */
    assert_int_equal(fm_fanout_next(&f, 0.0), 0);
    fm_fanout_push(&f, 0); /* due again while in flight: to the end of the queue */
    assert_true(fm_fanout_sent_at(&f, 0) < 0.0);
    assert_int_equal(fm_fanout_next(&f, 0.0), 1);
    assert_int_equal(fm_fanout_next(&f, 0.0), 2); /* 0 gave up its place */
    assert_int_equal(fm_fanout_next(&f, 0.0), -1);
    fm_fanout_done(&f, 3); /* left while queued */
    assert_false(fm_fanout_queued(&f, 3));
    fm_fanout_done(&f, 1);
    assert_int_equal(fm_fanout_next(&f, 0.0), 0); /* 3 skipped */
    fm_fanout_done(&f, 2);
    fm_fanout_done(&f, 0);
    assert_int_equal(fm_fanout_next(&f, 0.0), -1);
    fm_fanout_push(&f, 4);
    fm_fanout_push(&f, 3);
    assert_int_equal(fm_fanout_next(&f, 0.0), 4);
    assert_int_equal(fm_fanout_next(&f, 0.0), 3);
    assert_int_equal(fm_fanout_next(&f, 0.0), -1);
    fm_fanout_free(&f);
}

/* ---- registry.c ------------------------------------------------------------ */

/* Slots stay fixed while the id order (every deterministic choice's) follows
 * the ids; lookup by id; partitions: the lowest free one, one owner each, and
 * released with -1. Destroying frees the pool entries (the sanitizers' leak
 * check). */
static void test_registry(void **state)
{
    (void)state;
    fm_registry_t *r = NULL;
    assert_int_equal(fm_registry_new(&r, 3), FM_OK);
    const char *ids[] = {"m", "b", "z", "a"};
    for (int i = 0; i < 4; i++)
        assert_int_equal(fm_registry_add(r, ids[i]), i);
    assert_int_equal(fm_registry_count(r), 4);
    const int *order = fm_registry_sorted(r);
    int want[] = {3, 1, 0, 2}; /* a b m z */
    for (int i = 0; i < 4; i++)
        assert_int_equal(order[i], want[i]);
    assert_int_equal(fm_registry_find(r, "z"), 2);
    assert_int_equal(fm_registry_find(r, "q"), -1);
    assert_string_equal(fm_registry_at(r, 1)->id, "b");
    assert_int_equal(fm_registry_at(r, 1)->partition, -1);

    assert_int_equal(fm_registry_free_partition(r), 0);
    fm_registry_set_partition(r, 2, 0);
    fm_registry_set_partition(r, 0, 2);
    assert_int_equal(fm_registry_free_partition(r), 1);
    assert_int_equal(fm_registry_partition_owner(r, 0), 2);
    assert_int_equal(fm_registry_partition_owner(r, 1), -1);
    assert_int_equal(fm_registry_partition_owner(r, 5), -1); /* out of range */
    fm_registry_set_partition(r, 1, 1);
    assert_int_equal(fm_registry_free_partition(r), -1); /* all held */
    fm_registry_set_partition(r, 2, -1); /* released */
    assert_int_equal(fm_registry_partition_owner(r, 0), -1);
    assert_int_equal(fm_registry_free_partition(r), 0);
    assert_int_equal(fm_registry_at(r, 2)->partition, -1);

    fm_registry_at(r, 3)->prompt = calloc(8, sizeof(float));
    fm_registry_destroy(&r);
    assert_null(r);
    fm_registry_destroy(&r); /* safe on NULL */
}

/* ---- budget.c -------------------------------------------------------------- */

/* A kind's burst is spent, then it refills at its rate; each id has its own
 * buckets; refusals are counted. Unreadable messages: 4, then one in 10 s. */
static void test_budget_rates(void **state)
{
    (void)state;
    fm_budget_t *b;
    assert_int_equal(fm_budget_new(&b, 16), FM_OK);
    for (int i = 0; i < 4; i++)
        assert_true(fm_budget_take(b, "k1", FM_BUDGET_UNREADABLE, 100.0));
    assert_false(fm_budget_take(b, "k1", FM_BUDGET_UNREADABLE, 100.0));
    assert_true(fm_budget_take(b, "k2", FM_BUDGET_UNREADABLE, 100.0)); /* another key's own */
    assert_false(fm_budget_take(b, "k1", FM_BUDGET_UNREADABLE, 109.0));
    assert_true(fm_budget_take(b, "k1", FM_BUDGET_UNREADABLE, 110.5)); /* one in 10 s */
    assert_false(fm_budget_take(b, "k1", FM_BUDGET_UNREADABLE, 110.6));
    assert_int_equal(fm_budget_refused(b, FM_BUDGET_UNREADABLE), 3);
    /* the other kinds of k1 untouched */
    for (int i = 0; i < 8; i++)
        assert_true(fm_budget_take(b, "k1", FM_BUDGET_HANDSHAKE, 110.6));
    assert_false(fm_budget_take(b, "k1", FM_BUDGET_HANDSHAKE, 110.6));
    fm_budget_free(&b);
    assert_null(b);
}

/* A hold lasts until its end and only for its id; a shorter hold does not
 * shorten a longer one. */
static void test_budget_hold(void **state)
{
    (void)state;
    fm_budget_t *b;
    assert_int_equal(fm_budget_new(&b, 16), FM_OK);
    assert_false(fm_budget_held(b, "k1", 0.0));
    fm_budget_hold(b, "k1", 60.0, 0.0);
    assert_true(fm_budget_held(b, "k1", 0.0));
    assert_true(fm_budget_held(b, "k1", 59.9));
    assert_false(fm_budget_held(b, "k2", 30.0));
    fm_budget_hold(b, "k1", 40.0, 30.0);
    assert_true(fm_budget_held(b, "k1", 50.0));
    assert_false(fm_budget_held(b, "k1", 60.0));
    /* a flood of new ids starts the table afresh (16 ids here), but not a hold */
    fm_budget_hold(b, "k1", 200.0, 100.0);
    for (int i = 0; i < 100; i++) {
        char id[16];
        snprintf(id, sizeof id, "new%d", i);
        assert_true(fm_budget_take(b, id, FM_BUDGET_UNREADABLE, 100.0));
        assert_false(fm_budget_held(b, id, 100.0));
    }
    assert_true(fm_budget_held(b, "k1", 150.0));
    assert_false(fm_budget_held(b, "k1", 200.0));
    fm_budget_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_all_in),        cmocka_unit_test(test_round_transitions),
        cmocka_unit_test(test_round_deadlines),     cmocka_unit_test(test_fanout_window),
        cmocka_unit_test(test_fanout_order_and_places), cmocka_unit_test(test_fanout_once),
        cmocka_unit_test(test_registry),            cmocka_unit_test(test_budget_rates),
        cmocka_unit_test(test_budget_hold),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
