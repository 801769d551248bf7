// Hostile PyTorch DCP directories that cost memory or time out of all proportion to their size
// (the inputs of the same names in fuzz/corpus/dcp/, measured with dcp_fuzzer): each is refused
// with an error naming the file and what was too large, before anything of that size is allocated,
// while legitimate checkpoints of the same shape still load.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "interop/dcp_testutil.h"
#include "io/mem_fs.h"
#include "savepoint/dcp.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::Metadata;
using ::savepoint::testing::PickleText;
using ::savepoint::testing::StatusIs;
using ::savepoint::testing::WriteAndLoadDcp;

constexpr char kDir[] = "/dcp";

// The raw bytes of the float32 values 0, 1, ..., n - 1.
std::string Floats(int n) {
  std::string out(4 * n, '\0');
  for (int i = 0; i < n; ++i) {
    const float f = static_cast<float>(i);
    std::memcpy(out.data() + 4 * i, &f, 4);
  }
  return out;
}

// planner_data as DCP's default planner writes it, {fqn: key path}, for `n` fqns "model.p<i>":
// each path ("model", "p<i>") refers to the memoized string "model" (memo slot 0).
void KeyPaths(PickleText& p, int n) {
  p.Op('}').Op('(');
  for (int i = 0; i < n; ++i) {
    p.Str("model.p" + std::to_string(i));
    if (i == 0) {
      p.Str("model").Put(0);
    } else {
      p.Get(0);
    }
    p.Str("p" + std::to_string(i)).Op('\x86');
  }
  p.Op('u');
}

TEST(DcpHostileTest, LegitimateChunksAndPlannerDataLoad) {
  MemFileSystem fs;
  const std::string metadata = Metadata({2, 4}, {{{0, 0}, {1, 4}, 0, 16}, {{1, 0}, {1, 4}, 16, 16}},
                                        [](PickleText& p) { KeyPaths(p, 1000); });
  SP_ASSERT_OK_AND_ASSIGN(State s, WriteAndLoadDcp(fs, kDir, metadata, Floats(8)));
  const TensorView* w = s.FindTensor("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->shape(), (Shape{2, 4}));
  EXPECT_EQ(std::memcmp(w->bytes().data(), Floats(8).data(), 32), 0);
  const Json& planner_data = s.metadata()[kDcpMetadataKey]["planner_data"];
  ASSERT_EQ(planner_data.size(), 1000u);
  EXPECT_EQ(planner_data["model.p999"], Json::array({"model", "p999"}));
}

// planner_data_memo_bomb: 7 nested tuples, each of 12 memo references to the next, in 302 bytes of
// `.metadata`, made 12^7 (36 M) JSON values (2.9 GB, 8 s).
TEST(DcpHostileTest, PlannerDataMemoBombIsRefused) {
  auto bomb = [](PickleText& p) {
    for (int level = 0; level < 7; ++level) p.Op('(');
    p.Op('N');
    for (uint8_t level = 0; level < 7; ++level) {
      p.Put(level);
      for (int k = 1; k < 12; ++k) p.Get(level);
      p.Op('t');
    }
  };
  MemFileSystem fs;
  EXPECT_THAT(
      WriteAndLoadDcp(fs, kDir, Metadata({0}, {{{0}, {0}}}, bomb), ""),
      StatusIs(StatusCode::kInvalidArgument, "/dcp/.metadata: planner_data expands to more than"));
}

// tensor_larger_than_data_file: a [2^20, 2^20] float32 tensor (4 TiB) in one chunk said to be
// stored in the 16 bytes of the data file was allocated (asked for) before the data was read.
TEST(DcpHostileTest, TensorLargerThanDataFileIsCorruption) {
  const Shape huge = {1 << 20, 1 << 20};
  const std::string data(16, '\0');
  MemFileSystem fs;
  EXPECT_THAT(WriteAndLoadDcp(fs, kDir, Metadata(huge, {{{0, 0}, huge, 0, 16}}), data),
              StatusIs(StatusCode::kCorruption,
                       "/dcp/.metadata: tensor \"w\" (F32 [1048576, 1048576]) needs 4398046511104 "
                       "bytes, but the extents of its chunks in the data files hold only 16"));
  EXPECT_THAT(
      WriteAndLoadDcp(fs, kDir, Metadata(huge, {{{0, 0}, huge, 8, int64_t{1} << 42}}), data),
      StatusIs(StatusCode::kCorruption,
               "tensor \"w\" chunk at [0, 0]: bytes [8, +4398046511104) beyond the end of "
               "__0_0.distcp (16 bytes)"));
}

// A chunk said to be stored in fewer bytes than it has, though the extents of the tensor's chunks
// add up to the tensor's bytes.
TEST(DcpHostileTest, ChunkLargerThanItsExtentIsCorruption) {
  MemFileSystem fs;
  const std::string metadata = Metadata({2, 4}, {{{0, 0}, {1, 4}, 0, 4}, {{1, 0}, {1, 4}, 4, 28}});
  EXPECT_THAT(WriteAndLoadDcp(fs, kDir, metadata, Floats(8)),
              StatusIs(StatusCode::kCorruption,
                       "tensor \"w\" chunk at [0, 0] (F32 [1, 4]) needs 16 bytes, but its extent "
                       "at byte 0 of __0_0.distcp holds only 4"));
}

// chunks_share_file_bytes: 2,000 one-row chunks of a [2000, 125000] float32 tensor all stored at
// the same 500 KB of the data file loaded, as 1 GB, from 1.3 MB. Two rows show it here.
TEST(DcpHostileTest, ChunksSharingFileBytesAreCorruption) {
  MemFileSystem fs;
  EXPECT_THAT(
      WriteAndLoadDcp(fs, kDir,
                      Metadata({2, 4}, {{{0, 0}, {1, 4}, 0, 16}, {{1, 0}, {1, 4}, 0, 16}}),
                      Floats(4)),
      StatusIs(StatusCode::kCorruption,
               "storage_data: tensor \"w\" chunk at [0, 0] (bytes [0, +16)) and tensor \"w\" chunk "
               "at [1, 0] (bytes [0, +16)) overlap in __0_0.distcp"));
  EXPECT_THAT(WriteAndLoadDcp(fs, kDir,
                              Metadata({2, 4}, {{{0, 0}, {1, 4}, 0, 16}, {{1, 0}, {1, 4}, 12, 16}}),
                              Floats(7)),
              StatusIs(StatusCode::kCorruption, "overlap in __0_0.distcp"));
  // Empty extents may sit anywhere, also inside another one.
  SP_EXPECT_OK(WriteAndLoadDcp(fs, kDir,
                               Metadata({2, 4}, {{{0, 0}, {2, 4}, 0, 32}, {{2, 0}, {0, 4}, 8, 0}}),
                               Floats(8))
                   .status());
}

// A torch.Size of more dims than a savepoint tensor may have is not read (a memoized one shared by
// many chunks would be copied for each).
TEST(DcpHostileTest, SizeAboveMaxRankIsMalformed) {
  MemFileSystem fs;
  auto load = [&](size_t rank) {
    const Shape ones(rank, 1);
    return WriteAndLoadDcp(fs, kDir, Metadata(ones, {{Shape(rank, 0), ones, 0, 4}}), Floats(1));
  };
  SP_EXPECT_OK(load(kMaxRank).status());
  EXPECT_THAT(load(kMaxRank + 1),
              StatusIs(StatusCode::kCorruption, "tensor \"w\": malformed TensorStorageMetadata"));
}

}  // namespace
}  // namespace savepoint
