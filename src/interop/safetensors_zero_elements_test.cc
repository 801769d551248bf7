// Zero-element tensors with INT64_MAX-sized and near-overflow dimensions in safetensors headers
// (issue 37: all arithmetic on numbers read from a file is checked). What the reference reader
// (safetensors 0.8 with torch 2.13, build/venv) does with each file decides the outcome here: it
// computes an element count as a checked product of u64 dims, left to right, and refuses a file on
// the first overflow even when a later dim is 0; savepoint's NumElements does the same in int64.
//   [0, 2^63-1], [2^63-1, 0], [0, 2^63-1, 2^63-1]  load in safetensors.torch.load_file, and here;
//   [2^63-1, 2^63-1, 0], [2^62, 2^62, 0]            "overflow computing buffer size", Corruption;
//   [2^63-1, 2, 0]   loads in safetensors (the u64 product 2^64-2 fits) but not here: its
//                    intermediate product passes INT64_MAX, and savepoint shapes hold int64
//                    element counts (Corruption naming the tensor);
//   [2^63, 0], [-1, 0]  refused by safetensors (torch cannot unpack 2^63; -1 is not a usize);
//   data_offsets near 2^64  "invalid offset" in safetensors, a hole or overlap here.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "format/endian.h"
#include "interop/safetensors_testutil.h"
#include "io/mem_fs.h"
#include "savepoint/safetensors.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::LoadWith;
using ::savepoint::testing::StatusIs;

constexpr char kPath[] = "/zero.safetensors";
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t k2p62 = int64_t{1} << 62;

// A file of one tensor "t": `shape` and `offsets` are JSON text, `data` follows the header.
std::string OneTensorFile(const std::string& dtype, const std::string& shape,
                          const std::string& offsets, const std::string& data = "") {
  const std::string header = fmt::format(
      R"({{"t": {{"dtype": "{}", "shape": {}, "data_offsets": {}}}}})", dtype, shape, offsets);
  std::string file(8, '\0');
  format::PutU64(&file, 0, header.size());
  return file + header + data;
}

class SafetensorsZeroElementsTest : public ::testing::Test {
 protected:
  // Writes `bytes` and loads them (through read and mmap, which must agree); Inspect must agree
  // with the load on the status.
  Result<State> Load(const std::string& bytes) {
    EXPECT_TRUE(fs_.WriteFileSynced(kPath, bytes).ok());
    Result<State> read = LoadSafetensors(kPath, LoadWith(false), {.fs = &fs_});
    Result<State> mapped = LoadSafetensors(kPath, LoadWith(true), {.fs = &fs_});
    EXPECT_EQ(read.status(), mapped.status());
    EXPECT_EQ(InspectSafetensors(kPath, &fs_).status(), read.status());
    return read;
  }

  // Loads the file and expects the zero-element tensor "t" of `shape`; it must also write back
  // and load again the same.
  void ExpectZeroElements(const std::string& bytes, const Shape& shape) {
    SP_ASSERT_OK_AND_ASSIGN(State s, Load(bytes));
    const TensorView* t = s.FindTensor("t");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->shape(), shape);
    EXPECT_EQ(t->nbytes(), 0u);
    SP_ASSERT_OK(SaveSafetensors(s, "/back.safetensors", {.overwrite = true}, {.fs = &fs_}));
    SP_ASSERT_OK_AND_ASSIGN(State back, LoadSafetensors("/back.safetensors", {}, {.fs = &fs_}));
    EXPECT_TRUE(testing::StatesEqual(s, back));
  }

  MemFileSystem fs_;
};

TEST_F(SafetensorsZeroElementsTest, ZeroElementsWithInt64MaxDimension) {
  const std::string m = std::to_string(kMax);
  ExpectZeroElements(OneTensorFile("F32", fmt::format("[0, {}]", m), "[0, 0]"), {0, kMax});
  ExpectZeroElements(OneTensorFile("F64", fmt::format("[{}, 0]", m), "[0, 0]"), {kMax, 0});
  ExpectZeroElements(OneTensorFile("U8", fmt::format("[0, {0}, {0}]", m), "[0, 0]"),
                     {0, kMax, kMax});
  ExpectZeroElements(OneTensorFile("BF16", fmt::format("[{}, 0]", k2p62), "[0, 0]"), {k2p62, 0});
}

TEST_F(SafetensorsZeroElementsTest, ProductOverflowBeforeTheZeroDimensionIsCorruption) {
  for (const std::string& shape :
       {fmt::format("[{0}, {0}, 0]", kMax), fmt::format("[{0}, {0}, 0]", k2p62),
        fmt::format("[{}, 2, 0]", kMax), fmt::format("[{}, {}, 0]", int64_t{1} << 32, 1u << 31)}) {
    SCOPED_TRACE(shape);
    EXPECT_THAT(Load(OneTensorFile("F32", shape, "[0, 0]")),
                StatusIs(StatusCode::kCorruption, "tensor \"t\": shape"));
  }
}

TEST_F(SafetensorsZeroElementsTest, DimensionsOutsideInt64AreCorruption) {
  for (const std::string& shape :
       {std::string("[9223372036854775808, 0]"), std::string("[18446744073709551615, 0]"),
        std::string("[0, 18446744073709551616]"), std::string("[-1, 0]"),
        std::string("[0, -9223372036854775808]")}) {
    SCOPED_TRACE(shape);
    EXPECT_THAT(Load(OneTensorFile("F32", shape, "[0, 0]")),
                StatusIs(StatusCode::kCorruption, "tensor \"t\": shape"));
  }
}

TEST_F(SafetensorsZeroElementsTest, OffsetsNearU64MaxAreCorruption) {
  const uint64_t top = std::numeric_limits<uint64_t>::max();
  const std::string m = std::to_string(kMax);
  // A zero-element tensor placed past the end: a hole before it.
  EXPECT_THAT(Load(OneTensorFile("F32", fmt::format("[0, {}]", m), fmt::format("[{0}, {0}]", top))),
              StatusIs(StatusCode::kCorruption, "hole of 18446744073709551615 bytes"));
  EXPECT_THAT(Load(OneTensorFile("U8", "[0]", fmt::format("[{0}, {0}]", top - 1))),
              StatusIs(StatusCode::kCorruption, "hole"));
  // A span whose length matches no shape (2^64 - 1 bytes), and one reversed.
  EXPECT_THAT(Load(OneTensorFile("U8", fmt::format("[{}]", m), fmt::format("[0, {}]", top))),
              StatusIs(StatusCode::kCorruption, "needs 9223372036854775807 bytes"));
  EXPECT_THAT(Load(OneTensorFile("U8", "[0]", fmt::format("[{}, 0]", top))),
              StatusIs(StatusCode::kCorruption, "data_offsets"));
  // The largest byte count a shape can claim, for a file that holds 4 bytes.
  EXPECT_THAT(Load(OneTensorFile("U8", fmt::format("[{}]", m), fmt::format("[0, {}]", m), "abcd")),
              StatusIs(StatusCode::kCorruption, "truncated"));
}

}  // namespace
}  // namespace savepoint
