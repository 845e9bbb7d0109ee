/* Key files and the allow-list: a generated pair reads back; files are never
 * overwritten; a pair file others may read, a secret that does not match its
 * public key, a bad Z85 value, an unknown name, a missing id and a .pub given as
 * a pair are refused naming the file; the allow-list finds ids by key, ignores
 * other files, and refuses two keys for one id and one key for two ids. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fedmoe/keys.h"
#include "fedmoe/log.h"

#include "procs.h"

static char dir[64];

static void write_file(const char *name, mode_t mode, const char *text)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    chmod(path, mode);
}

static fm_status read_key(const char *name, bool secret, fm_key_t *k)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return fm_key_read(path, secret, k);
}

static void test_pair_round_trip_and_no_overwrite(void **state)
{
    (void)state;
    fm_key_t k, back, pub;
    assert_int_equal(fm_key_generate(&k, "dev-07"), FM_OK);
    assert_int_equal(fm_key_write(&k, dir), FM_OK);
    assert_int_equal(read_key("dev-07.key", true, &back), FM_OK);
    assert_string_equal(back.id, "dev-07");
    assert_string_equal(back.public_z85, k.public_z85);
    assert_string_equal(back.secret_z85, k.secret_z85);
    assert_int_equal(read_key("dev-07.pub", false, &pub), FM_OK);
    assert_string_equal(pub.public_z85, k.public_z85);
    assert_string_equal(pub.secret_z85, "");
    struct stat sb;
    char path[256];
    snprintf(path, sizeof path, "%s/dev-07.key", dir);
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0600);
    fm_key_t other;
    assert_int_equal(fm_key_generate(&other, "dev-07"), FM_OK);
    assert_int_equal(fm_key_write(&other, dir), FM_ERR_IO); /* never overwritten */
    assert_int_equal(read_key("dev-07.key", true, &back), FM_OK);
    assert_string_equal(back.secret_z85, k.secret_z85);
    assert_int_equal(fm_key_generate(&other, "bad id"), FM_ERR_ARG);
}

static void test_bad_files_refused(void **state)
{
    (void)state;
    fm_key_t a, b, k;
    assert_int_equal(fm_key_generate(&a, "a"), FM_OK);
    assert_int_equal(fm_key_generate(&b, "b"), FM_OK);
    char text[512];
    snprintf(text, sizeof text, "id = a\npublic = %s\nsecret = %s\n", a.public_z85, a.secret_z85);
    write_file("open.key", 0644, text);
    assert_int_equal(read_key("open.key", true, &k), FM_ERR_ARG);
    assert_non_null(strstr(fm_error_last(), "others may read it"));
    snprintf(text, sizeof text, "id = a\npublic = %s\nsecret = %s\n", a.public_z85, b.secret_z85);
    write_file("mixed.key", 0600, text);
    assert_int_equal(read_key("mixed.key", true, &k), FM_ERR_FORMAT);
    assert_non_null(strstr(fm_error_last(), "does not belong"));
    write_file("short.pub", 0644, "id = a\n\n# the key\npublic = abc\n");
    assert_int_equal(read_key("short.pub", false, &k), FM_ERR_FORMAT);
    assert_non_null(strstr(fm_error_last(), "short.pub:4")); /* blank and comment lines counted */
    snprintf(text, sizeof text, "id = a\npublic = %s\ncolour = blue\n", a.public_z85);
    write_file("odd.pub", 0644, text);
    assert_int_equal(read_key("odd.pub", false, &k), FM_ERR_FORMAT);
    assert_non_null(strstr(fm_error_last(), "odd.pub:3: unknown name"));
    snprintf(text, sizeof text, "public = %s\n", a.public_z85);
    write_file("noid.pub", 0644, text);
    assert_int_equal(read_key("noid.pub", false, &k), FM_ERR_FORMAT);
    snprintf(text, sizeof text, "id = a\npublic = %s\n", a.public_z85);
    write_file("a-only.pub", 0644, text);
    assert_int_equal(read_key("a-only.pub", true, &k), FM_ERR_FORMAT); /* a .pub is no pair */
    assert_int_equal(read_key("missing.key", true, &k), FM_ERR_IO);
}

static void test_allowlist(void **state)
{
    (void)state;
    char sub[128], path[256];
    snprintf(sub, sizeof sub, "%s/allow", dir);
    assert_int_equal(mkdir(sub, 0700), 0);
    fm_key_t k[3];
    const char *ids[] = {"c0", "c1", "c2"};
    fm_allowlist_t *a = NULL;
    assert_int_equal(fm_allowlist_load(&a, sub), FM_OK); /* empty: nobody may join yet */
    assert_int_equal(fm_allowlist_count(a), 0);
    uint8_t any[FM_KEY_BYTES] = {1};
    assert_null(fm_allowlist_id(a, any));
    assert_false(fm_allowlist_has(a, "c0"));
    fm_allowlist_free(&a);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(fm_key_generate(&k[i], ids[i]), FM_OK);
        assert_int_equal(fm_key_write(&k[i], sub), FM_OK); /* .key files there are ignored */
    }
    assert_int_equal(fm_allowlist_load(&a, sub), FM_OK);
    assert_int_equal(fm_allowlist_count(a), 3);
    for (int i = 0; i < 3; i++) {
        uint8_t bin[FM_KEY_BYTES];
        fm_key_binary(k[i].public_z85, bin);
        assert_string_equal(fm_allowlist_id(a, bin), ids[i]);
        assert_true(fm_allowlist_has(a, ids[i]));
    }
    uint8_t zero[FM_KEY_BYTES] = {0};
    assert_null(fm_allowlist_id(a, zero));
    assert_false(fm_allowlist_has(a, "c9"));
    fm_allowlist_free(&a);
    assert_null(a);
    /* a second key claiming c1 */
    fm_key_t dup;
    assert_int_equal(fm_key_generate(&dup, "c1"), FM_OK);
    char text[256];
    snprintf(text, sizeof text, "id = c1\npublic = %s\n", dup.public_z85);
    snprintf(path, sizeof path, "%s/c1-again.pub", sub);
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    assert_int_equal(fm_allowlist_load(&a, sub), FM_ERR_FORMAT);
    assert_non_null(strstr(fm_error_last(), "two keys for id c1"));
    /* c0's key under another id */
    snprintf(text, sizeof text, "id = c7\npublic = %s\n", k[0].public_z85);
    f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    assert_int_equal(fm_allowlist_load(&a, sub), FM_ERR_FORMAT);
    assert_non_null(strstr(fm_error_last(), "one key for two ids"));
    assert_int_equal(fm_allowlist_load(&a, "/nonexistent-folder"), FM_ERR_IO);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pair_round_trip_and_no_overwrite),
        cmocka_unit_test(test_bad_files_refused),
        cmocka_unit_test(test_allowlist),
    };
    return procs_run_tests("keys", tests, sizeof tests / sizeof tests[0], dir, sizeof dir);
}
