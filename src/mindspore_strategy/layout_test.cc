// Tests of MindSpore device-matrix layouts (layout.cc): boxes and replica groups per rank, and
// the layouts refused.
#include <gtest/gtest.h>

#include "savepoint/mindspore_strategy.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

TEST(MindSporeLayoutTest, DeviceMatrix) {
  // D=[2,4], map=[1,-1], shape [32,32]: ranks 0-3 hold rows 0:16, ranks 4-7 rows 16:32.
  MindSporeLayout l{{2, 4}, {1, -1}};
  for (int r = 0; r < 8; ++r) {
    auto s = ShardFromLayout({32, 32}, l, r);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(s->offsets, (Shape{r < 4 ? 0 : 16, 0}));
    EXPECT_EQ(s->sizes, (Shape{16, 32}));
    EXPECT_EQ(s->replicas, r < 4 ? (std::vector<int>{0, 1, 2, 3}) : (std::vector<int>{4, 5, 6, 7}));
  }
  // With optimizer sharding k=2, step 1: {0,2} rows 0:8, {1,3} 8:16, {4,6} 16:24, {5,7} 24:32.
  l.opt_shard_size = 2;
  int64_t want[8] = {0, 8, 0, 8, 16, 24, 16, 24};
  for (int r = 0; r < 8; ++r) {
    auto s = ShardFromLayout({32, 32}, l, r);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(s->offsets[0], want[r]) << "rank " << r;
    EXPECT_EQ(s->sizes[0], 8);
    EXPECT_EQ(s->replicas.size(), 2u);
  }
  EXPECT_FALSE(ShardFromLayout({32, 32}, {{2, 4}, {1, 1}}, 0).ok());   // axis used twice
  EXPECT_FALSE(ShardFromLayout({32, 32}, {{2, 4}, {2, -1}}, 0).ok());  // no such axis
  EXPECT_FALSE(ShardFromLayout({32, 32}, {{2, 4}, {1, -1}}, 8).ok());  // rank outside
}

}  // namespace
}  // namespace savepoint
