/* procs.h - test support: starting the real programs, waiting for them, reading
 * what they left in the round log. */
#ifndef FEDMOE_TEST_PROCS_H
#define FEDMOE_TEST_PROCS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "fedmoe/store.h"
#include "fedmoe/wire.h"

/* A program of the build under test; FEDMOE_BIN_DIR (a build folder) points
 * the attack tests at other programs, to measure them (bench/hostile.sh). */
#define BIN(name) procs_bin(name)
char *procs_bin(const char *name);
/* FEDMOE_MEASURE_ONLY set: an attack test reports its numbers without judging
 * them (for programs that are meant to fail them). */
bool procs_measure_only(void);
/* A number macro as a string literal (for argv). */
#define FM_STR_(x) #x
#define FM_STR(x) FM_STR_(x)

struct CMUnitTest;
/* Makes a scratch folder /tmp/fedmoe-test-NAME-XXXXXX into dir, runs the tests,
 * removes the folder if they passed (keeps it, and says where, if not). */
int procs_run_tests(const char *name, const struct CMUnitTest *tests, size_t n, char *dir, size_t dircap);

/* Speaking the protocol from a test: encode and send env on a DEALER socket;
 * send an Update of round (echoing nonce, the 16 bytes of its Task; NULL sends
 * none) with a 1 x n model tensor, a 4 x 64 prompt, samples and plausible
 * metrics. Return 0 when sent. */

int procs_send_env(void *sock, Fedmoe__Envelope *env);
/* Sends a Heartbeat on a DEALER. */
void procs_heartbeat(void *sock);
/* The largest message a coordinator reads, from its log's first lines (0: not
 * found). */
long procs_max_message(const char *log);
/* Whether a line of the log file contains text. */
bool procs_log_has(const char *log, const char *text);
/* A loopback TCP port free now (the kernel's choice): tests running side by
 * side do not collide as ports derived from their pids could. */
int procs_free_port(void);
/* The next message of kind on sock (others, and what does not decode, skipped;
 * kind 0 takes any) within seconds, or NULL; the caller frees it. On a ROUTER
 * (rid not NULL) the sender's routing id goes into rid (256 bytes) and *ridn. */
Fedmoe__Envelope *procs_recv_kind(void *sock, int kind, double seconds, uint8_t *rid, int *ridn);
/* Fills env and h (the caller's) as a Hello from id for partition (-1: assign
 * one) with train_samples (0: no data yet), a quarter of it validation and a
 * third test, 2 specialists, this protocol version. */
void procs_hello(Fedmoe__Envelope *env, Fedmoe__Hello *h, const char *id, int partition, uint64_t train_samples);
/* The counts a fake client on data of its own declares with train_samples (and
 * its updates report): validation train/4, test train/3, half of test correct. */
void procs_fake_counts(uint64_t train, uint64_t *val, uint64_t *test, uint64_t *correct, float *accuracy);
int procs_send_update(void *sock, uint32_t round, const uint8_t *nonce, const float *vec, uint32_t n, const float *prompt,
                      uint64_t samples);
/* The same with the metrics given (NULL: procs_fake_counts(samples)). */
int procs_send_update_metrics(void *sock, uint32_t round, const uint8_t *nonce, const float *vec, uint32_t n,
                              const float *prompt, uint64_t samples, const Fedmoe__Metrics *metrics);

/* Real CURVE keys for the programs and sockets a test starts, kept in the
 * folder of procs_run_tests: DIR/keys/coordinator.key and .pub, and one pair per
 * client id in DIR/keys/clients, the coordinator's allow-list. Make every
 * client's key before the coordinator starts (it reads the list then, and again
 * on SIGHUP). */
/* The path of id's key pair file, made if missing, in out (512 bytes). */
const char *procs_client_key(const char *id, char *out);
/* Makes the keys of clients PREFIX0 .. PREFIX(n-1) (c0, c1, ...). */
void procs_client_keys(const char *prefix, int n);
/* The coordinator's key pair file, public key file and the allow-list folder
 * (512 bytes each), made if missing. */
void procs_server_keys(char *key, char *pub, char *allow);
/* Makes a DEALER socket (before it connects) a CURVE client with id's key,
 * talking to the test coordinator's key. */
void procs_secure_client(void *sock, const char *id);
/* Makes a ROUTER socket (before it binds) a CURVE server with the test
 * coordinator's key (a fake coordinator: no allow-list, any key admitted). */
void procs_secure_server(void *sock);

/* procs_spawn of a fedmoe-server argv with "--key K --allow DIR" of the test's
 * keys added, and of a fedmoe-client argv (which names its --id) with "--key
 * ID.key --server-key coordinator.pub" added; the client's key is made if
 * missing (before the coordinator starts, or it is not on the list). */
pid_t procs_spawn_server(char *const argv[], const char *log);
pid_t procs_spawn_client(char *const argv[], const char *log);

/* Starts argv[0] with stdout and stderr to log. */
pid_t procs_spawn(char *const argv[], const char *log);
/* Exit status of pid within seconds (128 + signal when killed), or -1 after
 * killing it when it did not exit in time. */
int procs_wait(pid_t pid, double seconds);
/* Runs a shell command; returns its exit status and stdout (malloc'd). */
int procs_capture(const char *cmd, char **out);
int procs_count_lines(const char *s);
/* Runs command (its stderr with its stdout) and fails the test unless it
 * exits non-zero with one line that contains says. */
void procs_expect_refusal(const char *command, const char *says);
/* Rounds committed in the latest run of db (0 if none or unreadable). */
int procs_committed_rounds(const char *db);
/* SHA-256 of the latest run's last checkpoint into out (65 bytes); false if none. */
bool procs_last_checkpoint_sha(const char *db, char out[65]);
/* Opens db read-only and reads its latest run (which must exist) into *run;
 * the caller clears run and closes *st. */
void procs_open_latest(const char *db, fm_store_t **st, fm_run_row_t *run);
/* DIR/TAG.db and DIR/TAG-server.log in the test's folder (512 bytes each). */
void procs_files(const char *tag, char *db, char *log);
/* The latest run of db, which must be finished: its rounds and every client
 * row (malloc'd; the caller frees both). */
void procs_finished_run(const char *db, fm_round_row_t **rounds, int *nr, fm_client_round_row_t **rows, int *nc);
/* Waits for the coordinator (300 s) and the n clients (30 s each) to exit 0,
 * then asserts the finished run in db: `rounds` rounds, each with a completed
 * row of every client, every row one of ids[0..n). */
void procs_assert_run_of(const char *db, pid_t server, const pid_t *clients, const char *const *ids, int n,
                         int rounds);
struct fm_checkpoint;
/* The latest checkpoint of db's latest run, decoded into *ck (free with
 * fm_checkpoint_free), and its round. */
void procs_latest_checkpoint(const char *db, struct fm_checkpoint *ck, int *round);
/* Its global vector then its global prompt, as bytes (malloc'd, *len). */
uint8_t *procs_final_state(const char *db, size_t *len);
/* PRAGMA integrity_check of db is "ok". */
bool procs_integrity_ok(const char *db);

/* A process's resident memory in kB (-1 when unknown). */
long procs_rss_kb(pid_t pid);
/* How many descriptors a process holds. */
int procs_fd_count(pid_t pid);

#endif
