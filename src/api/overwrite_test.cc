// Overwrite never loses data: an empty directory is a fine target for Save, overwrite or not; an
// overwrite replaces a checkpoint's own files only, and refuses a directory holding anything else
// (a user's file beside the checkpoint's, or a directory that is no checkpoint at all).
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "engine/paths.h"
#include "io/mem_fs.h"
#include "savepoint/catalog.h"
#include "savepoint/checkpoint.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

class OverwriteTest : public ::testing::Test {
 protected:
  std::unique_ptr<MemFileSystem> fs_ = std::make_unique<MemFileSystem>();
  IoOptions io_{.fs = fs_.get(), .io_threads = 2, .direct_io = false};
  State state_ = testing::RandomState(testing::TestSeed("OverwriteTest"), 3, 64 << 10);

  void Write(const std::string& path, const std::string& contents) {
    SP_ASSERT_OK(fs_->WriteFileSynced(path, contents));
  }
};

TEST_F(OverwriteTest, AnEmptyDirectoryIsAFineTarget) {
  SP_ASSERT_OK(fs_->CreateDir("/empty"));
  SP_ASSERT_OK(Save(state_, "/empty", {}, io_));
  EXPECT_TRUE(testing::StatesEqual(Load("/empty", {}, io_).value(), state_));
  SP_ASSERT_OK(fs_->CreateDir("/empty2"));
  SP_ASSERT_OK(Save(state_, "/empty2", {.overwrite = true}, io_));
  EXPECT_TRUE(testing::StatesEqual(Load("/empty2", {}, io_).value(), state_));
}

TEST_F(OverwriteTest, ReplacesACheckpointButRefusesAnythingElse) {
  SP_ASSERT_OK(Save(state_, "/ckpt", {}, io_));
  EXPECT_THAT(Save(state_, "/ckpt", {}, io_),
              StatusIs(StatusCode::kAlreadyExists, "a checkpoint already exists there"));
  SP_ASSERT_OK(Save(state_, "/ckpt", {.overwrite = true}, io_));  // its own files only

  // A user's file inside the checkpoint directory: the overwrite is refused, nothing changes.
  Write("/ckpt/keep.txt", "mine");
  EXPECT_THAT(Save(State(), "/ckpt", {.overwrite = true}, io_),
              StatusIs(StatusCode::kFailedPrecondition, "\"keep.txt\""));
  EXPECT_EQ(fs_->ReadFile("/ckpt/keep.txt", 100).value(), "mine");
  EXPECT_TRUE(testing::StatesEqual(Load("/ckpt", {}, io_).value(), state_));

  // A directory that is not a checkpoint, and a file.
  SP_ASSERT_OK(fs_->CreateDir("/proj"));
  Write("/proj/notes.txt", "notes");
  EXPECT_THAT(Save(state_, "/proj", {.overwrite = true}, io_),
              StatusIs(StatusCode::kFailedPrecondition, "savepoint did not write (\"notes.txt\")"));
  EXPECT_EQ(fs_->ReadFile("/proj/notes.txt", 100).value(), "notes");
  Write("/model.bin", "bytes");
  EXPECT_THAT(Save(state_, "/model.bin", {.overwrite = true}, io_),
              StatusIs(StatusCode::kFailedPrecondition, "is a file"));
  EXPECT_EQ(fs_->ReadFile("/model.bin", 100).value(), "bytes");
  for (const FileInfo& e : fs_->ListDir("/").value()) {
    EXPECT_NE(e.name[0], '.') << "debris of a refused save: " << e.name;
  }
}

// DeleteCheckpoint deletes what savepoint wrote, never a user's file: a directory without a
// MANIFEST is refused whole, and from one holding other files only the checkpoint's go.
TEST_F(OverwriteTest, DeleteRemovesOnlyACheckpointsOwnFiles) {
  SP_ASSERT_OK(fs_->CreateDir("/proj"));
  Write("/proj/notes.txt", "notes");
  Write("/proj/data-00000-00000.spd", "looks like ours, but no MANIFEST commits it");
  EXPECT_THAT(DeleteCheckpoint("/proj", fs_.get()), StatusIs(StatusCode::kNotFound, "MANIFEST"));
  EXPECT_EQ(fs_->ListDir("/proj").value().size(), 2u);

  SP_ASSERT_OK(Save(state_, "/ckpt", {}, io_));
  Write("/ckpt/keep.txt", "mine");
  SP_ASSERT_OK(DeleteCheckpoint("/ckpt", fs_.get()));
  EXPECT_THAT(Load("/ckpt", {}, io_), StatusIs(StatusCode::kNotFound));
  std::vector<FileInfo> left = fs_->ListDir("/ckpt").value();
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].name, "keep.txt");

  SP_ASSERT_OK(Save(state_, "/only", {}, io_));  // nothing else in it: the directory goes whole
  SP_ASSERT_OK(DeleteCheckpoint("/only", fs_.get()));
  EXPECT_FALSE(fs_->Exists("/only"));
}

TEST(CheckpointEntry, NamesTheFilesOfANativeCheckpoint) {
  for (const char* own : {"MANIFEST", "data-00000-00000.spd", "data-12345-00002.spd"}) {
    EXPECT_TRUE(engine::IsCheckpointEntry(own)) << own;
  }
  for (const char* other : {"keep.txt", "MANIFEST.bak", "data-.spd", "data-1-.spd", "data--1.spd",
                            "data-0a-00000.spd", "data-00000-00000.spd.tmp", ".MANIFEST"}) {
    EXPECT_FALSE(engine::IsCheckpointEntry(other)) << other;
  }
}

}  // namespace
}  // namespace savepoint
