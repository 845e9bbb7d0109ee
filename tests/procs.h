/* procs.h - test support: starting the real programs, waiting for them, reading
 * what they left in the round log. */
#ifndef FEDMOE_TEST_PROCS_H
#define FEDMOE_TEST_PROCS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "fedmoe/wire.h"

#define BIN(name) FM_BIN_DIR "/" name

struct CMUnitTest;
/* Makes a scratch folder /tmp/fedmoe-test-NAME-XXXXXX into dir, runs the tests,
 * removes the folder if they passed (keeps it, and says where, if not). */
int procs_run_tests(const char *name, const struct CMUnitTest *tests, size_t n, char *dir, size_t dircap);

/* Speaking the protocol from a test: encode and send env on a DEALER socket;
 * send an Update of round with a 1 x n model tensor, a 4 x 64 prompt, samples
 * and plausible metrics. Return 0 when sent. */

int procs_send_env(void *sock, Fedmoe__Envelope *env);
int procs_send_update(void *sock, uint32_t round, const float *vec, uint32_t n, const float *prompt, uint64_t samples);

/* Starts argv[0] with stdout and stderr to log. */
pid_t procs_spawn(char *const argv[], const char *log);
/* Exit status of pid within seconds (128 + signal when killed), or -1 after
 * killing it when it did not exit in time. */
int procs_wait(pid_t pid, double seconds);
/* Runs a shell command; returns its exit status and stdout (malloc'd). */
int procs_capture(const char *cmd, char **out);
int procs_count_lines(const char *s);
/* Rounds committed in the latest run of db (0 if none or unreadable). */
int procs_committed_rounds(const char *db);
/* SHA-256 of the latest run's last checkpoint into out (65 bytes); false if none. */
bool procs_last_checkpoint_sha(const char *db, char out[65]);
/* PRAGMA integrity_check of db is "ok". */
bool procs_integrity_ok(const char *db);

#endif
