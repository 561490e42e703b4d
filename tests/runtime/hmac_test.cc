// hmac_test.cc: SHA-256 against FIPS 180-4's examples and HMAC-SHA-256
// against RFC 4231's test cases 1, 2, 3 and 6 (a key longer than a block),
// including a message split into parts.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "runtime/hmac.h"

namespace {

std::string Hex(const uint8_t *p, size_t n) {
  std::string s;
  char b[3];
  for (size_t i = 0; i < n; i++) {
    std::snprintf(b, sizeof b, "%02x", p[i]);
    s += b;
  }
  return s;
}

std::string Sha(const std::string &m) {
  mep_sha256_t s;
  mep_sha256_init(&s);
  mep_sha256_update(&s, m.data(), m.size());
  uint8_t out[MEP_SHA256_BYTES];
  mep_sha256_final(&s, out);
  return Hex(out, sizeof out);
}

std::string Hmac(const std::string &key, const std::vector<std::string> &parts) {
  std::vector<const void *> p;
  std::vector<size_t> l;
  for (const std::string &x : parts) {
    p.push_back(x.data());
    l.push_back(x.size());
  }
  uint8_t out[MEP_SHA256_BYTES];
  mep_hmac_sha256(key.data(), key.size(), (int)p.size(), p.data(), l.data(), out);
  return Hex(out, sizeof out);
}

TEST(Sha256, FipsExamples) {
  EXPECT_EQ(Sha("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Sha(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(HmacSha256, Rfc4231) {
  EXPECT_EQ(Hmac(std::string(20, '\x0b'), {"Hi There"}),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(Hmac("Jefe", {"what do ya want ", "for nothing?"}),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(Hmac(std::string(20, '\xaa'), {std::string(50, '\xdd')}),
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  EXPECT_EQ(Hmac(std::string(131, '\xaa'),
                 {"Test Using Larger Than Block-Size Key - Hash Key First"}),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(BytesEqual, ComparesEveryByte) {
  const uint8_t a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 5};
  EXPECT_TRUE(mep_bytes_equal(a, a, 4));
  EXPECT_FALSE(mep_bytes_equal(a, b, 4));
  EXPECT_TRUE(mep_bytes_equal(a, b, 3));
}

}  // namespace
