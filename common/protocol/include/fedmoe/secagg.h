/* secagg.h - secure aggregation's masking (Bonawitz et al., CCS 2017) as
 * objects without I/O: what each client computes in each phase, and how the
 * coordinator turns the sum of masked inputs into the plain sum once enough
 * clients are left, whoever dropped between phases. The transport, deadlines
 * and the round's state machine are the caller's.
 *
 * The phases of one round, for the participants numbered 1..n (their Shamir
 * x), with threshold t:
 *   0 advertise  every client makes two X25519 pairs (c: to encrypt its
 *                shares, s: to agree on masks) and sends the public keys;
 *                U1 = the clients whose keys came (>= t, else the round is
 *                abandoned).
 *   1 share      each client of U1 draws its self-mask seed b, splits b and
 *                its s secret key into n Shamir shares (t of them rebuild
 *                either) and sends every other client of U1 its two shares,
 *                sealed with AES-256-GCM under a key agreed from the c keys
 *                (the coordinator relays them and cannot read them); U2 = the
 *                clients whose shares came.
 *   2 masked     each client of U2 sends y = v + PRG(b) + sum over the
 *                other clients j of U2 of +-PRG(s_ij), where v is its
 *                update in the aggregator's fixed point (weight x value x
 *                2^40, truncated: aggregate.h) and, last, its weight; + when
 *                its number is below j's, - above; s_ij is agreed from the
 *                s keys (X25519 then HKDF-SHA-256). U3 = the clients whose
 *                masked input came: the coordinator sums their y.
 *   3 unmask     each client of U3 that is told U3 sends, for every client
 *                of U3, its share of that client's b, and for every client
 *                of U2 not in U3, its share of that client's s key (never
 *                both for one client). With t such answers the coordinator
 *                rebuilds them, removes every self mask of U3 and every pair
 *                mask between U3 and the dropped, and holds the plain sum of
 *                U3's updates and weights.
 * Everything is in the ring of integers mod 2^128: the aggregator's own
 * accumulator, whose sums cannot wrap (|w x 2^40| < 2^99 a value, at most
 * 2^28 clients), so the unmasked sum is bit for bit the plaintext one.
 * Masks are ChaCha20 keystreams of 256-bit seeds, 16 bytes a value. */
#ifndef FEDMOE_SECAGG_H
#define FEDMOE_SECAGG_H

#include <stddef.h>
#include <stdint.h>

#include "fedmoe/secagg_crypto.h"
#include "fedmoe/status.h"

typedef unsigned __int128 fm_u128;

/* Participants of one secure-aggregation round at most: the coordinator
 * relays every pair's sealed shares (n^2 of them, 156 bytes each: 156 MB at
 * 1,000), every client expands n - 1 pair masks, and a message of keys or
 * shares stays within the wire's 1,024 embedded messages. */
#define FM_SA_MAX_CLIENTS 1000

/* Phase 0: a client's public keys. */
typedef struct {
    uint32_t who; /* 1..n */
    uint8_t c_pk[FM_X25519_BYTES], s_pk[FM_X25519_BYTES];
    uint8_t b_commit[32]; /* binds its self-mask seed: the coordinator checks what it rebuilds */
} fm_sa_keys_t;

/* Phase 1: the sealed shares of `from`'s secrets for `to` (who = from). */
#define FM_SA_SEALED_BYTES (2 * FM_SHAMIR_Y_BYTES)
typedef struct {
    uint32_t from, to;
    uint8_t sealed[FM_SA_SEALED_BYTES];
    uint8_t tag[FM_GCM_TAG_BYTES];
} fm_sa_sealed_t;

/* Phase 3: one client's share of another's secret (kind: 0 its self-mask
 * seed b, 1 its s key). */
typedef struct {
    uint32_t owner;  /* whose secret */
    uint32_t holder; /* who answered (the share's x) */
    uint8_t kind;
    uint8_t y[FM_SHAMIR_Y_BYTES];
} fm_sa_share_t;

typedef struct fm_sa_client fm_sa_client_t;

/* A client numbered `who` of n in round `round` with threshold t (a
 * majority: n/2 < t <= n): draws its key pairs (phase 0). */
fm_status fm_sa_client_new(fm_sa_client_t **out, uint32_t who, uint32_t n, uint32_t t, uint64_t round);
void fm_sa_client_destroy(fm_sa_client_t **c);
void fm_sa_client_keys(const fm_sa_client_t *c, fm_sa_keys_t *out);
/* Phase 1: given U1's keys (k of them, its own among them), seals its
 * shares for every other client of U1 into out (k - 1 entries). FM_ERR_STATE
 * when k < t, FM_ERR_FORMAT for a repeated or out-of-range number or a bad key. */
fm_status fm_sa_client_share(fm_sa_client_t *c, const fm_sa_keys_t *u1, uint32_t k, fm_sa_sealed_t *out);
/* Phase 2, once: opens the sealed shares addressed to it (k: U2 but itself,
 * each from a client of U1), then writes its masked input: d + 1 values (the
 * update in fixed point, then the weight), with a pair mask for every client
 * of U2. A share that does not open (a wrong key, tampered, another round's)
 * is detected by GCM and not held: the input is masked all the same, and
 * fm_sa_client_unopened names its sender (whose secret the coordinator must
 * rebuild from the others' shares). An entry not addressed to it, from a
 * client not in U1, or repeated is FM_ERR_FORMAT; fewer than t - 1 is
 * FM_ERR_STATE; a value not finite or beyond FM_AGG_MAX_ABS, or a weight
 * outside 1..FM_AGG_MAX_WEIGHT, FM_ERR_ARG (the aggregator's own bounds: the
 * ring cannot wrap). A refused call keeps none of its shares: the client can
 * be given them again. */
fm_status fm_sa_client_mask(fm_sa_client_t *c, const fm_sa_sealed_t *in, uint32_t k, const float *x, size_t d,
                            uint64_t weight, fm_u128 *out);
/* The clients whose sealed shares did not open in phase 2: their count, and
 * up to cap of their numbers in who. */
uint32_t fm_sa_client_unopened(const fm_sa_client_t *c, uint32_t *who, uint32_t cap);
/* Phase 3, once and after phase 2: told U3 (k numbers, its own among them),
 * writes its shares into out (at most |U2|: b for U3, the s key for U2 but
 * not U3) and their count. FM_ERR_STATE for fewer than t, a client of U3
 * that was not in U2, a U3 without itself, or a second call (another U3
 * could ask for both secrets of one client). */
fm_status fm_sa_client_unmask(fm_sa_client_t *c, const uint32_t *u3, uint32_t k, fm_sa_share_t *out, uint32_t *nout);

/* The records the messages carry (docs/protocol.md), little-endian. */
#define FM_SA_KEYS_RECORD (4 + 2 * FM_X25519_BYTES + 32)
#define FM_SA_SEALED_RECORD (8 + FM_SA_SEALED_BYTES + FM_GCM_TAG_BYTES)
#define FM_SA_SHARE_RECORD (5 + FM_SHAMIR_Y_BYTES)
void fm_sa_keys_put(const fm_sa_keys_t *k, uint8_t out[FM_SA_KEYS_RECORD]);
void fm_sa_keys_get(const uint8_t in[FM_SA_KEYS_RECORD], fm_sa_keys_t *k);
void fm_sa_sealed_put(const fm_sa_sealed_t *s, uint8_t out[FM_SA_SEALED_RECORD]);
void fm_sa_sealed_get(const uint8_t in[FM_SA_SEALED_RECORD], fm_sa_sealed_t *s);
/* (a share's holder is not in its record: the sender is) */
void fm_sa_share_put(const fm_sa_share_t *s, uint8_t out[FM_SA_SHARE_RECORD]);
void fm_sa_share_get(const uint8_t in[FM_SA_SHARE_RECORD], uint32_t holder, fm_sa_share_t *s);

/* The coordinator's sum: sum (d + 1 values) += y. */
void fm_sa_sum_add(fm_u128 *sum, const fm_u128 *y, size_t d);
/* Phase 3 on the coordinator: removes the masks from sum (the sum of U3's
 * masked inputs) with the answers' shares (at least t of each needed
 * secret, from distinct holders), given U2's keys. Every secret rebuilt is
 * checked against what its owner advertised (the s key against its public
 * key, the seed against its commitment); when it does not match, other t of
 * its shares are tried: first every run of t consecutive ones (cyclically),
 * so one wrong answer among more than t costs at most k tries a secret,
 * then other choices (up to 4096). FM_ERR_FORMAT for a U2 with repeats or a
 * U3 not within it; FM_ERR_STATE when some secret cannot be rebuilt (its
 * owner's number in *unbuilt: a client whose shares were sealed wrong for
 * too many, or that too few answered) or the result is out of what k3
 * updates can sum to (a mask left in): the round is abandoned, never
 * unmasked wrong. */
fm_status fm_sa_unmask(fm_u128 *sum, size_t d, uint32_t t, uint64_t round, const fm_sa_keys_t *u2, uint32_t k2,
                       const uint32_t *u3, uint32_t k3, const fm_sa_share_t *shares, uint32_t nshares,
                       uint32_t *unbuilt);

/* An update in the ring: weight x x[i] x 2^40, truncated (the aggregator's
 * fixed point), then the weight. */
void fm_sa_encode(const float *x, size_t d, uint64_t weight, fm_u128 *out);

#endif
