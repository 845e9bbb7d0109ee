/* gradcheck.h - a model's hand-written backward against central finite
 * differences (test helper shared by the model families' tests). */
#ifndef FEDMOE_TEST_GRADCHECK_H
#define FEDMOE_TEST_GRADCHECK_H

#include <stdbool.h>

#include "fedmoe/model.h"

/* Compares, for about `per_view` coordinates of every parameter view, the
 * gradient of fm_model_backward (both levels) with the central difference of
 * the objective of fm_model_forward on b (step h), within abs_tol + 3%, skipping points where the
 * branch signature changes (a routing choice flipped). Fails the test on a
 * mismatch or when more than a tenth are skipped; returns the coordinates
 * compared. */
int fm_test_gradcheck(fm_model_t *m, const fm_batch_t *b, bool with_lb, float h, int per_view, float abs_tol);

/* Moves the routers, the gating, every bias and every LayerNorm off their
 * initial values (small, zero or one) by up to 0.5, so every term carries
 * gradient. */
void fm_test_unsettle(fm_model_t *m, uint64_t seed);

#endif
