/* digest.c - the SHA-256 that names a checkpoint in the round log (OpenSSL EVP). */
#include <openssl/evp.h>
#include <stdio.h>

#include "fedmoe/store.h"

void fm_sha256_hex(const uint8_t *data, size_t len, char out[65])
{
    uint8_t d[32];
    unsigned int n = 32;
    EVP_Digest(data, len, d, &n, EVP_sha256(), NULL);
    for (int i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}
