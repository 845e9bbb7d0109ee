/* secagg_client.c - the secure-aggregation tests' client: fedmoe-client with
 * a session hook set at load time (session.h), linked into the test program
 * fedmoe-secagg-client only, never into fedmoe-client.
 *   FEDMOE_SA_DUMP=DIR    writes the values it is about to mask, and their
 *                         weight, to DIR/ID-rROUND.bin (ID from FEDMOE_SA_ID):
 *                         a uint64 count, the floats, a uint64 weight, then
 *                         (with a client bound) the count floats of the
 *                         state its Task sent; what
 *                         the test sums in the clear to check the
 *                         coordinator's unmasked result
 *   FEDMOE_SA_DROP=P:R    leaves (exits at once, status 0, nothing said) when
 *                         about to answer phase P (0-3) of round R: a client
 *                         that drops at that phase; P "upload": about to
 *                         upload round R without secure aggregation (its
 *                         model vector then dumped to DIR/ID-rROUND.plain)
 *   FEDMOE_SA_TAMPER=P:R  spoils every sealed share it sends (P 1) or every
 *                         unmasking share (P 3) in rounds R and later: a
 *                         malicious client */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "session.h"

static void dump(const float *x, const float *ref, size_t n, uint32_t round, uint64_t weight)
{
    const char *dir = getenv("FEDMOE_SA_DUMP"), *id = getenv("FEDMOE_SA_ID");
    if (!dir || !id)
        return;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s-r%u.bin", dir, id, round);
    FILE *f = fopen(path, "wb");
    if (!f)
        return;
    uint64_t count = n;
    fwrite(&count, sizeof count, 1, f);
    fwrite(x, sizeof *x, n, f);
    fwrite(&weight, sizeof weight, 1, f);
    if (ref)
        fwrite(ref, sizeof *ref, n, f);
    fclose(f);
}

static void phase(uint32_t round, int p)
{
    const char *spec = getenv("FEDMOE_SA_DROP");
    int dp = -1;
    unsigned dr = 0;
    if (spec && sscanf(spec, "%d:%u", &dp, &dr) == 2 && dp == p && dr == round)
        _exit(0);
}

static void upload(float *x, size_t n, uint32_t round)
{
    const char *spec = getenv("FEDMOE_SA_DROP"), *dir = getenv("FEDMOE_SA_DUMP"), *id = getenv("FEDMOE_SA_ID");
    unsigned dr = 0;
    if (dir && id) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s-r%u.plain", dir, id, round);
        FILE *f = fopen(path, "wb");
        if (f) {
            fwrite(x, sizeof *x, n, f);
            fclose(f);
        }
    }
    if (spec && sscanf(spec, "upload:%u", &dr) == 1 && dr == round)
        _exit(0);
}

static void tamper(uint32_t round, int p, uint8_t *bytes, size_t n)
{
    const char *spec = getenv("FEDMOE_SA_TAMPER");
    int tp = -1;
    unsigned tr = 0;
    if (n > 20 && spec && sscanf(spec, "%d:%u", &tp, &tr) == 2 && tp == p && round >= tr)
        bytes[20] ^= 0x5a;
}

__attribute__((constructor)) static void install(void)
{
    static const fm_session_upload_hook_t hook = {.upload = upload, .masking = dump, .phase = phase, .tamper = tamper};
    fm_session_set_upload_hook(&hook);
}
