// End-to-end corruption handling on real checkpoints: damaged chunks, data files and manifests
// must be reported (never crash, never return wrong bytes) with messages that say where.
#include <fmt/format.h>

#include <cctype>
#include <cstring>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "format/endian.h"
#include "format/manifest.h"
#include "io/mem_fs.h"
#include "testutil/testutil.h"
#include "util/crc32c.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

using testing::StatesEqual;

constexpr uint64_t kChunk = 4096;
constexpr char kDataFile[] = "data-00000-00000.spd";

// A small state whose tensors span several 4 KiB chunks (the last one short), plus values.
State MakeState(uint64_t seed) {
  State s;
  Tensor w = Tensor::Empty(DType::kF32, {64, 100}).value();  // 25600 bytes: 7 chunks
  testing::FillPattern(w.view(), seed);
  EXPECT_TRUE(s.Put("model.w", std::move(w)).ok());
  Tensor b = Tensor::Empty(DType::kBF16, {333}).value();  // 666 bytes: 1 chunk
  testing::FillPattern(b.view(), seed + 1);
  EXPECT_TRUE(s.Put("model.b", std::move(b)).ok());
  Tensor x = Tensor::Empty(DType::kF64, {}).value();
  testing::FillPattern(x.view(), seed + 2);
  EXPECT_TRUE(s.Put("scalar", std::move(x)).ok());
  EXPECT_TRUE(s.Put("empty", Tensor::Zeros(DType::kI32, {0, 4}).value()).ok());
  EXPECT_TRUE(s.PutValue("step", int64_t{42}).ok());
  EXPECT_TRUE(s.PutValue("rng", Bytes{{9, 8, 7}}).ok());
  s.metadata() = Json{{"run", "corruption"}};
  return s;
}

bool Contains(const Status& s, std::string_view needle) {
  return s.message().find(needle) != std::string::npos;
}

class CorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_ = MakeState(7);
    SaveOptions so;
    so.chunk_bytes = kChunk;
    ASSERT_TRUE(Save(state_, "/ck", so, io_).ok());
    manifest_ = Read("/ck/MANIFEST");
    data_ = Read(DataPath());
    Result<format::Manifest> m = format::DecodeManifest(manifest_, "MANIFEST");
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    m_ = std::move(m).value();
  }

  static std::string DataPath(std::string_view dir = "/ck") { return JoinPath(dir, kDataFile); }

  std::string Read(const std::string& path) {
    Result<std::string> r = fs_.ReadFile(path, uint64_t{1} << 30);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : std::string();
  }

  void Write(const std::string& path, std::string_view contents) {
    ASSERT_TRUE(fs_.WriteFileSynced(path, contents).ok());
  }

  const format::ShardRecord& ShardOf(std::string_view name) {
    for (const auto& t : m_.tensors) {
      if (t.name == name) return t.shards.at(0);
    }
    ADD_FAILURE() << "no tensor " << name;
    return m_.tensors.at(0).shards.at(0);
  }

  // Flips one bit of the data file at `offset`.
  void FlipDataBit(uint64_t offset, int bit = 0) {
    std::string d = data_;
    d[offset] = static_cast<char>(d[offset] ^ (1 << bit));
    Write(DataPath(), d);
  }

  MemFileSystem fs_;
  State state_;
  LoadOptions lo_;
  IoOptions io_{.fs = &fs_};
  std::string manifest_, data_;
  format::Manifest m_;
};

TEST_F(CorruptionTest, IntactCheckpointLoadsAndVerifies) {
  Result<State> back = Load("/ck", lo_, io_);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(StatesEqual(state_, *back));
  LoadStats stats;
  LoadOptions vo = lo_;
  vo.stats = &stats;
  SP_EXPECT_OK(VerifyCheckpoint("/ck", vo, io_));
  EXPECT_EQ(stats.chunks, 7u + 1u + 1u);
  EXPECT_EQ(ShardOf("model.w").crc32c.size(), 7u);
}

TEST_F(CorruptionTest, BitFlipInEveryChunkIsNamedPrecisely) {
  const format::ShardRecord& s = ShardOf("model.w");
  for (uint64_t chunk = 0; chunk < s.crc32c.size(); ++chunk) {
    uint64_t len = std::min(kChunk, s.bytes - chunk * kChunk);
    uint64_t chunk_offset = s.offset + chunk * kChunk;
    FlipDataBit(chunk_offset + (chunk * 977) % len, static_cast<int>(chunk % 8));
    for (int threads : {1, 3, 8}) {
      SCOPED_TRACE(fmt::format("chunk {} io_threads {}", chunk, threads));
      io_.io_threads = threads;
      std::vector<Status> errors = {Load("/ck", lo_, io_).status(),
                                    VerifyCheckpoint("/ck", lo_, io_)};
      auto reader = CheckpointReader::Open("/ck", lo_, io_);
      ASSERT_TRUE(reader.ok());
      errors.push_back((*reader)->ReadTensor("model.w").status());
      errors.push_back((*reader)->Verify());
      for (const Status& st : errors) {
        EXPECT_THAT(st, StatusIs(StatusCode::kCorruption));
        EXPECT_TRUE(Contains(st, "/ck")) << st.ToString();
        EXPECT_TRUE(Contains(st, "model.w")) << st.ToString();
        EXPECT_TRUE(Contains(st, fmt::format("chunk {} ", chunk))) << st.ToString();
        EXPECT_TRUE(Contains(st, fmt::format("offset {}", chunk_offset))) << st.ToString();
        EXPECT_TRUE(Contains(st, kDataFile)) << st.ToString();
      }
      // Other tensors are still readable.
      SP_EXPECT_OK((*reader)->ReadTensor("model.b").status());
    }
  }
}

TEST_F(CorruptionTest, UnverifiedLoadReturnsTheDamagedBytes) {
  const format::ShardRecord& s = ShardOf("model.w");
  uint64_t at = s.offset + 5000;
  FlipDataBit(at, 3);
  lo_.verify_checksums = false;
  Result<State> back = Load("/ck", lo_, io_);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  const TensorView* w = back->FindTensor("model.w");
  const TensorView* orig = state_.FindTensor("model.w");
  ASSERT_NE(w, nullptr);
  for (uint64_t i = 0; i < w->nbytes(); ++i) {
    auto expect = orig->data()[i] ^ (i == 5000 ? std::byte{8} : std::byte{0});
    ASSERT_EQ(w->data()[i], expect) << "byte " << i;
  }
  EXPECT_EQ(
      std::memcmp(back->FindTensor("model.b")->data(), state_.FindTensor("model.b")->data(), 666),
      0);
  // Verification is still available on demand, and the selected subset loads cleanly.
  EXPECT_THAT(VerifyCheckpoint("/ck", lo_, io_), StatusIs(StatusCode::kCorruption));
  lo_.verify_checksums = true;
  lo_.names = {"model.b", "scalar", "step"};
  Result<State> part = Load("/ck", lo_, io_);
  ASSERT_TRUE(part.ok()) << part.status().ToString();
  EXPECT_EQ(part->num_tensors(), 2u);
}

TEST_F(CorruptionTest, FlipInPaddingOrPastExtentsIsHarmless) {
  // Padding between extents is not covered by any checksum and never read into a tensor.
  const format::ShardRecord& b = ShardOf("model.b");
  FlipDataBit(b.offset + b.bytes + 10);
  Result<State> back = Load("/ck", lo_, io_);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(StatesEqual(state_, *back));
}

TEST_F(CorruptionTest, TruncatedDataFile) {
  for (uint64_t size :
       {data_.size() - 1, data_.size() - 4096, uint64_t{4096}, uint64_t{10}, uint64_t{0}}) {
    SCOPED_TRACE(fmt::format("truncated to {} bytes", size));
    Write(DataPath(), std::string_view(data_).substr(0, size));
    for (const Status& st : {Load("/ck", lo_, io_).status(), VerifyCheckpoint("/ck", lo_, io_)}) {
      EXPECT_THAT(st, StatusIs(StatusCode::kCorruption));
      EXPECT_TRUE(Contains(st, kDataFile)) << st.ToString();
      EXPECT_TRUE(Contains(st, "truncated")) << st.ToString();
      EXPECT_TRUE(Contains(st, "/ck")) << st.ToString();
      // The first chunk the file no longer holds is named (tensor, chunk, offset); cutting one
      // byte may only cut the padding after the last extent.
      if (size + 4096 <= data_.size()) {
        EXPECT_TRUE(Contains(st, "first chunk lost: tensor \"")) << st.ToString();
      }
    }
  }
  // Extra bytes at the end are tolerated.
  Write(DataPath(), data_ + std::string(5000, 'x'));
  SP_EXPECT_OK(VerifyCheckpoint("/ck", lo_, io_));
}

TEST_F(CorruptionTest, DataFileFromAnotherCheckpoint) {
  SaveOptions so;
  so.chunk_bytes = kChunk;
  SP_ASSERT_OK(Save(state_, "/other", so, io_));  // same state, same layout, another id
  std::string foreign = Read(DataPath("/other"));
  ASSERT_EQ(foreign.size(), data_.size());
  Write(DataPath(), foreign);
  for (const Status& st : {Load("/ck", lo_, io_).status(), VerifyCheckpoint("/ck", lo_, io_)}) {
    EXPECT_THAT(st, StatusIs(StatusCode::kCorruption));
    EXPECT_TRUE(Contains(st, "another checkpoint")) << st.ToString();
    EXPECT_TRUE(Contains(st, DataPath())) << st.ToString();
  }
}

TEST_F(CorruptionTest, CorruptedDataHeader) {
  struct Case {
    size_t offset;
    std::string needle;
  };
  for (const Case& c : {Case{0, "bad magic"}, Case{9, "checksum"}, Case{24, "checksum"},
                        Case{2000, "checksum"}, Case{4092, "checksum"}}) {
    SCOPED_TRACE(fmt::format("byte {}", c.offset));
    FlipDataBit(c.offset, 1);
    for (const Status& st : {Load("/ck", lo_, io_).status(), VerifyCheckpoint("/ck", lo_, io_)}) {
      EXPECT_THAT(st, StatusIs(StatusCode::kCorruption));
      EXPECT_TRUE(Contains(st, c.needle)) << st.ToString();
      EXPECT_TRUE(Contains(st, DataPath())) << st.ToString();
    }
  }
  // A well-formed header of a newer version: unimplemented, not corruption.
  std::string d = data_;
  format::PutU32(&d, 8, format::kMaxFormatVersion + 1);
  format::PutU32(&d, 4092, Crc32c(std::string_view(d).substr(0, 4092)));
  Write(DataPath(), d);
  EXPECT_THAT(VerifyCheckpoint("/ck", lo_, io_), StatusIs(StatusCode::kUnimplemented));
}

TEST_F(CorruptionTest, MissingDataFile) {
  SP_ASSERT_OK(fs_.RemoveFile(DataPath()));
  for (const Status& st : {Load("/ck", lo_, io_).status(), VerifyCheckpoint("/ck", lo_, io_)}) {
    EXPECT_THAT(st, StatusIs(StatusCode::kNotFound));
    EXPECT_TRUE(Contains(st, kDataFile)) << st.ToString();
  }
}

TEST_F(CorruptionTest, DamagedManifest) {
  std::mt19937_64 rng(3);
  std::string garbage(1 << 20, '\0');
  for (char& c : garbage) c = static_cast<char>(rng());
  std::string magic_garbage = garbage;
  magic_garbage.replace(0, 8, format::kManifestMagic);
  std::vector<std::string> bad = {"",
                                  manifest_.substr(0, 1),
                                  manifest_.substr(0, 63),
                                  manifest_.substr(0, 64),
                                  manifest_.substr(0, 100),
                                  manifest_.substr(0, manifest_.size() - 1),
                                  manifest_ + "\n",
                                  garbage,
                                  magic_garbage,
                                  std::string(1 << 20, '\0')};
  for (size_t i = 0; i < bad.size(); ++i) {
    SCOPED_TRACE(fmt::format("case {} ({} bytes)", i, bad[i].size()));
    Write("/ck/MANIFEST", bad[i]);
    std::vector<Status> errors = {Load("/ck", lo_, io_).status(), VerifyCheckpoint("/ck", lo_, io_),
                                  CheckpointReader::Open("/ck", lo_, io_).status()};
    for (const Status& st : errors) {
      EXPECT_THAT(st, StatusIs(StatusCode::kCorruption));
      EXPECT_TRUE(Contains(st, "/ck/MANIFEST")) << st.ToString();
    }
  }
  SP_ASSERT_OK(fs_.RemoveFile("/ck/MANIFEST"));
  Status missing = Load("/ck", lo_, io_).status();
  EXPECT_THAT(missing, StatusIs(StatusCode::kNotFound));
  EXPECT_TRUE(Contains(missing, "not a committed checkpoint")) << missing.ToString();
}

TEST(CorruptionPosix, BitFlipOnDisk) {
  testing::TempDir dir;
  State s = MakeState(11);
  SaveOptions so;
  so.chunk_bytes = kChunk;
  SP_ASSERT_OK(Save(s, dir.Sub("ck"), so));
  std::string data_path = JoinPath(dir.Sub("ck"), kDataFile);
  FileSystem* fs = DefaultFileSystem();
  std::string data = fs->ReadFile(data_path, 1 << 20).value();
  // Chunk 2 of "model.w" (packed after "model.b" in format version 2, so not 4 KiB-aligned: direct
  // reads of it take the blocks around it).
  const std::string manifest_path = JoinPath(dir.Sub("ck"), "MANIFEST");
  const format::Manifest m =
      format::DecodeManifest(fs->ReadFile(manifest_path, 1 << 20).value(), manifest_path).value();
  uint64_t chunk2 = 0;
  for (const auto& t : m.tensors) {
    if (t.name == "model.w") chunk2 = t.shards[0].offset + 2 * kChunk;
  }
  ASSERT_NE(chunk2 % 4096, 0u);
  data[chunk2 + 1] ^= 0x40;
  SP_ASSERT_OK(fs->WriteFileSynced(data_path, data));
  for (bool direct : {true, false}) {
    LoadOptions lo;
    const IoOptions io{.direct_io = direct};
    for (const Status& st :
         {Load(dir.Sub("ck"), lo, io).status(), VerifyCheckpoint(dir.Sub("ck"), lo, io)}) {
      EXPECT_THAT(st, StatusIs(StatusCode::kCorruption));
      EXPECT_TRUE(Contains(st, dir.Sub("ck"))) << st.ToString();
      EXPECT_TRUE(Contains(st, "\"model.w\" chunk 2 ")) << st.ToString();
      EXPECT_TRUE(Contains(st, fmt::format("offset {}", chunk2))) << st.ToString();
    }
    lo.verify_checksums = false;
    SP_EXPECT_OK(Load(dir.Sub("ck"), lo, io).status());
  }
}

// Random byte mutations of a valid MANIFEST (CRCs left stale) and random character mutations of
// its JSON body (re-framed with correct CRCs). Decoding and loading must never crash; a mutated
// manifest either fails cleanly or, when it still validates, loads without returning wrong bytes.
TEST_F(CorruptionTest, FuzzManifest) {
  uint64_t seed = testing::TestSeed("CorruptionTest.FuzzManifest");
  std::mt19937_64 rng(seed);
  const std::string body = manifest_.substr(format::kManifestHeaderBytes);
  SP_ASSERT_OK(fs_.CreateDir("/fz"));
  Write(DataPath("/fz"), data_);
  const std::string kAlphabet = "0123456789{}[]\",:.-+eEtrufalsn \\/u";
  std::map<std::string, int> outcomes;
  constexpr int kIterations = 2000;
  for (int it = 0; it < kIterations; ++it) {
    bool binary = it % 2 == 0;
    std::string bytes;
    bool unchanged;
    if (binary) {
      bytes = manifest_;
      int n = 1 + static_cast<int>(rng() % 4);
      for (int k = 0; k < n; ++k) {
        size_t at = rng() % 3 == 0 ? rng() % format::kManifestHeaderBytes : rng() % bytes.size();
        bytes[at] = static_cast<char>(rng() % 4 == 0 ? bytes[at] ^ (1 << (rng() % 8)) : rng());
      }
      if (rng() % 16 == 0) bytes.resize(rng() % bytes.size());
      unchanged = bytes == manifest_;
    } else {
      std::string text = body;
      int n = 1 + static_cast<int>(rng() % 3);
      for (int k = 0; k < n && !text.empty(); ++k) {
        size_t at = rng() % text.size();
        char c = rng() % 8 == 0 ? static_cast<char>(rng()) : kAlphabet[rng() % kAlphabet.size()];
        if (rng() % 2 == 0) {  // keep the JSON well-formed: change a digit of some number
          for (int tries = 0; tries < 64 && !std::isdigit(static_cast<unsigned char>(text[at]));
               ++tries) {
            at = rng() % text.size();
          }
          if (std::isdigit(static_cast<unsigned char>(text[at]))) {
            text[at] = static_cast<char>('0' + rng() % 10);
            continue;
          }
        }
        switch (rng() % 4) {
          case 0:
            text.insert(at, 1, c);
            break;
          case 1:
            text.erase(at, 1);
            break;
          case 2:
            text.insert(at, text.substr(rng() % text.size(), rng() % 16));
            break;
          default:
            text[at] = c;
            break;
        }
      }
      unchanged = text == body;
      bytes = manifest_.substr(0, format::kManifestHeaderBytes) + text;
      format::PutU64(&bytes, 16, text.size());
      format::PutU32(&bytes, 32, Crc32c(text));
      format::PutU32(&bytes, 60, Crc32c(std::string_view(bytes).substr(0, 60)));
    }
    SCOPED_TRACE(fmt::format("iteration {} ({}), seed {}", it, binary ? "binary" : "json", seed));
    Result<format::Manifest> m = format::DecodeManifest(bytes, "/fz/MANIFEST");
    if (unchanged) {
      ASSERT_TRUE(m.ok()) << m.status().ToString();
    } else if (binary) {
      ASSERT_FALSE(m.ok()) << "a mutation with stale CRCs was accepted";
    }
    if (!m.ok()) {
      StatusCode c = m.status().code();
      ASSERT_TRUE(c == StatusCode::kCorruption || c == StatusCode::kUnimplemented)
          << m.status().ToString();
      ASSERT_TRUE(Contains(m.status(), "/fz/MANIFEST")) << m.status().ToString();
    }
    Write("/fz/MANIFEST", bytes);
    Result<State> loaded = Load("/fz", lo_, io_);
    if (m.ok() != CheckpointReader::Open("/fz", lo_, io_).ok()) {
      ADD_FAILURE() << "DecodeManifest and CheckpointReader::Open disagree";
    }
    if (!m.ok()) {
      ASSERT_FALSE(loaded.ok());
      ASSERT_EQ(loaded.status().code(), m.status().code()) << loaded.status().ToString();
    }
    if (!loaded.ok()) {
      StatusCode c = loaded.status().code();
      ASSERT_TRUE(c == StatusCode::kCorruption || c == StatusCode::kUnimplemented ||
                  c == StatusCode::kNotFound || c == StatusCode::kOutOfRange)
          << loaded.status().ToString();
      ASSERT_FALSE(loaded.status().message().empty());
      outcomes[fmt::format("{} ({})", m.ok() ? "load failed" : "decode failed",
                           StatusCodeName(c))]++;
      continue;
    }
    outcomes[unchanged ? "unchanged, loaded" : "mutated, loaded"]++;
    if (unchanged) {
      ASSERT_TRUE(StatesEqual(state_, *loaded));
    }
    // Whatever validated and passed the checksums holds the original bytes under the same name.
    for (const auto& [name, e] : loaded->entries()) {
      const TensorView* orig = state_.FindTensor(name);
      if (!e.is_tensor() || orig == nullptr) continue;
      const TensorView& got = e.tensor();
      if (got.dtype() != orig->dtype() || got.shape() != orig->shape()) continue;
      ASSERT_EQ(std::memcmp(got.data(), orig->data(), got.nbytes()), 0) << name;
    }
  }
  for (const auto& [what, n] : outcomes) std::cout << "  " << what << ": " << n << "\n";
}

}  // namespace
}  // namespace savepoint
