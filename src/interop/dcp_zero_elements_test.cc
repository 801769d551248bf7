// Zero-element tensors with INT64_MAX-sized and near-overflow dims in PyTorch DCP metadata
// (issue 37: all arithmetic on numbers read from a file is checked). The `.metadata` pickles are
// built opcode by opcode (dcp_testutil.h), as DCP's FileSystemWriter lays them out.
//
// torch 2.13 (build/venv) saves and loads, with dcp.save and dcp.load, tensors of sizes
// [0, 2^63-1], [2^63-1, 0] and [2^63-1, 2, 0] (a chunk of the same sizes each); savepoint loads
// the first two as the zero-element tensors they are and refuses the third with Corruption naming
// the tensor: savepoint shapes need element counts that fit in int64 when multiplied out left to
// right, and 2^63-1 * 2 does not (torch multiplies in u64). Chunks are untrusted boxes: negative
// or out-of-shape ones, and ones whose element counts add up past INT64_MAX, are Corruption before
// anything is allocated or copied; storage offsets and lengths near 2^63 are checked against the
// data file before it is read.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "interop/dcp_testutil.h"
#include "io/mem_fs.h"
#include "savepoint/dcp.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::Chunk;
using ::savepoint::testing::Metadata;
using ::savepoint::testing::PickleText;
using ::savepoint::testing::StatusIs;
using ::savepoint::testing::WriteAndLoadDcp;

constexpr char kDir[] = "/dcp";
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t k2p62 = int64_t{1} << 62;

class DcpZeroElementsTest : public ::testing::Test {
 protected:
  void SetUp() override { SP_ASSERT_OK(fs_.CreateDirs(kDir)); }

  // Loads a directory of `metadata` and a data file of `data` bytes.
  Result<State> Load(const std::string& metadata, const std::string& data = "") {
    return WriteAndLoadDcp(fs_, kDir, metadata, data);
  }
  // "w" of `size` in one chunk covering it.
  Result<State> LoadWhole(const Shape& size) {
    return Load(Metadata(size, {{Shape(size.size(), 0), size}}));
  }

  MemFileSystem fs_;
};

TEST_F(DcpZeroElementsTest, ZeroElementsWithInt64MaxDimension) {
  for (const Shape& size :
       {Shape{0, kMax}, Shape{kMax, 0}, Shape{0, kMax, kMax}, Shape{k2p62, 0}}) {
    SCOPED_TRACE(ShapeToString(size));
    SP_ASSERT_OK_AND_ASSIGN(State s, LoadWhole(size));
    const TensorView* w = s.FindTensor("w");
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(w->shape(), size);
    EXPECT_EQ(w->nbytes(), 0u);
  }
  // [2^62, 0] in two zero-element chunks, one of them at the far end of dim 0.
  SP_ASSERT_OK_AND_ASSIGN(State s,
                          Load(Metadata({k2p62, 0}, {{{0, 0}, {k2p62, 0}}, {{k2p62, 0}, {0, 0}}})));
  EXPECT_EQ(s.FindTensor("w")->shape(), (Shape{k2p62, 0}));
}

TEST_F(DcpZeroElementsTest, InvalidShapesAreCorruptionNamingTheTensor) {
  for (const Shape& size :
       {Shape{kMax, 2, 0}, Shape{kMax, kMax, 0}, Shape{k2p62, k2p62, 0}, Shape{-1, 0}}) {
    SCOPED_TRACE(ShapeToString(size));
    EXPECT_THAT(LoadWhole(size), StatusIs(StatusCode::kCorruption, "tensor \"w\": shape ["));
  }
}

TEST_F(DcpZeroElementsTest, ChunksOutsideTheShapeAreCorruption) {
  const std::vector<std::pair<Shape, std::vector<Chunk>>> cases = {
      {{0, 0}, {{{0, 0}, {-1, 0}}}},
      {{0, 0}, {{{-1, 0}, {1, 0}}}},
      {{0, 0}, {{{0, 0}, {kMax, 2}}}},  // sizes whose element count overflows
      {{kMax, 0}, {{{kMax, 0}, {kMax, 0}}}},
      {{k2p62, 0}, {{{k2p62, 0}, {k2p62, 0}}}},  // offset + size is 2^63, no element
      {{0, kMax}, {{{0, 1}, {0, kMax}}}},
  };
  for (const auto& [size, chunks] : cases) {
    SCOPED_TRACE(ShapeToString(chunks[0].offsets) + " " + ShapeToString(chunks[0].sizes));
    EXPECT_THAT(Load(Metadata(size, chunks)), StatusIs(StatusCode::kCorruption, "exceeds shape"));
  }
}

// Chunks whose element counts add up past INT64_MAX: the whole [2^62] u8-sized tensor two and
// three times. They overlap, which must be found without a signed overflow (and before the
// 2^62-element tensor is allocated).
TEST_F(DcpZeroElementsTest, ChunksSummingPastInt64MaxAreCorruption) {
  for (size_t copies : {2u, 3u}) {
    std::vector<Chunk> chunks;
    for (size_t k = 0; k < copies; ++k) chunks.push_back({{0}, {k2p62}});
    EXPECT_THAT(Load(Metadata({k2p62}, chunks)),
                StatusIs(StatusCode::kCorruption, "tensor \"w\": shards overlap"))
        << copies;
  }
}

TEST_F(DcpZeroElementsTest, StorageOffsetsNearInt64MaxAreCorruption) {
  const Shape size = {0, kMax};
  for (const auto& [offset, length] : std::vector<std::pair<int64_t, int64_t>>{
           {kMax, 0}, {kMax, kMax}, {0, kMax}, {4, kMax - 3}}) {
    SCOPED_TRACE(std::to_string(offset) + "+" + std::to_string(length));
    EXPECT_THAT(Load(Metadata(size, {{{0, 0}, size, offset, length}}), "data"),
                StatusIs(StatusCode::kCorruption, "beyond the end of __0_0.distcp (4 bytes)"));
  }
  EXPECT_THAT(Load(Metadata(size, {{{0, 0}, size, -1, 0}})),
              StatusIs(StatusCode::kCorruption, "malformed storage_data entry"));
  // A zero-element chunk whose stored bytes are not empty (and not a torch.save archive).
  EXPECT_THAT(
      Load(Metadata(size, {{{0, 0}, size, 0, 4}}), "data"),
      StatusIs(StatusCode::kCorruption, "neither a torch.save archive nor the 0 raw bytes"));
}

// A dim of 2^63 needs a 9-byte LONG1, which the restricted pickle reader refuses.
TEST_F(DcpZeroElementsTest, DimensionOf2To63IsRefused) {
  PickleText p;
  p.Global("torch", "Size").Op('(').Int(0).Int(std::numeric_limits<int64_t>::min(), 9);
  const std::string metadata = std::move(p.Op('t').Op('\x85').Op('R')).Stop();
  EXPECT_THAT(Load(metadata), StatusIs(StatusCode::kInvalidArgument, "integer of 9 bytes"));
}

}  // namespace
}  // namespace savepoint
