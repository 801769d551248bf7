// The tiling check's grid path (GridOrder) against its sweep (CheckBoxTiling without the grid).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "format/manifest_checks.h"
#include "format/manifest_index.h"
#include "testutil/testutil.h"

namespace savepoint::format {
namespace {

using Box = std::vector<int64_t>;  // offsets, then sizes

std::vector<int64_t> Flatten(const std::vector<Box>& boxes) {
  std::vector<int64_t> flat;
  for (const Box& b : boxes) flat.insert(flat.end(), b.begin(), b.end());
  return flat;
}

// The cells of the grid of `shape` cut at `cuts` (each dimension's starts, 0 first).
std::vector<Box> Grid(const Shape& shape, const std::vector<std::vector<int64_t>>& cuts) {
  std::vector<Box> out(1);
  for (size_t d = 0; d < shape.size(); ++d) {
    std::vector<Box> next;
    for (const Box& b : out) {
      for (size_t i = 0; i < cuts[d].size(); ++i) {
        Box c = b;
        c.push_back(cuts[d][i]);
        c.push_back((i + 1 < cuts[d].size() ? cuts[d][i + 1] : shape[d]) - cuts[d][i]);
        next.push_back(c);
      }
    }
    out = std::move(next);
  }
  for (Box& b : out) {  // (offset, size) pairs -> offsets, then sizes
    Box flat(b.size());
    for (size_t d = 0; d < shape.size(); ++d) {
      flat[d] = b[2 * d];
      flat[shape.size() + d] = b[2 * d + 1];
    }
    b = flat;
  }
  return out;
}

Status Sweep(const Shape& shape, const std::vector<Box>& boxes, bool grid = false) {
  const std::vector<int64_t> flat = Flatten(boxes);
  return internal::CheckBoxTiling(shape, flat.data(), boxes.size(), internal::Ctx{"test"}, "t",
                                  true, grid);
}

bool IsGrid(const Shape& shape, const std::vector<Box>& boxes, std::vector<uint32_t>* order) {
  const std::vector<int64_t> flat = Flatten(boxes);
  return GridOrder(shape, flat.data(), boxes.size(), order);
}

TEST(Tiling, GridOrderOrdersAShuffledGridByItsOffsets) {
  const Shape shape = {6, 10, 4};
  std::vector<Box> boxes = Grid(shape, {{0, 2, 5}, {0, 3, 7, 9}, {0, 1}});
  const std::vector<Box> sorted = boxes;  // (Grid builds them in row-major order)
  std::mt19937_64 rng(7);
  std::shuffle(boxes.begin(), boxes.end(), rng);
  std::vector<uint32_t> order;
  ASSERT_TRUE(IsGrid(shape, boxes, &order));
  ASSERT_EQ(order.size(), sorted.size());
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(boxes[order[i]], sorted[i]) << i;
  EXPECT_TRUE(Sweep(shape, boxes).ok());

  // A scalar's one box; a tensor of one dimension cut in three.
  ASSERT_TRUE(IsGrid({}, {Box{}}, &order));
  EXPECT_EQ(order, std::vector<uint32_t>{0});
  ASSERT_TRUE(IsGrid({9}, {{5, 4}, {0, 2}, {2, 3}}, &order));
  EXPECT_EQ(order, (std::vector<uint32_t>{1, 2, 0}));
}

// Each layout is not a grid; the sweep gives the verdict (and CheckBoxTiling with the grid path
// gives the same one).
TEST(Tiling, WhatIsNotAGridIsSwept) {
  struct Case {
    const char* what;
    Shape shape;
    std::vector<Box> boxes;
    bool tiles;
  };
  const std::vector<Case> cases = {
      {"tiles, but as an L", {4, 4}, {{0, 0, 2, 4}, {2, 0, 2, 2}, {2, 2, 2, 2}}, true},
      {"a cell missing", {4, 4}, {{0, 0, 2, 2}, {0, 2, 2, 2}, {2, 0, 2, 2}}, false},
      {"a cell twice", {4, 4}, {{0, 0, 2, 2}, {0, 2, 2, 2}, {2, 0, 2, 2}, {0, 0, 2, 2}}, false},
      {"past the shape", {4}, {{0, 2}, {2, 3}}, false},
      {"first cut not at 0", {4}, {{1, 3}}, false},
      {"a negative offset", {4}, {{-1, 1}, {0, 4}}, false},
      {"a box short of its cell",
       {4, 4},
       {{0, 0, 2, 2}, {0, 2, 2, 1}, {2, 0, 2, 2}, {2, 2, 2, 2}},
       false},
      {"an empty tensor", {0, 4}, {{0, 0, 0, 4}}, true},
      {"no boxes", {4}, {}, false},
  };
  for (const Case& c : cases) {
    std::vector<uint32_t> order;
    EXPECT_FALSE(IsGrid(c.shape, c.boxes, &order)) << c.what;
    const Status swept = Sweep(c.shape, c.boxes);
    EXPECT_EQ(swept.ok(), c.tiles) << c.what << ": " << swept.ToString();
    EXPECT_EQ(Sweep(c.shape, c.boxes, true).ToString(), swept.ToString()) << c.what;
  }
}

// 40 cut points that all hash to one slot of GridOrder's table: it gives up (a hostile layout
// must not make it quadratic) and the sweep still finds that they tile.
TEST(Tiling, CollidingOffsetsAreLeftToTheSweep) {
  std::vector<int64_t> cuts = {0};
  const int shift = 64 - 7;  // (slot 0 of 128 is slot 0 of every smaller table too)
  const uint64_t slot = (uint64_t{0} * 0x9e3779b97f4a7c15u) >> shift;
  for (int64_t v = 1; cuts.size() < 40; ++v) {
    if ((static_cast<uint64_t>(v) * 0x9e3779b97f4a7c15u) >> shift == slot) cuts.push_back(v);
  }
  const Shape shape = {cuts.back() + 1};
  const std::vector<Box> boxes = Grid(shape, {cuts});
  std::vector<uint32_t> order;
  EXPECT_FALSE(IsGrid(shape, boxes, &order));
  EXPECT_TRUE(Sweep(shape, boxes, true).ok());
}

// Random grids, shuffled, and some broken by one change: whenever GridOrder says grid, the sweep
// says they tile and the order is by offsets; CheckBoxTiling's verdict is the sweep's either way.
TEST(Tiling, GridOrderAgreesWithTheSweep) {
  const uint64_t seed = testing::TestSeed("Tiling.GridOrderAgreesWithTheSweep");
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  int grids = 0, broken = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    Shape shape;
    std::vector<std::vector<int64_t>> cuts;
    for (int64_t d = 0, nd = pick(1, 3); d < nd; ++d) {
      shape.push_back(pick(1, 12));
      std::vector<int64_t> at = {0};
      for (int64_t v = 1; v < shape.back(); ++v) {
        if (pick(0, 2) == 0) at.push_back(v);
      }
      cuts.push_back(at);
    }
    std::vector<Box> boxes = Grid(shape, cuts);
    std::shuffle(boxes.begin(), boxes.end(), rng);
    if (pick(0, 1) == 1) {  // one change
      Box& b = boxes[pick(0, static_cast<int64_t>(boxes.size()) - 1)];
      switch (pick(0, 3)) {
        case 0:
          b[pick(0, static_cast<int64_t>(b.size()) - 1)] += pick(0, 1) ? 1 : -1;
          break;
        case 1:
          boxes.pop_back();
          break;
        case 2:
          boxes.push_back(boxes.front());
          break;
        default:
          std::swap(b, boxes.front());
          break;  // (still a grid)
      }
    }
    std::vector<uint32_t> order;
    const bool grid = IsGrid(shape, boxes, &order);
    const Status swept = Sweep(shape, boxes);
    EXPECT_EQ(Sweep(shape, boxes, true).ToString(), swept.ToString()) << trial;
    if (!grid) {
      broken += !swept.ok();
      continue;
    }
    ++grids;
    EXPECT_TRUE(swept.ok()) << trial << ": " << swept.ToString();
    std::vector<uint32_t> sorted(boxes.size());
    std::iota(sorted.begin(), sorted.end(), 0u);
    std::sort(sorted.begin(), sorted.end(),
              [&](uint32_t x, uint32_t y) { return boxes[x] < boxes[y]; });
    EXPECT_EQ(order, sorted) << trial;
  }
  EXPECT_GT(grids, 1000);
  EXPECT_GT(broken, 200);
}

}  // namespace
}  // namespace savepoint::format
