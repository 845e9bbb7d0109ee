/* runspec_wire.h - a run spec on the wire: the Welcome that carries it to a
 * client and its validated reading there. Private to the library and the
 * programs that speak the protocol (public headers never include protobuf). */
#ifndef FEDMOE_RUNSPEC_WIRE_H
#define FEDMOE_RUNSPEC_WIRE_H

#include "fedmoe.pb-c.h"
#include "fedmoe/runspec.h"

/* A Welcome with the three spec messages it points to: fill it in place and do
 * not copy it (welcome points into the struct; strings point into the spec). */
/* The regime's strings, as the DataSpec carries them. */
typedef struct {
    char examples[640], bytes[640], domains[256];
} fm_regime_text_t;

typedef struct {
    Fedmoe__Welcome welcome;
    Fedmoe__ModelSpec model;
    Fedmoe__TrainSpec train;
    Fedmoe__DataSpec data;
    fm_regime_text_t regime;
} fm_welcome_pb_t;
/* The Welcome of run run_id under s (seed, specs, strategy), for a client given
 * partition (-1: none assigned) at the run's current round. */
void fm_run_spec_welcome(const fm_run_spec_t *s, const char *run_id, int32_t partition, uint32_t round,
                         fm_welcome_pb_t *w);
/* Reads a Welcome's specs (from the network: validated); specialists is the
 * client's own count. */
fm_status fm_run_spec_from_welcome(fm_run_spec_t *s, const Fedmoe__Welcome *w, int specialists);
#endif
