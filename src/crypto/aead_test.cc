// Tests of the crypto primitives (crypto/aead.h): known-answer vectors (the GCM specification's
// AES-256 test cases 13, 14 and 16, RFC 5869 HKDF cases 1 and 3, RFC 4231 HMAC case 2 and the
// empty-key HMAC), the incremental GcmSealer against one-shot GcmSeal, tamper detection of
// GcmOpen, GcmDecryptRange, and hex.
#include "crypto/aead.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "testutil/testutil.h"

namespace savepoint::crypto {
namespace {

using ::savepoint::testing::StatusIs;

std::string H(const std::string& hex) { return Unhex(hex).value(); }
std::string HexOf(Bytes b) { return Hex(b); }
MutableBytes Mut(std::string& s) { return std::as_writable_bytes(std::span(s)); }

// The GCM specification (McGrew & Viega), test case 16: AES-256, 60-byte plaintext, 20-byte AAD.
struct Case16 {
  std::string key = H("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308");
  std::string nonce = H("cafebabefacedbaddecaf888");
  std::string plain = H(
      "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a721c3c0c95956809532fcf0e2449a6"
      "b525b16aedf5aa0de657ba637b39");
  std::string aad = H("feedfacedeadbeeffeedfacedeadbeefabaddad2");
  std::string cipher =
      "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa8cb08e48590dbb3da7b08b1056"
      "828838c5f61e6393ba7a0abcc9f662";
  std::string tag = "76fc6ece0f4e1768cddf8853bb2d551b";
};

TEST(Gcm, SpecTestCase16) {
  Case16 c;
  std::string out(c.plain.size(), '\0');
  Result<GcmTag> tag =
      GcmSeal(AsBytes(c.key), AsBytes(c.nonce), AsBytes(c.aad), AsBytes(c.plain), Mut(out));
  ASSERT_TRUE(tag.ok()) << tag.status().ToString();
  EXPECT_EQ(HexOf(AsBytes(out)), c.cipher);
  EXPECT_EQ(HexOf(*tag), c.tag);
  std::string back(out.size(), '\0');
  SP_EXPECT_OK(
      GcmOpen(AsBytes(c.key), AsBytes(c.nonce), AsBytes(c.aad), AsBytes(out), *tag, Mut(back)));
  EXPECT_EQ(back, c.plain);
}

TEST(Gcm, SpecTestCases13And14ZeroKey) {
  const std::string key(32, '\0'), nonce(12, '\0');
  std::string none;
  Result<GcmTag> t13 = GcmSeal(AsBytes(key), AsBytes(nonce), {}, AsBytes(none), Mut(none));
  ASSERT_TRUE(t13.ok());
  EXPECT_EQ(HexOf(*t13), "530f8afbc74536b9a963b4f1c4cb738b");
  const std::string zeros(16, '\0');
  std::string out(16, '\0');
  Result<GcmTag> t14 = GcmSeal(AsBytes(key), AsBytes(nonce), {}, AsBytes(zeros), Mut(out));
  ASSERT_TRUE(t14.ok());
  EXPECT_EQ(HexOf(AsBytes(out)), "cea7403d4d606b6e074ec5d3baf39d18");
  EXPECT_EQ(HexOf(*t14), "d0d1c8a799996bf0265b98b5d48ab919");
}

TEST(Gcm, InPlaceAndInPieces) {
  Case16 c;
  std::string buf = c.plain;  // in == out
  Result<GcmTag> tag =
      GcmSeal(AsBytes(c.key), AsBytes(c.nonce), AsBytes(c.aad), AsBytes(buf), Mut(buf));
  ASSERT_TRUE(tag.ok());
  EXPECT_EQ(HexOf(AsBytes(buf)), c.cipher);
  // Pieces of odd sizes (not multiples of the 16-byte block), as one message.
  std::vector<Bytes> pieces = {AsBytes(c.plain).subspan(0, 7), AsBytes(c.plain).subspan(7, 20),
                               AsBytes(c.plain).subspan(27)};
  std::string out(c.plain.size(), '\0');
  tag = GcmSeal(AsBytes(c.key), AsBytes(c.nonce), AsBytes(c.aad), pieces, Mut(out));
  ASSERT_TRUE(tag.ok());
  EXPECT_EQ(HexOf(AsBytes(out)), c.cipher);
  EXPECT_EQ(HexOf(*tag), c.tag);
  SP_EXPECT_OK(GcmOpen(AsBytes(c.key), AsBytes(c.nonce), AsBytes(c.aad), AsBytes(out), *tag,
                       Mut(out)));  // decrypt in place
  EXPECT_EQ(out, c.plain);
}

TEST(Gcm, SealerWritesPiecesToSeparateBuffers) {
  Case16 c;
  Result<GcmSealer> s = GcmSealer::Begin(AsBytes(c.key), AsBytes(c.nonce), AsBytes(c.aad));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::string a(13, '\0'), b(c.plain.size() - 13, '\0');
  SP_ASSERT_OK(s->Update(AsBytes(c.plain).first(13), Mut(a)));
  SP_ASSERT_OK(s->Update(AsBytes(c.plain).subspan(13), Mut(b)));
  Result<GcmTag> tag = s->Finish();
  ASSERT_TRUE(tag.ok());
  EXPECT_EQ(HexOf(AsBytes(a + b)), c.cipher);
  EXPECT_EQ(HexOf(*tag), c.tag);
  EXPECT_THAT(s->Finish(), StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(s->Update(AsBytes(a), Mut(a)), StatusIs(StatusCode::kFailedPrecondition));
}

TEST(Gcm, OpenDetectsEveryChange) {
  Case16 c;
  std::string ct(c.plain.size(), '\0');
  GcmTag tag =
      GcmSeal(AsBytes(c.key), AsBytes(c.nonce), AsBytes(c.aad), AsBytes(c.plain), Mut(ct)).value();
  std::string out(ct.size(), '\0');
  auto open = [&](const std::string& key, const std::string& nonce, const std::string& aad,
                  const std::string& in, const GcmTag& t) {
    return GcmOpen(AsBytes(key), AsBytes(nonce), AsBytes(aad), AsBytes(in), t, Mut(out)).code();
  };
  const StatusCode kU = StatusCode::kUnauthenticated;
  EXPECT_EQ(open(c.key, c.nonce, c.aad, ct, tag), StatusCode::kOk);
  std::string bad = c.key;
  bad[5] ^= 1;
  EXPECT_EQ(open(bad, c.nonce, c.aad, ct, tag), kU) << "wrong key";
  bad = c.nonce;
  bad[11] ^= 0x80;
  EXPECT_EQ(open(c.key, bad, c.aad, ct, tag), kU) << "flipped nonce bit";
  bad = c.aad;
  bad[0] ^= 1;
  EXPECT_EQ(open(c.key, c.nonce, bad, ct, tag), kU) << "changed aad";
  EXPECT_EQ(open(c.key, c.nonce, "", ct, tag), kU) << "missing aad";
  bad = ct;
  bad[40] ^= 4;
  EXPECT_EQ(open(c.key, c.nonce, c.aad, bad, tag), kU) << "flipped ciphertext bit";
  EXPECT_EQ(open(c.key, c.nonce, c.aad, ct.substr(0, 59), tag), kU) << "truncated";
  GcmTag t = tag;
  t[15] ^= std::byte{1};
  EXPECT_EQ(open(c.key, c.nonce, c.aad, ct, t), kU) << "flipped tag bit";
}

TEST(Gcm, RejectsBadSizes) {
  const std::string key(20, 'k'), nonce(12, 'n'), in(16, 'p');
  std::string out(16, '\0');
  EXPECT_EQ(GcmSeal(AsBytes(key), AsBytes(nonce), {}, AsBytes(in), Mut(out)).status().code(),
            StatusCode::kInvalidArgument);
  const std::string key32(32, 'k'), nonce8(8, 'n');
  EXPECT_FALSE(GcmSeal(AsBytes(key32), AsBytes(nonce8), {}, AsBytes(in), Mut(out)).ok());
  std::string small(15, '\0');
  EXPECT_FALSE(GcmSeal(AsBytes(key32), AsBytes(nonce), {}, AsBytes(in), Mut(small)).ok());
}

TEST(Gcm, DecryptRangeMatchesTheMessage) {
  Case16 c;
  std::string ct(c.plain.size(), '\0');
  ASSERT_TRUE(
      GcmSeal(AsBytes(c.key), AsBytes(c.nonce), AsBytes(c.aad), AsBytes(c.plain), Mut(ct)).ok());
  for (uint64_t from : {0, 1, 15, 16, 17, 33, 59}) {
    std::string part = ct.substr(from);
    SP_ASSERT_OK(GcmDecryptRange(AsBytes(c.key), AsBytes(c.nonce), from, AsBytes(part), Mut(part)));
    EXPECT_EQ(part, c.plain.substr(from)) << "from " << from;
  }
}

// RFC 5869, test cases 1 (salt and info) and 3 (empty salt and info).
TEST(Hkdf, Rfc5869) {
  const std::string ikm(22, '\x0b');
  std::string out(42, '\0');
  const std::string salt = H("000102030405060708090a0b0c"), info = H("f0f1f2f3f4f5f6f7f8f9");
  SP_ASSERT_OK(HkdfSha256(AsBytes(ikm), AsBytes(salt), AsBytes(info), Mut(out)));
  EXPECT_EQ(HexOf(AsBytes(out)),
            "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865");
  SP_ASSERT_OK(HkdfSha256(AsBytes(ikm), {}, {}, Mut(out)));
  EXPECT_EQ(HexOf(AsBytes(out)),
            "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8");
}

// RFC 4231, test case 2 (a key shorter than the block), and the empty key and message.
TEST(Hmac, Rfc4231AndEmptyKey) {
  const std::string key = "Jefe", data = "what do ya want for nothing?";
  std::vector<Bytes> parts = {AsBytes(data)};
  EXPECT_EQ(HexOf(HmacSha256(AsBytes(key), parts)),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // The same message in two parts.
  std::vector<Bytes> split = {AsBytes(data).first(10), AsBytes(data).subspan(10)};
  EXPECT_EQ(HmacSha256(AsBytes(key), split), HmacSha256(AsBytes(key), parts));
  EXPECT_EQ(HexOf(HmacSha256({}, {})),
            "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad");
}

TEST(Random, FillsAndDiffers) {
  std::string a(32, '\0'), b(32, '\0');
  SP_ASSERT_OK(RandomBytes(Mut(a)));
  SP_ASSERT_OK(RandomBytes(Mut(b)));
  EXPECT_NE(a, b);
  EXPECT_NE(a, std::string(32, '\0'));
}

TEST(Hex, RoundTripAndErrors) {
  const std::string bytes("\x00\x01\xab\xff", 4);
  EXPECT_EQ(Hex(AsBytes(bytes)), "0001abff");
  EXPECT_EQ(Unhex("0001ABff").value(), bytes);
  EXPECT_FALSE(Unhex("abc").ok());
  EXPECT_FALSE(Unhex("zz").ok());
}

}  // namespace
}  // namespace savepoint::crypto
