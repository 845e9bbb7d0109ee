/* attack.c - the model-poisoning attacks of the robust-aggregation benchmark,
 * linked into bench's fedmoe-attacker only (the client's sources and this
 * file, which sets the session's upload hook when the program loads: see
 * session.h), never into fedmoe-client.
 *
 * FEDMOE_ATTACK chooses the attack on the averaged vector, from the state the
 * Task sent (g) and the honestly trained one (x):
 *   signflip:S   g - S (x - g)
 *   scale:S      g + S (x - g)
 *   random:S     g + S n, n standard normal per value (seeded by the round)
 * The client trains and reports its metrics honestly; only its upload lies. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/log.h"
#include "fedmoe/rng.h"
#include "session.h"

static float *sent;
static size_t nsent;

static void attack_received(const float *g, size_t n)
{
    float *p = realloc(sent, sizeof(float) * (n ? n : 1));
    if (!p)
        return;
    sent = p;
    nsent = n;
    memcpy(sent, g, sizeof(float) * n);
}

static void attack_apply(float *x, size_t n, uint32_t round)
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

/* fedmoe-attacker is fedmoe-client with this file: its sessions upload through
 * the attack from the start */
__attribute__((constructor)) static void attack_install(void)
{
    static const fm_session_upload_hook_t hook = {.received = attack_received, .upload = attack_apply};
    fm_session_set_upload_hook(&hook);
}
