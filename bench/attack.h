/* attack.h - the model-poisoning attacks of the robust-aggregation benchmark,
 * built into bench's fedmoe-attacker only (client/session.c with
 * FM_BENCH_ATTACK), never into fedmoe-client.
 *
 * FEDMOE_ATTACK chooses the attack on the averaged vector, from the state the
 * Task sent (g) and the honestly trained one (x):
 *   signflip:S   g - S (x - g)
 *   scale:S      g + S (x - g)
 *   random:S     g + S n, n standard normal per value (seeded by the round)
 * The client trains and reports its metrics honestly; only its upload lies. */
#ifndef FEDMOE_BENCH_ATTACK_H
#define FEDMOE_BENCH_ATTACK_H

#include <stddef.h>
#include <stdint.h>

/* Remembers the state a Task sent (n values). */
void fm_bench_attack_received(const float *g, size_t n);
/* Turns the trained vector x (n values) into the attack's upload for round. */
void fm_bench_attack_apply(float *x, size_t n, uint32_t round);

#endif
