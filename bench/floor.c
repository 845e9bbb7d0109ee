/* fedmoe-floor: what one client costs a coordinator per round at the least,
 * for a federated vector of F floats (BENCHMARKS.md "Scale"): the bytes a
 * round moves for it (its Task down, its Update up) at this machine's memory
 * bandwidth (memcpy of 256 MiB, beyond the caches), the SHA-256 of its Update (the digest the coordinator
 * checks), and with CURVE the encryption of its Task and the decryption of its
 * Update (XSalsa20-Poly1305, libsodium's crypto_secretbox, what libzmq's CURVE
 * runs per message). Medians of 7 runs of 20 repetitions each.
 *   fedmoe-floor [F]      (default 233088: the default model under `full`) */
#include <openssl/evp.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/clock.h"

#define RUNS 7
#define REPS 20

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median over RUNS of the milliseconds of one call of: 0 memcpy, 1 SHA-256,
 * 2 seal, 3 seal then open (into out). */
static double median_ms(int kind, unsigned char *src, unsigned char *dst, unsigned char *out, size_t n)
{
    unsigned char key[32] = {1}, nonce[24] = {2}, mac[16], digest[32];
    unsigned int dlen;
    double t[RUNS];
    for (int r = 0; r < RUNS; r++) {
        double t0 = fm_clock_seconds();
        for (int i = 0; i < REPS; i++) {
            src[(size_t)i % n] ^= (unsigned char)(i + 1); /* (not the same input twice) */
            if (kind == 0)
                memcpy(dst, src, n);
            else if (kind == 1)
                EVP_Digest(src, n, digest, &dlen, EVP_sha256(), NULL);
            else
                crypto_secretbox_detached(dst, mac, src, n, nonce, key);
            if (kind == 3 && crypto_secretbox_open_detached(out, dst, mac, n, nonce, key) != 0)
                abort();
        }
        t[r] = (fm_clock_seconds() - t0) / REPS * 1e3;
    }
    qsort(t, RUNS, sizeof t[0], cmp);
    return t[RUNS / 2];
}

int main(int argc, char **argv)
{
    size_t floats = argc > 1 ? strtoul(argv[1], NULL, 10) : 233088, n = 4 * floats;
    if (sodium_init() < 0 || floats == 0) {
        fprintf(stderr, "usage: fedmoe-floor [FLOATS]\n");
        return 2;
    }
    unsigned char *a = calloc(n, 1), *b = calloc(n, 1), *c = calloc(n, 1);
    /* memory bandwidth: copies of 256 MiB (beyond every cache), scaled to n */
    size_t big = (size_t)256 << 20;
    unsigned char *x = malloc(big), *y = malloc(big);
    memset(x, 1, big);
    memset(y, 2, big);
    double copy = median_ms(0, x, y, NULL, big) * (double)n / (double)big;
    free(x);
    free(y);
    double sha = median_ms(1, a, b, c, n), seal = median_ms(2, a, b, c, n);
    double open = median_ms(3, a, b, c, n) - seal;
    printf("model %zu floats (%.0f KB)\n", floats, n / 1024.0);
    printf("  moving the Task and the Update once at memory speed  %.3f ms  (memcpy: %.1f GB/s)\n", 2 * copy,
           n / copy / 1e6);
    printf("  SHA-256 of the Update                                %.3f ms  (%.2f GB/s)\n", sha, n / sha / 1e6);
    printf("  CURVE: seal the Task, open the Update                %.3f ms  (%.3f + %.3f)\n", seal + open, seal, open);
    printf("  floor, insecure: %.3f ms; with CURVE: %.3f ms per client-round\n", 2 * copy + sha,
           2 * copy + sha + seal + open);
    free(a);
    free(b);
    free(c);
    return 0;
}
