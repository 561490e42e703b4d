/* hmac.h: SHA-256 (FIPS 180-4), HMAC-SHA-256 (RFC 2104) and random bytes,
 * for the bootstrap's gate (a joiner and rank 0 prove to each other that
 * they hold the job token without sending it) and the host mesh's message
 * keys. Small and dependency-free on purpose: the plugin links no crypto
 * library. */
#ifndef MEP_RUNTIME_HMAC_H_
#define MEP_RUNTIME_HMAC_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MEP_SHA256_BYTES 32

typedef struct mep_sha256 {
  uint32_t h[8];
  uint64_t bytes;      /* message bytes so far */
  uint8_t block[64];   /* the partial block */
  size_t fill;
} mep_sha256_t;

void mep_sha256_init(mep_sha256_t *s);
void mep_sha256_update(mep_sha256_t *s, const void *data, size_t len);
void mep_sha256_final(mep_sha256_t *s, uint8_t out[MEP_SHA256_BYTES]);
/* SHA-256 of len bytes in one call. */
void mep_sha256(const void *data, size_t len, uint8_t out[MEP_SHA256_BYTES]);

/* HMAC over the concatenation of `n` parts (parts[i], lens[i]). */
void mep_hmac_sha256(const void *key, size_t key_len, int n,
                     const void *const *parts, const size_t *lens,
                     uint8_t out[MEP_SHA256_BYTES]);

/* A key made ready once, as the two hash states after its padded blocks:
 * each HMAC under it then costs the message's blocks and two more, not
 * four (the host mesh tags every message). */
typedef struct mep_hmac_key {
  mep_sha256_t inner, outer;
} mep_hmac_key_t;
void mep_hmac_key_init(mep_hmac_key_t *k, const void *key, size_t key_len);
/* mep_hmac_sha256 under a ready key. */
void mep_hmac_keyed(const mep_hmac_key_t *k, int n, const void *const *parts,
                    const size_t *lens, uint8_t out[MEP_SHA256_BYTES]);

/* 1 when a and b hold the same n bytes; time independent of where they
 * differ. */
int mep_bytes_equal(const void *a, const void *b, size_t n);

/* n bytes from the kernel's random source (getrandom); 0, or -1 with errno
 * set when it gives none. */
int mep_random_bytes(void *out, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* MEP_RUNTIME_HMAC_H_ */
