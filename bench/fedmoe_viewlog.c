/* fedmoe-viewlog: writes a round log of R rounds x C clients through the
 * store (the coordinator's own writer, one transaction a round) with made-up
 * metrics, for measuring the browser view's API on a log of that size
 * (bench/view.sh). Not a run: no model, no checkpoint state.
 *   fedmoe-viewlog DB ROUNDS CLIENTS */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/clock.h"
#include "fedmoe/log.h"
#include "fedmoe/rng.h"
#include "fedmoe/store.h"

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: fedmoe-viewlog DB ROUNDS CLIENTS\n");
        return 2;
    }
    int rounds = atoi(argv[2]), clients = atoi(argv[3]);
    if (rounds < 1 || rounds > 100000 || clients < 1 || clients > 100000) {
        fprintf(stderr, "fedmoe-viewlog: ROUNDS and CLIENTS must be 1..100000\n");
        return 2;
    }
    fm_store_t *st;
    if (fm_store_open(&st, argv[1], false) != FM_OK) {
        fprintf(stderr, "fedmoe-viewlog: %s\n", fm_error_last());
        return 1;
    }
    const char *run = "run-viewlog";
    fm_client_round_row_t *rows = calloc((size_t)clients, sizeof *rows);
    fm_rng_t r;
    fm_rng_init(&r, 1, 0);
    fm_status s = rows ? fm_store_create_run(st, run, "{\"strategy\":\"comigs\",\"synthetic\":true}", 1, "comigs", rounds)
                       : FM_ERR_NOMEM;
    uint8_t ckpt[32] = {0};
    for (int k = 1; s == FM_OK && k <= rounds; k++) {
        double acc = 0.6 + 0.35 * (1.0 - exp(-k / 50.0));
        fm_round_row_t rr = {.round = k, .selected = clients, .bytes_up = 2000000LL * clients,
                             .bytes_down = 2000000LL * clients, .seconds = 5.0};
        fm_clock_utc(rr.started_at);
        fm_clock_utc(rr.finished_at);
        for (int i = 0; i < clients; i++) {
            fm_client_round_row_t *c = &rows[i];
            memset(c, 0, sizeof *c);
            c->round = k;
            snprintf(c->client_id, sizeof c->client_id, "client-%05d", i);
            bool dropped = fm_rng_uniform(&r) < 0.02;
            snprintf(c->status, sizeof c->status, "%s", dropped ? "dropped" : "completed");
            c->test_accuracy = acc + 0.05 * (fm_rng_uniform(&r) - 0.5);
            c->train_loss = c->val_loss = c->test_loss = 1.0 - c->test_accuracy;
            c->generalist_share = fm_rng_uniform(&r);
            c->train_samples = 1000;
            c->test_samples = c->val_samples = 300;
            c->test_correct = (int64_t)(300 * c->test_accuracy);
            c->seconds = 4.0 + fm_rng_uniform(&r);
            c->bytes_up = c->bytes_down = 2000000;
            rr.completed += !dropped;
            rr.test_accuracy += c->test_accuracy / clients;
        }
        rr.dropped = rr.selected - rr.completed;
        rr.test_loss = rr.train_loss = 1.0 - rr.test_accuracy;
        rr.val_accuracy = rr.test_accuracy;
        rr.generalist_share = 0.5;
        fm_sha256_hex(ckpt, sizeof ckpt, rr.checkpoint_sha256);
        s = fm_store_commit_round(st, run, &rr, rows, clients, ckpt, sizeof ckpt);
    }
    if (s == FM_OK)
        s = fm_store_set_run_status(st, run, "finished");
    if (s != FM_OK)
        fprintf(stderr, "fedmoe-viewlog: %s\n", fm_error_last());
    free(rows);
    fm_store_close(&st);
    return s == FM_OK ? 0 : 1;
}
