/* Writes the seed corpus of fuzz_wire: one valid message of each kind. */
#include <stdio.h>
#include <stdlib.h>

#include "fedmoe/runspec.h"
#include "fedmoe/runspec_wire.h"
#include "fedmoe/wire.h"

static void write_env(const char *dir, const char *name, Fedmoe__Envelope *env)
{
    uint8_t *buf;
    size_t len;
    if (fm_wire_encode(env, &buf, &len) != FM_OK)
        exit(1);
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, len, f) != len || fclose(f) != 0) {
        fprintf(stderr, "make_corpus: cannot write %s\n", path);
        exit(1);
    }
    free(buf);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: make_corpus DIR\n");
        return 2;
    }
    float x[256];
    for (int i = 0; i < 256; i++)
        x[i] = 0.01f * (float)i - 1.0f;
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    Fedmoe__Hello h = FEDMOE__HELLO__INIT;
    h.client_id = "client-7";
    h.protocol_version = FM_PROTOCOL_VERSION;
    h.specialists = 2;
    h.partition_index = -1;
    h.train_samples = 1000;
    env.body_case = FEDMOE__ENVELOPE__BODY_HELLO;
    env.hello = &h;
    write_env(argv[1], "hello", &env);

    fm_run_spec_t spec;
    fm_run_spec_default(&spec);
    fm_run_spec_finish(&spec);
    fm_welcome_pb_t w;
    fm_run_spec_welcome(&spec, "run-1", 0, 0, &w);
    env.body_case = FEDMOE__ENVELOPE__BODY_WELCOME;
    env.welcome = &w.welcome;
    write_env(argv[1], "welcome", &env);

    Fedmoe__Tensor model, prompt, nl, *ml[1] = {&model}, *nll[1] = {&nl};
    fm_wire_tensor_set(&model, "model", x, 1, 200);
    fm_wire_tensor_set(&prompt, "prompt", x, 4, 64);
    fm_wire_tensor_set(&nl, "nonlocal", x, 4, 64);
    Fedmoe__Task t = FEDMOE__TASK__INIT;
    t.round = 3;
    t.model = ml;
    t.n_model = 1;
    t.global_prompt = &prompt;
    t.nonlocal_prompts = nll;
    t.n_nonlocal_prompts = 1;
    uint8_t nonce_bytes[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    ProtobufCBinaryData nonce = {sizeof nonce_bytes, nonce_bytes};
    t.nonce = nonce;
    env.body_case = FEDMOE__ENVELOPE__BODY_TASK;
    env.task = &t;
    write_env(argv[1], "task", &env);

    Fedmoe__Update u = FEDMOE__UPDATE__INIT;
    Fedmoe__Metrics m = FEDMOE__METRICS__INIT;
    m.test_accuracy = 0.5f;
    u.round = 3;
    u.model = ml;
    u.n_model = 1;
    u.prompt = &prompt;
    u.train_samples = 1000;
    u.metrics = &m;
    u.nonce = nonce;
    env.body_case = FEDMOE__ENVELOPE__BODY_UPDATE;
    env.update = &u;
    write_env(argv[1], "update", &env);

    Fedmoe__Error e = FEDMOE__ERROR__INIT;
    e.code = FM_WIRE_WRONG_ROUND;
    e.text = "round 3 is closed";
    env.body_case = FEDMOE__ENVELOPE__BODY_ERROR;
    env.error = &e;
    write_env(argv[1], "error", &env);
    fm_wire_tensor_clear(&model);
    fm_wire_tensor_clear(&prompt);
    fm_wire_tensor_clear(&nl);
    return 0;
}
