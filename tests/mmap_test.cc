// Zero-copy loading: Load with LoadOptions::mmap and CheckpointReader::MapTensor, on the POSIX and
// in-memory file systems. Checks that mapped loads equal normal loads, that lazy verification
// still names corrupt chunks precisely, that a mapped State outlives its reader, that mapping one
// tensor of many reads only that tensor from storage (page-cache residency via mincore), and that
// multi-shard tensors are copied. Ends with a printed, unasserted cold-read measurement.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "format/manifest.h"
#include "io/fault_fs.h"
#include "io/mem_fs.h"
#include "testutil/testutil.h"
#include "util/crc32c.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

using testing::RandomState;
using testing::StatesEqual;
using testing::TempDir;

constexpr char kDataFile[] = "data-00000-00000.spd";

bool Contains(const Status& s, std::string_view needle) {
  return s.message().find(needle) != std::string::npos;
}

bool IsBorrowed(const State& s, std::string_view name) {
  const State::Entry* e = s.Find(name);
  return e != nullptr && std::holds_alternative<TensorView>(e->item);
}

bool IsOwned(const State& s, std::string_view name) {
  const State::Entry* e = s.Find(name);
  return e != nullptr && std::holds_alternative<Tensor>(e->item);
}

format::Manifest ReadManifest(FileSystem* fs, const std::string& dir) {
  std::string path = JoinPath(dir, "MANIFEST");
  Result<std::string> bytes = fs->ReadFile(path, uint64_t{1} << 30);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  Result<format::Manifest> m = format::DecodeManifest(bytes.ok() ? *bytes : "", path);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(m).value() : format::Manifest{};
}

const format::ShardRecord* ShardOf(const format::Manifest& m, std::string_view name) {
  for (const auto& t : m.tensors) {
    if (t.name == name) return &t.shards.at(0);
  }
  return nullptr;
}

// XORs one byte of a real file in place (no truncation, so live mappings stay valid).
void XorFileByte(const std::string& path, uint64_t offset, uint8_t mask) {
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0) << path;
  uint8_t b = 0;
  ASSERT_EQ(::pread(fd, &b, 1, static_cast<off_t>(offset)), 1);
  b ^= mask;
  ASSERT_EQ(::pwrite(fd, &b, 1, static_cast<off_t>(offset)), 1);
  ASSERT_EQ(::fsync(fd), 0);
  ::close(fd);
}

// A FileSystem that forwards everything to a MemFileSystem except MapFile (base default), like a
// third-party file system that cannot map.
class NoMapFileSystem final : public FileSystem {
 public:
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& p,
                                                        const FileOptions& o) override {
    return mem_.NewWritableFile(p, o);
  }
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& p,
                                                                const FileOptions& o) override {
    return mem_.NewRandomAccessFile(p, o);
  }
  Status CreateDir(const std::string& p) override { return mem_.CreateDir(p); }
  Result<std::vector<FileInfo>> ListDir(const std::string& p) override { return mem_.ListDir(p); }
  Result<FileInfo> Stat(const std::string& p) override { return mem_.Stat(p); }
  Status RemoveFile(const std::string& p) override { return mem_.RemoveFile(p); }
  Status RemoveDir(const std::string& p) override { return mem_.RemoveDir(p); }
  Status Rename(const std::string& a, const std::string& b) override { return mem_.Rename(a, b); }
  Status SyncDir(const std::string& p) override { return mem_.SyncDir(p); }

 private:
  MemFileSystem mem_;
};

TEST(Mmap, LoadEqualsReadingLoadPosix) {
  uint64_t seed = testing::TestSeed("Mmap.LoadEqualsReadingLoadPosix");
  TempDir dir;
  State s = RandomState(seed, 20, 6 << 20);
  SP_ASSERT_OK(s.Put("empty", Tensor::Zeros(DType::kF32, {0, 3}).value()));
  SP_ASSERT_OK(s.Put("scalar", Tensor::Zeros(DType::kF64, {}).value()));
  SaveOptions so;
  so.chunk_bytes = 64 << 10;
  SP_ASSERT_OK(Save(s, dir.Sub("ck"), so));
  Result<State> read = Load(dir.Sub("ck"));
  SP_ASSERT_OK(read.status());
  for (bool verify : {true, false}) {
    SCOPED_TRACE(fmt::format("verify_checksums {}", verify));
    LoadOptions lo;
    lo.mmap = true;
    lo.verify_checksums = verify;
    LoadStats stats;
    lo.stats = &stats;
    Result<State> mapped = Load(dir.Sub("ck"), lo);
    SP_ASSERT_OK(mapped.status());
    EXPECT_TRUE(StatesEqual(*read, *mapped));
    EXPECT_TRUE(StatesEqual(s, *mapped));
    EXPECT_EQ(mapped->num_keep_alive(), 1u);  // one data file, one mapping
    EXPECT_EQ(stats.bytes, s.tensor_bytes());
    EXPECT_FALSE(stats.direct_io);
    if (verify) {
      uint64_t chunks = 0;
      for (const auto& [name, e] : s.entries()) {
        if (e.is_tensor()) chunks += format::NumChunks(e.tensor().nbytes(), so.chunk_bytes);
      }
      EXPECT_EQ(stats.chunks, chunks);
    }
    for (const auto& [name, e] : mapped->entries()) {
      if (!e.is_tensor()) continue;
      EXPECT_TRUE(IsBorrowed(*mapped, name)) << name;
      if (e.tensor().nbytes() > 0) {  // extents are 4096-aligned in the file and the mapping
        EXPECT_EQ(reinterpret_cast<uintptr_t>(e.tensor().data()) % 4096, 0u) << name;
      }
    }
  }
  // Selection by name works the same way.
  LoadOptions lo;
  lo.mmap = true;
  lo.names = {"scalar", "step"};
  Result<State> part = Load(dir.Sub("ck"), lo);
  SP_ASSERT_OK(part.status());
  EXPECT_EQ(part->size(), 2u);
  EXPECT_TRUE(IsBorrowed(*part, "scalar"));
}

TEST(Mmap, LoadEqualsReadingLoadMemAndFault) {
  MemFileSystem fs;
  State s = RandomState(11, 8, 1 << 20);
  SP_ASSERT_OK(Save(s, "/ck", {}, {.fs = &fs}));
  LoadOptions lo;
  lo.mmap = true;
  Result<State> mapped = Load("/ck", lo, {.fs = &fs});
  SP_ASSERT_OK(mapped.status());
  EXPECT_TRUE(StatesEqual(s, *mapped));
  EXPECT_EQ(mapped->num_keep_alive(), 1u);
  // The snapshot outlives the file system itself.
  SP_ASSERT_OK(fs.RemoveAll("/ck"));
  EXPECT_TRUE(StatesEqual(s, *mapped));

  MemFileSystem base;
  FaultInjectionFileSystem fault(&base);
  SP_ASSERT_OK(Save(s, "/ck", {}, {.fs = &fault}));
  Result<State> through = Load("/ck", lo, {.fs = &fault});
  SP_ASSERT_OK(through.status());
  EXPECT_TRUE(StatesEqual(s, *through));
  for (const auto& [name, e] : through->entries()) {
    if (e.is_tensor()) {
      EXPECT_TRUE(IsBorrowed(*through, name)) << name;
    }
  }
}

TEST(Mmap, FileSystemWithoutMappingFallsBackToReading) {
  NoMapFileSystem fs;
  const IoOptions io{.fs = &fs};
  State s = RandomState(5, 4, 1 << 18);
  SP_ASSERT_OK(Save(s, "/ck", {}, io));
  LoadOptions lo;
  lo.mmap = true;
  Result<State> back = Load("/ck", lo, io);
  SP_ASSERT_OK(back.status());
  EXPECT_TRUE(StatesEqual(s, *back));
  EXPECT_EQ(back->num_keep_alive(), 0u);
  for (const auto& [name, e] : back->entries()) {
    if (e.is_tensor()) {
      EXPECT_TRUE(IsOwned(*back, name)) << name;
    }
  }
  auto reader = CheckpointReader::Open("/ck", lo, io);
  SP_ASSERT_OK(reader.status());
  Result<TensorView> v = (*reader)->MapTensor((*reader)->tensors()[0].name, true);
  EXPECT_THAT(v, StatusIs(StatusCode::kUnimplemented));
  EXPECT_TRUE(Contains(v.status(), kDataFile)) << v.status().ToString();
}

// A checkpoint with a multi-chunk tensor "model.w" (4 KiB chunks) and a small "model.b".
class MmapCorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Tensor w = Tensor::Empty(DType::kF32, {64, 100}).value();  // 25600 bytes: 7 chunks
    testing::FillPattern(w.view(), 1);
    Tensor b = Tensor::Empty(DType::kBF16, {333}).value();
    testing::FillPattern(b.view(), 2);
    SP_ASSERT_OK(state_.Put("model.w", std::move(w)));
    SP_ASSERT_OK(state_.Put("model.b", std::move(b)));
    SaveOptions so;
    so.chunk_bytes = 4096;
    SP_ASSERT_OK(Save(state_, ck(), so));
    m_ = ReadManifest(DefaultFileSystem(), ck());
  }
  std::string ck() const { return dir_.Sub("ck"); }
  std::string data() const { return JoinPath(ck(), kDataFile); }

  TempDir dir_;
  State state_;
  format::Manifest m_;
};

TEST_F(MmapCorruptionTest, MapTensorVerifiesLazilyAndNamesTheChunk) {
  const format::ShardRecord* w = ShardOf(m_, "model.w");
  ASSERT_NE(w, nullptr);
  const uint64_t at = 5000;  // in chunk 1
  XorFileByte(data(), w->offset + at, 0x10);

  auto reader = CheckpointReader::Open(ck());
  SP_ASSERT_OK(reader.status());
  Result<TensorView> checked = (*reader)->MapTensor("model.w", /*verify=*/true);
  const Status& st = checked.status();
  EXPECT_THAT(st, StatusIs(StatusCode::kCorruption));
  EXPECT_TRUE(Contains(st, ck())) << st.ToString();
  EXPECT_TRUE(Contains(st, "\"model.w\"")) << st.ToString();
  EXPECT_TRUE(Contains(st, "chunk 1 ")) << st.ToString();
  EXPECT_TRUE(Contains(st, fmt::format("offset {}", w->offset + 4096))) << st.ToString();
  EXPECT_TRUE(Contains(st, kDataFile)) << st.ToString();
  EXPECT_TRUE(Contains(st, "CRC32C mismatch")) << st.ToString();
  // Same message as the reading path.
  EXPECT_EQ(st.message(), (*reader)->ReadTensor("model.w").status().message());

  Result<TensorView> raw = (*reader)->MapTensor("model.w", /*verify=*/false);
  SP_ASSERT_OK(raw.status());
  const TensorView* orig = state_.FindTensor("model.w");
  ASSERT_EQ(raw->nbytes(), orig->nbytes());
  EXPECT_EQ(raw->dtype(), DType::kF32);
  EXPECT_EQ(raw->shape(), (Shape{64, 100}));
  for (uint64_t i = 0; i < raw->nbytes(); ++i) {
    std::byte expect = orig->data()[i] ^ (i == at ? std::byte{0x10} : std::byte{0});
    ASSERT_EQ(raw->data()[i], expect) << "byte " << i;
  }
  // Other tensors map and verify fine; unknown names are NotFound.
  Result<TensorView> b = (*reader)->MapTensor("model.b", true);
  SP_ASSERT_OK(b.status());
  EXPECT_EQ(std::memcmp(b->data(), state_.FindTensor("model.b")->data(), b->nbytes()), 0);
  EXPECT_THAT((*reader)->MapTensor("nope", true), StatusIs(StatusCode::kNotFound));

  // Load(mmap): verification catches it; without verification the damaged byte shows.
  LoadOptions lo;
  lo.mmap = true;
  Status load = Load(ck(), lo).status();
  EXPECT_THAT(load, StatusIs(StatusCode::kCorruption));
  EXPECT_TRUE(Contains(load, "model.w")) << load.ToString();
  EXPECT_TRUE(Contains(load, "chunk 1 ")) << load.ToString();
  lo.verify_checksums = false;
  Result<State> unverified = Load(ck(), lo);
  SP_ASSERT_OK(unverified.status());
  EXPECT_EQ(unverified->FindTensor("model.w")->data()[at], orig->data()[at] ^ std::byte{0x10});
}

TEST_F(MmapCorruptionTest, HeaderAndTruncationAreCheckedBeforeMapping) {
  // A damaged data file header is reported on the first MapTensor, even without verify.
  XorFileByte(data(), 0, 0x01);
  auto reader = CheckpointReader::Open(ck());
  SP_ASSERT_OK(reader.status());
  Status st = (*reader)->MapTensor("model.b", false).status();
  EXPECT_THAT(st, StatusIs(StatusCode::kCorruption));
  EXPECT_TRUE(Contains(st, kDataFile)) << st.ToString();
  XorFileByte(data(), 0, 0x01);
  // A truncated data file is never mapped (access past its end would raise SIGBUS).
  ASSERT_EQ(::truncate(data().c_str(), 4096 + 100), 0);
  auto reader2 = CheckpointReader::Open(ck());
  SP_ASSERT_OK(reader2.status());
  st = (*reader2)->MapTensor("model.b", false).status();
  EXPECT_THAT(st, StatusIs(StatusCode::kCorruption));
  EXPECT_TRUE(Contains(st, "truncated")) << st.ToString();
  LoadOptions lo;
  lo.mmap = true;
  lo.verify_checksums = false;
  EXPECT_THAT(Load(ck(), lo), StatusIs(StatusCode::kCorruption));
}

TEST(Mmap, StateOutlivesReaderAndFiles) {
  TempDir dir;
  State s = RandomState(21, 6, 2 << 20);
  SP_ASSERT_OK(Save(s, dir.Sub("ck")));
  State kept;
  {
    LoadOptions lo;
    lo.mmap = true;
    Result<State> mapped = Load(dir.Sub("ck"), lo);  // its reader is gone when Load returns
    SP_ASSERT_OK(mapped.status());
    kept = std::move(mapped).value();
  }
  EXPECT_EQ(kept.num_keep_alive(), 1u);
  // Even the checkpoint's files may go: the mapping holds the data.
  SP_ASSERT_OK(DefaultFileSystem()->RemoveAll(dir.Sub("ck")));
  EXPECT_TRUE(StatesEqual(s, kept));

  // MapTensor views live as long as the reader.
  SP_ASSERT_OK(Save(s, dir.Sub("ck2")));
  auto reader = CheckpointReader::Open(dir.Sub("ck2"));
  SP_ASSERT_OK(reader.status());
  for (const TensorInfo& info : (*reader)->tensors()) {
    Result<TensorView> v = (*reader)->MapTensor(info.name, true);
    SP_ASSERT_OK(v.status());
    const TensorView* orig = s.FindTensor(info.name);
    ASSERT_EQ(v->nbytes(), orig->nbytes());
    EXPECT_EQ(std::memcmp(v->data(), orig->data(), v->nbytes()), 0) << info.name;
    // Mapping twice gives the same memory (one mapping per data file).
    EXPECT_EQ((*reader)->MapTensor(info.name, false)->data(), v->data());
  }
}

TEST(Mmap, CopyOnWriteViewsAreWritableAndPrivate) {
  TempDir dir;
  State s = RandomState(31, 4, 1 << 20);
  SP_ASSERT_OK(Save(s, dir.Sub("ck")));
  LoadOptions lo;
  lo.mmap = true;
  lo.map_mode = MapMode::kCopyOnWrite;
  Result<State> mapped = Load(dir.Sub("ck"), lo);
  SP_ASSERT_OK(mapped.status());
  ASSERT_TRUE(StatesEqual(s, *mapped));
  for (const auto& [name, e] : mapped->entries()) {
    if (!e.is_tensor() || e.tensor().nbytes() == 0) continue;
    ASSERT_TRUE(std::holds_alternative<TensorView>(e.item)) << name << " was not mapped";
    std::memset(e.tensor().data(), 0x7f, e.tensor().nbytes());  // would crash if read-only
  }
  // The writes stayed in this mapping: the files, a fresh mapping and a verify see the saved bytes.
  lo.map_mode = MapMode::kReadOnly;
  Result<State> again = Load(dir.Sub("ck"), lo);
  SP_ASSERT_OK(again.status());
  EXPECT_TRUE(StatesEqual(s, *again));
  SP_EXPECT_OK(VerifyCheckpoint(dir.Sub("ck")));

  // Copy-on-write asks for a mapping: without mmap it is refused, not ignored.
  LoadOptions bad;
  bad.map_mode = MapMode::kCopyOnWrite;
  Result<State> refused = Load(dir.Sub("ck"), bad);
  EXPECT_THAT(refused, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_TRUE(Contains(refused.status(), "map_mode")) << refused.status().ToString();
}

TEST(Mmap, ConcurrentMapTensorMapsEachFileOnce) {
  TempDir dir;
  State s = RandomState(8, 16, 4 << 20);
  SP_ASSERT_OK(Save(s, dir.Sub("ck")));
  auto reader = CheckpointReader::Open(dir.Sub("ck"));
  SP_ASSERT_OK(reader.status());
  const std::vector<TensorInfo>& infos = (*reader)->tensors();
  std::vector<const std::byte*> first(infos.size());
  std::vector<Status> errors(8);
  std::vector<std::thread> threads;
  for (int w = 0; w < 8; ++w) {
    threads.emplace_back([&, w] {
      for (size_t i = 0; i < infos.size(); ++i) {
        Result<TensorView> v = (*reader)->MapTensor(infos[i].name, /*verify=*/w % 2 == 0);
        if (!v.ok()) {
          errors[w] = v.status();
          return;
        }
        if (w == 0) first[i] = v->data();
        if (std::memcmp(v->data(), s.FindTensor(infos[i].name)->data(), v->nbytes()) != 0) {
          errors[w] = InternalError("bytes of " + infos[i].name);
          return;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const Status& st : errors) SP_EXPECT_OK(st);
  for (size_t i = 0; i < infos.size(); ++i) {
    EXPECT_EQ((*reader)->MapTensor(infos[i].name, false)->data(), first[i]) << infos[i].name;
  }
}

TEST(Mmap, MultiShardTensorsAreCopied) {
  TempDir dir;
  State s;
  Tensor w = Tensor::Empty(DType::kF32, {4, 1024}).value();  // 16 KiB: two 8 KiB row blocks
  testing::FillPattern(w.view(), 3);
  Tensor v = Tensor::Empty(DType::kI16, {1000}).value();
  testing::FillPattern(v.view(), 4);
  SP_ASSERT_OK(s.Put("w", std::move(w)));
  SP_ASSERT_OK(s.Put("v", std::move(v)));
  SaveOptions so;
  so.chunk_bytes = 4096;
  SP_ASSERT_OK(Save(s, dir.Sub("ck"), so));
  // Rewrite the manifest so that "w" is stored as two boxes (rows 0-1 and rows 2-3), which lie
  // back to back in the original extent (each 8192 bytes, so both stay 4096-aligned).
  FileSystem* fs = DefaultFileSystem();
  format::Manifest m = ReadManifest(fs, dir.Sub("ck"));
  for (auto& t : m.tensors) {
    if (t.name != "w") continue;
    format::ShardRecord whole = t.shards.at(0);
    t.shards.clear();
    for (int64_t half = 0; half < 2; ++half) {
      format::ShardRecord sh{{2 * half, 0}, {2, 1024}, 0, whole.offset + 8192 * half, 8192, {}};
      const std::byte* src = s.FindTensor("w")->data() + 8192 * half;
      for (uint64_t c = 0; c < 2; ++c) sh.crc32c.push_back(Crc32c({src + 4096 * c, 4096}));
      t.shards.push_back(std::move(sh));
    }
  }
  SP_ASSERT_OK(fs->RemoveFile(JoinPath(dir.Sub("ck"), "MANIFEST")));
  SP_ASSERT_OK(fs->WriteFileSynced(JoinPath(dir.Sub("ck"), "MANIFEST"), format::EncodeManifest(m)));

  LoadOptions lo;
  lo.mmap = true;
  LoadStats stats;
  lo.stats = &stats;
  Result<State> back = Load(dir.Sub("ck"), lo);
  SP_ASSERT_OK(back.status());
  EXPECT_TRUE(StatesEqual(s, *back));
  EXPECT_TRUE(IsOwned(*back, "w"));
  EXPECT_TRUE(IsBorrowed(*back, "v"));
  EXPECT_EQ(stats.chunks, 4u + 1u);
  EXPECT_EQ(stats.bytes, s.tensor_bytes());

  auto reader = CheckpointReader::Open(dir.Sub("ck"));
  SP_ASSERT_OK(reader.status());
  EXPECT_EQ((*reader)->FindTensor("w")->num_shards, 2u);
  Status st = (*reader)->MapTensor("w", false).status();
  EXPECT_THAT(st, StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_TRUE(Contains(st, "\"w\"")) << st.ToString();
  SP_EXPECT_OK((*reader)->MapTensor("v", true).status());
}

// --- Page-cache residency: mapping one tensor reads only that tensor. ---

// Drops a file's clean pages from the page cache.
bool DropCache(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ::fdatasync(fd);
  bool ok = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0;
  ::close(fd);
  return ok;
}

// Resident-page bitmap of a file, through the test's own (never touched) mapping of it.
class Residency {
 public:
  explicit Residency(const std::string& path) {
    Result<std::shared_ptr<const MappedFile>> m =
        DefaultFileSystem()->MapFile(path, MapMode::kReadOnly);
    if (m.ok()) map_ = *m;
  }
  bool ok() const { return map_ != nullptr; }
  // Resident pages of the file in [begin, end).
  uint64_t Pages(uint64_t begin, uint64_t end) const {
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    begin = begin / page * page;
    end = std::min<uint64_t>(end, map_->data().size());
    if (end <= begin) return 0;
    std::vector<unsigned char> vec((end - begin + page - 1) / page);
    void* addr = const_cast<std::byte*>(map_->data().data() + begin);
    if (::mincore(addr, end - begin, vec.data()) != 0) return UINT64_MAX;
    uint64_t n = 0;
    for (unsigned char c : vec) n += c & 1;
    return n;
  }

 private:
  std::shared_ptr<const MappedFile> map_;
};

// The file system's read-ahead size in bytes (so the test can allow for it), 8 MiB if unknown.
uint64_t ReadAheadBytes(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return 8 << 20;
  std::ifstream f(
      fmt::format("/sys/class/bdi/{}:{}/read_ahead_kb", major(st.st_dev), minor(st.st_dev)));
  uint64_t kb = 0;
  if (f >> kb && kb > 0) return kb << 10;
  return 8 << 20;
}

TEST(Mmap, MappingOneTensorReadsOnlyThatTensor) {
  constexpr int kTensors = 64;
  constexpr int64_t kFloats = 512 << 10;  // 2 MiB per tensor, 128 MiB in all
  constexpr int kTarget = 32;
  TempDir dir;
  State s;
  for (int i = 0; i < kTensors; ++i) {
    Tensor t = Tensor::Empty(DType::kF32, {kFloats}).value();
    testing::FillPattern(t.view(), i);
    SP_ASSERT_OK(s.Put(fmt::format("t{:02}", i), std::move(t)));
  }
  SP_ASSERT_OK(Save(s, dir.Sub("ck")));
  const std::string data = JoinPath(dir.Sub("ck"), kDataFile);
  format::Manifest m = ReadManifest(DefaultFileSystem(), dir.Sub("ck"));
  ASSERT_TRUE(DropCache(data));
  Residency res(data);
  ASSERT_TRUE(res.ok());
  const uint64_t file_size = m.files.at(0).bytes;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  // Needs a disk file system (not tmpfs): set TMPDIR to one if this fails.
  ASSERT_LE(res.Pages(0, file_size), file_size / page / 100)
      << "posix_fadvise(DONTNEED) did not drop this file system's cache (tmpfs? set TMPDIR to a "
         "directory on disk): "
      << res.Pages(0, file_size) << " of " << file_size / page << " pages resident";
  const format::ShardRecord* target = ShardOf(m, fmt::format("t{:02}", kTarget));
  ASSERT_NE(target, nullptr);
  // Bytes the kernel may legitimately read around a fault (read-around/readahead), both ways.
  const uint64_t margin = 2 * ReadAheadBytes(data);
  auto far_pages = [&] {
    uint64_t n = 0;
    for (const auto& t : m.tensors) {
      const format::ShardRecord& sh = t.shards.at(0);
      if (sh.offset + sh.bytes + margin > target->offset &&
          sh.offset < target->offset + target->bytes + margin) {
        continue;  // near the target
      }
      if (sh.offset < margin) continue;  // near the header, read at open
      n += res.Pages(sh.offset, sh.offset + sh.bytes);
    }
    return n;
  };

  auto reader = CheckpointReader::Open(dir.Sub("ck"));
  SP_ASSERT_OK(reader.status());
  Result<TensorView> v = (*reader)->MapTensor(fmt::format("t{:02}", kTarget), /*verify=*/false);
  SP_ASSERT_OK(v.status());
  // Unverified: nothing of the tensor has been read yet.
  EXPECT_EQ(res.Pages(target->offset, target->offset + target->bytes), 0u);
  // Verified: every page of the target is read, and nothing far from it.
  SP_ASSERT_OK((*reader)->MapTensor(fmt::format("t{:02}", kTarget), /*verify=*/true).status());
  EXPECT_EQ(res.Pages(target->offset, target->offset + target->bytes), target->bytes / page);
  EXPECT_EQ(far_pages(), 0u) << "margin " << margin;
  std::cout << fmt::format(
                   "[residency] after MapTensor(verify) of 1 of {} tensors: {} of {} pages of the "
                   "data file resident (read-around margin {} KiB)",
                   kTensors, res.Pages(0, file_size), file_size / page, margin >> 10)
            << std::endl;

  // Load(mmap) of one tensor by name behaves the same.
  reader->reset();
  ASSERT_TRUE(DropCache(data));
  LoadOptions lo;
  lo.mmap = true;
  lo.names = {fmt::format("t{:02}", kTarget)};
  Result<State> one = Load(dir.Sub("ck"), lo);
  SP_ASSERT_OK(one.status());
  EXPECT_EQ(far_pages(), 0u);
  EXPECT_EQ(std::memcmp(one->FindTensor(lo.names[0])->data(), s.FindTensor(lo.names[0])->data(),
                        target->bytes),
            0);
}

// --- A printed measurement (not asserted). ---

TEST(MmapBenchmark, ColdOpenMapAndSumOne16MiBTensorOf1GiB) {
  constexpr int kTensors = 64;
  constexpr int64_t kFloats = 4 << 20;  // 16 MiB per tensor, 1 GiB in all
  TempDir dir;
  {
    State s;
    for (int i = 0; i < kTensors; ++i) {
      Tensor t = Tensor::Empty(DType::kF32, {kFloats}).value();
      float* f = reinterpret_cast<float*>(t.data());
      for (int64_t j = 0; j < kFloats; ++j) f[j] = static_cast<float>((j + i) % 7);
      SP_ASSERT_OK(s.Put(fmt::format("layer{:02}.weight", i), std::move(t)));
    }
    SP_ASSERT_OK(Save(s, dir.Sub("ck")));
  }
  const std::string data = JoinPath(dir.Sub("ck"), kDataFile);
  const std::string name = "layer41.weight";
  double expected = 0;
  for (int64_t j = 0; j < kFloats; ++j) expected += static_cast<float>((j + 41) % 7);

  auto sum = [](const TensorView& v) {
    const float* f = reinterpret_cast<const float*>(v.data());
    double total = 0;
    for (uint64_t j = 0; j < v.nbytes() / sizeof(float); ++j) total += f[j];
    return total;
  };
  using Clock = std::chrono::steady_clock;
  auto ms = [](Clock::time_point a) {
    return std::chrono::duration<double, std::milli>(Clock::now() - a).count();
  };
  for (bool verify : {false, true}) {
    ASSERT_TRUE(DropCache(data));
    Clock::time_point start = Clock::now();
    auto reader = CheckpointReader::Open(dir.Sub("ck"));
    SP_ASSERT_OK(reader.status());
    Result<TensorView> v = (*reader)->MapTensor(name, verify);
    SP_ASSERT_OK(v.status());
    double total = sum(*v);
    double elapsed = ms(start);
    EXPECT_EQ(total, expected);
    std::cout << fmt::format(
                     "[mmap timing] cold open + MapTensor(verify={}) + sum of one 16 MiB tensor "
                     "of a 1 GiB checkpoint: {:.2f} ms",
                     verify, elapsed)
              << std::endl;
  }
  {
    ASSERT_TRUE(DropCache(data));
    Clock::time_point start = Clock::now();
    auto reader = CheckpointReader::Open(dir.Sub("ck"));
    SP_ASSERT_OK(reader.status());
    Result<Tensor> t = (*reader)->ReadTensor(name);
    SP_ASSERT_OK(t.status());
    double total = sum(t->view());
    double elapsed = ms(start);
    EXPECT_EQ(total, expected);
    std::cout << fmt::format(
                     "[mmap timing] for comparison, cold open + ReadTensor (O_DIRECT, verified) + "
                     "sum of the same tensor: {:.2f} ms",
                     elapsed)
              << std::endl;
  }
  {
    ASSERT_TRUE(DropCache(data));
    Clock::time_point start = Clock::now();
    LoadOptions lo;
    lo.mmap = true;
    lo.verify_checksums = false;
    Result<State> all = Load(dir.Sub("ck"), lo);
    SP_ASSERT_OK(all.status());
    double open_ms = ms(start);
    double total = sum(*all->FindTensor(name));
    EXPECT_EQ(total, expected);
    std::cout << fmt::format(
                     "[mmap timing] cold Load(mmap, no verify) of all 64 tensors: {:.2f} ms; "
                     "+ summing one: {:.2f} ms",
                     open_ms, ms(start))
              << std::endl;
  }
}

}  // namespace
}  // namespace savepoint
