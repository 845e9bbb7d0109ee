/* The coordinator's checkpoint: what a resumed run needs, in the one checkpoint
 * format (fedmoe/checkpoint.h). */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator.h"
#include "fedmoe/checkpoint.h"
#include "fedmoe/log.h"

#define VERSION 3u /* 1: the unframed layout before fedmoe/checkpoint.h; 2: without the clip bounds */
#define WHAT "coordinator checkpoint"

fm_status fm_checkpoint_encode(const fm_checkpoint_t *c, uint8_t **blob, size_t *len)
{
    fm_ckpt_writer_t w;
    fm_ckpt_begin(&w, FM_CKPT_MAGIC_COORDINATOR, VERSION);
    fm_ckpt_put_u32(&w, (uint32_t)c->round);
    fm_ckpt_put_u64(&w, c->nglobal);
    fm_ckpt_put_floats(&w, c->global, c->nglobal);
    fm_ckpt_put_u64(&w, c->nprompt);
    fm_ckpt_put_floats(&w, c->prompt, c->nprompt);
    fm_ckpt_put_u32(&w, (uint32_t)c->pool_count);
    for (int i = 0; i < c->pool_count; i++) {
        char id[64] = {0};
        memcpy(id, c->pool_ids[i], strnlen(c->pool_ids[i], 63));
        fm_ckpt_put_bytes(&w, id, sizeof id);
        fm_ckpt_put_floats(&w, c->pool + (size_t)i * c->nprompt, c->nprompt);
    }
    for (int g = 0; g < 2; g++) {
        uint64_t bits;
        memcpy(&bits, &c->clip[g], sizeof bits);
        fm_ckpt_put_u64(&w, bits);
    }
    return fm_ckpt_finish(&w, blob, len);
}

fm_status fm_checkpoint_decode(const uint8_t *blob, size_t len, fm_checkpoint_t *out)
{
    memset(out, 0, sizeof *out);
    fm_ckpt_reader_t r;
    uint32_t version = VERSION;
    fm_status st = fm_ckpt_open(&r, blob, len, FM_CKPT_MAGIC_COORDINATOR, version, WHAT);
    if (st != FM_OK && fm_ckpt_open(&r, blob, len, FM_CKPT_MAGIC_COORDINATOR, 2, WHAT) == FM_OK) {
        version = 2; /* a run checkpointed before the clip bounds: none */
        st = FM_OK;
    }
    if (st != FM_OK) {
        fm_ckpt_open(&r, blob, len, FM_CKPT_MAGIC_COORDINATOR, VERSION, WHAT); /* its reason */
        return st;
    }
    uint32_t round = 0, count = 0;
    uint64_t ng = 0, np = 0;
    bool ok = fm_ckpt_get_u32(&r, &round) && round >= 1 && round < INT_MAX && fm_ckpt_get_u64(&r, &ng) &&
              ng <= fm_ckpt_left(&r) / 4 && (out->global = malloc(4 * (ng ? ng : 1))) &&
              fm_ckpt_get_floats(&r, out->global, ng) && fm_ckpt_get_u64(&r, &np) && np <= fm_ckpt_left(&r) / 4 &&
              (out->prompt = malloc(4 * (np ? np : 1))) && fm_ckpt_get_floats(&r, out->prompt, np) &&
              fm_ckpt_get_u32(&r, &count) && count <= fm_ckpt_left(&r) / (64 + 4 * np) &&
              (out->pool_ids = calloc(count ? count : 1, 64)) &&
              (out->pool = malloc(4 * (size_t)(count ? count : 1) * (np ? np : 1)));
    for (uint32_t i = 0; ok && i < count; i++) {
        ok = fm_ckpt_get_bytes(&r, out->pool_ids[i], 64) && fm_ckpt_get_floats(&r, out->pool + (size_t)i * np, np);
        out->pool_ids[i][63] = 0;
    }
    for (int g = 0; ok && version >= 3 && g < 2; g++) {
        uint64_t bits = 0;
        ok = fm_ckpt_get_u64(&r, &bits);
        memcpy(&out->clip[g], &bits, sizeof bits);
        ok = ok && out->clip[g] >= 0.0 && out->clip[g] < 1e30; /* not NaN either */
    }
    if (!ok || fm_ckpt_close(&r, WHAT) != FM_OK) {
        fm_checkpoint_free(out);
        fm_error_set("%s: fields missing or out of range", WHAT);
        return FM_ERR_FORMAT;
    }
    out->round = (int)round;
    out->nglobal = ng;
    out->nprompt = np;
    out->pool_count = (int)count;
    return FM_OK;
}

void fm_checkpoint_free(fm_checkpoint_t *c)
{
    free(c->global);
    free(c->prompt);
    free(c->pool_ids);
    free(c->pool);
    memset(c, 0, sizeof *c);
}
