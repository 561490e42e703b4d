/* hmac.c: SHA-256 and HMAC-SHA-256 (see hmac.h), written from FIPS 180-4
 * and RFC 2104, and the random bytes the gate's nonces and the host mesh's
 * keys come from. */
#define _GNU_SOURCE /* explicit_bzero */
#include "runtime/hmac.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1,
    0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3,
    0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147,
    0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
    0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void sha256_block(uint32_t h[8], const uint8_t *p) {
  uint32_t w[64];
  for (int i = 0; i < 16; i++) {
    w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
           (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
  }
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3];
  uint32_t e = h[4], f = h[5], g = h[6], k = h[7];
  for (int i = 0; i < 64; i++) {
    uint32_t t1 = k + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) +
                  ((e & f) ^ (~e & g)) + K[i] + w[i];
    uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) +
                  ((a & b) ^ (a & c) ^ (b & c));
    k = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h[0] += a;
  h[1] += b;
  h[2] += c;
  h[3] += d;
  h[4] += e;
  h[5] += f;
  h[6] += g;
  h[7] += k;
}

void mep_sha256_init(mep_sha256_t *s) {
  static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372,
                                 0xa54ff53a, 0x510e527f, 0x9b05688c,
                                 0x1f83d9ab, 0x5be0cd19};
  memcpy(s->h, h0, sizeof(h0));
  s->bytes = 0;
  s->fill = 0;
}

void mep_sha256_update(mep_sha256_t *s, const void *data, size_t len) {
  const uint8_t *p = (const uint8_t *)data;
  s->bytes += len;
  while (len > 0) {
    size_t take = 64 - s->fill < len ? 64 - s->fill : len;
    memcpy(s->block + s->fill, p, take);
    s->fill += take;
    p += take;
    len -= take;
    if (s->fill == 64) {
      sha256_block(s->h, s->block);
      s->fill = 0;
    }
  }
}

void mep_sha256_final(mep_sha256_t *s, uint8_t out[MEP_SHA256_BYTES]) {
  uint64_t bits = s->bytes * 8;
  uint8_t pad = 0x80;
  mep_sha256_update(s, &pad, 1);
  uint8_t zero = 0;
  while (s->fill != 56) mep_sha256_update(s, &zero, 1);
  uint8_t len[8];
  for (int i = 0; i < 8; i++) len[i] = (uint8_t)(bits >> (56 - 8 * i));
  mep_sha256_update(s, len, 8);
  for (int i = 0; i < 8; i++) {
    out[4 * i] = (uint8_t)(s->h[i] >> 24);
    out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
    out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
    out[4 * i + 3] = (uint8_t)s->h[i];
  }
}

void mep_sha256(const void *data, size_t len, uint8_t out[MEP_SHA256_BYTES]) {
  mep_sha256_t s;
  mep_sha256_init(&s);
  mep_sha256_update(&s, data, len);
  mep_sha256_final(&s, out);
}

void mep_hmac_key_init(mep_hmac_key_t *k, const void *key, size_t key_len) {
  uint8_t block[64] = {0};
  if (key_len > 64) { /* longer keys are hashed first */
    mep_sha256(key, key_len, block);
  } else if (key_len > 0) {
    memcpy(block, key, key_len);
  }
  uint8_t pad[64];
  for (int i = 0; i < 64; i++) pad[i] = block[i] ^ 0x36;
  mep_sha256_init(&k->inner);
  mep_sha256_update(&k->inner, pad, 64);
  for (int i = 0; i < 64; i++) pad[i] = block[i] ^ 0x5c;
  mep_sha256_init(&k->outer);
  mep_sha256_update(&k->outer, pad, 64);
  /* Only the hash states keep anything of the key. */
  explicit_bzero(block, sizeof(block));
  explicit_bzero(pad, sizeof(pad));
}

void mep_hmac_keyed(const mep_hmac_key_t *k, int n, const void *const *parts,
                    const size_t *lens, uint8_t out[MEP_SHA256_BYTES]) {
  mep_sha256_t s = k->inner;
  uint8_t inner[MEP_SHA256_BYTES];
  for (int i = 0; i < n; i++) mep_sha256_update(&s, parts[i], lens[i]);
  mep_sha256_final(&s, inner);
  s = k->outer;
  mep_sha256_update(&s, inner, sizeof(inner));
  mep_sha256_final(&s, out);
}

void mep_hmac_sha256(const void *key, size_t key_len, int n,
                     const void *const *parts, const size_t *lens,
                     uint8_t out[MEP_SHA256_BYTES]) {
  mep_hmac_key_t k;
  mep_hmac_key_init(&k, key, key_len);
  mep_hmac_keyed(&k, n, parts, lens, out);
}

int mep_bytes_equal(const void *a, const void *b, size_t n) {
  const uint8_t *x = (const uint8_t *)a, *y = (const uint8_t *)b;
  uint8_t diff = 0;
  for (size_t i = 0; i < n; i++) diff |= (uint8_t)(x[i] ^ y[i]);
  return diff == 0;
}

int mep_random_bytes(void *out, size_t n) {
  uint8_t *o = out;
  size_t got = 0;
  while (got < n) {
    ssize_t r = getrandom(o + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      if (r == 0) errno = EIO;
      return -1;
    }
    got += (size_t)r;
  }
  return 0;
}
