/* libFuzzer target: the decode-and-validate path of everything that arrives from
 * the network: envelope decoding with the size limit and version check, tensors
 * (name, shape, length, digest, finiteness) as the coordinator and clients check
 * them, a Welcome's specs as a client turns them into a run spec, and the
 * decode-cost budget: what protobuf-c allocates decoding an accepted message,
 * counted by an allocator of its own, never passes its charge
 * (fm_wire_decode_cost) nor the budget (fm_wire_decode_budget). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/runspec.h"
#include "fedmoe/runspec_wire.h"
#include "fedmoe/wire.h"

#define MAX_MESSAGE (1u << 20)

static void check_tensor(const Fedmoe__Tensor *t, const char *name)
{
    if (!t || t->n_shape != 2)
        return;
    uint64_t n = (uint64_t)t->shape[0] * t->shape[1];
    if (n > MAX_MESSAGE)
        return;
    float *out = malloc(sizeof(float) * (n ? n : 1));
    if (fm_wire_tensor_get(t, name, t->shape[0], t->shape[1], out) == FM_OK) {
        for (uint64_t i = 0; i < n; i++)
            if (out[i] != out[i])
                abort(); /* a NaN got through */
    }
    if (n >= 256)
        fm_wire_tensor_get(t, name, 4, 64, out); /* the fixed shape a prompt must have */
    free(out);
}

/* Bytes allocated by protobuf-c, with 16 for the allocator's own per block
 * (the charge the budget makes for each). */
static size_t g_allocated;

static void *counted_alloc(void *data, size_t size)
{
    (void)data;
    g_allocated += size + 16;
    return malloc(size);
}

static void counted_free(void *data, void *p)
{
    (void)data;
    free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    Fedmoe__Envelope *env = NULL;
    if (fm_wire_decode(data, size, MAX_MESSAGE, &env) != FM_OK)
        return 0;
    ProtobufCAllocator counting = {counted_alloc, counted_free, NULL};
    g_allocated = 0;
    Fedmoe__Envelope *again = fedmoe__envelope__unpack(&counting, size, data);
    if (!again || g_allocated > fm_wire_decode_cost(data, size) || g_allocated > fm_wire_decode_budget(size))
        abort(); /* accepted, but decoding it allocates more than charged, or than the budget */
    fedmoe__envelope__free_unpacked(again, &counting);
    switch (env->body_case) {
    case FEDMOE__ENVELOPE__BODY_UPDATE:
        for (size_t i = 0; i < env->update->n_model; i++)
            check_tensor(env->update->model[i], "model");
        check_tensor(env->update->prompt, "prompt");
        break;
    case FEDMOE__ENVELOPE__BODY_TASK:
        for (size_t i = 0; i < env->task->n_model; i++)
            check_tensor(env->task->model[i], "model");
        check_tensor(env->task->global_prompt, "prompt");
        for (size_t i = 0; i < env->task->n_nonlocal_prompts; i++)
            check_tensor(env->task->nonlocal_prompts[i], "nonlocal");
        break;
    case FEDMOE__ENVELOPE__BODY_WELCOME: {
        fm_run_spec_t spec;
        if (fm_run_spec_from_welcome(&spec, env->welcome, 2) == FM_OK && fm_model_config_check(&spec.model) != FM_OK)
            abort(); /* an accepted spec must build a valid model */
        break;
    }
    case FEDMOE__ENVELOPE__BODY_HELLO:
        (void)fm_id_valid(env->hello->client_id, strlen(env->hello->client_id));
        break;
    default: break;
    }
    fm_wire_free(env);
    return 0;
}
