// Unit tests of encryption in the format (docs/FORMAT.md §10): known answers for the key
// derivation, a chunk's nonce, AAD and sealing and the manifest MAC (computed independently with
// Python's `cryptography` from the specification's text); the encrypted manifest's encoding and
// authentication; and hostile or inconsistent encryption fields, which the decoder rejects.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>

#include "format/encryption.h"
#include "format/endian.h"
#include "format/manifest.h"
#include "testutil/testutil.h"
#include "util/crc32c.h"

namespace savepoint::format {
namespace {

using ::savepoint::testing::StatusIs;

constexpr std::string_view kWhere = "/ck/MANIFEST";

std::string Range(int from, int n) {
  std::string s(n, '\0');
  for (int i = 0; i < n; ++i) s[i] = static_cast<char>(from + i);
  return s;
}

Salt TestSalt() {
  Salt salt;
  const std::string s = Range(0x20, 32);
  std::memcpy(salt.data(), s.data(), salt.size());
  return salt;
}

CheckpointKeys TestKeys() {
  return CheckpointKeys::Derive(SecretBytes(Range(0, 32)), TestSalt()).value();
}

// The specification's example values, as Python computed them from docs/FORMAT.md §10 with HKDF,
// AESGCM and hmac of the `cryptography` package and the standard library.
TEST(EncryptionFormat, KnownAnswers) {
  const CheckpointKeys keys = TestKeys();
  EXPECT_EQ(crypto::Hex(keys.key_check()), "e8939e4a211864bf5efe0f36ab1f8d5c");
  const Shape box = {4, 0};
  ChunkIdentity id;
  id.checkpoint_id = 0x0123456789abcdefULL;
  id.file = 2;
  id.offset = 8192;
  id.tensor = "w";
  id.box = box;
  id.chunk = 1;
  id.raw_bytes = 27;
  id.stored_bytes = 27;
  EXPECT_EQ(crypto::Hex(ChunkNonce(id)), "020000000020000000000000");
  EXPECT_EQ(crypto::Hex(crypto::AsBytes(ChunkAad(id))),
            "5356505443484e4befcdab896745230102000000002000000000000001000000000000001b00000000"
            "0000001b000000000000000002000000040000000000000000000000000000000100000077");
  const std::string plain = "hello, encrypted checkpoint";
  std::string out(plain.size(), '\0');
  crypto::GcmSealer sealer = keys.BeginSeal(id).value();
  SP_ASSERT_OK(sealer.Update(crypto::AsBytes(plain), std::as_writable_bytes(std::span(out))));
  const crypto::GcmTag tag = sealer.Finish().value();
  EXPECT_EQ(crypto::Hex(crypto::AsBytes(out)),
            "ab8e52596eebd83d0e6351d77a2328c02352ae2b5cf78a9a2f79ae");
  EXPECT_EQ(crypto::Hex(tag), "c51430ab10079d52e1282e3ccb6c552c");
  std::string back(out.size(), '\0');
  SP_ASSERT_OK(keys.Open(id, crypto::AsBytes(out), tag, std::as_writable_bytes(std::span(back))));
  EXPECT_EQ(back, plain);
  id.compressed = true;  // any field of the identity changes the AAD
  EXPECT_EQ(
      keys.Open(id, crypto::AsBytes(out), tag, std::as_writable_bytes(std::span(back))).code(),
      StatusCode::kUnauthenticated);
  EXPECT_EQ(crypto::Hex(keys.Mac(Range(0, 40), "{\"x\":1}")),
            "00e54c96bace6a38f116d325fe3524c88578fc8e");
}

TEST(EncryptionFormat, UserKeyLength) {
  for (size_t n : {0, 1, 15, 65, 1000}) {
    Result<SecretBytes> k =
        ResolveUserKey(EncryptionKey::FromBytes(std::string(n, 'k')), nullptr, "SaveOptions.key");
    EXPECT_THAT(k, StatusIs(StatusCode::kInvalidArgument)) << n;
  }
  for (size_t n : {16, 32, 64}) {
    SP_EXPECT_OK(
        ResolveUserKey(EncryptionKey::FromBytes(std::string(n, 'k')), nullptr, "f").status());
  }
  Status none = ResolveUserKey({}, nullptr, "LoadOptions.key").status();
  EXPECT_THAT(none, StatusIs(StatusCode::kInvalidArgument, "LoadOptions.key"));
}

// An encrypted manifest: tensor "a" (U8 [10000], chunks of 4096) uncompressed at 4096, tensor "e"
// empty; a tag per chunk.
Manifest EncryptedManifest() {
  Manifest m;
  m.checkpoint_id = 0xfeedULL;
  m.chunk_bytes = 4096;
  m.files.push_back({"data-00000-00000.spd", 16384});
  ShardRecord a;
  a.offsets = {0};
  a.sizes = {10000};
  a.offset = 4096;
  a.bytes = 10000;
  a.crc32c = {1, 2, 3};
  a.tags.resize(3);
  for (size_t c = 0; c < 3; ++c) a.tags[c].fill(std::byte(0x10 + c));
  m.tensors.push_back({"a", DType::kU8, {10000}, {a}});
  ShardRecord e;
  e.offsets = {0};
  e.sizes = {0};
  e.offset = 4096;
  m.tensors.push_back({"e", DType::kU8, {0}, {e}});
  const CheckpointKeys keys = TestKeys();
  m.encryption.enabled = true;
  m.encryption.salt = keys.salt();
  m.encryption.key_check = keys.key_check();
  EXPECT_TRUE(m.values.PutValue("step", int64_t{3}).ok());
  return m;
}

TEST(EncryptionFormat, ManifestRoundTripAndAuthentication) {
  const CheckpointKeys keys = TestKeys();
  Manifest m = EncryptedManifest();
  const std::string bytes = EncodeManifest(m, &keys);
  EXPECT_EQ(GetU32(bytes, 36), kManifestFlagEncrypted);
  // The body is the canonical dump of the JSON model (what `inspect --json` shows).
  EXPECT_EQ(bytes.substr(kManifestHeaderBytes),
            ManifestToJson(m).dump(-1, ' ', false, Json::error_handler_t::replace));
  Result<Manifest> back = DecodeManifest(bytes, kWhere);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(back->encryption.enabled);
  EXPECT_EQ(back->encryption.salt, keys.salt());
  EXPECT_EQ(back->encryption.key_check, keys.key_check());
  EXPECT_EQ(back->tensors[0].shards[0].tags, m.tensors[0].shards[0].tags);
  EXPECT_TRUE(back->tensors[1].shards[0].tags.empty());
  SP_EXPECT_OK(AuthenticateManifest(bytes, *back, keys, kWhere));
  EXPECT_EQ(EncodeManifest(*back, &keys), bytes);  // deterministic
  const Json j = ManifestToJson(*back);
  EXPECT_EQ(j["required_features"], Json::array({"encryption"}));
  EXPECT_EQ(j["encryption"]["kdf"], "HKDF-SHA256");
  EXPECT_EQ(j["encryption"]["salt"], crypto::Hex(keys.salt()));
  std::string tag2;
  for (int i = 0; i < 16; ++i) tag2 += "12";
  EXPECT_EQ(j["tensors"][0]["shards"][0]["tags"][2], tag2);

  const CheckpointKeys other =
      CheckpointKeys::Derive(SecretBytes(Range(1, 32)), TestSalt()).value();
  EXPECT_FALSE(other.MatchesKeyCheck(back->encryption.key_check));
  EXPECT_THAT(AuthenticateManifest(bytes, *back, other, kWhere),
              StatusIs(StatusCode::kUnauthenticated));
  // Without keys the MAC is zero: never accepted.
  const std::string unkeyed = EncodeManifest(m);
  Result<Manifest> u = DecodeManifest(unkeyed, kWhere);
  ASSERT_TRUE(u.ok());
  EXPECT_THAT(AuthenticateManifest(unkeyed, *u, keys, kWhere),
              StatusIs(StatusCode::kUnauthenticated));
}

// MANIFEST bytes of `m` with `body` instead of its body (lengths and CRCs fixed), and header
// flags `flags`.
std::string Reframe(const Manifest& m, const std::string& body, uint32_t flags) {
  std::string bytes = EncodeManifest(m).substr(0, kManifestHeaderBytes) + body;
  PutU64(&bytes, 16, body.size());
  PutU32(&bytes, 32, Crc32c(body));
  PutU32(&bytes, 36, flags);
  PutU32(&bytes, 60, Crc32c(std::string_view(bytes).substr(0, 60)));
  return bytes;
}

Result<Manifest> DecodeEdited(const std::function<void(Json&)>& edit,
                              uint32_t flags = kManifestFlagEncrypted) {
  Manifest m = EncryptedManifest();
  Json j = ManifestToJson(m);
  edit(j);
  return DecodeManifest(Reframe(m, j.dump(), flags), kWhere);
}

::testing::AssertionResult Rejected(const Result<Manifest>& r, StatusCode code,
                                    std::string_view needle) {
  if (r.ok()) return ::testing::AssertionFailure() << "accepted";
  const Status& s = r.status();
  if (s.code() != code || s.message().find(needle) == std::string::npos ||
      s.message().find(kWhere) == std::string::npos) {
    return ::testing::AssertionFailure() << "wrong error: " << s.ToString();
  }
  return ::testing::AssertionSuccess();
}

TEST(EncryptionFormat, InconsistentOrHostileFieldsAreRejected) {
  const StatusCode kC = StatusCode::kCorruption;
  SP_ASSERT_OK(DecodeEdited([](Json&) {}).status());
  EXPECT_TRUE(Rejected(DecodeEdited([](Json&) {}, 0), kC, "header flag clear"));
  EXPECT_TRUE(Rejected(DecodeEdited([](Json& j) { j.erase("encryption"); }), kC,
                       "\"encryption\" object absent"));
  EXPECT_TRUE(Rejected(DecodeEdited([](Json& j) { j["required_features"] = Json::array(); }), kC,
                       "required feature not listed"));
  EXPECT_TRUE(Rejected(DecodeEdited([](Json& j) { j["encryption"]["salt"] = "00ff"; }), kC,
                       "salt is not 64 hex digits"));
  EXPECT_TRUE(Rejected(DecodeEdited([](Json& j) { j["encryption"]["key_check"] = 7; }), kC,
                       "key_check is not a string"));
  EXPECT_TRUE(Rejected(DecodeEdited([](Json& j) { j["encryption"]["cipher"] = "ChaCha20"; }),
                       StatusCode::kUnimplemented, "ChaCha20"));
  auto tags = [](Json& j) -> Json& { return j["tensors"][0]["shards"][0]["tags"]; };
  EXPECT_TRUE(Rejected(DecodeEdited([&](Json& j) { tags(j).erase(2); }), kC, "2 tags for 3"));
  EXPECT_TRUE(
      Rejected(DecodeEdited([&](Json& j) { tags(j).push_back(tags(j)[0]); }), kC, "has 4 entries"));
  EXPECT_TRUE(Rejected(DecodeEdited([&](Json& j) { tags(j)[1] = "xyz"; }), kC,
                       "chunk 1: tag is not 32 hex digits"));
  EXPECT_TRUE(Rejected(DecodeEdited([&](Json& j) { j["tensors"][0]["shards"][0].erase("tags"); }),
                       kC, "lacks field \"tags\""));
  // An unencrypted manifest with tags.
  Manifest plain = EncryptedManifest();
  plain.encryption = {};
  Json j = ManifestToJson(plain);
  j["tensors"][0]["shards"][0]["tags"] = Json::array({"00"});
  EXPECT_TRUE(Rejected(DecodeManifest(Reframe(plain, j.dump(), 0), kWhere), kC,
                       "tags in an unencrypted checkpoint"));
  // Flags this build does not know.
  EXPECT_TRUE(Rejected(DecodeEdited([](Json&) {}, 3), StatusCode::kUnimplemented, "header flags"));
  // An old reader's view: "encryption" is a required feature it does not know (tested by the
  // compression suite for unknown features in general).
}

}  // namespace
}  // namespace savepoint::format
