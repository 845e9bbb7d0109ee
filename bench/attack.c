#include "attack.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/log.h"
#include "fedmoe/rng.h"

static float *sent;
static size_t nsent;

void fm_bench_attack_received(const float *g, size_t n)
{
    float *p = realloc(sent, sizeof(float) * (n ? n : 1));
    if (!p)
        return;
    sent = p;
    nsent = n;
    memcpy(sent, g, sizeof(float) * n);
}

void fm_bench_attack_apply(float *x, size_t n, uint32_t round)
{
    const char *spec = getenv("FEDMOE_ATTACK");
    char kind[16] = "";
    double s = 0.0;
    if (!spec || sscanf(spec, "%15[a-z]:%lf", kind, &s) != 2 || n != nsent) {
        fm_warn("attacker: FEDMOE_ATTACK unset or unreadable, or no state received: honest upload");
        return;
    }
    fm_rng_t r;
    fm_rng_init(&r, 0xa77ac4, round);
    for (size_t i = 0; i < n; i++) {
        double g = sent[i], d = (double)x[i] - g;
        if (!strcmp(kind, "signflip"))
            x[i] = (float)(g - s * d);
        else if (!strcmp(kind, "scale"))
            x[i] = (float)(g + s * d);
        else if (!strcmp(kind, "random"))
            x[i] = (float)(g + s * fm_rng_normal(&r));
    }
    fm_info("attacker: round %u upload is %s x %g", round, kind, s);
}
