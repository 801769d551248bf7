// DeleteCheckpoint of a single file: safetensors and MindSpore .ckpt files (plain, encrypted,
// empty) are removed; any other file, whatever its name, is FailedPrecondition and stays.
#include <gtest/gtest.h>

#include <string>

#include "format/endian.h"
#include "format/file_magic.h"
#include "io/mem_fs.h"
#include "savepoint/catalog.h"
#include "savepoint/checkpoint.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

// A safetensors head: header length `n`, then `first` (the header's first byte) and `rest`.
std::string SafetensorsHead(uint64_t n, char first, const std::string& rest) {
  std::string s(8, '\0');
  format::PutU64(&s, 0, n);
  return s + first + rest;
}

TEST(DeleteFileTest, CheckpointFilesGoOthersStay) {
  MemFileSystem fs;
  State s;
  SP_ASSERT_OK(s.PutValue("step", int64_t{3}));
  SP_ASSERT_OK(s.Put("w", Tensor::Zeros(DType::kF32, {4}).value()));
  for (const char* path : {"/m.safetensors", "/m.ckpt"}) {
    SP_ASSERT_OK(Save(s, path, {}, {.fs = &fs}));
    SCOPED_TRACE(path);
    SP_EXPECT_OK(DeleteCheckpoint(path, &fs));
    EXPECT_FALSE(fs.Exists(path)) << path;
  }
  std::string encrypted(16, '\0');
  format::PutU32(&encrypted, 0, format::kMindSporeMagicGcm);
  const std::string header = R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})";
  for (const auto& [path, bytes] : std::vector<std::pair<std::string, std::string>>{
           {"/empty.ckpt", ""},
           {"/enc.ckpt", encrypted},
           {"/hand.safetensors", SafetensorsHead(header.size(), '{', header.substr(1))}}) {
    SP_ASSERT_OK(fs.WriteFileSynced(path, bytes));
    SCOPED_TRACE(path);
    SP_EXPECT_OK(DeleteCheckpoint(path, &fs));
    EXPECT_FALSE(fs.Exists(path)) << path;
  }
  for (const auto& [path, bytes] : std::vector<std::pair<std::string, std::string>>{
           {"/notes.txt", "my notes, not a checkpoint"},
           {"/notes.ckpt", "my notes, not a checkpoint"},
           {"/notes.safetensors", "short"},
           {"/past_end.safetensors", SafetensorsHead(1000, '{', "}")},
           {"/not_json.safetensors", SafetensorsHead(2, '[', "]")},
           {"/empty.safetensors", ""}}) {
    SP_ASSERT_OK(fs.WriteFileSynced(path, bytes));
    EXPECT_THAT(DeleteCheckpoint(path, &fs), StatusIs(StatusCode::kFailedPrecondition, path))
        << path;
    EXPECT_EQ(fs.ReadFile(path, 1 << 20).value(), bytes) << path;
  }
}

}  // namespace
}  // namespace savepoint
