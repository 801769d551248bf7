// Tables of more than 2^32 rows, on the in-memory file system: row counts, offsets and byte counts
// are 64-bit and overflow-checked. A real table that large does not fit in memory (ids alone take
// 8 bytes a row: 32 GiB), so the checkpoint is forged: a manifest claiming kRows rows over a data
// file that reads as zeros except for its header, the slice index and the last kTail rows (a
// VirtualFile), each chunk with its true CRC. A loader of one shard reads the index, sums it into
// a row range past 2^32 and reads just its chunks there.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <map>

#include "format/manifest.h"
#include "io/mem_fs.h"
#include "savepoint/sparse.h"
#include "sparse/stored.h"
#include "testutil/testutil.h"
#include "util/crc32c.h"

namespace savepoint::sparse {
namespace {

constexpr int64_t kRows = (int64_t{1} << 32) + (int64_t{1} << 19);  // its bytes: whole chunks
constexpr int64_t kTail = 10;                                       // 5 in slice 32768, 5 in 65535
constexpr uint64_t kChunk = uint64_t{4} << 20;

// A file of `size` bytes reading as zeros except at `extents` (offset -> bytes).
class VirtualFile final : public RandomAccessFile {
 public:
  VirtualFile(std::string path, uint64_t size, const std::map<uint64_t, std::string>* extents)
      : path_(std::move(path)), size_(size), extents_(extents) {}
  Status ReadAt(uint64_t offset, std::span<std::byte> dst) const override {
    if (offset > size_ || dst.size() > size_ - offset) {
      return OutOfRangeError(
          fmt::format("{}: read of {} at {} past {}", path_, dst.size(), offset, size_));
    }
    std::memset(dst.data(), 0, dst.size());
    for (const auto& [at, bytes] : *extents_) {
      const uint64_t begin = std::max(at, offset),
                     end = std::min(at + bytes.size(), offset + dst.size());
      if (begin < end)
        std::memcpy(dst.data() + (begin - offset), bytes.data() + (begin - at), end - begin);
    }
    return Status::OK();
  }
  uint64_t size() const override { return size_; }
  bool direct() const override { return false; }
  const std::string& path() const override { return path_; }

 private:
  std::string path_;
  uint64_t size_;
  const std::map<uint64_t, std::string>* extents_;
};

// The in-memory file system, with file `path` replaced by a VirtualFile.
class VirtualFs final : public ForwardingFileSystem {
 public:
  explicit VirtualFs(FileSystem* base) : ForwardingFileSystem(base) {}
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& p,
                                                                const FileOptions& o) override {
    if (p != path) return ForwardingFileSystem::NewRandomAccessFile(p, o);
    return std::unique_ptr<RandomAccessFile>(std::make_unique<VirtualFile>(p, size, &extents));
  }
  Result<FileInfo> Stat(const std::string& p) override {
    SP_ASSIGN_OR_RETURN(FileInfo info, ForwardingFileSystem::Stat(p));
    if (p == path) info.size = size;
    return info;
  }
  // The CRC32C of chunk `c` of the `bytes` bytes at `offset`.
  uint32_t ChunkCrc(uint64_t offset, uint64_t bytes, uint64_t c) const {
    std::string buf(format::ChunkLen(bytes, c, kChunk), '\0');
    VirtualFile f(path, size, &extents);
    (void)f.ReadAt(offset + c * kChunk, std::as_writable_bytes(std::span(buf)));
    return Crc32c(buf);
  }

  std::string path;
  uint64_t size = 0;
  std::map<uint64_t, std::string> extents;
};

int64_t TailId(int64_t i) { return i < 5 ? 32768 + i * 65536 : 65535 + (i - 5) * 65536; }
float TailValue(int64_t i, int64_t k) { return static_cast<float>(TailId(i)) * 0.5f + k; }

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

class LargeTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    index_ = {PackSlice(0, kRows - kTail), PackSlice(32768, 5), PackSlice(65535, 5)};
  }

  // Forges /ck: kRows rows, slice index `index_`, a data file of `file_bytes` (0: all of it).
  void Forge(uint64_t file_bytes = 0) {
    std::vector<int64_t> ids(kTail);
    std::vector<float> emb(kTail * 2);
    for (int64_t i = 0; i < kTail; ++i) {
      ids[i] = TailId(i);
      emb[i * 2] = TailValue(i, 0);
      emb[i * 2 + 1] = TailValue(i, 1);
    }
    State s;
    SP_ASSERT_OK(s.PutTable(
        "emb",
        SparseTable::FromViews(TensorView(ids.data(), DType::kI64, {kTail}),
                               {{"embedding", TensorView(emb.data(), DType::kF32, {kTail, 2})},
                                {"flag", TensorView(emb.data(), DType::kF32, {kTail, 0})}})
            .value()));
    SparseSaveOptions o;
    o.save.chunk_bytes = kChunk;
    o.save.overwrite = true;
    SP_ASSERT_OK(SaveSparse(s, "/ck", o, {.fs = &mem_, .direct_io = false}));
    SP_ASSERT_OK_AND_ASSIGN(std::string bytes, mem_.ReadFile("/ck/MANIFEST", 1 << 26));
    SP_ASSERT_OK_AND_ASSIGN(format::Manifest m, format::DecodeManifest(bytes, "m"));
    ASSERT_EQ(m.files.size(), 1u);
    fs_.path = "/ck/" + m.files[0].name;
    const uint64_t slices = 4096, ranks = 6144, id_at = 8192, emb_at = id_at + kRows * 8;
    fs_.size = emb_at + kRows * 8;
    fs_.extents = {{0, format::EncodeDataHeader(m.checkpoint_id, 0, m.version)},
                   {slices, Bytes(index_)},
                   {ranks, Bytes(Ranks())},
                   {id_at + (kRows - kTail) * 8, Bytes(ids)},
                   {emb_at + (kRows - kTail) * 8, Bytes(emb)}};
    m.files[0].bytes = fs_.size;
    for (format::TensorRecord& t : m.tensors) {
      const int64_t n = static_cast<int64_t>(index_.size());
      if (t.name.ends_with("/slices")) Place(t, n, slices, n * 8);
      if (t.name.ends_with("/ranks")) Place(t, Ranks().size() / 3, ranks, Ranks().size() * 8);
      if (t.name.ends_with("/ids")) Place(t, kRows, id_at, kRows * 8);
      if (t.name.ends_with("/embedding")) Place(t, kRows, emb_at, kRows * 8);
      if (t.name.ends_with("/flag")) Place(t, kRows, fs_.size, 0);
    }
    SP_ASSERT_OK(mem_.WriteFileSynced("/ck/MANIFEST", format::EncodeManifest(m)));
    if (file_bytes != 0) fs_.size = file_bytes;
  }

  // Makes `t` (whose dim 0 becomes `rows`) one shard of `bytes` bytes at `offset` of the file.
  void Place(format::TensorRecord& t, int64_t rows, uint64_t offset, uint64_t bytes) {
    t.shape[0] = rows;
    format::ShardRecord& s = t.shards.at(0);
    s.sizes = t.shape;
    s.offset = offset;
    s.bytes = bytes;
    s.crc32c.clear();
    const uint64_t chunks = format::NumChunks(bytes, kChunk);
    const uint32_t zeros = chunks > 1 ? fs_.ChunkCrc(offset, bytes, 0) : 0;  // chunk 0 is all zero
    for (uint64_t c = 0; c < chunks; ++c) {
      s.crc32c.push_back(c == 0 || c + 2 >= chunks ? fs_.ChunkCrc(offset, bytes, c) : zeros);
    }
  }

  Result<State> LoadShard(int shard_id, int shard_num = 65536) {
    return LoadSparse("/ck", {.shard_id = shard_id, .shard_num = shard_num},
                      {.fs = &fs_, .direct_io = false});
  }

  MemFileSystem mem_;
  VirtualFs fs_{&mem_};
  std::vector<int64_t> index_;
  // The rows of the ranks tensor (3 per saving rank); empty: TrueRanks().
  std::vector<int64_t> ranks_;
  std::vector<int64_t> Ranks() const { return ranks_.empty() ? TrueRanks() : ranks_; }
  std::vector<int64_t> TrueRanks() const { return {0, static_cast<int64_t>(index_.size()), 0}; }
};

TEST_F(LargeTableTest, ShardsPast2To32RowsLoadExactly) {
  ASSERT_NO_FATAL_FAILURE(Forge());
  for (int64_t shard : {32768, 65535}) {
    SCOPED_TRACE(shard);
    SP_ASSERT_OK_AND_ASSIGN(State s, LoadShard(static_cast<int>(shard)));
    const SparseTable* t = s.FindTable("emb");
    ASSERT_NE(t, nullptr);
    ASSERT_EQ(t->num_rows(), 5);
    const int64_t first = shard == 32768 ? 0 : 5;
    const float* emb = reinterpret_cast<const float*>(t->FindSlot("embedding")->data());
    for (int64_t i = 0; i < 5; ++i) {
      EXPECT_EQ(t->ids()[i], TailId(first + i));
      EXPECT_EQ(emb[i * 2], TailValue(first + i, 0));
      EXPECT_EQ(emb[i * 2 + 1], TailValue(first + i, 1));
    }
    EXPECT_EQ(t->FindSlot("flag")->shape(), (Shape{5, 0}));
  }
  SP_ASSERT_OK_AND_ASSIGN(State none, LoadShard(1));  // slice 1: no rows
  EXPECT_EQ(none.FindTable("emb")->num_rows(), 0);
}

::testing::AssertionResult Corrupt(const Status& s, std::string_view needle) {
  if (s.code() == StatusCode::kCorruption && s.message().find(needle) != std::string::npos) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << s.ToString();
}

TEST_F(LargeTableTest, CountsPastTheRowsAreCorruption) {
  index_[0] = PackSlice(0, kRows - kTail + 1);  // one row more than stored
  ASSERT_NO_FATAL_FAILURE(Forge());
  EXPECT_TRUE(Corrupt(LoadShard(65535).status(), "rows among the 4295491584 stored"));
  index_[0] = PackSlice(0, kMaxSliceRows);  // the largest count an entry holds
  ASSERT_NO_FATAL_FAILURE(Forge());
  EXPECT_TRUE(Corrupt(LoadShard(65535).status(), "entry 0 (9223372036854710272)"));
}

TEST_F(LargeTableTest, IndexEntriesThatAreNoAscendingSlicesAreCorruption) {
  index_[1] = std::numeric_limits<int64_t>::min();  // no count, no slice
  ASSERT_NO_FATAL_FAILURE(Forge());
  EXPECT_TRUE(Corrupt(LoadShard(65535).status(), "entry 1 (-9223372036854775808)"));
  index_[1] = PackSlice(0, 5);  // slice 0 twice
  ASSERT_NO_FATAL_FAILURE(Forge());
  EXPECT_TRUE(Corrupt(LoadShard(65535).status(), "is not a later slice"));
  index_[1] = PackSlice(32768, 0);  // a slice without rows
  ASSERT_NO_FATAL_FAILURE(Forge());
  EXPECT_TRUE(Corrupt(LoadShard(65535).status(), "entry 1 (32768)"));
}

TEST_F(LargeTableTest, RanksWhoseEntriesAreNoRangeOfTheIndexAreCorruption) {
  for (std::vector<int64_t> row : std::vector<std::vector<int64_t>>{
           {0, 4, 0}, {-1, 3, 0}, {1, 3, 0}, {0, -1, 0}, {0, INT64_MAX, 0}}) {
    ranks_ = row;
    ASSERT_NO_FATAL_FAILURE(Forge());
    EXPECT_TRUE(Corrupt(LoadShard(65535).status(), "saving ranks 0 to 0 give entries"))
        << row[0] << " " << row[1];
  }
  ranks_ = {0, 3, -1};  // a negative first row
  ASSERT_NO_FATAL_FAILURE(Forge());
  EXPECT_TRUE(Corrupt(LoadShard(65535).status(), "first row -1 do not follow"));
  ranks_ = {0, 3, 1};  // one row later than stored: the last rows run past the ids
  ASSERT_NO_FATAL_FAILURE(Forge());
  EXPECT_TRUE(Corrupt(LoadShard(65535).status(), "rows among the 4295491584 stored"));
}

// The same rows as saved by 2 ranks (slices [0, 32768) and [32768, 65536)): a loader whose slices
// span both reads each rank's row and entries; a rank whose entries or first row do not follow the
// rank before it, or whose entries leave its own slices, is Corruption naming it.
TEST_F(LargeTableTest, TwoSavingRanksMustFollowEachOther) {
  const int64_t first_of_1 = kRows - kTail;
  ranks_ = {0, 1, 0, 1, 2, first_of_1};
  ASSERT_NO_FATAL_FAILURE(Forge());
  SP_ASSERT_OK_AND_ASSIGN(State s, LoadShard(1, 3));  // slices [21846, 43691): both ranks
  const SparseTable* t = s.FindTable("emb");
  ASSERT_NE(t, nullptr);
  ASSERT_EQ(t->num_rows(), 5);
  EXPECT_EQ(t->ids()[0], TailId(0));
  SP_ASSERT_OK_AND_ASSIGN(State last, LoadShard(65535));  // rank 1's row only
  EXPECT_EQ(last.FindTable("emb")->num_rows(), 5);

  ranks_ = {0, 1, 0, 1, 2, first_of_1 - 1};  // rank 1 starts a row early
  ASSERT_NO_FATAL_FAILURE(Forge());
  EXPECT_TRUE(
      Corrupt(LoadShard(1, 3).status(),
              fmt::format("saving rank 1 of 2: its entries [1, 3) or first row {} do not follow",
                          first_of_1 - 1)));
  ranks_ = {0, 1, 0, 2, 1, first_of_1};  // rank 1's entries overlap rank 0's
  ASSERT_NO_FATAL_FAILURE(Forge());
  EXPECT_TRUE(Corrupt(LoadShard(1, 3).status(), "saving rank 1 of 2: its entries [2, 3)"));
  ranks_ = {0, 2, 0, 2, 1, first_of_1};  // rank 0 claims slice 32768, which is rank 1's
  ASSERT_NO_FATAL_FAILURE(Forge());
  EXPECT_TRUE(Corrupt(LoadShard(1, 3).status(), "saving rank 0 of 2: entry 1"));
}

TEST_F(LargeTableTest, TruncatedDataIsCorruption) {
  ASSERT_NO_FATAL_FAILURE(Forge(uint64_t{1} << 32));  // the rows past 2^29 are missing
  EXPECT_TRUE(Corrupt(LoadShard(65535).status(), "truncated"));
}

}  // namespace
}  // namespace savepoint::sparse
