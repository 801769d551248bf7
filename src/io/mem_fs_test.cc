// Tests of MemFileSystem's durability model (SimulatePowerLoss) and its large-file support.
#include "io/mem_fs.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

std::span<const std::byte> AsBytes(std::string_view s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

class MemFileSystemTest : public ::testing::Test {
 protected:
  // Creates `path` holding `contents`, optionally syncing the data (not the directory).
  std::unique_ptr<WritableFile> Write(const std::string& path, std::string_view contents,
                                      bool sync) {
    auto file = fs_.NewWritableFile(path, FileOptions{});
    EXPECT_TRUE(file.ok()) << file.status().ToString();
    if (!file.ok()) return nullptr;
    EXPECT_TRUE((*file)->WriteAt(0, AsBytes(contents)).ok());
    if (sync) {
      EXPECT_TRUE((*file)->Sync().ok());
    }
    return std::move(file).value();
  }

  // The file's contents, or "<error>" if it cannot be read.
  std::string Read(const std::string& path) {
    Result<std::string> contents = fs_.ReadFile(path, 1 << 20);
    return contents.ok() ? *contents : "<" + contents.status().ToString() + ">";
  }

  MemFileSystem fs_;
};

TEST_F(MemFileSystemTest, UnsyncedDataIsLost) {
  ASSERT_TRUE(fs_.SyncDir("/").ok());
  auto file = Write("/f", "hello", /*sync=*/false);
  ASSERT_TRUE(fs_.SyncDir("/").ok());  // the entry is durable, the bytes are not
  EXPECT_EQ(Read("/f"), "hello");
  fs_.SimulatePowerLoss();
  ASSERT_TRUE(fs_.Exists("/f"));
  EXPECT_EQ(Read("/f"), "");
}

TEST_F(MemFileSystemTest, SyncedDataSurvives) {
  auto file = Write("/f", "hello", /*sync=*/true);
  ASSERT_TRUE(file->WriteAt(5, AsBytes(" world")).ok());  // after the sync: lost
  ASSERT_TRUE(fs_.SyncDir("/").ok());
  fs_.SimulatePowerLoss();
  EXPECT_EQ(Read("/f"), "hello");
  auto info = fs_.Stat("/f");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->size, 5u);
}

TEST_F(MemFileSystemTest, TruncationIsUndoneUntilSync) {
  Write("/f", "old contents", /*sync=*/true);
  ASSERT_TRUE(fs_.SyncDir("/").ok());
  Write("/f", "new", /*sync=*/false);
  EXPECT_EQ(Read("/f"), "new");
  fs_.SimulatePowerLoss();
  EXPECT_EQ(Read("/f"), "old contents");
}

TEST_F(MemFileSystemTest, FileInUnsyncedDirectoryDisappears) {
  ASSERT_TRUE(fs_.CreateDir("/dir").ok());
  ASSERT_TRUE(fs_.SyncDir("/").ok());
  Write("/dir/f", "data", /*sync=*/true);  // data synced, but /dir never SyncDir'd
  fs_.SimulatePowerLoss();
  EXPECT_TRUE(fs_.Exists("/dir"));
  EXPECT_FALSE(fs_.Exists("/dir/f"));
}

TEST_F(MemFileSystemTest, UnsyncedDirectoryDisappears) {
  ASSERT_TRUE(fs_.CreateDirs("/a/b").ok());
  ASSERT_TRUE(fs_.SyncDir("/a").ok());  // /a's entry in / is not durable
  fs_.SimulatePowerLoss();
  EXPECT_FALSE(fs_.Exists("/a"));
  EXPECT_TRUE(fs_.Exists("/"));
}

TEST_F(MemFileSystemTest, RemovalIsUndoneWithoutSyncDir) {
  Write("/f", "keep", /*sync=*/true);
  ASSERT_TRUE(fs_.SyncDir("/").ok());
  ASSERT_TRUE(fs_.RemoveFile("/f").ok());
  fs_.SimulatePowerLoss();
  EXPECT_EQ(Read("/f"), "keep");
  ASSERT_TRUE(fs_.RemoveFile("/f").ok());
  ASSERT_TRUE(fs_.SyncDir("/").ok());
  fs_.SimulatePowerLoss();
  EXPECT_FALSE(fs_.Exists("/f"));
}

TEST_F(MemFileSystemTest, RenameWithoutSyncDirIsUndone) {
  Write("/tmp-file", "payload", /*sync=*/true);
  ASSERT_TRUE(fs_.SyncDir("/").ok());
  ASSERT_TRUE(fs_.Rename("/tmp-file", "/final").ok());
  fs_.SimulatePowerLoss();
  EXPECT_TRUE(fs_.Exists("/tmp-file"));
  EXPECT_FALSE(fs_.Exists("/final"));
  EXPECT_EQ(Read("/tmp-file"), "payload");
}

TEST_F(MemFileSystemTest, RenameFollowedBySyncDirSurvives) {
  Write("/tmp-file", "payload", /*sync=*/true);
  ASSERT_TRUE(fs_.SyncDir("/").ok());
  ASSERT_TRUE(fs_.Rename("/tmp-file", "/final").ok());
  ASSERT_TRUE(fs_.SyncDir("/").ok());
  fs_.SimulatePowerLoss();
  EXPECT_FALSE(fs_.Exists("/tmp-file"));
  EXPECT_EQ(Read("/final"), "payload");
}

TEST_F(MemFileSystemTest, DirectoryRenameBetweenParents) {
  ASSERT_TRUE(fs_.CreateDirs("/a/ckpt").ok());
  ASSERT_TRUE(fs_.CreateDir("/b").ok());
  Write("/a/ckpt/data", "tensor bytes", /*sync=*/true);
  for (const char* dir : {"/", "/a", "/b", "/a/ckpt"}) ASSERT_TRUE(fs_.SyncDir(dir).ok());

  // Neither parent synced: the move is undone.
  ASSERT_TRUE(fs_.Rename("/a/ckpt", "/b/ckpt").ok());
  EXPECT_EQ(Read("/b/ckpt/data"), "tensor bytes");
  fs_.SimulatePowerLoss();
  EXPECT_EQ(Read("/a/ckpt/data"), "tensor bytes");
  EXPECT_FALSE(fs_.Exists("/b/ckpt"));

  // Both parents synced: the move is durable, and the directory's own contents came along.
  ASSERT_TRUE(fs_.Rename("/a/ckpt", "/b/ckpt").ok());
  ASSERT_TRUE(fs_.SyncDir("/a").ok());
  ASSERT_TRUE(fs_.SyncDir("/b").ok());
  fs_.SimulatePowerLoss();
  EXPECT_FALSE(fs_.Exists("/a/ckpt"));
  EXPECT_EQ(Read("/b/ckpt/data"), "tensor bytes");

  // Only the destination synced: the directory would be in both; it stays at the first place
  // met in name order, so the result is still a tree.
  ASSERT_TRUE(fs_.Rename("/b/ckpt", "/a/ckpt").ok());
  ASSERT_TRUE(fs_.SyncDir("/a").ok());
  fs_.SimulatePowerLoss();
  EXPECT_EQ(Read("/a/ckpt/data"), "tensor bytes");
  EXPECT_FALSE(fs_.Exists("/b/ckpt"));
}

TEST_F(MemFileSystemTest, DirectoryCannotMoveIntoItself) {
  ASSERT_TRUE(fs_.CreateDirs("/a/b").ok());
  EXPECT_FALSE(fs_.Rename("/a", "/a/b/c").ok());
  EXPECT_TRUE(fs_.Exists("/a/b"));
}

TEST_F(MemFileSystemTest, HandlesFromBeforePowerLossFail) {
  auto writer = Write("/f", "abc", /*sync=*/true);
  ASSERT_TRUE(fs_.SyncDir("/").ok());
  auto reader = fs_.NewRandomAccessFile("/f", FileOptions{});
  ASSERT_TRUE(reader.ok());
  fs_.SimulatePowerLoss();
  EXPECT_THAT(writer->WriteAt(0, AsBytes("x")), StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(writer->Sync(), StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(writer->Close(), StatusIs(StatusCode::kFailedPrecondition));
  std::vector<std::byte> dst(3);
  EXPECT_THAT((*reader)->ReadAt(0, dst), StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_EQ(Read("/f"), "abc");
}

TEST_F(MemFileSystemTest, PathsAreNormalised) {
  ASSERT_TRUE(fs_.CreateDir("//dir///").ok());
  Write("dir/./f", "x", /*sync=*/false);
  EXPECT_EQ(Read("/dir/f"), "x");
  EXPECT_EQ(Read("/dir/../dir//f"), "x");
  auto info = fs_.Stat("/");
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->is_dir);
  EXPECT_THAT(fs_.CreateDir("/"), StatusIs(StatusCode::kAlreadyExists));
  EXPECT_FALSE(fs_.RemoveDir("/").ok());
}

TEST_F(MemFileSystemTest, CountsWrites) {
  EXPECT_EQ(fs_.bytes_written(), 0u);
  auto file = Write("/f", "hello", /*sync=*/false);
  ASSERT_TRUE(file->WriteAt(100, AsBytes("abc")).ok());
  EXPECT_EQ(fs_.bytes_written(), 8u);
  EXPECT_EQ(fs_.write_calls(), 2u);
  fs_.SimulatePowerLoss();
  EXPECT_EQ(fs_.bytes_written(), 8u);
}

TEST_F(MemFileSystemTest, SparseHolesReadAsZeros) {
  auto file = Write("/f", "", /*sync=*/false);
  ASSERT_TRUE(file->WriteAt(3 * 1024 * 1024 - 2, AsBytes("edge")).ok());  // spans two blocks
  auto reader = fs_.NewRandomAccessFile("/f", FileOptions{});
  ASSERT_TRUE(reader.ok());
  ASSERT_EQ((*reader)->size(), 3u * 1024 * 1024 + 2);
  std::vector<std::byte> dst(6);
  ASSERT_TRUE((*reader)->ReadAt(3 * 1024 * 1024 - 4, dst).ok());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(dst.data()), dst.size()),
            std::string("\0\0edge", 6));
}

TEST_F(MemFileSystemTest, CopyOnWriteKeepsDurableBytes) {
  auto file = Write("/f", "aaaa", /*sync=*/true);
  ASSERT_TRUE(fs_.SyncDir("/").ok());
  ASSERT_TRUE(file->WriteAt(1, AsBytes("bb")).ok());  // same block as the synced bytes
  EXPECT_EQ(Read("/f"), "abba");
  fs_.SimulatePowerLoss();
  EXPECT_EQ(Read("/f"), "aaaa");
}

TEST_F(MemFileSystemTest, FileLargerThan4GiB) {
  constexpr uint64_t kOffset = (uint64_t{4} << 30) + 10;
  auto file = Write("/big", "", /*sync=*/false);
  ASSERT_TRUE(file->WriteAt(kOffset, AsBytes("Z")).ok());
  ASSERT_TRUE(file->Sync().ok());
  ASSERT_TRUE(file->Close().ok());
  ASSERT_TRUE(fs_.SyncDir("/").ok());
  fs_.SimulatePowerLoss();

  auto info = fs_.Stat("/big");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->size, kOffset + 1);
  auto reader = fs_.NewRandomAccessFile("/big", FileOptions{});
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ((*reader)->size(), kOffset + 1);
  std::vector<std::byte> dst(2);
  ASSERT_TRUE((*reader)->ReadAt(kOffset - 1, dst).ok());
  EXPECT_EQ(dst[0], std::byte{0});
  EXPECT_EQ(dst[1], std::byte{'Z'});
  EXPECT_THAT((*reader)->ReadAt(kOffset, dst), StatusIs(StatusCode::kOutOfRange));
}

}  // namespace
}  // namespace savepoint
