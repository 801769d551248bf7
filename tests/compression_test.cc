// Compressed checkpoints end to end: round trips for every codec x shuffle mode through the
// synchronous Save and the async Checkpointer, on MemFileSystem and on POSIX with O_DIRECT, read
// back through every load path; corruption of compressed chunks and of their manifest entries
// (Corruption naming tensor and chunk, never a crash); faults during a compressed save.
#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <string>
#include <tuple>

#include "format/manifest.h"
#include "io/fault_fs.h"
#include "io/mem_fs.h"
#include "savepoint/async.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

using Codec = Compression::Codec;
using Shuffle = Compression::Shuffle;
using testing::StatesEqual;

constexpr uint64_t kChunk = 64 << 10;  // also the Checkpointer's slab (its minimum)
constexpr char kDataFile[] = "data-00000-00000.spd";

Tensor Make(DType dtype, Shape shape) { return Tensor::Zeros(dtype, std::move(shape)).value(); }

// Tensors of every kind that matters to a codec: random (incompressible) multi-chunk data,
// mostly-zero data, smooth bf16, tensors smaller than a chunk, an empty tensor and a scalar.
State MakeState(uint64_t seed) {
  State s;
  Tensor rnd = Make(DType::kF32, {64, 1000});  // 256000 bytes: 4 chunks, random
  testing::FillPattern(rnd.view(), seed);
  Tensor zeros = Make(DType::kF64, {40000});  // 320000 bytes, 1 in 1000 elements set
  for (int64_t i = 0; i < 40000; i += 1000) zeros.as<double>()[i] = 1.5 * i;
  Tensor ramp = Make(DType::kBF16, {70000});  // smooth values: compressible with shuffle
  for (int64_t i = 0; i < 70000; ++i) {
    float f = 1.0f + static_cast<float>(i % 512) / 512.0f;
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    reinterpret_cast<uint16_t*>(ramp.data())[i] = static_cast<uint16_t>(bits >> 16);
  }
  Tensor mask = Make(DType::kU8, {100000});  // 2 chunks, mostly zero
  for (int64_t i = 0; i < 100000; i += 97) mask.as<uint8_t>()[i] = 1;
  Tensor small = Make(DType::kI16, {7});
  testing::FillPattern(small.view(), seed + 1);
  Tensor cplx = Make(DType::kC64, {3});
  testing::FillPattern(cplx.view(), seed + 2);
  Tensor scalar = Make(DType::kF64, {});
  testing::FillPattern(scalar.view(), seed + 3);
  EXPECT_TRUE(s.Put("rand.f32", std::move(rnd)).ok());
  EXPECT_TRUE(s.Put("zeros.f64", std::move(zeros)).ok());
  EXPECT_TRUE(s.Put("ramp.bf16", std::move(ramp)).ok());
  EXPECT_TRUE(s.Put("mask.u8", std::move(mask)).ok());
  EXPECT_TRUE(s.Put("small.i16", std::move(small)).ok());
  EXPECT_TRUE(s.Put("small.c64", std::move(cplx)).ok());
  EXPECT_TRUE(s.Put("scalar.f64", std::move(scalar)).ok());
  EXPECT_TRUE(s.Put("empty.f32", Make(DType::kF32, {0, 5})).ok());
  EXPECT_TRUE(s.PutValue("step", int64_t{12}).ok());
  s.metadata() = Json{{"run", "compression"}};
  return s;
}

Compression Make(Codec codec, Shuffle shuffle = Shuffle::kAuto) {
  Compression c;
  c.codec = codec;
  c.shuffle = shuffle;
  return c;
}

// The filter a tensor of `dtype` gets under `shuffle`.
std::string ExpectedFilter(Shuffle shuffle, DType dtype) {
  size_t e = DTypeSize(dtype);
  bool on =
      shuffle == Shuffle::kOn ? e > 1 : shuffle == Shuffle::kAuto && (e == 2 || e == 4 || e == 8);
  return on ? "shuffle" : "none";
}

bool Has(const Status& s, std::string_view needle) {
  return s.message().find(needle) != std::string::npos;
}

// Saves `state` at `path` with `c`, synchronously or through a Checkpointer; returns the stored
// bytes the save reported.
Result<uint64_t> SaveWith(const State& state, const std::string& path, FileSystem* fs,
                          const Compression& c, bool async) {
  const IoOptions io{.fs = fs, .io_threads = 3};
  SaveOptions so;
  so.chunk_bytes = kChunk;
  so.compression = c;
  SaveStats stats;
  if (!async) {
    so.stats = &stats;
    SP_RETURN_IF_ERROR(Save(state, path, so, io));
    return stats.stored_bytes;
  }
  CheckpointerOptions co;
  co.slab_bytes = kChunk;
  co.staging_bytes = 4 * kChunk;  // smaller than the state: the snapshot waits for the writers
  SP_ASSIGN_OR_RETURN(std::unique_ptr<Checkpointer> ckpt, Checkpointer::Create(co, io));
  SP_ASSIGN_OR_RETURN(SaveHandle h, ckpt->SaveAsync(state, path, so));
  SP_RETURN_IF_ERROR(h.Wait());
  return h.stats().stored_bytes;
}

using Param = std::tuple<Codec, Shuffle, bool /*async*/, bool /*posix*/>;

class CompressionRoundTrip : public ::testing::TestWithParam<Param> {
 protected:
  Codec codec() const { return std::get<0>(GetParam()); }
  Shuffle shuffle() const { return std::get<1>(GetParam()); }
  bool async() const { return std::get<2>(GetParam()); }
  bool posix() const { return std::get<3>(GetParam()); }
  FileSystem* fs() { return posix() ? DefaultFileSystem() : &mem_; }
  std::string Path() { return posix() ? dir_.Sub("ck") : "/ck"; }
  IoOptions Io() { return {.fs = fs()}; }

  MemFileSystem mem_;
  testing::TempDir dir_;
};

// Every tensor's codec, filter and stored size as the reader describes them. Tensors below 64 KiB
// (and empty ones) are packed uncompressed (format version 2, docs/FORMAT.md §8).
void CheckDescription(const CheckpointReader& r, Codec codec, Shuffle shuffle) {
  const std::string name = codec == Codec::kZstd ? "zstd" : "lz4";
  EXPECT_EQ(r.manifest_json()["required_features"], Json::array({"compression"}));
  for (const TensorInfo& t : r.tensors()) {
    SCOPED_TRACE(t.name);
    const bool packed = t.nbytes < format::kPackBelowBytes;
    EXPECT_EQ(t.codec, packed ? "none" : name);
    EXPECT_EQ(t.filter, packed ? "none" : ExpectedFilter(shuffle, t.dtype));
    EXPECT_LE(t.stored_bytes, t.nbytes);
  }
  EXPECT_EQ(r.FindTensor("rand.f32")->stored_bytes, r.FindTensor("rand.f32")->nbytes);
  EXPECT_LT(r.FindTensor("zeros.f64")->stored_bytes, r.FindTensor("zeros.f64")->nbytes / 10);
  EXPECT_LT(r.FindTensor("mask.u8")->stored_bytes, r.FindTensor("mask.u8")->nbytes / 4);
}

TEST_P(CompressionRoundTrip, EveryLoadPathReturnsTheSavedState) {
  State state = MakeState(testing::TestSeed("CompressionRoundTrip"));
  Result<uint64_t> stored = SaveWith(state, Path(), fs(), Make(codec(), shuffle()), async());
  SP_ASSERT_OK(stored.status());
  EXPECT_LT(*stored, state.tensor_bytes());
  EXPECT_GT(*stored, 256000u);  // the random tensor is stored raw

  auto reader = CheckpointReader::Open(Path(), {}, Io());
  SP_ASSERT_OK(reader.status());
  CheckDescription(**reader, codec(), shuffle());
  LoadStats vs;
  SP_ASSERT_OK((*reader)->Verify(&vs));
  EXPECT_EQ(vs.bytes, state.tensor_bytes());
  EXPECT_EQ(vs.stored_bytes, *stored);
  EXPECT_GT(vs.compression_ratio(), 1.0);
  for (const auto& [name, e] : state.entries()) {
    if (!e.is_tensor()) continue;
    Result<Tensor> t = (*reader)->ReadTensor(name);
    SP_ASSERT_OK(t.status());
    EXPECT_EQ(std::memcmp(t->data(), e.tensor().data(), e.tensor().nbytes()), 0) << name;
  }
  Result<TensorView> mapped = (*reader)->MapTensor("zeros.f64", false);
  ASSERT_THAT(mapped, StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_TRUE(Has(mapped.status(), "compressed")) << mapped.status().ToString();
  SP_EXPECT_OK((*reader)->MapTensor("empty.f32", true).status());

  Result<State> loaded = Load(Path(), {}, Io());
  SP_ASSERT_OK(loaded.status());
  EXPECT_TRUE(StatesEqual(state, *loaded));
  LoadOptions mm;
  mm.mmap = true;
  Result<State> mapped_state = Load(Path(), mm, Io());
  SP_ASSERT_OK(mapped_state.status());
  EXPECT_TRUE(StatesEqual(state, *mapped_state));
  State into = MakeState(999);  // same names, dtypes and shapes; other bytes
  SP_ASSERT_OK(LoadInto(Path(), into, {}, Io()));
  EXPECT_TRUE(StatesEqual(state, into));
  LoadOptions unverified;
  unverified.verify_checksums = false;
  loaded = Load(Path(), unverified, Io());
  SP_ASSERT_OK(loaded.status());
  EXPECT_TRUE(StatesEqual(state, *loaded));
  Result<FileInfo> data = fs()->Stat(JoinPath(Path(), kDataFile));
  SP_ASSERT_OK(data.status());
  EXPECT_EQ(data->size % 4096, 0u);
  EXPECT_LT(data->size, state.tensor_bytes());
}

std::string CaseName(const ::testing::TestParamInfo<Param>& info) {
  auto [codec, shuffle, async, posix] = info.param;
  const char* shuffles[] = {"Auto", "On", "Off"};
  return fmt::format("{}_Shuffle{}_{}_{}", codec == Codec::kZstd ? "Zstd" : "Lz4",
                     shuffles[static_cast<int>(shuffle)], async ? "Async" : "Sync",
                     posix ? "Posix" : "Mem");
}

INSTANTIATE_TEST_SUITE_P(All, CompressionRoundTrip,
                         ::testing::Combine(::testing::Values(Codec::kZstd, Codec::kLz4),
                                            ::testing::Values(Shuffle::kAuto, Shuffle::kOn,
                                                              Shuffle::kOff),
                                            ::testing::Bool(), ::testing::Bool()),
                         CaseName);

TEST(Compression, UncompressedSavesKeepThePlainFormat) {
  MemFileSystem mem;
  State state = MakeState(3);
  SP_ASSERT_OK(SaveWith(state, "/ck", &mem, Compression{}, false).status());
  auto reader = CheckpointReader::Open("/ck", {}, {.fs = &mem});
  SP_ASSERT_OK(reader.status());
  const Json& j = (*reader)->manifest_json();
  EXPECT_EQ(j["required_features"], Json::array());
  EXPECT_EQ(j["version"], format::kFormatVersion);
  for (const Json& t : j["tensors"]) EXPECT_FALSE(t["shards"][0].contains("codec"));
  for (const TensorInfo& t : (*reader)->tensors()) {
    EXPECT_EQ(t.codec, "none");
    EXPECT_EQ(t.stored_bytes, t.nbytes);
  }
  SP_EXPECT_OK((*reader)->MapTensor("zeros.f64", true).status());
}

TEST(Compression, BadOptionsAreInvalidArgument) {
  MemFileSystem mem;
  State state = MakeState(4);
  Compression bad_level = Make(Codec::kZstd);
  bad_level.zstd_level = 99;
  Result<uint64_t> r = SaveWith(state, "/a", &mem, bad_level, false);
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_TRUE(Has(r.status(), "zstd_level = 99")) << r.status().ToString();
  r = SaveWith(state, "/a", &mem, bad_level, true);
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
  Compression bad_codec = Make(static_cast<Codec>(9));
  r = SaveWith(state, "/a", &mem, bad_codec, false);
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_TRUE(Has(r.status(), "compression.codec")) << r.status().ToString();
  Compression bad_shuffle = Make(Codec::kLz4, static_cast<Shuffle>(7));
  r = SaveWith(state, "/a", &mem, bad_shuffle, false);
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_FALSE(mem.Exists("/a"));
  Compression lz4_any_level = Make(Codec::kLz4);
  lz4_any_level.zstd_level = 99;  // ignored by lz4
  SP_EXPECT_OK(SaveWith(state, "/a", &mem, lz4_any_level, false).status());
}

// A compressed checkpoint in memory, and surgery on its data file and manifest.
class CompressedCorruption : public ::testing::TestWithParam<Codec> {
 protected:
  void SetUp() override {
    state_ = MakeState(5);
    ASSERT_TRUE(SaveWith(state_, "/ck", &fs_, Make(GetParam()), false).ok());
    data_ = fs_.ReadFile("/ck/" + std::string(kDataFile), uint64_t{1} << 30).value();
    manifest_ = format::DecodeManifest(fs_.ReadFile("/ck/MANIFEST", 1 << 20).value(), "M").value();
  }
  format::ShardRecord& Shard(std::string_view name) {
    for (auto& t : manifest_.tensors) {
      if (t.name == name) return t.shards.at(0);
    }
    ADD_FAILURE() << "no tensor " << name;
    return manifest_.tensors.at(0).shards.at(0);
  }
  void WriteData(const std::string& d) {
    ASSERT_TRUE(fs_.WriteFileSynced("/ck/" + std::string(kDataFile), d).ok());
  }
  void WriteManifest() {
    ASSERT_TRUE(fs_.WriteFileSynced("/ck/MANIFEST", format::EncodeManifest(manifest_)).ok());
  }
  // Expects Corruption naming the chunk of "zeros.f64", its file and its stored offset.
  void ExpectChunkCorruption(const Status& s, uint64_t chunk, std::string_view what) {
    EXPECT_THAT(s, StatusIs(StatusCode::kCorruption));
    const format::StoredChunk& sc = Shard("zeros.f64").stored.at(chunk);
    for (std::string needle :
         {std::string("checkpoint /ck"), fmt::format("tensor \"zeros.f64\" chunk {}", chunk),
          fmt::format("file {} offset {}", kDataFile, sc.offset), std::string(what)}) {
      EXPECT_TRUE(Has(s, needle)) << "lacks \"" << needle << "\": " << s.ToString();
    }
  }

  MemFileSystem fs_;
  State state_;
  LoadOptions lo_;
  const IoOptions io_{.fs = &fs_};
  std::string data_;
  format::Manifest manifest_;
};

TEST_P(CompressedCorruption, FlippedByteIsACrcMismatchOnEveryPath) {
  const format::StoredChunk& sc = Shard("zeros.f64").stored.at(1);
  ASSERT_TRUE(sc.compressed);
  std::string d = data_;
  d[sc.offset + sc.bytes / 2] ^= 0x40;
  WriteData(d);
  ExpectChunkCorruption(Load("/ck", lo_, io_).status(), 1, "CRC32C mismatch");
  ExpectChunkCorruption(VerifyCheckpoint("/ck", lo_, io_), 1, "CRC32C mismatch");
  auto reader = CheckpointReader::Open("/ck", lo_, io_);
  SP_ASSERT_OK(reader.status());
  ExpectChunkCorruption((*reader)->ReadTensor("zeros.f64").status(), 1, "compressed");
  SP_EXPECT_OK((*reader)->ReadTensor("mask.u8").status());  // other tensors still read
}

TEST_P(CompressedCorruption, GarbageWithoutVerificationIsADecompressionError) {
  const format::StoredChunk& sc = Shard("zeros.f64").stored.at(2);
  ASSERT_TRUE(sc.compressed);
  std::string d = data_;
  for (uint64_t i = 0; i < sc.bytes; ++i) d[sc.offset + i] = static_cast<char>(0xA5 ^ i);
  WriteData(d);
  lo_.verify_checksums = false;
  ExpectChunkCorruption(Load("/ck", lo_, io_).status(), 2, "zeros.f64");
}

TEST_P(CompressedCorruption, TruncatedStoredSizeInTheManifest) {
  format::StoredChunk& sc = Shard("zeros.f64").stored.at(0);
  ASSERT_TRUE(sc.compressed);
  ASSERT_GT(sc.bytes, 8u);
  sc.bytes -= 8;
  WriteManifest();
  ExpectChunkCorruption(Load("/ck", lo_, io_).status(), 0, "CRC32C mismatch");
  lo_.verify_checksums = false;
  ExpectChunkCorruption(Load("/ck", lo_, io_).status(), 0, "zeros.f64");
}

TEST_P(CompressedCorruption, StoredExtentPastTheFileIsRejectedAtOpen) {
  Shard("zeros.f64").stored.at(0).offset = manifest_.files[0].bytes;
  WriteManifest();
  Status s = Load("/ck", lo_, io_).status();
  EXPECT_THAT(s, StatusIs(StatusCode::kCorruption));
  EXPECT_TRUE(Has(s, "zeros.f64")) << s.ToString();
  EXPECT_TRUE(Has(s, "chunk 0")) << s.ToString();
}

// Random damage to compressed chunks, read without verification: every outcome is either the
// right size of (possibly wrong) data or Corruption naming the tensor; never a crash (ASan).
TEST_P(CompressedCorruption, RandomDamageNeverCrashesTheDecompressor) {
  uint64_t seed = testing::TestSeed("CompressedCorruption.RandomDamage");
  std::mt19937_64 rng(seed);
  lo_.verify_checksums = false;
  const format::ShardRecord& s = Shard("zeros.f64");
  for (int round = 0; round < 60; ++round) {
    std::string d = data_;
    for (int k = 0; k < 1 + round % 4; ++k) {
      const format::StoredChunk& sc = s.stored[rng() % s.stored.size()];
      d[sc.offset + rng() % sc.bytes] = static_cast<char>(rng());
    }
    WriteData(d);
    Status st = Load("/ck", lo_, io_).status();
    if (!st.ok()) {
      EXPECT_THAT(st, StatusIs(StatusCode::kCorruption));
      EXPECT_TRUE(Has(st, "tensor \"zeros.f64\" chunk")) << st.ToString();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, CompressedCorruption, ::testing::Values(Codec::kZstd, Codec::kLz4),
                         [](const auto& info) {
                           return std::string(info.param == Codec::kZstd ? "Zstd" : "Lz4");
                         });

// ENOSPC in the middle of a compressed save: an error, nothing committed, and the next save works.
TEST(CompressionFaults, NoSpaceDuringACompressedSaveCommitsNothing) {
  using Op = FaultInjectionFileSystem::Op;
  State state = MakeState(6);
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "sync");
    MemFileSystem mem;
    FaultInjectionFileSystem fault(&mem);
    fault.FailNth(Op::kWrite, 3, ENOSPC);
    Result<uint64_t> r = SaveWith(state, "/root/ck", &fault, Make(Codec::kZstd), async);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(Has(r.status(), "/root/ck")) << r.status().ToString();
    EXPECT_FALSE(mem.Exists("/root/ck"));
    EXPECT_TRUE(mem.ListDir("/root").value().empty());  // the temporary directory is gone
    SP_ASSERT_OK(SaveWith(state, "/root/ck", &fault, Make(Codec::kZstd), async).status());
    Result<State> back = Load("/root/ck", {}, {.fs = &mem});
    SP_ASSERT_OK(back.status());
    EXPECT_TRUE(StatesEqual(state, *back));
  }
}

}  // namespace
}  // namespace savepoint
