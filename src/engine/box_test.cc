// Tests of engine::CopyRegion (a dense box into a whole tensor, as Load places a stored shard)
// against a naive element-by-element reference.
#include "engine/box.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "testutil/testutil.h"

namespace savepoint::engine {
namespace {

// Copies element by element: the box element at box index b goes to global index offsets + b.
void NaiveCopy(const std::byte* src, const Shape& offsets, const Shape& sizes, std::byte* dst,
               const Shape& shape, size_t elem) {
  size_t rank = shape.size();
  int64_t count = NumElements(sizes).value();
  std::vector<int64_t> b(rank, 0);
  for (int64_t n = 0; n < count; ++n) {
    // Global linear index of box element b.
    int64_t g = 0;
    for (size_t d = 0; d < rank; ++d) g = g * shape[d] + offsets[d] + b[d];
    std::memcpy(dst + g * elem, src + n * elem, elem);
    for (size_t d = rank; d-- > 0;) {  // next box index, C order
      if (++b[d] < sizes[d]) break;
      b[d] = 0;
    }
  }
}

// The dense box `src` of shape `sizes` into `dst` (shape `shape`) at `offsets`, as Load does.
void CopyRegionInto(const std::byte* src, const Shape& offsets, const Shape& sizes, std::byte* dst,
                    const Shape& shape, size_t elem) {
  const Shape origin(sizes.size(), 0);
  CopyRegion({const_cast<std::byte*>(src), sizes, origin, 0}, {dst, shape, offsets, 0}, sizes,
             elem);
}

std::vector<std::byte> Pattern(size_t n, std::mt19937_64& rng) {
  std::vector<std::byte> v(n);
  for (auto& x : v) x = static_cast<std::byte>(rng());
  return v;
}

// Runs both copies into equal pre-filled destinations and compares them (and the guard bytes).
::testing::AssertionResult SameAsNaive(const Shape& shape, const Shape& offsets, const Shape& sizes,
                                       size_t elem, std::mt19937_64& rng) {
  uint64_t total = NumElements(shape).value() * elem;
  uint64_t box = NumElements(sizes).value() * elem;
  constexpr size_t kGuard = 64;
  std::vector<std::byte> src = Pattern(box + kGuard, rng);
  std::vector<std::byte> expect = Pattern(total + 2 * kGuard, rng);
  std::vector<std::byte> got = expect;
  NaiveCopy(src.data(), offsets, sizes, expect.data() + kGuard, shape, elem);
  CopyRegionInto(src.data(), offsets, sizes, got.data() + kGuard, shape, elem);
  if (got != expect) {
    size_t i = 0;
    while (got[i] == expect[i]) ++i;
    return ::testing::AssertionFailure()
           << fmt::format("shape {} offsets {} sizes {} elem {}: first difference at byte {}",
                          ShapeToString(shape), ShapeToString(offsets), ShapeToString(sizes), elem,
                          static_cast<int64_t>(i) - static_cast<int64_t>(kGuard));
  }
  return ::testing::AssertionSuccess();
}

TEST(CopyBox, FixedCases) {
  std::mt19937_64 rng(1);
  // Whole tensor, a row, a column, a corner, scalars, zero-size boxes.
  EXPECT_TRUE(SameAsNaive({4, 5}, {0, 0}, {4, 5}, 4, rng));
  EXPECT_TRUE(SameAsNaive({4, 5}, {2, 0}, {1, 5}, 4, rng));
  EXPECT_TRUE(SameAsNaive({4, 5}, {0, 3}, {4, 1}, 2, rng));
  EXPECT_TRUE(SameAsNaive({4, 5}, {3, 4}, {1, 1}, 8, rng));
  EXPECT_TRUE(SameAsNaive({}, {}, {}, 16, rng));
  EXPECT_TRUE(SameAsNaive({7}, {2}, {5}, 1, rng));
  EXPECT_TRUE(SameAsNaive({7}, {7}, {0}, 1, rng));
  EXPECT_TRUE(SameAsNaive({4, 5}, {1, 1}, {0, 3}, 4, rng));
  EXPECT_TRUE(SameAsNaive({4, 5}, {1, 1}, {3, 0}, 4, rng));
  EXPECT_TRUE(SameAsNaive({0, 5}, {0, 0}, {0, 5}, 4, rng));
  EXPECT_TRUE(SameAsNaive({2, 3, 4, 5}, {1, 1, 1, 1}, {1, 2, 3, 4}, 2, rng));
  EXPECT_TRUE(SameAsNaive({1, 1, 1, 1, 1}, {0, 0, 0, 0, 0}, {1, 1, 1, 1, 1}, 1, rng));
}

TEST(CopyBox, ZeroSizeBoxWritesNothing) {
  std::vector<std::byte> dst(20 * 4, std::byte{0x5a});
  std::vector<std::byte> before = dst;
  CopyRegionInto(nullptr, {2, 0}, {0, 5}, dst.data(), {4, 5}, 4);
  CopyRegionInto(nullptr, {0, 5}, {4, 0}, dst.data(), {4, 5}, 4);
  EXPECT_EQ(dst, before);
}

TEST(CopyBox, RandomBoxes) {
  uint64_t seed = savepoint::testing::TestSeed("CopyBox.RandomBoxes");
  std::mt19937_64 rng(seed);
  const size_t kElem[] = {1, 2, 4, 8, 16};
  for (int round = 0; round < 3000; ++round) {
    size_t rank = rng() % 5;  // 0..4
    size_t elem = kElem[rng() % 5];
    Shape shape(rank), offsets(rank), sizes(rank);
    for (size_t d = 0; d < rank; ++d) {
      shape[d] = static_cast<int64_t>(rng() % 7);  // 0..6
      if (rng() % 8 == 0 && shape[d] > 0) {
        offsets[d] = 0;
        sizes[d] = shape[d];  // full extent in this dimension
      } else {
        offsets[d] = static_cast<int64_t>(rng() % (shape[d] + 1));
        sizes[d] = static_cast<int64_t>(rng() % (shape[d] - offsets[d] + 1));
      }
    }
    ASSERT_TRUE(SameAsNaive(shape, offsets, sizes, elem, rng)) << "round " << round;
  }
}

TEST(CopyBox, TilingReassemblesTensor) {
  // Cut a [6, 5, 4] tensor into 2 x 3 x 2 boxes, copy each into a fresh tensor: the result is the
  // original.
  const Shape shape{6, 5, 4};
  const std::vector<std::vector<int64_t>> cuts = {{0, 2, 6}, {0, 1, 3, 5}, {0, 3, 4}};
  std::vector<uint32_t> global(6 * 5 * 4);
  for (size_t i = 0; i < global.size(); ++i) global[i] = static_cast<uint32_t>(i * 2654435761u);
  std::vector<uint32_t> out(global.size(), 0);
  for (size_t a = 0; a + 1 < cuts[0].size(); ++a) {
    for (size_t b = 0; b + 1 < cuts[1].size(); ++b) {
      for (size_t c = 0; c + 1 < cuts[2].size(); ++c) {
        Shape off{cuts[0][a], cuts[1][b], cuts[2][c]};
        Shape size{cuts[0][a + 1] - off[0], cuts[1][b + 1] - off[1], cuts[2][c + 1] - off[2]};
        std::vector<uint32_t> box;
        for (int64_t i = 0; i < size[0]; ++i) {
          for (int64_t j = 0; j < size[1]; ++j) {
            for (int64_t k = 0; k < size[2]; ++k) {
              box.push_back(global[((off[0] + i) * 5 + off[1] + j) * 4 + off[2] + k]);
            }
          }
        }
        CopyRegionInto(reinterpret_cast<const std::byte*>(box.data()), off, size,
                       reinterpret_cast<std::byte*>(out.data()), shape, 4);
      }
    }
  }
  EXPECT_EQ(out, global);
}

}  // namespace
}  // namespace savepoint::engine
