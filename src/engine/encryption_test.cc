// Encrypted native checkpoints end to end (docs/FORMAT.md §10): round trips through Save (format
// versions 1 and 2, with and without compression) and the async Checkpointer (with and without
// compression, with a custom copier) read back through every read path; the key's sources (raw
// bytes, key file, provider) and their errors; missing, wrong and superfluous keys; mmap refused;
// the merges and the manager; and that an unencrypted save is unchanged. Tampering is tested in
// encryption_tamper_test.cc, multi-rank saves in distributed/dist_encryption_test.cc.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <string>
#include <tuple>

#include "engine/encryption_testutil.h"
#include "io/mem_fs.h"
#include "savepoint/async.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

using Codec = Compression::Codec;
using testing::EncLoad;
using testing::EncSave;
using testing::EncState;
using testing::Has;
using testing::kEncChunk;
using testing::kEncDataFile;
using testing::kKeyA;
using testing::kKeyB;
using testing::StatesEqual;

// The bytes of `t` as a string (to search for plaintext in a data file).
std::string BytesOf(const TensorView& t, uint64_t n) {
  return std::string(reinterpret_cast<const char*>(t.data()), std::min(n, t.nbytes()));
}

// Checks everything a reader can do with an encrypted checkpoint at `path` holding `expect`.
void ExpectReadable(const std::string& path, const State& expect, const IoOptions& io,
                    const std::string& key) {
  Result<State> back = Load(path, EncLoad(key), io);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(StatesEqual(*back, expect));
  LoadOptions unverified = EncLoad(key);
  unverified.verify_checksums = false;
  back = Load(path, unverified, io);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(StatesEqual(*back, expect));
  State into;
  for (const auto& [name, e] : expect.entries()) {
    if (e.is_tensor()) {
      ASSERT_TRUE(
          into.Put(name, Tensor::Zeros(e.tensor().dtype(), e.tensor().shape()).value()).ok());
    }
  }
  SP_ASSERT_OK(LoadInto(path, into, EncLoad(key), io));
  EXPECT_TRUE(StatesEqual(into, expect));
  LoadStats stats;
  LoadOptions with_stats = EncLoad(key);
  with_stats.stats = &stats;
  SP_EXPECT_OK(VerifyCheckpoint(path, with_stats, io));
  EXPECT_EQ(stats.bytes, expect.tensor_bytes());
  auto reader = CheckpointReader::Open(path, EncLoad(key), io);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_TRUE((*reader)->encrypted());
  for (const auto& [name, e] : expect.entries()) {
    if (!e.is_tensor()) continue;
    Result<Tensor> t = (*reader)->ReadTensor(name);
    ASSERT_TRUE(t.ok()) << name << ": " << t.status().ToString();
    EXPECT_EQ(0, std::memcmp(t->data(), e.tensor().data(), e.tensor().nbytes())) << name;
  }
}

class EncryptedRoundTrip : public ::testing::TestWithParam<std::tuple<uint32_t, Codec>> {};

TEST_P(EncryptedRoundTrip, EveryReadPath) {
  const auto [version, codec] = GetParam();
  MemFileSystem fs;
  const IoOptions io{.fs = &fs, .io_threads = 3};
  const State state = EncState(7);
  SaveOptions o = EncSave(kKeyA);
  o.format_version = version;
  o.compression.codec = codec;
  SaveStats stats;
  o.stats = &stats;
  SP_ASSERT_OK(Save(state, "/ck", o, io));
  EXPECT_EQ(stats.bytes, state.tensor_bytes());
  ExpectReadable("/ck", state, io, kKeyA);

  format::Manifest m = testing::ReadManifest(&fs, "/ck");
  EXPECT_EQ(m.version, version);
  EXPECT_TRUE(m.encryption.enabled);
  EXPECT_EQ(format::UsesCompression(m), codec != Codec::kNone);
  for (const auto& t : m.tensors) {
    for (const auto& s : t.shards) {
      EXPECT_EQ(s.tags.size(), s.crc32c.size()) << t.name;
    }
  }
  auto reader = CheckpointReader::Open("/ck", {}, io).value();
  const Json& j = reader->manifest_json();
  EXPECT_NE(j["required_features"].dump().find("\"encryption\""), std::string::npos) << j.dump();
  EXPECT_EQ(j["encryption"]["cipher"], "AES-256-GCM");
  // No plaintext in the data file: neither a random tensor's bytes nor a packed small one's.
  const std::string data = fs.ReadFile("/ck/" + std::string(kEncDataFile), 1 << 24).value();
  EXPECT_EQ(data.find(BytesOf(*state.FindTensor("rand.f32"), 256)), std::string::npos);
  EXPECT_EQ(data.find(BytesOf(*state.FindTensor("mid.u8"), 256)), std::string::npos);
  EXPECT_EQ(data.find(BytesOf(*state.FindTensor("opt.bias"), 64)), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(VersionsAndCodecs, EncryptedRoundTrip,
                         ::testing::Combine(::testing::Values(1u, 2u),
                                            ::testing::Values(Codec::kNone, Codec::kZstd,
                                                              Codec::kLz4)));

TEST(Encryption, CompressesBeforeEncrypting) {
  MemFileSystem fs;
  const IoOptions io{.fs = &fs};
  SaveOptions o = EncSave(kKeyA);
  o.compression.codec = Codec::kZstd;
  SP_ASSERT_OK(Save(EncState(3), "/ck", o, io));
  format::Manifest m = testing::ReadManifest(&fs, "/ck");
  const format::ShardRecord& zeros = testing::ShardOf(m, "zeros.f64");
  ASSERT_TRUE(zeros.compressed());
  EXPECT_LT(format::StoredBytes(zeros), zeros.bytes / 4) << "mostly zero: compresses well";
}

// Copies with memcpy and counts the bytes (a stand-in for a device copier).
class CountingCopier final : public SnapshotCopier {
 public:
  Status Copy(const std::byte* src, std::byte* dst, uint64_t n) override {
    std::memcpy(dst, src, n);
    bytes += n;
    return Status::OK();
  }
  std::atomic<uint64_t> bytes{0};
};

class EncryptedAsync : public ::testing::TestWithParam<std::tuple<Codec, bool>> {};

TEST_P(EncryptedAsync, RoundTrip) {
  const auto [codec, custom_copier] = GetParam();
  MemFileSystem fs;
  const IoOptions io{.fs = &fs, .io_threads = 2};
  CountingCopier copier;
  CheckpointerOptions co;
  co.slab_bytes = kEncChunk;
  co.staging_bytes = 3 * kEncChunk;  // fewer slabs than the state: slabs are reused
  co.snapshot_threads = 2;
  if (custom_copier) co.copier = &copier;
  auto ckpt = Checkpointer::Create(co, io).value();
  const State state = EncState(11);
  SaveOptions o;
  o.key = EncryptionKey::FromBytes(kKeyA);
  o.compression.codec = codec;
  for (int i = 0; i < 2; ++i) {  // twice: the second save reuses the staging slabs
    Result<SaveHandle> h = ckpt->SaveAsync(state, "/ck" + std::to_string(i), o);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    SP_ASSERT_OK(h->Wait());
    ExpectReadable("/ck" + std::to_string(i), state, io, kKeyA);
  }
  if (custom_copier) {
    EXPECT_GE(copier.bytes.load(), state.tensor_bytes());
  }
  EXPECT_NE(testing::ReadManifest(&fs, "/ck0").encryption.salt,
            testing::ReadManifest(&fs, "/ck1").encryption.salt)
      << "every checkpoint has a salt of its own";
}

INSTANTIATE_TEST_SUITE_P(Codecs, EncryptedAsync,
                         ::testing::Combine(::testing::Values(Codec::kNone, Codec::kZstd),
                                            ::testing::Bool()));

TEST(Encryption, AsyncKeyErrorsAreReportedBySaveAsync) {
  MemFileSystem fs;
  const IoOptions io{.fs = &fs};
  auto ckpt = Checkpointer::Create({.slab_bytes = kEncChunk}, io).value();
  SaveOptions o;
  o.key = EncryptionKey::FromFile("/no/such/key");
  Result<SaveHandle> h = ckpt->SaveAsync(EncState(1), "/ck", o);
  EXPECT_THAT(h, StatusIs(StatusCode::kNotFound));
  EXPECT_TRUE(Has(h.status(), "SaveOptions.key")) << h.status().ToString();
  EXPECT_FALSE(fs.Exists("/ck"));
}

TEST(Encryption, KeyFile) {
  MemFileSystem fs;
  const IoOptions io{.fs = &fs};
  SP_ASSERT_OK(fs.CreateDir("/keys"));
  SP_ASSERT_OK(fs.WriteFileSynced("/keys/ckpt.key", kKeyA));
  SaveOptions o = EncSave("");
  o.key = EncryptionKey::FromFile("/keys/ckpt.key");  // read through io.fs
  const State state = EncState(5);
  SP_ASSERT_OK(Save(state, "/ck", o, io));
  ExpectReadable("/ck", state, io, kKeyA);  // the same key given as bytes
  LoadOptions lo;
  lo.key = EncryptionKey::FromFile("/keys/ckpt.key");
  SP_EXPECT_OK(Load("/ck", lo, io).status());

  o.key = EncryptionKey::FromFile("/keys/missing.key");
  Status s = Save(state, "/ck2", o, io);
  EXPECT_THAT(s, StatusIs(StatusCode::kNotFound));
  EXPECT_TRUE(Has(s, "SaveOptions.key") && Has(s, "key file /keys/missing.key")) << s.ToString();
  EXPECT_FALSE(fs.Exists("/ck2"));
  EXPECT_EQ(fs.ListDir("/").value().size(), 2u) << "no temporary directory was left";
  lo.key = EncryptionKey::FromFile("/keys/missing.key");
  s = Load("/ck", lo, io).status();
  EXPECT_THAT(s, StatusIs(StatusCode::kNotFound));
  EXPECT_TRUE(Has(s, "LoadOptions.key") && Has(s, "checkpoint /ck")) << s.ToString();
}

TEST(Encryption, ProviderIsAskedOncePerCall) {
  MemFileSystem fs;
  const IoOptions io{.fs = &fs};
  std::atomic<int> calls{0};
  EncryptionKey provider = EncryptionKey::FromProvider(
      [&]() -> Result<std::string> {
        ++calls;
        return kKeyA;
      },
      "kms:test");
  SaveOptions o = EncSave("");
  o.key = provider;
  const State state = EncState(9);
  SP_ASSERT_OK(Save(state, "/ck", o, io));
  EXPECT_EQ(calls.load(), 1);
  LoadOptions lo;
  lo.key = provider;
  Result<State> back = Load("/ck", lo, io);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(StatesEqual(*back, state));
  EXPECT_EQ(calls.load(), 2);
  SP_EXPECT_OK(VerifyCheckpoint("/ck", lo, io));
  EXPECT_EQ(calls.load(), 3);
}

TEST(Encryption, ProviderErrorsAndBadKeysNameTheSourceNotTheKey) {
  MemFileSystem fs;
  const IoOptions io{.fs = &fs};
  const State state = EncState(2);
  SaveOptions o = EncSave("");
  o.key = EncryptionKey::FromProvider(
      []() -> Result<std::string> { return PermissionDeniedError("kms down"); }, "kms:test");
  Status s = Save(state, "/ck", o, io);
  EXPECT_THAT(s, StatusIs(StatusCode::kPermissionDenied));
  EXPECT_TRUE(Has(s, "key provider kms:test") && Has(s, "kms down")) << s.ToString();
  EXPECT_FALSE(fs.Exists("/ck"));

  const std::string short_key = "SECRET-15-BYTES";
  for (const std::string& bad : {short_key, std::string(65, 'k'), std::string()}) {
    o.key = EncryptionKey::FromProvider([bad]() -> Result<std::string> { return bad; }, "p");
    s = Save(state, "/ck", o, io);
    EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
    EXPECT_TRUE(Has(s, "SaveOptions.key")) << s.ToString();
    EXPECT_FALSE(Has(s, "SECRET")) << "the message shows the key: " << s.ToString();
  }
  o.key = EncryptionKey::FromBytes(short_key);
  s = Save(state, "/ck", o, io);
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_TRUE(Has(s, "raw key (15 bytes)") && Has(s, "16 to 64 bytes")) << s.ToString();
  EXPECT_FALSE(Has(s, "SECRET")) << s.ToString();
  EXPECT_FALSE(fs.Exists("/ck"));
  for (size_t n : {16, 64}) {  // the bounds are accepted
    o.key = EncryptionKey::FromBytes(std::string(n, 'k'));
    SP_EXPECT_OK(Save(state, "/ck" + std::to_string(n), o, io));
    SP_EXPECT_OK(Load("/ck" + std::to_string(n), EncLoad(std::string(n, 'k')), io).status());
  }
}

TEST(Encryption, MissingWrongAndSuperfluousKeys) {
  MemFileSystem fs;
  const IoOptions io{.fs = &fs};
  const State state = EncState(4);
  SP_ASSERT_OK(Save(state, "/root/ck", EncSave(kKeyA), io));
  const std::string no_key = "checkpoint /root/ck is encrypted: pass LoadOptions::key";
  auto expect_no_key = [&](const Status& s) {
    EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
    EXPECT_TRUE(Has(s, no_key)) << s.ToString();
  };
  expect_no_key(Load("/root/ck", {}, io).status());
  State into = EncState(4);
  expect_no_key(LoadInto("/root/ck", into, {}, io));
  expect_no_key(VerifyCheckpoint("/root/ck", {}, io));
  // Without a key the manifest can still be listed (not authenticated), but no tensor read.
  auto reader = CheckpointReader::Open("/root/ck", {}, io);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_TRUE((*reader)->encrypted());
  EXPECT_EQ((*reader)->tensors().size(), 6u);
  EXPECT_EQ((*reader)->values().FindValue("step")->as_int(), 12);
  expect_no_key((*reader)->ReadTensor("rand.f32").status());
  expect_no_key((*reader)->Verify());
  auto listed = ListCheckpoints("/root", &fs).value();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_TRUE(listed[0].committed) << listed[0].problem;
  EXPECT_EQ(listed[0].step, 12);

  for (const std::string& wrong : {kKeyB, std::string(16, 'x')}) {
    Status s = Load("/root/ck", EncLoad(wrong), io).status();
    EXPECT_THAT(s, StatusIs(StatusCode::kUnauthenticated));
    EXPECT_TRUE(Has(s, "wrong key") && Has(s, "checkpoint /root/ck")) << s.ToString();
    EXPECT_EQ(CheckpointReader::Open("/root/ck", EncLoad(wrong), io).status().code(),
              StatusCode::kUnauthenticated);
    EXPECT_EQ(VerifyCheckpoint("/root/ck", EncLoad(wrong), io).code(),
              StatusCode::kUnauthenticated);
  }

  SP_ASSERT_OK(Save(state, "/plain", {}, io));
  Status s = Load("/plain", EncLoad(kKeyA), io).status();
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_TRUE(Has(s, "checkpoint /plain is not encrypted, but LoadOptions.key is set"))
      << s.ToString();
  EXPECT_FALSE((*CheckpointReader::Open("/plain", {}, io))->encrypted());
}

TEST(Encryption, MmapIsRefused) {
  MemFileSystem fs;
  const IoOptions io{.fs = &fs};
  SP_ASSERT_OK(Save(EncState(6), "/ck", EncSave(kKeyA), io));
  LoadOptions lo = EncLoad(kKeyA);
  lo.mmap = true;
  Status s = Load("/ck", lo, io).status();
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_TRUE(Has(s, "LoadOptions.mmap") && Has(s, "encrypted")) << s.ToString();
  lo.map_mode = MapMode::kCopyOnWrite;
  EXPECT_THAT(Load("/ck", lo, io), StatusIs(StatusCode::kInvalidArgument));
  auto reader = CheckpointReader::Open("/ck", EncLoad(kKeyA), io).value();
  for (bool verify : {false, true}) {
    s = reader->MapTensor("rand.f32", verify).status();
    EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
    EXPECT_TRUE(Has(s, "encrypted")) << s.ToString();
  }
}

TEST(Encryption, UnencryptedSaveIsUnchanged) {
  MemFileSystem fs;
  const IoOptions io{.fs = &fs};
  SP_ASSERT_OK(Save(EncState(8), "/ck", {.chunk_bytes = kEncChunk}, io));
  const std::string bytes = fs.ReadFile("/ck/MANIFEST", 1 << 24).value();
  EXPECT_EQ(bytes.substr(36, 24), std::string(24, '\0')) << "header flags and reserved bytes";
  EXPECT_EQ(bytes.find("\"encryption\":"), std::string::npos);
  EXPECT_EQ(bytes.find("\"tags\""), std::string::npos);
  EXPECT_NE(bytes.find("\"required_features\":[]"), std::string::npos);
}

TEST(Encryption, MergeReadsWithOneKeyAndWritesWithAnother) {
  MemFileSystem fs;
  const IoOptions io{.fs = &fs};
  const State state = EncState(12);
  SP_ASSERT_OK(Save(state, "/src", EncSave(kKeyA), io));
  MergeOptions mo;
  mo.load = EncLoad(kKeyA);
  mo.save = EncSave(kKeyB);
  SP_ASSERT_OK(MergeCheckpoint("/src", "/dst", mo, io));
  ExpectReadable("/dst", state, io, kKeyB);
  mo.load.key = {};
  Status s = MergeCheckpoint("/src", "/dst2", mo, io);
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_TRUE(Has(s, "pass LoadOptions::key")) << s.ToString();
  // Into safetensors files (which are never encrypted): the source's key reads it.
  MergeSafetensorsOptions st;
  st.load = EncLoad(kKeyA);
  SP_ASSERT_OK(MergeToSafetensors("/src", "/st", st, io));
  SafetensorsLoadOptions sl;
  Result<State> back = LoadSafetensors("/st/model.safetensors", sl, io);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(0, std::memcmp(back->FindTensor("rand.f32")->data(),
                           state.FindTensor("rand.f32")->data(), 256000));
}

class EncryptedManager : public ::testing::TestWithParam<bool> {};

TEST_P(EncryptedManager, SavesAndRestoresWithItsKey) {
  MemFileSystem fs;
  ManagerOptions o;
  o.naming.directory = "/mgr";
  o.io.fs = &fs;
  o.async_save.enabled = GetParam();
  o.async_save.checkpointer.slab_bytes = kEncChunk;
  o.storage.key = EncryptionKey::FromBytes(kKeyA);
  const State state = EncState(13);
  {
    auto m = CheckpointManager::Open(o).value();
    ASSERT_TRUE(m->Save(10, state).value());
    ASSERT_TRUE(m->Save(20, state).value());
    Result<State> back = m->Restore();
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->FindValue("step")->as_int(), 12);  // the state's own value
    EXPECT_EQ(0, std::memcmp(back->FindTensor("rand.f32")->data(),
                             state.FindTensor("rand.f32")->data(), 256000));
    SP_ASSERT_OK(m->Close());
  }
  for (const auto& e : ListCheckpoints("/mgr", &fs).value()) {
    if (!e.committed) continue;
    EXPECT_TRUE(CheckpointReader::Open(e.path, {}, {.fs = &fs}).value()->encrypted()) << e.path;
  }
  o.storage.key = {};
  auto plain = CheckpointManager::Open(o).value();
  Status s = plain->Restore().status();
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_TRUE(Has(s, "pass LoadOptions::key")) << s.ToString();
  o.storage.format = CheckpointFormat::kSafetensors;
  o.storage.key = EncryptionKey::FromBytes(kKeyA);
  EXPECT_THAT(ValidateManagerOptions(o), StatusIs(StatusCode::kInvalidArgument));
}

INSTANTIATE_TEST_SUITE_P(SyncAndAsync, EncryptedManager, ::testing::Bool());

}  // namespace
}  // namespace savepoint
