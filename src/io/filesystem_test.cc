// Conformance tests for the FileSystem interface, run against every implementation:
// DefaultFileSystem() in a fresh temporary directory, MemFileSystem, and a fault-free
// FaultInjectionFileSystem over MemFileSystem. Plus POSIX-only direct I/O and mmap checks,
// MemFileSystem's MapFile snapshot, the base class's MapFile default, and the path helpers.
#include "savepoint/filesystem.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "io/fault_fs.h"
#include "io/mem_fs.h"
#include "savepoint/tensor.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

enum class Kind { kPosix, kMem, kFaultOverMem };

std::string KindName(const ::testing::TestParamInfo<Kind>& info) {
  switch (info.param) {
    case Kind::kPosix:
      return "Posix";
    case Kind::kMem:
      return "Mem";
    case Kind::kFaultOverMem:
      return "FaultOverMem";
  }
  return "Unknown";
}

// A fresh directory under $TMPDIR (or /tmp) on the real file system.
std::string MakeTempDir() {
  const char* tmpdir = std::getenv("TMPDIR");
  std::string pattern =
      JoinPath(tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp", "savepoint_fs_test_XXXXXX");
  if (::mkdtemp(pattern.data()) == nullptr) return "";
  return pattern;
}

std::vector<std::byte> Pattern(size_t size, uint8_t seed) {
  std::vector<std::byte> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<std::byte>((i * 131 + seed) & 0xff);
  return bytes;
}

std::span<const std::byte> AsBytes(std::string_view s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

class FileSystemTest : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    switch (GetParam()) {
      case Kind::kPosix:
        fs_ = DefaultFileSystem();
        root_ = MakeTempDir();
        ASSERT_FALSE(root_.empty()) << "mkdtemp failed";
        break;
      case Kind::kMem:
        fs_ = &mem_;
        root_ = "/test";
        ASSERT_TRUE(fs_->CreateDir(root_).ok());
        break;
      case Kind::kFaultOverMem:
        fault_ = std::make_unique<FaultInjectionFileSystem>(&mem_);
        fs_ = fault_.get();
        root_ = "/test";
        ASSERT_TRUE(fs_->CreateDir(root_).ok());
        break;
    }
  }

  void TearDown() override {
    if (GetParam() == Kind::kPosix && !root_.empty()) {
      EXPECT_TRUE(fs_->RemoveAll(root_).ok());
      EXPECT_FALSE(fs_->Exists(root_));
    }
  }

  std::string Path(std::string_view name) const { return JoinPath(root_, name); }

  void WriteWhole(const std::string& path, std::span<const std::byte> data) {
    auto file = fs_->NewWritableFile(path, FileOptions{});
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    ASSERT_TRUE((*file)->WriteAt(0, data).ok());
    ASSERT_TRUE((*file)->Sync().ok());
    ASSERT_TRUE((*file)->Close().ok());
  }

  std::vector<std::byte> ReadWhole(const std::string& path) {
    auto file = fs_->NewRandomAccessFile(path, FileOptions{});
    EXPECT_TRUE(file.ok()) << file.status().ToString();
    if (!file.ok()) return {};
    std::vector<std::byte> data((*file)->size());
    EXPECT_TRUE((*file)->ReadAt(0, data).ok());
    return data;
  }

  MemFileSystem mem_;
  std::unique_ptr<FaultInjectionFileSystem> fault_;
  FileSystem* fs_ = nullptr;
  std::string root_;
};

TEST_P(FileSystemTest, WriteReadRoundTrip) {
  const std::string path = Path("data-00000.spd");
  const std::vector<std::byte> data = Pattern(100000, 7);
  auto file = fs_->NewWritableFile(path, FileOptions{});
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ((*file)->path(), path);
  // Out of order, leaving no gaps.
  ASSERT_TRUE((*file)->WriteAt(50000, std::span(data).subspan(50000)).ok());
  ASSERT_TRUE((*file)->WriteAt(0, std::span(data).first(50000)).ok());
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->Close().ok());
  EXPECT_THAT((*file)->WriteAt(0, data), StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT((*file)->Close(), StatusIs(StatusCode::kFailedPrecondition));

  auto reader = fs_->NewRandomAccessFile(path, FileOptions{});
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ((*reader)->size(), data.size());
  EXPECT_FALSE((*reader)->direct());
  std::vector<std::byte> middle(1000);
  ASSERT_TRUE((*reader)->ReadAt(49500, middle).ok());
  EXPECT_TRUE(std::equal(middle.begin(), middle.end(), data.begin() + 49500));
  EXPECT_EQ(ReadWhole(path), data);
  EXPECT_TRUE((*reader)->ReadAt(data.size(), std::span<std::byte>()).ok());
}

TEST_P(FileSystemTest, NewWritableFileTruncates) {
  const std::string path = Path("f");
  WriteWhole(path, Pattern(5000, 1));
  WriteWhole(path, Pattern(10, 2));
  EXPECT_EQ(ReadWhole(path), Pattern(10, 2));
}

// truncate = false: an existing file is written in place, alongside another handle (the tail of a
// file whose blocks an O_DIRECT handle writes, interop/byte_layout.cc).
TEST_P(FileSystemTest, NewWritableFileWithoutTruncateWritesInPlace) {
  const std::string path = Path("f");
  const std::vector<std::byte> data = Pattern(3 * 4096 + 100, 3);
  auto blocks = fs_->NewWritableFile(path, FileOptions{.direct_io = true});
  ASSERT_TRUE(blocks.ok()) << blocks.status().ToString();
  auto tail = fs_->NewWritableFile(path, FileOptions{.direct_io = false, .truncate = false});
  ASSERT_TRUE(tail.ok()) << tail.status().ToString();
  Tensor aligned = Tensor::Empty(DType::kU8, {3 * 4096}).value();  // O_DIRECT needs alignment
  std::memcpy(aligned.data(), data.data(), 3 * 4096);
  ASSERT_TRUE((*tail)->WriteAt(3 * 4096, std::span(data).subspan(3 * 4096)).ok());
  ASSERT_TRUE((*blocks)->WriteAt(0, {aligned.data(), 3 * 4096}).ok());
  for (auto* f : {&*tail, &*blocks}) {
    ASSERT_TRUE((*f)->Sync().ok());
    ASSERT_TRUE((*f)->Close().ok());
  }
  EXPECT_EQ(ReadWhole(path), data);
}

TEST_P(FileSystemTest, ConcurrentWritesToDisjointRanges) {
  constexpr size_t kThreads = 4;
  constexpr size_t kPerThread = 256 * 1024;
  constexpr size_t kChunk = 16 * 1024;
  const std::vector<std::byte> data = Pattern(kThreads * kPerThread, 3);
  auto file = fs_->NewWritableFile(Path("concurrent"), FileOptions{});
  ASSERT_TRUE(file.ok());
  WritableFile* writer = file->get();
  std::vector<std::thread> threads;
  std::vector<Status> results(kThreads);
  for (size_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Interleave: thread t writes chunks t, t + 4, t + 8, ...
      for (size_t off = t * kChunk; off < data.size(); off += kThreads * kChunk) {
        Status s = writer->WriteAt(off, std::span(data).subspan(off, kChunk));
        if (!s.ok()) results[t] = s;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const Status& s : results) EXPECT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(writer->Sync().ok());
  ASSERT_TRUE(writer->Close().ok());
  EXPECT_EQ(ReadWhole(Path("concurrent")), data);
}

// Batched transfers: every implementation (the defaults for Mem and FaultOverMem, io_uring or
// pwrite for Posix) writes and reads a shuffled batch exactly, and a batch reaching past end of
// file fails with OutOfRange.
TEST_P(FileSystemTest, BatchedWritesAndReads) {
  const std::string path = Path("batch");
  const std::vector<std::byte> data = Pattern(10 * 1000, 5);
  std::vector<WriteOp> writes;
  for (size_t i : {3, 7, 0, 9, 1, 5, 2, 8, 6, 4}) {
    writes.push_back({i * 1000, std::span(data).subspan(i * 1000, 1000)});
  }
  auto file = fs_->NewWritableFile(path, FileOptions{});
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  ASSERT_TRUE((*file)->WriteAtMany(writes).ok());
  ASSERT_TRUE((*file)->Close().ok());
  EXPECT_THAT((*file)->WriteAtMany(writes), StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_EQ(ReadWhole(path), data);

  auto reader = fs_->NewRandomAccessFile(path, FileOptions{});
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  std::vector<std::byte> got(data.size());
  std::vector<ReadOp> reads;
  for (const WriteOp& w : writes) {
    reads.push_back({w.offset, std::span(got).subspan(w.offset, w.data.size())});
  }
  ASSERT_TRUE((*reader)->ReadAtMany(reads).ok());
  EXPECT_EQ(got, data);
  reads.push_back({9500, std::span(got).first(1000)});
  EXPECT_THAT((*reader)->ReadAtMany(reads), StatusIs(StatusCode::kOutOfRange));
}

TEST_P(FileSystemTest, ReadPastEndIsOutOfRange) {
  const std::string path = Path("short");
  WriteWhole(path, Pattern(100, 4));
  auto reader = fs_->NewRandomAccessFile(path, FileOptions{});
  ASSERT_TRUE(reader.ok());
  std::vector<std::byte> dst(50);
  Status s = (*reader)->ReadAt(60, dst);
  EXPECT_THAT(s, StatusIs(StatusCode::kOutOfRange, path));
  EXPECT_NE(s.message().find("offset 60"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("50 bytes"), std::string::npos) << s.message();
  EXPECT_THAT((*reader)->ReadAt(1000, dst), StatusIs(StatusCode::kOutOfRange));
  EXPECT_TRUE((*reader)->ReadAt(50, dst).ok());
}

TEST_P(FileSystemTest, RenameMovesFilesAndDirs) {
  WriteWhole(Path("a"), Pattern(10, 5));
  ASSERT_TRUE(fs_->Rename(Path("a"), Path("b")).ok());
  EXPECT_FALSE(fs_->Exists(Path("a")));
  EXPECT_EQ(ReadWhole(Path("b")), Pattern(10, 5));

  ASSERT_TRUE(fs_->CreateDirs(Path("d1/sub")).ok());
  WriteWhole(Path("d1/sub/x"), Pattern(3, 6));
  ASSERT_TRUE(fs_->CreateDir(Path("d2")).ok());
  ASSERT_TRUE(fs_->Rename(Path("d1/sub"), Path("d2/moved")).ok());
  EXPECT_EQ(ReadWhole(Path("d2/moved/x")), Pattern(3, 6));
  EXPECT_FALSE(fs_->Exists(Path("d1/sub")));
  ASSERT_TRUE(fs_->SyncDir(Path("d1")).ok());
  ASSERT_TRUE(fs_->SyncDir(Path("d2")).ok());
}

TEST_P(FileSystemTest, RenameNeverReplaces) {
  WriteWhole(Path("src"), Pattern(10, 1));
  WriteWhole(Path("dst"), Pattern(20, 2));
  Status s = fs_->Rename(Path("src"), Path("dst"));
  EXPECT_THAT(s, StatusIs(StatusCode::kAlreadyExists));
  EXPECT_NE(s.message().find(Path("dst")), std::string::npos) << s.message();
  EXPECT_EQ(ReadWhole(Path("src")), Pattern(10, 1));
  EXPECT_EQ(ReadWhole(Path("dst")), Pattern(20, 2));

  ASSERT_TRUE(fs_->CreateDir(Path("dir1")).ok());
  ASSERT_TRUE(fs_->CreateDir(Path("dir2")).ok());  // empty: rename(2) would replace it
  EXPECT_THAT(fs_->Rename(Path("dir1"), Path("dir2")), StatusIs(StatusCode::kAlreadyExists));
  EXPECT_THAT(fs_->Rename(Path("src"), Path("dir2")), StatusIs(StatusCode::kAlreadyExists));
  EXPECT_THAT(fs_->Rename(Path("dir1"), Path("dst")), StatusIs(StatusCode::kAlreadyExists));
  EXPECT_TRUE(fs_->Exists(Path("dir1")));
  EXPECT_TRUE(fs_->Exists(Path("src")));
}

TEST_P(FileSystemTest, ListDirAndStat) {
  ASSERT_TRUE(fs_->CreateDir(Path("dir")).ok());
  WriteWhole(Path("dir/one"), Pattern(1, 0));
  WriteWhole(Path("dir/two"), Pattern(2222, 0));
  ASSERT_TRUE(fs_->CreateDir(Path("dir/sub")).ok());
  auto entries = fs_->ListDir(Path("dir"));
  ASSERT_TRUE(entries.ok()) << entries.status().ToString();
  std::sort(entries->begin(), entries->end(),
            [](const FileInfo& a, const FileInfo& b) { return a.name < b.name; });
  ASSERT_EQ(entries->size(), 3u);
  EXPECT_EQ((*entries)[0].name, "one");
  EXPECT_FALSE((*entries)[0].is_dir);
  EXPECT_EQ((*entries)[0].size, 1u);
  EXPECT_EQ((*entries)[1].name, "sub");
  EXPECT_TRUE((*entries)[1].is_dir);
  EXPECT_EQ((*entries)[2].name, "two");
  EXPECT_EQ((*entries)[2].size, 2222u);
  for (const FileInfo& e : *entries) EXPECT_GT(e.mtime_ns, 0) << e.name;

  auto info = fs_->Stat(Path("dir/two"));
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->name, "two");
  EXPECT_FALSE(info->is_dir);
  EXPECT_EQ(info->size, 2222u);
  EXPECT_GT(info->mtime_ns, 0);
  info = fs_->Stat(Path("dir"));
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->is_dir);
  EXPECT_EQ(info->name, "dir");

  auto empty = fs_->ListDir(Path("dir/sub"));
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST_P(FileSystemTest, CreateDirsAndRemoveAll) {
  ASSERT_TRUE(fs_->CreateDirs(Path("a/b/c")).ok());
  ASSERT_TRUE(fs_->CreateDirs(Path("a/b/c")).ok());  // idempotent
  ASSERT_TRUE(fs_->CreateDirs(Path("a//b/d/")).ok());
  WriteWhole(Path("a/b/c/f"), Pattern(10, 0));
  WriteWhole(Path("a/g"), Pattern(10, 0));
  EXPECT_FALSE(fs_->CreateDirs(Path("a/g")).ok());  // a file is in the way
  EXPECT_FALSE(fs_->CreateDirs(Path("a/g/h")).ok());

  EXPECT_THAT(fs_->CreateDir(Path("a")), StatusIs(StatusCode::kAlreadyExists));
  EXPECT_THAT(fs_->RemoveDir(Path("a")), StatusIs(StatusCode::kAlreadyExists));  // ENOTEMPTY

  ASSERT_TRUE(fs_->RemoveAll(Path("a/g")).ok());
  EXPECT_FALSE(fs_->Exists(Path("a/g")));
  ASSERT_TRUE(fs_->RemoveAll(Path("a")).ok());
  EXPECT_FALSE(fs_->Exists(Path("a")));
  EXPECT_TRUE(fs_->RemoveAll(Path("a")).ok());  // absent is fine
  EXPECT_TRUE(fs_->Exists(root_));

  ASSERT_TRUE(fs_->CreateDir(Path("empty")).ok());
  EXPECT_TRUE(fs_->RemoveDir(Path("empty")).ok());
  WriteWhole(Path("file"), Pattern(1, 0));
  EXPECT_TRUE(fs_->RemoveFile(Path("file")).ok());
  EXPECT_FALSE(fs_->Exists(Path("file")));
}

TEST_P(FileSystemTest, NotFoundErrors) {
  const std::string missing = Path("missing");
  auto expect_not_found = [&](const Status& s, const std::string& what) {
    EXPECT_THAT(s, StatusIs(StatusCode::kNotFound, missing)) << what << ": " << s.ToString();
  };
  expect_not_found(fs_->NewRandomAccessFile(missing, FileOptions{}).status(), "open");
  expect_not_found(fs_->NewWritableFile(missing + "/f", FileOptions{}).status(), "create");
  expect_not_found(fs_->Stat(missing).status(), "stat");
  expect_not_found(fs_->ListDir(missing).status(), "list");
  expect_not_found(fs_->RemoveFile(missing), "remove file");
  expect_not_found(fs_->RemoveDir(missing), "remove dir");
  expect_not_found(fs_->CreateDir(missing + "/sub"), "create dir");
  expect_not_found(fs_->Rename(missing, Path("other")), "rename");
  expect_not_found(fs_->SyncDir(missing), "sync dir");
  expect_not_found(fs_->ReadFile(missing, 100).status(), "read file");
  EXPECT_FALSE(fs_->Exists(missing));
}

TEST_P(FileSystemTest, ReadFileAndWriteFileSynced) {
  const std::string path = Path("manifest.json");
  const std::string contents(100, 'x');
  ASSERT_TRUE(fs_->WriteFileSynced(path, contents).ok());
  auto read = fs_->ReadFile(path, 100);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, contents);
  Result<std::string> capped = fs_->ReadFile(path, 99);
  EXPECT_THAT(capped, StatusIs(StatusCode::kResourceExhausted, path));
  ASSERT_TRUE(fs_->WriteFileSynced(path, "").ok());
  read = fs_->ReadFile(path, 0);
  ASSERT_TRUE(read.ok());
  EXPECT_TRUE(read->empty());
}

TEST_P(FileSystemTest, SyncDirAndWrongTypes) {
  ASSERT_TRUE(fs_->SyncDir(root_).ok());
  WriteWhole(Path("f"), AsBytes("hello"));
  EXPECT_FALSE(fs_->SyncDir(Path("f")).ok());
  EXPECT_FALSE(fs_->ListDir(Path("f")).ok());
  EXPECT_FALSE(fs_->RemoveDir(Path("f")).ok());
  EXPECT_FALSE(fs_->RemoveFile(root_).ok());
  EXPECT_FALSE(fs_->NewRandomAccessFile(root_, FileOptions{}).ok());
  EXPECT_FALSE(fs_->NewWritableFile(root_, FileOptions{}).ok());
  EXPECT_TRUE(fs_->Exists(Path("f")));
}

TEST_P(FileSystemTest, MapFileReadsWholeFile) {
  const std::string path = Path("mapped.spd");
  const std::vector<std::byte> data = Pattern(3 * 4096 + 123, 5);  // not a multiple of pages
  WriteWhole(path, data);
  Result<std::shared_ptr<const MappedFile>> map = fs_->MapFile(path, MapMode::kReadOnly);
  ASSERT_TRUE(map.ok()) << map.status().ToString();
  ASSERT_NE(*map, nullptr);
  EXPECT_EQ((*map)->path(), path);
  std::span<const std::byte> bytes = (*map)->data();
  ASSERT_EQ(bytes.size(), data.size());
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), data.begin()));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(bytes.data()) % 4096, 0u) << "not page aligned";
  // Two mappings of one file are independent objects with the same bytes.
  Result<std::shared_ptr<const MappedFile>> again = fs_->MapFile(path, MapMode::kReadOnly);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), (*again)->data().begin()));
  // The mapping outlives the file's name.
  ASSERT_TRUE(fs_->RemoveFile(path).ok());
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), data.begin()));
}

TEST_P(FileSystemTest, MapFileOfEmptyFile) {
  const std::string path = Path("empty");
  WriteWhole(path, {});
  Result<std::shared_ptr<const MappedFile>> map = fs_->MapFile(path, MapMode::kReadOnly);
  ASSERT_TRUE(map.ok()) << map.status().ToString();
  EXPECT_TRUE((*map)->data().empty());
  EXPECT_EQ((*map)->path(), path);
}

TEST_P(FileSystemTest, MapFileErrors) {
  Result<std::shared_ptr<const MappedFile>> missing =
      fs_->MapFile(Path("nope"), MapMode::kReadOnly);
  EXPECT_THAT(missing, StatusIs(StatusCode::kNotFound));
  EXPECT_NE(missing.status().message().find(Path("nope")), std::string::npos)
      << missing.status().ToString();
  ASSERT_TRUE(fs_->CreateDir(Path("dir")).ok());
  EXPECT_FALSE(fs_->MapFile(Path("dir"), MapMode::kReadOnly).ok());
}

INSTANTIATE_TEST_SUITE_P(AllFileSystems, FileSystemTest,
                         ::testing::Values(Kind::kPosix, Kind::kMem, Kind::kFaultOverMem),
                         KindName);

// --- POSIX only: direct I/O. ---

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

TEST(PosixFileSystemTest, DirectIOAlignmentOrFallback) {
  FileSystem* fs = DefaultFileSystem();
  const std::string root = MakeTempDir();
  ASSERT_FALSE(root.empty());
  const std::string path = JoinPath(root, "direct.spd");
  constexpr size_t kSize = 4 * kDirectIOAlignment;
  std::unique_ptr<std::byte, FreeDeleter> buffer(
      static_cast<std::byte*>(std::aligned_alloc(kDirectIOAlignment, kSize)));
  ASSERT_NE(buffer, nullptr);
  std::span<std::byte> aligned(buffer.get(), kSize);
  const std::vector<std::byte> data = Pattern(kSize, 9);
  std::copy(data.begin(), data.end(), aligned.begin());

  auto file = fs->NewWritableFile(path, FileOptions{.direct_io = true});
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  if ((*file)->direct()) {
    EXPECT_THAT((*file)->WriteAt(1, aligned), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT((*file)->WriteAt(0, aligned.first(100)), StatusIs(StatusCode::kInvalidArgument));
    Status s = (*file)->WriteAt(0, aligned.subspan(1, kDirectIOAlignment));
    EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, path));
    ASSERT_TRUE((*file)->WriteAt(0, aligned).ok());
  } else {
    // The file system (e.g. tmpfs) refused O_DIRECT: buffered fallback, no alignment rules.
    ASSERT_TRUE((*file)->WriteAt(0, aligned.first(1)).ok());
    ASSERT_TRUE((*file)->WriteAt(1, aligned.subspan(1)).ok());
  }
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->Close().ok());

  auto reader = fs->NewRandomAccessFile(path, FileOptions{.direct_io = true});
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->size(), kSize);
  std::fill(aligned.begin(), aligned.end(), std::byte{0});
  ASSERT_TRUE((*reader)->ReadAt(0, aligned).ok());
  EXPECT_TRUE(std::equal(data.begin(), data.end(), aligned.begin()));
  if ((*reader)->direct()) {
    EXPECT_EQ((*reader)->ReadAt(3, aligned.first(kDirectIOAlignment)).code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ((*reader)->ReadAt(kSize, aligned.first(kDirectIOAlignment)).code(),
              StatusCode::kOutOfRange);
  } else {
    ASSERT_TRUE((*reader)->ReadAt(3, aligned.first(10)).ok());
  }
  EXPECT_TRUE(fs->RemoveAll(root).ok());
}

TEST(PosixFileSystemTest, MapFileIsSharedAndReadOnly) {
  FileSystem* fs = DefaultFileSystem();
  const std::string root = MakeTempDir();
  ASSERT_FALSE(root.empty());
  const std::string path = JoinPath(root, "shared.spd");
  const std::vector<std::byte> data = Pattern(2 * 4096, 3);
  ASSERT_TRUE(fs->WriteFileSynced(
                    path, std::string_view(reinterpret_cast<const char*>(data.data()), data.size()))
                  .ok());
  Result<std::shared_ptr<const MappedFile>> map = fs->MapFile(path, MapMode::kReadOnly);
  ASSERT_TRUE(map.ok()) << map.status().ToString();
  const std::byte* p = (*map)->data().data();
  // MAP_SHARED: a later in-place write to the file shows through the mapping.
  {
    FILE* f = std::fopen(path.c_str(), "r+b");  // in place: no truncation
    ASSERT_NE(f, nullptr);
    std::fseek(f, 100, SEEK_SET);
    std::fputc(0x5a, f);
    std::fclose(f);
  }
  EXPECT_EQ(p[100], std::byte{0x5a});
  // PROT_READ: writing through the mapping crashes.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH({ const_cast<std::byte*>(p)[0] = std::byte{1}; }, "");
  // The fd is closed right after mmap: the mapping survives unlink and needs no descriptor.
  ASSERT_TRUE(fs->RemoveAll(root).ok());
  EXPECT_EQ(p[1], data[1]);
}

TEST(PosixFileSystemTest, CopyOnWriteMappingIsWritableAndPrivate) {
  FileSystem* fs = DefaultFileSystem();
  const std::string root = MakeTempDir();
  ASSERT_FALSE(root.empty());
  const std::string path = JoinPath(root, "private.spd");
  const std::vector<std::byte> data = Pattern(2 * 4096, 5);
  const std::string_view bytes(reinterpret_cast<const char*>(data.data()), data.size());
  ASSERT_TRUE(fs->WriteFileSynced(path, bytes).ok());
  Result<std::shared_ptr<const MappedFile>> map = fs->MapFile(path, MapMode::kCopyOnWrite);
  ASSERT_TRUE(map.ok()) << map.status().ToString();
  EXPECT_EQ((*map)->mode(), MapMode::kCopyOnWrite);
  std::byte* p = const_cast<std::byte*>((*map)->data().data());
  p[0] = ~data[0];  // no crash: the pages are writable
  EXPECT_EQ(p[0], ~data[0]);
  // The write is private: the file and a second mapping still hold the original bytes.
  Result<std::string> on_disk = fs->ReadFile(path, 1 << 20);
  ASSERT_TRUE(on_disk.ok());
  EXPECT_EQ(*on_disk, bytes);
  Result<std::shared_ptr<const MappedFile>> other = fs->MapFile(path, MapMode::kReadOnly);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ((*other)->data()[0], data[0]);
  ASSERT_TRUE(fs->RemoveAll(root).ok());
}

TEST(MemFileSystemMapTest, MapFileIsASnapshot) {
  MemFileSystem fs;
  ASSERT_TRUE(fs.WriteFileSynced("/f", "hello world").ok());
  Result<std::shared_ptr<const MappedFile>> map = fs.MapFile("/f", MapMode::kReadOnly);
  ASSERT_TRUE(map.ok()) << map.status().ToString();
  ASSERT_TRUE(fs.WriteFileSynced("/f", "HELLO").ok());  // truncates and rewrites
  fs.SimulatePowerLoss();
  std::span<const std::byte> bytes = (*map)->data();
  EXPECT_EQ(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
            "hello world");
  // A file larger than one 1 MiB storage block, written sparsely: holes read as zeros.
  auto file = fs.NewWritableFile("/big", FileOptions{});
  ASSERT_TRUE(file.ok());
  const std::vector<std::byte> tail = Pattern(1000, 1);
  ASSERT_TRUE((*file)->WriteAt(3 << 20, tail).ok());
  Result<std::shared_ptr<const MappedFile>> big = fs.MapFile("/big", MapMode::kReadOnly);
  ASSERT_TRUE(big.ok());
  ASSERT_EQ((*big)->data().size(), (3u << 20) + 1000u);
  EXPECT_EQ((*big)->data()[12345], std::byte{0});
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), (*big)->data().begin() + (3 << 20)));
}

// A file system that implements only the pure virtual calls (as a third-party one might).
class MinimalFileSystem final : public FileSystem {
 public:
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string&,
                                                        const FileOptions&) override {
    return UnimplementedError("x");
  }
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string&,
                                                                const FileOptions&) override {
    return UnimplementedError("x");
  }
  Status CreateDir(const std::string&) override { return UnimplementedError("x"); }
  Result<std::vector<FileInfo>> ListDir(const std::string&) override {
    return UnimplementedError("x");
  }
  Result<FileInfo> Stat(const std::string&) override { return UnimplementedError("x"); }
  Status RemoveFile(const std::string&) override { return UnimplementedError("x"); }
  Status RemoveDir(const std::string&) override { return UnimplementedError("x"); }
  Status Rename(const std::string&, const std::string&) override { return UnimplementedError("x"); }
  Status SyncDir(const std::string&) override { return UnimplementedError("x"); }
};

TEST(FileSystemDefaultsTest, MapFileIsUnimplementedByDefault) {
  MinimalFileSystem fs;
  Result<std::shared_ptr<const MappedFile>> map = fs.MapFile("/some/file.spd", MapMode::kReadOnly);
  EXPECT_THAT(map, StatusIs(StatusCode::kUnimplemented));
  EXPECT_NE(map.status().message().find("/some/file.spd"), std::string::npos)
      << map.status().ToString();
}

TEST(PosixFileSystemTest, DefaultFileSystemIsASingleton) {
  EXPECT_NE(DefaultFileSystem(), nullptr);
  EXPECT_EQ(DefaultFileSystem(), DefaultFileSystem());
}

// --- Path helpers. ---

TEST(PathTest, JoinDirnameBasename) {
  EXPECT_EQ(JoinPath("a", "b"), "a/b");
  EXPECT_EQ(JoinPath("a/", "b"), "a/b");
  EXPECT_EQ(JoinPath("a", "/b"), "a/b");
  EXPECT_EQ(JoinPath("/", "b"), "/b");
  EXPECT_EQ(JoinPath("", "b"), "b");
  EXPECT_EQ(JoinPath("a", ""), "a");
  EXPECT_EQ(Dirname("a/b"), "a");
  EXPECT_EQ(Dirname("/a/b/"), "/a");
  EXPECT_EQ(Dirname("/a"), "/");
  EXPECT_EQ(Dirname("/"), "/");
  EXPECT_EQ(Dirname("a"), ".");
  EXPECT_EQ(Dirname("a//b"), "a");
  EXPECT_EQ(Basename("a/b"), "b");
  EXPECT_EQ(Basename("/a/b/"), "b");
  EXPECT_EQ(Basename("b"), "b");
  EXPECT_EQ(Basename("/"), "/");
}

}  // namespace
}  // namespace savepoint

namespace savepoint {
namespace {

TEST(PosixPreallocate, ReservesTheWholeRangeAndKeepsData) {
  char tmpl[] = "/tmp/savepoint-prealloc-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  FileSystem* fs = DefaultFileSystem();
  std::string path = std::string(tmpl) + "/pre";
  auto f = fs->NewWritableFile(path, FileOptions{}).value();
  ASSERT_TRUE((f->Preallocate(1 << 20)).ok());
  EXPECT_EQ(fs->Stat(path).value().size, 1u << 20);
  std::string hello = "hello";
  ASSERT_TRUE((f->WriteAt(4096, std::as_bytes(std::span<const char>(hello.data(), 5)))).ok());
  ASSERT_TRUE((f->Close()).ok());
  EXPECT_EQ(fs->Stat(path).value().size, 1u << 20);  // a write inside does not change the size
  std::string all = fs->ReadFile(path, 1 << 20).value();
  EXPECT_EQ(all.substr(4096, 5), "hello");
  EXPECT_EQ(all[0], '\0');
  EXPECT_TRUE((fs->RemoveAll(tmpl)).ok());
}

}  // namespace
}  // namespace savepoint
