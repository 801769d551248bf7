// Tests of encrypted MindSpore `.ckpt` files (interop/ckpt_cipher.h through savepoint/mindspore.h):
// round trips in the three modes and every key size, files of several 64 MiB blocks, CRC with
// encryption, and every way a key, a mode or the bytes can be wrong. Files written by the real
// MindSpore are tested in tests/mindspore/.
#include "interop/ckpt_cipher.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <utility>

#include "format/endian.h"
#include "interop/file_writer_testutil.h"
#include "io/mem_fs.h"
#include "savepoint/mindspore.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

using testing::FillPattern;

constexpr char kPath[] = "/d/enc.ckpt";

std::string Key(size_t n, char seed = 'k') {
  std::string k(n, '\0');
  for (size_t i = 0; i < n; ++i) k[i] = static_cast<char>(seed + i * 7);
  return k;
}

class CkptCipherTest : public ::testing::Test {
 protected:
  void SetUp() override { SP_ASSERT_OK(fs_.CreateDir("/d")); }
  IoOptions Io() { return {.fs = &fs_, .io_threads = 3, .direct_io = false}; }

  State Small() {
    State s;
    Tensor a = Tensor::Empty(DType::kF32, {64, 33}).value();
    FillPattern(a.view(), 1);
    Tensor b = Tensor::Empty(DType::kBF16, {7}).value();
    FillPattern(b.view(), 2);
    EXPECT_TRUE(s.Put("a", std::move(a)).ok());
    EXPECT_TRUE(s.Put("b", std::move(b)).ok());
    EXPECT_TRUE(s.PutValue("epoch_num", int64_t{4}).ok());
    EXPECT_TRUE(s.PutValue("tag", std::string("run-7")).ok());
    return s;
  }

  Status Save(const State& s, MindSporeCipher mode, const std::string& key, bool crc = false) {
    MindSporeSaveOptions o{.overwrite = true,
                           .crc_check = crc,
                           .enc_key = EncryptionKey::FromBytes(key),
                           .enc_mode = mode};
    return SaveMindSporeCheckpoint(s, kPath, o, Io());
  }
  Result<State> Load(const std::string& key, std::optional<MindSporeCipher> mode = std::nullopt) {
    MindSporeLoadOptions o{.dec_key = EncryptionKey::FromBytes(key), .dec_mode = mode};
    return LoadMindSporeCheckpoint(kPath, o, Io());
  }
  std::string Bytes(const std::string& path = kPath) { return fs_.ReadFile(path, 1 << 30).value(); }
  void Put(const std::string& bytes, const std::string& path = kPath) {
    SP_ASSERT_OK(fs_.WriteFileSynced(path, bytes));
  }
  // Loads after `edit` changed the file; returns the status.
  Status LoadEdited(const std::string& key, const std::function<void(std::string*)>& edit) {
    std::string b = Bytes();
    edit(&b);
    Put(b);
    return Load(key).status();
  }

  MemFileSystem fs_;
};

void ExpectSame(const State& got, const State& want) {
  for (const auto& [name, e] : want.entries()) {
    if (!e.is_tensor()) continue;
    const TensorView* t = got.FindTensor(name);
    ASSERT_NE(t, nullptr) << name;
    ASSERT_EQ(t->nbytes(), e.tensor().nbytes()) << name;
    EXPECT_EQ(t->dtype(), e.tensor().dtype()) << name;
    EXPECT_EQ(0, std::memcmp(t->data(), e.tensor().data(), t->nbytes())) << name;
  }
}

TEST_F(CkptCipherTest, RoundTripEveryModeAndKeySizeWithAndWithoutCrc) {
  const State s = Small();
  struct Case {
    MindSporeCipher mode;
    size_t key;
  };
  for (Case c : {Case{MindSporeCipher::kAesGcm, 16}, Case{MindSporeCipher::kAesGcm, 24},
                 Case{MindSporeCipher::kAesGcm, 32}, Case{MindSporeCipher::kAesCbc, 16},
                 Case{MindSporeCipher::kAesCbc, 24}, Case{MindSporeCipher::kAesCbc, 32},
                 Case{MindSporeCipher::kSm4Cbc, 16}}) {
    for (bool crc : {false, true}) {
      SCOPED_TRACE(std::string(MindSporeCipherName(c.mode)) + " key " + std::to_string(c.key) +
                   (crc ? " crc" : ""));
      SP_ASSERT_OK(Save(s, c.mode, Key(c.key), crc));
      SP_ASSERT_OK_AND_ASSIGN(State got, Load(Key(c.key), c.mode));
      ExpectSame(got, s);
      EXPECT_EQ(got.FindValue("tag")->as_string(), "run-7");
      SP_ASSERT_OK_AND_ASSIGN(
          MindSporeCheckpointInfo info,
          InspectMindSporeCheckpoint(kPath, &fs_, EncryptionKey::FromBytes(Key(c.key))));
      EXPECT_EQ(info.cipher, MindSporeCipherName(c.mode));
      EXPECT_EQ(info.has_crc, crc);
      EXPECT_EQ(info.entries.size(), 4u);
      EXPECT_EQ(fs_.Stat(std::string(kPath) + ".mac").ok(), c.mode != MindSporeCipher::kAesGcm);
    }
  }
}

TEST_F(CkptCipherTest, SeveralBlocksLoadAndTheCrcCoversThePlaintext) {
  // 150 MiB of tensors: three 64 MiB blocks; the tensor straddles the block boundaries.
  State s;
  Tensor big = Tensor::Empty(DType::kU8, {150 << 20}).value();
  FillPattern(big.view(), 9);
  SP_ASSERT_OK(s.Put("big", std::move(big)));
  for (MindSporeCipher mode : {MindSporeCipher::kAesGcm, MindSporeCipher::kAesCbc}) {
    SP_ASSERT_OK(Save(s, mode, Key(32), /*crc=*/true));
    SP_ASSERT_OK_AND_ASSIGN(
        auto info, InspectMindSporeCheckpoint(kPath, &fs_, EncryptionKey::FromBytes(Key(32))));
    EXPECT_EQ(info.cipher_blocks, 3u);
    EXPECT_TRUE(info.has_crc);
    LoadStats stats;
    SP_ASSERT_OK_AND_ASSIGN(
        State got,
        LoadMindSporeCheckpoint(
            kPath, {.dec_key = EncryptionKey::FromBytes(Key(32)), .stats = &stats}, Io()));
    ExpectSame(got, s);
    EXPECT_EQ(stats.bytes, uint64_t{150} << 20);
  }
}

TEST_F(CkptCipherTest, KeysAndModesThatDoNotFitAreRefusedClearly) {
  const State s = Small();
  Status st = Save(s, MindSporeCipher::kAesGcm, Key(20));
  EXPECT_THAT(st, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_NE(st.message().find("AES-GCM needs a key of 16, 24 or 32 bytes, the key has 20"),
            std::string::npos)
      << st.ToString();
  EXPECT_FALSE(fs_.Stat(kPath).ok()) << "nothing is left behind";
  st = Save(s, MindSporeCipher::kSm4Cbc, Key(32));
  EXPECT_THAT(st, StatusIs(StatusCode::kInvalidArgument));

  SP_ASSERT_OK(Save(s, MindSporeCipher::kAesGcm, Key(32)));
  st = LoadMindSporeCheckpoint(kPath, {}, Io()).status();
  EXPECT_THAT(st, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_NE(st.message().find("is encrypted (AES-GCM): pass its key"), std::string::npos)
      << st.ToString();
  st = Load(Key(32), MindSporeCipher::kAesCbc).status();
  EXPECT_NE(st.message().find("encrypted with AES-GCM, but dec_mode is AES-CBC"), std::string::npos)
      << st.ToString();
  st = Load(Key(16)).status();
  EXPECT_THAT(st, StatusIs(StatusCode::kUnauthenticated));
  st = Load(Key(32, 'x')).status();
  EXPECT_THAT(st, StatusIs(StatusCode::kUnauthenticated, "encrypted block 0 of 1"));
  EXPECT_EQ(st.message().find(Key(32, 'x')), std::string::npos) << "never the key";

  SP_ASSERT_OK(SaveMindSporeCheckpoint(s, kPath, {.overwrite = true}, Io()));
  st = Load(Key(32)).status();
  EXPECT_NE(st.message().find("is not encrypted, but a key was given"), std::string::npos)
      << st.ToString();
}

TEST_F(CkptCipherTest, WrongCbcKeyIsRefusedNotDecodedAsGarbage) {
  SP_ASSERT_OK(Save(Small(), MindSporeCipher::kAesCbc, Key(16)));
  const Status st = Load(Key(16, 'z')).status();
  EXPECT_THAT(st, StatusIs(StatusCode::kUnauthenticated));
  // Without the sidecar (a MindSpore file) about one wrong key in 256 still yields valid padding
  // and a garbage structure: that too is a wrong key or a changed file, never "corruption".
  SP_ASSERT_OK(fs_.RemoveFile(std::string(kPath) + ".mac"));
  for (int k = 0; k < 600; ++k) {
    std::string key = Key(16, 'q');
    key[0] = static_cast<char>(k);
    key[1] = static_cast<char>(k >> 8);
    const Status wrong = Load(key).status();
    ASSERT_THAT(wrong, StatusIs(StatusCode::kUnauthenticated)) << k << " " << wrong.ToString();
  }
}

TEST_F(CkptCipherTest, EveryTamperingOfAGcmFileIsDetected) {
  State s;
  Tensor big = Tensor::Empty(DType::kU8, {70 << 20}).value();  // two blocks
  FillPattern(big.view(), 3);
  SP_ASSERT_OK(s.Put("big", std::move(big)));
  SP_ASSERT_OK(Save(s, MindSporeCipher::kAesGcm, Key(32)));
  const std::string good = Bytes();
  const uint64_t block0 = 48 + (uint64_t{64} << 20);
  struct Edit {
    const char* what;
    uint64_t offset;
  };
  for (Edit e :
       {Edit{"tag", 4}, Edit{"iv", 28}, Edit{"ciphertext", 48 + 1000},
        Edit{"ciphertext of block 1", block0 + 48 + 5}, Edit{"last byte", good.size() - 1}}) {
    SCOPED_TRACE(e.what);
    const Status st = LoadEdited(Key(32), [&](std::string* b) {
      *b = good;
      (*b)[e.offset] ^= 0x10;
    });
    EXPECT_THAT(st, StatusIs(StatusCode::kUnauthenticated, kPath));
  }
  // Lengths, truncation, swapped blocks: structural errors or authentication failures.
  auto expect_refused = [&](const char* what, const std::function<void(std::string*)>& edit) {
    SCOPED_TRACE(what);
    const Status st = LoadEdited(Key(32), [&](std::string* b) {
      *b = good;
      edit(b);
    });
    EXPECT_TRUE(st.code() == StatusCode::kCorruption || st.code() == StatusCode::kUnauthenticated)
        << st.ToString();
    EXPECT_NE(st.message().find("encrypted block"), std::string::npos) << st.ToString();
  };
  expect_refused("cipher_len", [](std::string* b) { (*b)[44] ^= 1; });
  expect_refused("block_len", [](std::string* b) { (*b)[20] ^= 1; });
  expect_refused("cut short", [](std::string* b) { b->resize(b->size() - 100); });
  expect_refused("swapped",
                 [&](std::string* b) { *b = good.substr(block0) + good.substr(0, block0); });
  expect_refused("block dropped", [&](std::string* b) { *b = good.substr(0, block0); });
}

TEST_F(CkptCipherTest, CbcSidecarDetectsWhatCbcCannot) {
  SP_ASSERT_OK(Save(Small(), MindSporeCipher::kAesCbc, Key(32)));
  std::string b = Bytes();
  b[32 + 200] ^= 0x01;  // inside the ciphertext: CBC decrypts it to wrong bytes, padding intact
  Put(b);
  Status st = Load(Key(32)).status();
  EXPECT_THAT(st, StatusIs(StatusCode::kUnauthenticated, "HMAC-SHA256 does not match"));
  // Without the sidecar the change cannot be seen (MindSpore's CBC format); inspect says so.
  SP_ASSERT_OK(fs_.RemoveFile(std::string(kPath) + ".mac"));
  SP_ASSERT_OK_AND_ASSIGN(auto info, InspectMindSporeCheckpoint(kPath, &fs_));
  EXPECT_EQ(info.authentication, "none");
  EXPECT_FALSE(info.entries_listed);
  EXPECT_EQ(info.cipher, "AES-CBC");
}

TEST_F(CkptCipherTest, KeyFromFileAndProviderAndProviderErrors) {
  const State s = Small();
  Put(Key(24), "/d/key.bin");
  MindSporeSaveOptions o{.enc_key = EncryptionKey::FromFile("/d/key.bin")};
  SP_ASSERT_OK(SaveMindSporeCheckpoint(s, kPath, o, Io()));
  int calls = 0;
  auto provider = EncryptionKey::FromProvider(
      [&]() -> Result<std::string> {
        ++calls;
        return Key(24);
      },
      "test-kms");
  SP_ASSERT_OK_AND_ASSIGN(State got, LoadMindSporeCheckpoint(kPath, {.dec_key = provider}, Io()));
  ExpectSame(got, s);
  EXPECT_EQ(calls, 1);
  auto failing = EncryptionKey::FromProvider(
      []() -> Result<std::string> { return PermissionDeniedError("kms said no"); }, "test-kms");
  const Status st = LoadMindSporeCheckpoint(kPath, {.dec_key = failing}, Io()).status();
  EXPECT_THAT(st, StatusIs(StatusCode::kPermissionDenied, "key provider test-kms"));
  const Status missing =
      LoadMindSporeCheckpoint(kPath, {.dec_key = EncryptionKey::FromFile("/d/nope")}, Io())
          .status();
  EXPECT_THAT(missing, StatusIs(StatusCode::kNotFound));
}

TEST_F(CkptCipherTest, MindSporesZeroCrcAfterTheBlocksIsIgnored) {
  SP_ASSERT_OK(Save(Small(), MindSporeCipher::kAesGcm, Key(16)));
  Put(Bytes() + "crc_num" + std::string(10, '\0'));  // as MindSpore 2.10 writes enc + crc
  SP_ASSERT_OK_AND_ASSIGN(
      auto info, InspectMindSporeCheckpoint(kPath, &fs_, EncryptionKey::FromBytes(Key(16))));
  EXPECT_TRUE(info.outer_crc_trailer);
  SP_ASSERT_OK(Load(Key(16)).status());
}

TEST_F(CkptCipherTest, BadOrForeignSidecarsAreRefused) {
  const State s = Small();
  SP_ASSERT_OK(Save(s, MindSporeCipher::kSm4Cbc, Key(16)));
  const std::string side = std::string(kPath) + ".mac";
  const std::string good = Bytes(side);
  for (const char* bad : {"not json", "{\"format\": \"other\"}", "[]"}) {
    Put(bad, side);
    const Status st = Load(Key(16)).status();
    EXPECT_THAT(st, StatusIs(StatusCode::kCorruption, "MAC sidecar"))
        << bad << " " << st.ToString();
  }
  // A sidecar of another file (another size) is not taken for this one's.
  State bigger = Small();
  SP_ASSERT_OK(bigger.Put("extra", Tensor::Empty(DType::kF32, {1000}).value()));
  SP_ASSERT_OK(SaveMindSporeCheckpoint(
      bigger, "/d/other.ckpt",
      {.enc_key = EncryptionKey::FromBytes(Key(16)), .enc_mode = MindSporeCipher::kSm4Cbc}, Io()));
  Put(Bytes("/d/other.ckpt.mac"), side);
  Status st = Load(Key(16)).status();
  EXPECT_THAT(st, StatusIs(StatusCode::kUnauthenticated, "describes another file"));
  Put(good, side);
  SP_EXPECT_OK(Load(Key(16)).status());
  // Saving over a CBC file with AES-GCM removes its sidecar: it would describe nothing.
  SP_ASSERT_OK(Save(s, MindSporeCipher::kAesGcm, Key(16)));
  EXPECT_FALSE(fs_.Exists(side));
}

// A member of the wrong type threw nlohmann's type_error (the CLI printed "internal error").
TEST_F(CkptCipherTest, SidecarFieldOfTheWrongTypeIsCorruption) {
  SP_ASSERT_OK(Save(Small(), MindSporeCipher::kAesCbc, Key(16)));
  const std::string side = std::string(kPath) + ".mac";
  const Json good = Json::parse(Bytes(side));
  const std::pair<const char*, Json> cases[] = {
      {"format", 1},
      {"format", Json::array()},
      {"version", "1"},
      {"version", 1.5},
      {"cipher", 5},
      {"file_bytes", -1},
      {"file_bytes", "176"},
      {"blocks", "x"},
      {"blocks", Json::object()},
  };
  for (const auto& [field, value] : cases) {
    Json j = good;
    j[field] = value;
    Put(j.dump(), side);
    EXPECT_THAT(Load(Key(16)).status(),
                StatusIs(StatusCode::kCorruption,
                         fmt::format("MAC sidecar {}: field {:?} is missing", side, field)))
        << j.dump();
  }
  Put(R"({"format": 1})", side);
  EXPECT_THAT(Load(Key(16)).status(),
              StatusIs(StatusCode::kCorruption, "MAC sidecar /d/enc.ckpt.mac: field \"format\""));
  Put(good.dump(), side);
  SP_EXPECT_OK(Load(Key(16)).status());
}

// Every injected failure (full disk, failed sync, crash) during an encrypted save leaves either
// no file or the previous file at the path, never a partial one.
TEST_F(CkptCipherTest, FaultsNeverLeaveAPartialEncryptedFile) {
  State old_state, new_state;
  Tensor a = Tensor::Empty(DType::kF32, {100}).value();
  FillPattern(a.view(), 1);
  Tensor b = Tensor::Empty(DType::kF64, {300}).value();
  FillPattern(b.view(), 2);
  SP_ASSERT_OK(old_state.Put("old", std::move(a)));
  SP_ASSERT_OK(new_state.Put("new", std::move(b)));
  const std::string key = Key(32);
  testing::ExpectFaultsNeverLeaveAPartialFile(
      [&](const State& s, const std::string& p, bool overwrite, FileSystem* fs) {
        return SaveMindSporeCheckpoint(
            s, p,
            {.overwrite = overwrite, .crc_check = true, .enc_key = EncryptionKey::FromBytes(key)},
            {.fs = fs});
      },
      [&](const std::string& p, FileSystem* fs) {
        return LoadMindSporeCheckpoint(p, {.dec_key = EncryptionKey::FromBytes(key)}, {.fs = fs});
      },
      kPath, old_state, new_state);
}

}  // namespace
}  // namespace savepoint
