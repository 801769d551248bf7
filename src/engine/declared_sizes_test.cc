// A manifest that declares more bytes than its data files hold (hostile or damaged) is refused
// before any tensor of the declared size is allocated: a 1 TiB tensor declared by a few KiB of
// files is Corruption naming the file, not an attempt to allocate 1 TiB.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "format/manifest.h"
#include "io/mem_fs.h"
#include "savepoint/checkpoint.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

// Saves a 4-element tensor to /c, then rewrites its MANIFEST to declare `elems` elements.
void SaveDeclaring(MemFileSystem& fs, int64_t elems) {
  std::vector<float> w(4, 1.0f);
  State s;
  SP_ASSERT_OK(s.PutView("w", TensorView(w.data(), DType::kF32, {4})));
  SP_ASSERT_OK(Save(s, "/c", {}, {.fs = &fs}));
  SP_ASSERT_OK_AND_ASSIGN(std::string bytes, fs.ReadFile("/c/MANIFEST", 1 << 20));
  SP_ASSERT_OK_AND_ASSIGN(format::Manifest m, format::DecodeManifest(bytes, "test"));
  format::TensorRecord& t = m.tensors.at(0);
  format::ShardRecord& shard = t.shards.at(0);
  t.shape = shard.sizes = {elems};
  shard.bytes = static_cast<uint64_t>(elems) * 4;
  shard.crc32c.assign(format::NumChunks(shard.bytes, m.chunk_bytes), 0);
  m.files.at(shard.file).bytes = shard.offset + shard.bytes;
  SP_ASSERT_OK(fs.WriteFileSynced("/c/MANIFEST", format::EncodeManifest(m)));
}

TEST(DeclaredSizesTest, TensorLargerThanItsFileIsRefusedBeforeAllocation) {
  MemFileSystem fs;
  SaveDeclaring(fs, int64_t{1} << 38);  // 1 TiB of float32
  for (bool mmap : {false, true}) {
    SCOPED_TRACE(mmap);
    Result<State> loaded = Load("/c", {.mmap = mmap}, {.fs = &fs});
    EXPECT_THAT(loaded, StatusIs(StatusCode::kCorruption, "is truncated"));
    EXPECT_THAT(loaded.status().message(), ::testing::HasSubstr("manifest says"));
  }
}

}  // namespace
}  // namespace savepoint
