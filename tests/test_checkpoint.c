/* The one checkpoint format (fedmoe/checkpoint.h) and the coordinator's
 * checkpoint on it: round trips, every truncation, every corrupted byte and an
 * extension refused; fields read past their end refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coordinator.h"
#include "fedmoe/checkpoint.h"
#include "fedmoe/log.h"

#define MAGIC 0x54534554u /* "TEST" */

static void make_blob(uint8_t **blob, size_t *len)
{
    fm_ckpt_writer_t w;
    fm_ckpt_begin(&w, MAGIC, 3);
    fm_ckpt_put_u8(&w, 0xAB);
    fm_ckpt_put_u32(&w, 0xDEADBEEF);
    fm_ckpt_put_u64(&w, 0x0123456789ABCDEFull);
    const float x[5] = {1.5f, -0.0f, 3e-39f /* subnormal */, 1e30f, -2.25f};
    fm_ckpt_put_floats(&w, x, 5);
    fm_ckpt_put_bytes(&w, "fedmoe", 6);
    assert_int_equal(fm_ckpt_finish(&w, blob, len), FM_OK);
}

static void test_round_trip_little_endian(void **state)
{
    (void)state;
    uint8_t *blob;
    size_t len;
    make_blob(&blob, &len);
    assert_int_equal(len, FM_CKPT_OVERHEAD + 1 + 4 + 8 + 20 + 6);
    /* little-endian on every host: the magic's first byte is its low byte */
    assert_int_equal(blob[0], 0x54);
    assert_int_equal(blob[17], 0xEF);
    fm_ckpt_reader_t r;
    assert_int_equal(fm_ckpt_open(&r, blob, len, MAGIC, 3, "test"), FM_OK);
    uint8_t a;
    uint32_t b;
    uint64_t c;
    float x[5];
    char s[6];
    assert_true(fm_ckpt_get_u8(&r, &a) && fm_ckpt_get_u32(&r, &b) && fm_ckpt_get_u64(&r, &c));
    assert_true(fm_ckpt_get_floats(&r, x, 5) && fm_ckpt_get_bytes(&r, s, 6));
    assert_int_equal(a, 0xAB);
    assert_int_equal(b, 0xDEADBEEF);
    assert_true(c == 0x0123456789ABCDEFull);
    assert_true(x[0] == 1.5f && signbit(x[1]) && x[2] == 3e-39f && x[3] == 1e30f && x[4] == -2.25f);
    assert_memory_equal(s, "fedmoe", 6);
    assert_int_equal(fm_ckpt_left(&r), 0);
    assert_int_equal(fm_ckpt_close(&r, "test"), FM_OK);
    free(blob);
}

static void test_every_truncation_and_corruption_refused(void **state)
{
    (void)state;
    uint8_t *blob;
    size_t len;
    make_blob(&blob, &len);
    fm_ckpt_reader_t r;
    for (size_t n = 0; n < len; n++)
        assert_int_equal(fm_ckpt_open(&r, blob, n, MAGIC, 3, "test"), FM_ERR_FORMAT);
    for (size_t i = 0; i < len; i++) {
        for (int bit = 0; bit < 8; bit += 3) {
            blob[i] ^= (uint8_t)(1u << bit);
            assert_int_equal(fm_ckpt_open(&r, blob, len, MAGIC, 3, "test"), FM_ERR_FORMAT);
            blob[i] ^= (uint8_t)(1u << bit);
        }
    }
    uint8_t *longer = malloc(len + 1);
    memcpy(longer, blob, len);
    longer[len] = 0;
    assert_int_equal(fm_ckpt_open(&r, longer, len + 1, MAGIC, 3, "test"), FM_ERR_FORMAT);
    assert_int_equal(fm_ckpt_open(&r, blob, len, MAGIC, 4, "test"), FM_ERR_FORMAT); /* another version */
    assert_int_equal(fm_ckpt_open(&r, blob, len, FM_CKPT_MAGIC_CLIENT, 3, "test"), FM_ERR_FORMAT);
    assert_int_equal(fm_ckpt_open(&r, blob, len, MAGIC, 3, "test"), FM_OK);
    free(longer);
    free(blob);
}

static void test_reading_past_the_end_or_short_refused(void **state)
{
    (void)state;
    uint8_t *blob;
    size_t len;
    make_blob(&blob, &len);
    fm_ckpt_reader_t r;
    uint64_t big;
    float x[64];
    assert_int_equal(fm_ckpt_open(&r, blob, len, MAGIC, 3, "test"), FM_OK);
    assert_false(fm_ckpt_get_floats(&r, x, 64)); /* more than there is */
    assert_false(fm_ckpt_get_u64(&r, &big));     /* and the reader stays failed */
    assert_int_equal(fm_ckpt_close(&r, "test"), FM_ERR_FORMAT);
    assert_int_equal(fm_ckpt_open(&r, blob, len, MAGIC, 3, "test"), FM_OK);
    uint8_t a;
    assert_true(fm_ckpt_get_u8(&r, &a));
    assert_int_equal(fm_ckpt_close(&r, "test"), FM_ERR_FORMAT); /* bytes left over */
    free(blob);
}

static void test_coordinator_checkpoint(void **state)
{
    (void)state;
    float global[7] = {1, 2, 3, 4, 5, 6, 7}, prompt[3] = {0.5f, -0.5f, 0.25f}, pool[6] = {1, 1, 1, 2, 2, 2};
    char ids[2][64] = {"client-a", "client-b"};
    fm_checkpoint_t ck = {.round = 12, .global = global, .nglobal = 7, .prompt = prompt, .nprompt = 3,
                          .pool_count = 2, .pool_ids = ids, .pool = pool, .clip = {1.5, 0.25}};
    uint8_t *blob;
    size_t len;
    assert_int_equal(fm_checkpoint_encode(&ck, &blob, &len), FM_OK);
    fm_checkpoint_t out;
    assert_int_equal(fm_checkpoint_decode(blob, len, &out), FM_OK);
    assert_int_equal(out.round, 12);
    assert_true(out.clip[0] == 1.5 && out.clip[1] == 0.25); /* the learned clip bounds resume too */
    assert_int_equal(out.nglobal, 7);
    assert_memory_equal(out.global, global, sizeof global);
    assert_memory_equal(out.prompt, prompt, sizeof prompt);
    assert_int_equal(out.pool_count, 2);
    assert_string_equal(out.pool_ids[1], "client-b");
    assert_memory_equal(out.pool, pool, sizeof pool);
    fm_checkpoint_free(&out);
    for (size_t n = 0; n < len; n++)
        assert_int_equal(fm_checkpoint_decode(blob, n, &out), FM_ERR_FORMAT);
    blob[len / 2] ^= 1;
    assert_int_equal(fm_checkpoint_decode(blob, len, &out), FM_ERR_FORMAT);
    free(blob);
    /* a well-formed blob whose round would overflow the next round's number */
    ck.round = INT_MAX;
    assert_int_equal(fm_checkpoint_encode(&ck, &blob, &len), FM_OK);
    assert_int_equal(fm_checkpoint_decode(blob, len, &out), FM_ERR_FORMAT);
    free(blob);
    /* a pool count larger than the entries that follow, in a sealed blob */
    ck.round = 1;
    fm_ckpt_writer_t w;
    fm_ckpt_begin(&w, FM_CKPT_MAGIC_COORDINATOR, 2);
    fm_ckpt_put_u32(&w, 1);
    fm_ckpt_put_u64(&w, 7);
    fm_ckpt_put_floats(&w, global, 7);
    fm_ckpt_put_u64(&w, 3);
    fm_ckpt_put_floats(&w, prompt, 3);
    fm_ckpt_put_u32(&w, 1000000);
    assert_int_equal(fm_ckpt_finish(&w, &blob, &len), FM_OK);
    assert_int_equal(fm_checkpoint_decode(blob, len, &out), FM_ERR_FORMAT);
    free(blob);
}

static void test_files(void **state)
{
    (void)state;
    char dir[] = "/tmp/fedmoe-test-ckpt-XXXXXX", path[128];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/state", dir);
    uint8_t *blob, *back;
    size_t len, n;
    make_blob(&blob, &len);
    assert_int_equal(fm_ckpt_write_file(path, blob, len), FM_OK);
    assert_int_equal(fm_ckpt_read_file(path, len, &back, &n), FM_OK);
    assert_int_equal(n, len);
    assert_memory_equal(back, blob, len);
    free(back);
    assert_int_equal(fm_ckpt_read_file(path, len - 1, &back, &n), FM_ERR_FORMAT); /* larger than expected */
    assert_int_equal(fm_ckpt_read_file(dir, 1 << 20, &back, &n), FM_ERR_FORMAT);  /* not a file */
    unlink(path);
    assert_int_equal(fm_ckpt_read_file(path, len, &back, &n), FM_ERR_IO);
    rmdir(dir);
    free(blob);
}

int main(void)
{
    fm_log_set_level(FM_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_little_endian),
        cmocka_unit_test(test_every_truncation_and_corruption_refused),
        cmocka_unit_test(test_reading_past_the_end_or_short_refused),
        cmocka_unit_test(test_coordinator_checkpoint),
        cmocka_unit_test(test_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
