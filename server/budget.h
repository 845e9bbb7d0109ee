/* budget.h - what one client id (with CURVE: one key) may make the coordinator
 * do, per kind of work: token buckets per id, so that no single key's stream of
 * messages costs everyone else replies, log lines or transactions.
 *
 * Each kind has a rate (tokens a second) and a burst; fm_budget_take spends one
 * token or refuses. What was refused is counted, and fm_budget_flush logs one
 * summary line a kind every FM_BUDGET_SUMMARY_S ("N error replies withheld
 * from M ids in the last 10 s, most from ID (K)") instead of one line each: a
 * flood costs the log a few lines every 10 s, whatever its rate.
 *
 * The table holds at most `max_ids` ids; when a new id finds it full, every
 * bucket starts afresh (with CURVE the ids are the allow-list's, so the table is
 * sized to hold them all; without, anyone may use any id anyway). */
#ifndef FEDMOE_BUDGET_H
#define FEDMOE_BUDGET_H

#include <stdbool.h>

#include "fedmoe/status.h"

#define FM_BUDGET_SUMMARY_S 10.0

typedef enum {
    FM_BUDGET_REPLY = 0,   /* Error replies to its refused messages: 10 a second, bursts of 20 */
    FM_BUDGET_WELCOME,     /* Welcomes to its Hellos: 1 a second, bursts of 4 */
    FM_BUDGET_CHANGE,      /* Hellos that change its partition or counts: 1 a minute, bursts of 2 */
    FM_BUDGET_REPORT,      /* its Error reports written to the log: one in 5 s, bursts of 5 */
    FM_BUDGET_REFUSAL,     /* log lines about its refused messages: one in 5 s, bursts of 5 */
    FM_BUDGET_HANDSHAKE,   /* CURVE handshakes admitted for its key: one in 2 s, bursts of 8 */
    FM_BUDGET_UNREADABLE,  /* its messages that could not be read: one in 10 s, bursts of 4 (past that
                              its key is held: fm_budget_hold) */
    FM_BUDGET_KINDS
} fm_budget_kind;

typedef struct fm_budget fm_budget_t;

/* A table for at most max_ids ids (at least 16). */
fm_status fm_budget_new(fm_budget_t **out, int max_ids);
void fm_budget_free(fm_budget_t **b);
/* Spends one token of id's bucket of kind at now (seconds, never decreasing);
 * false (counted) when the bucket is empty. */
bool fm_budget_take(fm_budget_t *b, const char *id, fm_budget_kind kind, double now);
/* Holds id until `until` (seconds): fm_budget_held answers true till then. A
 * hold is the budget of a key that broke one: none at all for a while. */
void fm_budget_hold(fm_budget_t *b, const char *id, double until, double now);
/* Whether id is held at now. */
bool fm_budget_held(fm_budget_t *b, const char *id, double now);
/* Logs the summary of each kind with refusals once FM_BUDGET_SUMMARY_S has
 * passed since the last (call it every tick). */
void fm_budget_flush(fm_budget_t *b, double now);
/* Refusals of kind since the budget was made (tests, benchmarks). */
unsigned long fm_budget_refused(const fm_budget_t *b, fm_budget_kind kind);

#endif
