/* The option table: flags and config keys of each program, errors, --help. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "coordinator.h"
#include "fedmoe/log.h"
#include "fedmoe/options.h"
#include "fedmoe/runspec.h"

static const fm_prog progs[] = {FM_PROG_SERVER, FM_PROG_CLIENT, FM_PROG_SIM};

static fm_status parse(fm_options_t *o, fm_run_spec_t *spec, fm_prog prog, const char *const *args)
{
    char *argv[64] = {"prog"};
    int argc = 1;
    for (; args[argc - 1] && argc < 63; argc++)
        argv[argc] = (char *)args[argc - 1];
    fm_options_default(o, prog, spec);
    return fm_options_parse(o, argc, argv);
}

static void test_server_flags(void **state)
{
    (void)state;
    fm_options_t o;
    fm_run_spec_t spec;
    const char *args[] = {"--rounds", "7", "--min-clients=3", "--strategy", "comigs", "--pathological", "3", "--stem",
                          "cnn", "--tau", "5", "--lr", "0.01", "--new-run", "--max-message", "4096", "-v", "--seed",
                          "18446744073709551615", "--lr-schedule", "constant", "--bind", "tcp://*:7000",
                          "--prompt-pool", "off", NULL};
    assert_int_equal(parse(&o, &spec, FM_PROG_SERVER, args), FM_OK);
    assert_int_equal(spec.model.max_nonlocal, 0); /* (--prompt-pool off: no non-local prompt slots) */
    assert_int_equal(o.rounds, 7);
    assert_int_equal(o.min_clients, 3);
    assert_int_equal(spec.strategy, FM_STRATEGY_COMIGS);
    assert_int_equal(spec.part.kind, FM_PARTITION_PATHOLOGICAL);
    assert_int_equal(spec.part.classes_per_client, 3);
    assert_int_equal(spec.model.stem, FM_STEM_CNN);
    assert_true(spec.model.tau == 5.0f);
    assert_true(spec.train.lower.lr == 0.01f);
    assert_true(o.new_run && o.verbose && !o.help);
    assert_int_equal(o.max_message, 4096);
    assert_true(spec.seed == UINT64_MAX);
    assert_int_equal(spec.lr_schedule, FM_LR_CONSTANT);
    assert_string_equal(o.bind, "tcp://*:7000");
    assert_true(fm_options_given(&o, "min_clients"));
    assert_false(fm_options_given(&o, "fraction"));
    /* the last of the partition flags wins */
    const char *args2[] = {"--pathological", "3", "--iid", "--dirichlet", "0.5", "--prompt-pool", "on", NULL};
    assert_int_equal(parse(&o, &spec, FM_PROG_SERVER, args2), FM_OK);
    assert_true(spec.model.max_nonlocal > 0);
    assert_int_equal(spec.part.kind, FM_PARTITION_DIRICHLET);
    assert_true(spec.part.alpha == 0.5);
}

static void test_client_flags(void **state)
{
    (void)state;
    fm_options_t o;
    fm_run_spec_t spec;
    const char *args[] = {"--standalone", "--partition", "2/5", "--iid", "--blocks", "3", "--no-gating", "--schedule",
                          "constant", "--id", "abc", "--epochs", "4", "--min-examples", "7", "--gating-on-validation",
                          "--connect-timeout", "2.5", "--threads", "2", NULL};
    assert_int_equal(parse(&o, &spec, FM_PROG_CLIENT, args), FM_OK);
    assert_true(o.standalone);
    assert_int_equal(o.partition_index, 2);
    assert_int_equal(o.partition_count, 5);
    assert_int_equal(spec.part.kind, FM_PARTITION_IID);
    assert_int_equal(spec.model.blocks, 3);
    assert_false(spec.model.gating);
    assert_true(spec.model.gating_on_validation);
    assert_int_equal(spec.lr_schedule, FM_LR_CONSTANT);
    assert_string_equal(o.id, "abc");
    assert_int_equal(o.epochs, 4);
    assert_int_equal(spec.part.min_samples, 7);
    assert_true(o.connect_timeout == 2.5);
    assert_int_equal(o.threads, 2);
}

/* --task text sets the text model's defaults and its budget; the model's flags
 * win whether they come before or after it. */
static void test_text_task_defaults_and_flags(void **state)
{
    (void)state;
    fm_options_t o;
    fm_run_spec_t spec;
    const char *plain[] = {"--task", "text", NULL};
    assert_int_equal(parse(&o, &spec, FM_PROG_SERVER, plain), FM_OK);
    assert_int_equal(spec.model.family, FM_FAMILY_TEXT);
    assert_int_equal(spec.model.context, FM_TEXT_CONTEXT);
    assert_int_equal(spec.model.heads, FM_TEXT_HEADS);
    assert_int_equal(spec.model.d, 128);
    assert_int_equal(spec.train.batch, FM_TEXT_BATCH);
    assert_int_equal(spec.eval_sample, FM_TEXT_EVAL_SAMPLE);
    const char *before[] = {"--width", "64", "--heads", "2", "--context", "16", "--batch", "8", "--task", "text", NULL};
    const char *after[] = {"--task", "text", "--width", "64", "--heads", "2", "--context", "16", "--batch", "8", NULL};
    const char *const *both[] = {before, after};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(parse(&o, &spec, FM_PROG_SERVER, both[i]), FM_OK);
        assert_int_equal(spec.model.d, 64);
        assert_int_equal(spec.model.heads, 2);
        assert_int_equal(spec.model.context, 16);
        assert_int_equal(spec.train.batch, 8);
    }
    const char *image[] = {"--heads", "2", NULL}; /* (the image model's prompt gating) */
    assert_int_equal(parse(&o, &spec, FM_PROG_SERVER, image), FM_OK);
    assert_int_equal(spec.model.family, FM_FAMILY_IMAGE);
    assert_int_equal(spec.model.heads, 2);
}

static void test_sim_flags_and_forwarding(void **state)
{
    (void)state;
    fm_options_t o;
    fm_run_spec_t spec;
    const char *args[] = {"--clients", "4", "--port", "6000", "--holdout", "--anchor", "5", "--dirichlet", "0.5",
                          "--workdir", "/tmp/x", "--strategy", "local", "--iid", NULL};
    assert_int_equal(parse(&o, &spec, FM_PROG_SIM, args), FM_OK);
    assert_int_equal(o.clients, 4);
    assert_int_equal(o.port, 6000);
    assert_true(spec.holdout);
    assert_true(spec.train.anchor == 5.0f);
    assert_int_equal(spec.part.kind, FM_PARTITION_IID);
    assert_string_equal(o.workdir, "/tmp/x");
    assert_string_equal(o.db, "fedmoe-sim.db");
    /* what the server gets: the options it accepts, in the order given */
    char *fwd[32];
    int n = fm_options_forward(&o, FM_PROG_SERVER, fwd, 32);
    const char *want[] = {"--holdout", "--anchor", "5", "--dirichlet", "0.5", "--strategy", "local", "--iid"};
    assert_int_equal(n, 8);
    for (int i = 0; i < n; i++)
        assert_string_equal(fwd[i], want[i]);
    assert_int_equal(fm_options_forward(&o, FM_PROG_SERVER, fwd, 3), -1);
    /* and the server reads them to the same spec */
    fm_options_t so;
    fm_run_spec_t sspec;
    fwd[n] = NULL;
    assert_int_equal(parse(&so, &sspec, FM_PROG_SERVER, (const char *const *)fwd), FM_OK);
    assert_memory_equal(&sspec, &spec, sizeof spec);
}

/* Every value that can be wrong: FM_ERR_ARG, naming the flag. */
static void test_bad_values(void **state)
{
    (void)state;
    size_t n;
    const fm_option_t *t = fm_options_table(&n);
    fm_options_t o;
    fm_run_spec_t spec;
    for (size_t i = 0; i < n; i++) {
        char flag[64], v[64];
        snprintf(flag, sizeof flag, "--%s", t[i].name);
        fm_prog prog = (t[i].progs & FM_PROG_SERVER) ? FM_PROG_SERVER : (t[i].progs & FM_PROG_CLIENT) ? FM_PROG_CLIENT
                                                                                                     : FM_PROG_SIM;
        fm_options_default(&o, prog, &spec);
        if (t[i].arg && t[i].type != FM_OPT_STRING) {
            fm_error_set("-");
            assert_int_equal(fm_options_apply(&o, t[i].name, "x y"), FM_ERR_ARG);
            if (!strstr(fm_error_last(), flag))
                fail_msg("%s: '%s'", flag, fm_error_last());
        }
        if (t[i].type == FM_OPT_INT || t[i].type == FM_OPT_SIZE || t[i].type == FM_OPT_DOUBLE ||
            t[i].type == FM_OPT_FLOAT) {
            bool whole = t[i].type == FM_OPT_INT || t[i].type == FM_OPT_SIZE;
            snprintf(v, sizeof v, whole ? "%.0f" : "%.17g", whole ? t[i].max + 1 : t[i].max * 1.5 + 1);
            assert_int_equal(fm_options_apply(&o, t[i].name, v), FM_ERR_ARG);
            assert_non_null(strstr(fm_error_last(), "out of range"));
            assert_non_null(strstr(fm_error_last(), flag));
            snprintf(v, sizeof v, whole ? "%.0f" : "%.17g", t[i].min - 1);
            assert_int_equal(fm_options_apply(&o, t[i].name, v), FM_ERR_ARG);
            assert_non_null(strstr(fm_error_last(), flag));
        }
    }
    const char *args[] = {"--rounds", "0", NULL};
    assert_int_equal(parse(&o, &spec, FM_PROG_SERVER, args), FM_ERR_ARG);
    assert_string_equal(fm_error_last(), "--rounds: 0 is out of range 1..1000000");
    const char *args2[] = {"--rounds", NULL};
    assert_int_equal(parse(&o, &spec, FM_PROG_SERVER, args2), FM_ERR_ARG);
    assert_non_null(strstr(fm_error_last(), "'--rounds'"));
    const char *args3[] = {"--rounds", "3", "extra", NULL};
    assert_int_equal(parse(&o, &spec, FM_PROG_SERVER, args3), FM_ERR_ARG);
    assert_non_null(strstr(fm_error_last(), "'extra'"));
}

/* "--name" as a whole word in text. */
static bool mentions(const char *text, const char *name)
{
    char flag[72];
    size_t len = (size_t)snprintf(flag, sizeof flag, "--%s", name);
    for (const char *p = strstr(text, flag); p; p = strstr(p + 1, flag))
        if ((p[len] == ' ' || p[len] == '\n') && p > text && p[-1] == ' ')
            return true;
    return false;
}

static void test_help_lists_each_programs_options(void **state)
{
    (void)state;
    size_t n;
    const fm_option_t *t = fm_options_table(&n);
    for (size_t p = 0; p < 3; p++) {
        fm_options_t o;
        fm_run_spec_t spec;
        fm_options_default(&o, progs[p], &spec);
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        fm_options_usage(&o, f, NULL);
        fclose(f);
        for (size_t i = 0; i < n; i++) {
            bool accepted = (t[i].progs & progs[p]) != 0;
            if (mentions(text, t[i].name) != accepted)
                fail_msg("program %d: --%s %s in --help", progs[p], t[i].name, accepted ? "missing" : "shown");
        }
        /* the defaults shown are the values of a defaulted config */
        if (progs[p] == FM_PROG_SERVER) {
            assert_non_null(strstr(text, "--rounds N            rounds in the run (default 20)"));
            assert_non_null(strstr(text, "(default full)"));
            assert_non_null(strstr(text, "--anchor A"));
        }
        free(text);
    }
}

/* A config key (either spelling) and the flag set the same fields. */
static void test_config_key_equals_flag(void **state)
{
    (void)state;
    const char *cases[][3] = {
        {"rounds", "rounds", "9"},         {"min-clients", "min_clients", "4"}, {"round-timeout", "round_timeout", "3"},
        {"strategy", "strategy", "local"}, {"dirichlet", "dirichlet", "0.7"},   {"pathological", "pathological", "4"},
        {"iid", "iid", "true"},            {"holdout", "holdout", "yes"},       {"stem", "stem", "cnn"},
        {"lr-schedule", "lr_schedule", "constant"}, {"weight-decay", "weight_decay", "0.5"},
        {"router-lr", "router_lr", "0.02"}, {"seed", "seed", "77"},             {"new-run", "new_run", "on"},
        {"max-message", "max_message", "2048"},     {"dataset", "dataset", "csv:/x.csv"},
        {"client-examples", "client_examples", "25..1000"}, {"client-bytes", "client_bytes", "4096,65536"},
        {"domains", "domains", "rotate,blur"},      {"concept-groups", "concept_groups", "2"},
    };
    char path[] = "/tmp/fedmoe-test-options-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        FILE *f = fopen(path, "w");
        fprintf(f, "[server]\n%s = %s\n", cases[i][1], cases[i][2]);
        fclose(f);
        fm_options_t a, b;
        fm_run_spec_t sa, sb;
        fm_options_default(&a, FM_PROG_SERVER, &sa);
        assert_int_equal(fm_options_load_file(&a, path), FM_OK);
        char flag[64];
        snprintf(flag, sizeof flag, "--%s", cases[i][0]);
        const fm_option_t *r = fm_options_find(FM_PROG_SERVER, cases[i][0]);
        const char *args[] = {flag, r->arg ? cases[i][2] : NULL, NULL};
        assert_int_equal(parse(&b, &sb, FM_PROG_SERVER, args), FM_OK);
        assert_memory_equal(&sa, &sb, sizeof sa);
        size_t from = offsetof(fm_options_t, help), to = offsetof(fm_options_t, ngiven);
        assert_memory_equal((char *)&a + from, (char *)&b + from, to - from);
        fm_run_spec_t d;
        fm_options_t od;
        fm_options_default(&od, FM_PROG_SERVER, &d);
        assert_true(memcmp(&sa, &d, sizeof d) != 0 || memcmp((char *)&a + from, (char *)&od + from, to - from) != 0);
    }
    /* a bad key or value names the line; help and config are flags only */
    FILE *f = fopen(path, "w");
    fprintf(f, "rounds = 3\nmin-clients = many\n");
    fclose(f);
    fm_options_t o;
    fm_run_spec_t spec;
    fm_options_default(&o, FM_PROG_SERVER, &spec);
    assert_int_equal(fm_options_load_file(&o, path), FM_ERR_ARG);
    assert_non_null(strstr(fm_error_last(), ":2: --min-clients: 'many' is not an integer"));
    f = fopen(path, "w");
    fprintf(f, "help = true\n");
    fclose(f);
    assert_int_equal(fm_options_load_file(&o, path), FM_ERR_ARG);
    assert_non_null(strstr(fm_error_last(), "unknown option 'help'"));
    /* not a text file of short lines: a directory, a device read for ever, a
     * NUL byte (the rest of its line would be lost), a line libinih would cut */
    const char *nottext[][2] = {{"/tmp", "not a regular file"},
                                {"/dev/zero", "not a regular file"},
                                {NULL, "a NUL byte at offset 10"},
                                {NULL, ":2: a line longer than 199"}};
    for (int i = 0; i < 4; i++) {
        const char *file = nottext[i][0] ? nottext[i][0] : path;
        if (i == 2) {
            f = fopen(path, "w");
            fwrite("rounds = 3\0\nseed = 5\n", 1, 22, f);
            fclose(f);
        } else if (i == 3) {
            f = fopen(path, "w");
            fprintf(f, "rounds = 3\ndb = /%0250d\n", 0);
            fclose(f);
        }
        assert_int_equal(fm_options_load_file(&o, file), FM_ERR_ARG);
        assert_non_null(strstr(fm_error_last(), nottext[i][1]));
    }
    /* flags after --config win */
    f = fopen(path, "w");
    fprintf(f, "rounds = 3\nseed = 5\n");
    fclose(f);
    const char *args[] = {"--rounds", "8", "--config", path, NULL};
    assert_int_equal(parse(&o, &spec, FM_PROG_SERVER, args), FM_OK);
    assert_int_equal(o.rounds, 8);
    assert_true(spec.seed == 5);
    unlink(path);
}

/* Every program refuses the options it does not accept, as flags and keys. */
static void test_refuses_other_programs_options(void **state)
{
    (void)state;
    size_t n;
    const fm_option_t *t = fm_options_table(&n);
    for (size_t p = 0; p < 3; p++) {
        for (size_t i = 0; i < n; i++) {
            if (t[i].progs & progs[p])
                continue;
            fm_options_t o;
            fm_run_spec_t spec;
            fm_options_default(&o, progs[p], &spec);
            assert_int_equal(fm_options_apply(&o, t[i].name, "1"), FM_ERR_ARG);
            assert_non_null(strstr(fm_error_last(), "unknown option"));
            /* also when it starts one of the program's own (getopt_long takes
             * a unique prefix: --lr was --lr-schedule in fedmoe-sim) */
            char flag[64];
            snprintf(flag, sizeof flag, "--%s", t[i].name);
            const char *args[] = {flag, "1", NULL};
            assert_int_equal(parse(&o, &spec, progs[p], args), FM_ERR_ARG);
            assert_non_null(strstr(fm_error_last(), "unknown"));
            assert_non_null(strstr(fm_error_last(), flag));
        }
    }
}

/* An option is named whole: a unique prefix of one is refused, not taken for it. */
static void test_no_abbreviations(void **state)
{
    (void)state;
    fm_options_t o;
    fm_run_spec_t spec;
    const char *sch[] = {"--lr-sch", "constant", NULL};
    assert_int_equal(parse(&o, &spec, FM_PROG_SIM, sch), FM_ERR_ARG);
    assert_non_null(strstr(fm_error_last(), "'--lr-sch'"));
    const char *eq[] = {"--lr-sched=constant", NULL};
    assert_int_equal(parse(&o, &spec, FM_PROG_SERVER, eq), FM_ERR_ARG);
    assert_non_null(strstr(fm_error_last(), "'--lr-sched'"));
    const char *whole[] = {"--lr-schedule=constant", "--lr", "0.002", NULL};
    assert_int_equal(parse(&o, &spec, FM_PROG_SIM, whole), FM_OK);
    assert_int_equal(spec.lr_schedule, FM_LR_CONSTANT);
    assert_true(spec.train.lower.lr == 0.002f);
}

/* The table's server defaults are the coordinator's. */
static void test_server_defaults_match_coordinator(void **state)
{
    (void)state;
    fm_server_config_t c;
    fm_server_config_default(&c);
    for (size_t p = 0; p < 3; p++) {
        fm_options_t o;
        fm_run_spec_t spec;
        fm_options_default(&o, progs[p], &spec);
        assert_memory_equal(&spec, &c.spec, sizeof spec);
        assert_string_equal(o.bind, c.bind);
        if (progs[p] == FM_PROG_SERVER)
            assert_string_equal(o.db, c.db);
        assert_int_equal(o.rounds, c.rounds);
        assert_int_equal(o.min_clients, c.min_clients);
        assert_true(o.fraction == c.fraction && o.round_timeout == c.round_timeout &&
                    o.client_timeout == c.client_timeout);
        assert_int_equal(o.new_run, c.new_run);
        assert_int_equal(o.max_message, c.max_message);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_server_flags),
        cmocka_unit_test(test_client_flags),
        cmocka_unit_test(test_text_task_defaults_and_flags),
        cmocka_unit_test(test_sim_flags_and_forwarding),
        cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_help_lists_each_programs_options),
        cmocka_unit_test(test_config_key_equals_flag),
        cmocka_unit_test(test_refuses_other_programs_options),
        cmocka_unit_test(test_no_abbreviations),
        cmocka_unit_test(test_server_defaults_match_coordinator),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
