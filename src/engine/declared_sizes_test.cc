// A manifest that declares more bytes than its data files hold (hostile or damaged) is refused
// before any tensor of the declared size is allocated: a 1 TiB tensor declared by a few KiB of
// files is Corruption naming the file, not an attempt to allocate 1 TiB.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "format/manifest.h"
#include "io/mem_fs.h"
#include "savepoint/checkpoint.h"
#include "savepoint/distributed.h"
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

// MANIFEST files that claim `claimed` bytes: their reads past the real bytes give zeros, and the
// bytes read are counted.
class HugeManifestFs final : public ForwardingFileSystem {
 public:
  HugeManifestFs(FileSystem* base, uint64_t claimed)
      : ForwardingFileSystem(base), claimed_(claimed) {}
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& p,
                                                                const FileOptions& o) override {
    SP_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> f,
                        ForwardingFileSystem::NewRandomAccessFile(p, o));
    if (p.ends_with("/MANIFEST")) {
      return std::unique_ptr<RandomAccessFile>(std::make_unique<File>(std::move(f), this));
    }
    return f;
  }
  uint64_t read = 0;

 private:
  class File final : public RandomAccessFile {
   public:
    File(std::unique_ptr<RandomAccessFile> f, HugeManifestFs* fs) : f_(std::move(f)), fs_(fs) {}
    Status ReadAt(uint64_t offset, std::span<std::byte> dst) const override {
      fs_->read += dst.size();
      std::fill(dst.begin(), dst.end(), std::byte{0});
      if (offset >= f_->size()) return Status::OK();
      return f_->ReadAt(offset, dst.first(std::min<uint64_t>(dst.size(), f_->size() - offset)));
    }
    uint64_t size() const override { return fs_->claimed_; }
    bool direct() const override { return false; }
    const std::string& path() const override { return f_->path(); }

   private:
    std::unique_ptr<RandomAccessFile> f_;
    HugeManifestFs* fs_;
  };
  uint64_t claimed_;
};

TEST(DeclaredSizesTest, ManifestLargerThanItsVersionAllowsIsRefusedUnread) {
  // Versions 1 and 2 hold at most a 256 MiB body: a larger MANIFEST is refused by its size, for a
  // whole read and for the read in parts of a distributed load, before it is read.
  for (uint32_t version : {1u, 2u}) {
    SCOPED_TRACE(version);
    MemFileSystem mem;
    std::vector<float> w(4, 1.0f);
    State s;
    SP_ASSERT_OK(s.PutView("w", TensorView(w.data(), DType::kF32, {4})));
    SP_ASSERT_OK(Save(s, "/c", {.format_version = version}, {.fs = &mem}));
    HugeManifestFs fs(&mem, (uint64_t{300} << 20));
    EXPECT_THAT(Load("/c", {}, {.fs = &fs}), StatusIs(StatusCode::kResourceExhausted, "limit"));
    EXPECT_LE(fs.read, 64u) << "only the header may be read";
    fs.read = 0;
    EXPECT_THAT(LoadDistributedAlloc("/c", {}, {}, {.fs = &fs}),
                StatusIs(StatusCode::kResourceExhausted, "limit"));
    EXPECT_LE(fs.read, 64u) << "only the header may be read";
  }
}

}  // namespace
}  // namespace savepoint
