// Format version 2 (docs/FORMAT.md §8): small tensors packed back to back at 64-byte alignment.
// Checks the layout the writer produces (packed region, spans, large extents still 4096-aligned),
// round trips through every reader (Load with and without direct I/O, LoadInto, mmap, MapTensor,
// ReadTensor, Verify), compression and asynchronous saves, corruption of a packed tensor named
// precisely, the version rules of the data file header, SaveOptions::format_version = 1, and a
// version 1 checkpoint written by the last version-1-only build (tests/data/v1_checkpoint).
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "format/endian.h"
#include "format/manifest.h"
#include "savepoint/async.h"
#include "testutil/testutil.h"
#include "util/crc32c.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

using testing::StatesEqual;
using testing::TempDir;

constexpr char kDataFile[] = "data-00000-00000.spd";

format::Manifest ReadManifest(const std::string& dir) {
  std::string path = JoinPath(dir, "MANIFEST");
  Result<std::string> bytes = DefaultFileSystem()->ReadFile(path, uint64_t{1} << 30);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  Result<format::Manifest> m = format::DecodeManifest(bytes.ok() ? *bytes : "", path);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(m).value() : format::Manifest{};
}

const format::ShardRecord& ShardOf(const format::Manifest& m, std::string_view name) {
  for (const auto& t : m.tensors) {
    if (t.name == name) return t.shards.at(0);
  }
  ADD_FAILURE() << "no tensor " << name;
  static const format::ShardRecord none;
  return none;
}

// Reads, XORs and writes back bytes of a file in place.
void PatchFile(const std::string& path, uint64_t offset, const std::function<void(std::string*)>& f,
               uint64_t len = 1) {
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0) << path;
  std::string b(len, '\0');
  ASSERT_EQ(::pread(fd, b.data(), len, static_cast<off_t>(offset)), static_cast<ssize_t>(len));
  f(&b);
  ASSERT_EQ(::pwrite(fd, b.data(), len, static_cast<off_t>(offset)), static_cast<ssize_t>(len));
  ::close(fd);
}

std::string TinyName(int i) { return fmt::format("opt.{:04}.step", i); }

// 500 tensors of 16 f32 (Adam's `step`), a scalar, an empty tensor, a bias, a 256 KiB weight and a
// 70,000-byte tensor (large, not a multiple of 4096), values and metadata.
State MixedState() {
  State s;
  auto put = [&](const std::string& name, DType dtype, Shape shape, uint64_t seed) {
    Tensor t = Tensor::Empty(dtype, std::move(shape)).value();
    testing::FillPattern(t.view(), seed);
    EXPECT_TRUE(s.Put(name, std::move(t)).ok());
  };
  for (int i = 0; i < 500; ++i) put(TinyName(i), DType::kF32, {16}, i);
  put("scalar", DType::kF64, {}, 1000);
  put("empty", DType::kBF16, {0, 7}, 1001);
  put("model.b", DType::kF32, {256}, 1002);
  put("model.w", DType::kF32, {256, 256}, 1003);
  put("odd", DType::kU8, {70000}, 1004);
  EXPECT_TRUE(s.PutValue("step", int64_t{9}).ok());
  s.metadata() = Json{{"run", "packing"}};
  return s;
}

bool Packed(const format::ShardRecord& s) { return s.bytes < format::kPackBelowBytes; }

// Every load path, with and without direct I/O, returns `want`.
void ExpectAllReadersAgree(const std::string& path, const State& want) {
  for (bool direct : {true, false}) {
    for (int threads : {1, 4}) {
      SCOPED_TRACE(fmt::format("direct_io {} io_threads {}", direct, threads));
      LoadOptions o;
      const IoOptions io{.io_threads = threads, .direct_io = direct};
      Result<State> got = Load(path, o, io);
      SP_ASSERT_OK(got.status());
      EXPECT_TRUE(StatesEqual(want, *got));
      // LoadInto caller buffers at an address 4 KiB-aligned plus 64 bytes (direct reads cannot
      // land in them straight).
      State into;
      std::vector<Tensor> memory;
      for (const auto& [name, e] : want.entries()) {
        if (!e.is_tensor()) continue;
        memory.push_back(Tensor::Zeros(DType::kU8, {int64_t(e.tensor().nbytes() + 64)}).value());
        SP_ASSERT_OK(into.PutView(
            name, TensorView(memory.back().data() + 64, e.tensor().dtype(), e.tensor().shape())));
      }
      SP_ASSERT_OK(LoadInto(path, into, o, io));
      EXPECT_TRUE(StatesEqual(want, into));
      LoadStats stats;
      o.stats = &stats;
      SP_ASSERT_OK(VerifyCheckpoint(path, o, io));
      EXPECT_EQ(stats.bytes, want.tensor_bytes());
    }
  }
  LoadOptions mapped;
  mapped.mmap = true;
  Result<State> views = Load(path, mapped);
  SP_ASSERT_OK(views.status());
  EXPECT_TRUE(StatesEqual(want, *views));
  for (const auto& [name, e] : views->entries()) {
    if (e.is_tensor() && e.tensor().nbytes() > 0) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(e.tensor().data()) % 64, 0u) << name;
    }
  }
  auto reader = CheckpointReader::Open(path).value();
  for (const auto& [name, e] : want.entries()) {
    if (!e.is_tensor()) continue;
    Result<Tensor> t = reader->ReadTensor(name);
    SP_ASSERT_OK(t.status());
    EXPECT_EQ(0, std::memcmp(t->data(), e.tensor().data(), e.tensor().nbytes())) << name;
    Result<TensorView> v = reader->MapTensor(name, /*verify=*/true);
    if (reader->FindTensor(name)->codec != "none") continue;
    SP_ASSERT_OK(v.status());
    EXPECT_EQ(0, std::memcmp(v->data(), e.tensor().data(), e.tensor().nbytes())) << name;
  }
}

TEST(Packing, SmallTensorsArePackedAndLargeOnesStayAligned) {
  TempDir dir;
  const State state = MixedState();
  const std::string path = dir.Sub("ckpt");
  SP_ASSERT_OK(Save(state, path));
  format::Manifest m = ReadManifest(path);
  EXPECT_EQ(m.version, 2u);
  uint64_t packed_end = format::kDataHeaderBytes, misaligned = 0;
  for (const auto& t : m.tensors) {
    const format::ShardRecord& s = t.shards[0];
    EXPECT_EQ(s.offset % 64, 0u) << t.name;
    if (Packed(s)) {
      packed_end = std::max(packed_end, s.offset + s.bytes);
      misaligned += s.offset % 4096 != 0;
    } else {
      EXPECT_EQ(s.offset % 4096, 0u) << t.name;
      EXPECT_GE(s.offset, format::AlignUp(packed_end)) << t.name << " is not after the region";
    }
  }
  EXPECT_GT(misaligned, 400u);
  // Header + packed region (500 x 64 + 8 + 1024 bytes, 64-aligned) + 256 KiB + 70,000 bytes.
  const uint64_t region = format::AlignUp(500 * 64 + 64 + 1024);
  EXPECT_EQ(m.files[0].bytes, 4096 + region + (256 << 10) + format::AlignUp(70000));
  EXPECT_EQ(std::filesystem::file_size(JoinPath(path, kDataFile)), m.files[0].bytes);
  auto reader = CheckpointReader::Open(path).value();
  EXPECT_EQ(reader->format_version(), 2u);
  EXPECT_EQ(reader->manifest_json()["alignment"], 64);
  ExpectAllReadersAgree(path, state);
}

TEST(Packing, FormatVersion1WritesTheClassicLayout) {
  TempDir dir;
  const State state = MixedState();
  const std::string path = dir.Sub("ckpt");
  SaveOptions o;
  o.format_version = 1;
  SP_ASSERT_OK(Save(state, path, o));
  format::Manifest m = ReadManifest(path);
  EXPECT_EQ(m.version, 1u);
  for (const auto& t : m.tensors) EXPECT_EQ(t.shards[0].offset % 4096, 0u) << t.name;
  std::string header(format::kDataHeaderBytes, '\0');
  PatchFile(
      JoinPath(path, kDataFile), 0, [&](std::string* b) { header = *b; }, header.size());
  EXPECT_EQ(format::GetU32(header, 8), 1u);  // the data file header's version
  ExpectAllReadersAgree(path, state);
  for (uint32_t bad : {format::kMaxFormatVersion + 1, 1000u}) {  // (0: savepoint's choice, 2)
    o.format_version = bad;
    Status s = Save(state, dir.Sub(fmt::format("bad{}", bad)), o);
    EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "SaveOptions.format_version"));
  }
}

// Packed extents near 64 KiB fill 1 MiB spans; none crosses a span boundary, and with 4 KiB
// chunks each is several chunks, every one checksummed.
TEST(Packing, SpansAndMultiChunkPackedExtents) {
  TempDir dir;
  State state;
  for (int i = 0; i < 40; ++i) {
    Tensor t = Tensor::Empty(DType::kU8, {60000 + 13 * i}).value();
    testing::FillPattern(t.view(), 77 + i);
    SP_ASSERT_OK(state.Put(fmt::format("t{:02}", i), std::move(t)));
  }
  const std::string path = dir.Sub("ckpt");
  SaveOptions o;
  o.chunk_bytes = 4096;
  SP_ASSERT_OK(Save(state, path, o));
  format::Manifest m = ReadManifest(path);
  const uint64_t span = format::kPackSpanBytes, region = format::kDataHeaderBytes;
  for (const auto& t : m.tensors) {
    const format::ShardRecord& s = t.shards[0];
    EXPECT_EQ((s.offset - region) / span, (s.offset + s.bytes - 1 - region) / span) << t.name;
    EXPECT_EQ(s.crc32c.size(), format::NumChunks(s.bytes, 4096)) << t.name;
  }
  EXPECT_LT(m.files[0].bytes, 4096 + 40 * 61000 + 3 * (64 << 10));
  ExpectAllReadersAgree(path, state);
}

TEST(Packing, CompressionLeavesSmallTensorsPacked) {
  TempDir dir;
  State state = MixedState();
  SP_ASSERT_OK(state.Put("zeros", Tensor::Zeros(DType::kF32, {1 << 18}).value()));  // compresses
  const std::string path = dir.Sub("ckpt");
  SaveOptions o;
  o.compression.codec = Compression::Codec::kZstd;
  SP_ASSERT_OK(Save(state, path, o));
  format::Manifest m = ReadManifest(path);
  uint64_t packed_end = 0;
  for (const auto& t : m.tensors) {
    const format::ShardRecord& s = t.shards[0];
    EXPECT_EQ(s.compressed(), !Packed(s)) << t.name;
    if (Packed(s)) packed_end = std::max(packed_end, s.offset + s.bytes);
  }
  for (const auto& t : m.tensors) {
    for (const auto& c : t.shards[0].stored) EXPECT_GE(c.offset, packed_end) << t.name;
  }
  EXPECT_TRUE(ShardOf(m, "zeros").stored[0].compressed);
  ExpectAllReadersAgree(path, state);
}

TEST(Packing, AsyncSavesPackToo) {
  TempDir dir;
  State state = MixedState();
  SP_ASSERT_OK(state.Put("zeros", Tensor::Zeros(DType::kF32, {1 << 18}).value()));
  CheckpointerOptions co;
  co.slab_bytes = 64 << 10;  // the packed region spans several slabs
  co.staging_bytes = 4 * co.slab_bytes;
  co.snapshot_threads = 3;
  auto ckpt = Checkpointer::Create(co, {.io_threads = 2}).value();
  for (auto codec : {Compression::Codec::kNone, Compression::Codec::kLz4}) {
    const std::string path = dir.Sub(fmt::format("ckpt{}", static_cast<int>(codec)));
    SaveOptions o;
    o.compression.codec = codec;
    SP_ASSERT_OK(ckpt->SaveAsync(state, path, o).value().Wait());
    format::Manifest m = ReadManifest(path);
    EXPECT_EQ(m.version, 2u);
    EXPECT_EQ(ShardOf(m, TinyName(1)).offset, ShardOf(m, TinyName(0)).offset + 64);
    EXPECT_NE(ShardOf(m, TinyName(1)).offset % 4096, 0u);
    ExpectAllReadersAgree(path, state);
  }
}

TEST(Packing, CorruptPackedTensorIsNamed) {
  TempDir dir;
  const State state = MixedState();
  const std::string path = dir.Sub("ckpt");
  SP_ASSERT_OK(Save(state, path));
  const format::Manifest m = ReadManifest(path);
  const std::string victim = TinyName(123);
  const uint64_t offset = ShardOf(m, victim).offset;
  ASSERT_NE(offset % 4096, 0u);
  PatchFile(JoinPath(path, kDataFile), offset + 17, [](std::string* b) { (*b)[0] ^= 0x20; });
  const std::string needle =
      fmt::format("tensor \"{}\" chunk 0 (file {} offset {}, 64 bytes)", victim, kDataFile, offset);
  auto expect_named = [&](const Status& s) {
    EXPECT_THAT(s, StatusIs(StatusCode::kCorruption, needle));
    EXPECT_NE(s.message().find(path), std::string::npos) << s.ToString();
  };
  for (bool direct : {true, false}) {
    LoadOptions o;
    const IoOptions io{.direct_io = direct};
    expect_named(Load(path, o, io).status());
    expect_named(VerifyCheckpoint(path, o, io));
    o.mmap = true;
    expect_named(Load(path, o, io).status());
    // Its neighbours in the same 4 KiB block are intact.
    o.mmap = false;
    o.names = {TinyName(122), TinyName(124)};
    SP_EXPECT_OK(Load(path, o, io).status());
  }
  auto reader = CheckpointReader::Open(path).value();
  expect_named(reader->MapTensor(victim, /*verify=*/true).status());
  expect_named(reader->ReadTensor(victim).status());
}

// The data file header carries the manifest's version; a mismatch is corruption, an unknown
// version unimplemented.
TEST(Packing, DataHeaderVersionMustMatchTheManifest) {
  TempDir dir;
  const std::string path = dir.Sub("ckpt");
  SP_ASSERT_OK(Save(MixedState(), path));
  const std::string data = JoinPath(path, kDataFile);
  for (uint32_t version : {1u, 3u, 4u, format::kMaxFormatVersion + 1}) {
    PatchFile(
        data, 0,
        [&](std::string* h) {
          format::PutU32(h, 8, version);
          const uint64_t crc_at = format::kDataHeaderBytes - 4;
          format::PutU32(h, crc_at, Crc32c(std::string_view(*h).substr(0, crc_at)));
        },
        format::kDataHeaderBytes);
    Status s = Load(path).status();
    EXPECT_EQ(s.code(), version <= format::kMaxFormatVersion ? StatusCode::kCorruption
                                                             : StatusCode::kUnimplemented)
        << s.ToString();
    EXPECT_NE(s.message().find(fmt::format("data file format version {}", version)),
              std::string::npos)
        << s.ToString();
  }
}

// tests/data/v1_checkpoint was written by the last build that wrote only version 1 (generator:
// tests/data/make_v1_checkpoint.cc); every byte of it is a function of the tensor's name.
std::byte V1FixtureByte(const std::string& name, size_t j) {
  return static_cast<std::byte>((j * 31 + name.size() * 17) & 0xff);
}

TEST(Packing, Version1CheckpointsStayReadable) {
  // An absolute path from CMake: __FILE__ is relative when ccache rewrites paths (CCACHE_BASEDIR).
  const std::string path = std::string(SAVEPOINT_TEST_DATA) + "/v1_checkpoint";
  auto reader = CheckpointReader::Open(path).value();
  EXPECT_EQ(reader->format_version(), 1u);
  EXPECT_EQ(reader->tensors().size(), 7u);
  State want;
  for (const TensorInfo& info : reader->tensors()) {
    Tensor t = Tensor::Empty(info.dtype, info.shape).value();
    for (size_t j = 0; j < info.nbytes; ++j) t.data()[j] = V1FixtureByte(info.name, j);
    SP_ASSERT_OK(want.Put(info.name, std::move(t)));
  }
  SP_ASSERT_OK(want.PutValue("step", int64_t{42}));
  SP_ASSERT_OK(want.PutValue("lr", 0.25));
  want.metadata() = Json{{"fixture", "v1"}};
  ExpectAllReadersAgree(path, want);
  // Re-saved by this build, it becomes version 2 with the same contents.
  TempDir dir;
  State loaded = Load(path).value();
  SP_ASSERT_OK(Save(loaded, dir.Sub("v2")));
  EXPECT_EQ(CheckpointReader::Open(dir.Sub("v2")).value()->format_version(), 2u);
  ExpectAllReadersAgree(dir.Sub("v2"), want);
}

}  // namespace
}  // namespace savepoint
