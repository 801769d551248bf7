// Communicators (single process, thread group) and layout helpers.
#include "savepoint/comm.h"

#include <gtest/gtest.h>

#include <thread>

#include "distributed/shard.h"
#include "engine/box.h"
#include "savepoint/distributed.h"
#include "testutil/ranks.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

using namespace std::chrono_literals;

using testing::OnRanks;

TEST(ThreadCommTest, CollectivesWithVariableSizes) {
  auto st = OnRanks(5, [](Communicator& c) -> Status {
    for (int round = 0; round < 20; ++round) {
      std::string mine(c.rank() * 3 + round, static_cast<char>('a' + c.rank()));
      SP_ASSIGN_OR_RETURN(auto all, c.AllGather(mine, 5s));
      for (int r = 0; r < c.size(); ++r) {
        if (all[r] != std::string(r * 3 + round, static_cast<char>('a' + r))) {
          return InternalError("allgather mismatch");
        }
      }
      std::string b = c.rank() == round % 5 ? "from root " + std::to_string(round) : "";
      SP_RETURN_IF_ERROR(c.Broadcast(&b, round % 5, 5s));
      if (b != "from root " + std::to_string(round)) return InternalError("broadcast: " + b);
      SP_ASSIGN_OR_RETURN(auto g, c.Gather(mine, 2, 5s));
      if (g.size() != (c.rank() == 2 ? 5u : 0u)) return InternalError("gather size");
      SP_RETURN_IF_ERROR(c.Barrier(5s));
    }
    return Status::OK();
  });
  for (const auto& s : st) SP_EXPECT_OK(s);
}

TEST(ThreadCommTest, TimeoutNamesMissingRanksAndBreaksGroup) {
  auto st = OnRanks(4, [](Communicator& c) -> Status {
    if (c.rank() == 2) return Status::OK();  // never joins
    return c.Barrier(c.rank() == 0 ? 200ms : 5s);
  });
  EXPECT_THAT(st[0], StatusIs(StatusCode::kDeadlineExceeded, "Barrier"));
  EXPECT_NE(st[0].message().find("ranks [2]"), std::string::npos) << st[0].ToString();
  // The others were waiting with a longer timeout: the broken group wakes them.
  EXPECT_THAT(st[1], StatusIs(StatusCode::kDeadlineExceeded));
  EXPECT_THAT(st[3], StatusIs(StatusCode::kDeadlineExceeded));
}

// Who waits for whom, as with MPI's point-to-point collectives: a gather's non-roots and a
// broadcast's root do not wait; a broadcast's non-roots wait only for the root.
TEST(ThreadCommTest, GatherSendersAndBroadcastRootDoNotWait) {
  auto st = OnRanks(3, [](Communicator& c) -> Status {
    if (c.rank() == 2) return Status::OK();  // never joins
    SP_ASSIGN_OR_RETURN(auto g, c.Gather("x", 0, c.rank() == 0 ? 200ms : 5s));
    if (c.rank() == 0) return InternalError("root's gather returned without rank 2");
    std::string b = "b";
    SP_RETURN_IF_ERROR(c.Broadcast(&b, 1, 5s));  // rank 1, root: does not wait
    return c.rank() == 1 ? Status::OK() : InternalError("unexpected");
  });
  EXPECT_THAT(st[0], StatusIs(StatusCode::kDeadlineExceeded, "ranks [2]"));
  SP_EXPECT_OK(st[1]);
  auto bc = OnRanks(3, [](Communicator& c) -> Status {
    if (c.rank() == 2) return Status::OK();  // never joins
    if (c.rank() == 0) std::this_thread::sleep_for(50ms);
    std::string b = c.rank() == 0 ? "hello" : "";
    SP_RETURN_IF_ERROR(c.Broadcast(&b, 0, 5s));
    return b == "hello" ? Status::OK() : InternalError("got " + b);
  });
  SP_EXPECT_OK(bc[0]);
  SP_EXPECT_OK(bc[1]);
  auto late = OnRanks(2, [](Communicator& c) -> Status {
    if (c.rank() == 0) return Status::OK();  // the root never comes
    std::string b;
    return c.Broadcast(&b, 0, 100ms);
  });
  EXPECT_NE(late[1].message().find("ranks [0]"), std::string::npos) << late[1].ToString();
}

TEST(ThreadCommTest, AbortReachesEveryRank) {
  auto st = OnRanks(3, [](Communicator& c) -> Status {
    if (c.rank() == 1) {
      c.Abort(IOError("disk on fire"));
      return c.Barrier(5s);
    }
    return c.AllGather("x", 30s).status();
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_THAT(st[r], StatusIs(StatusCode::kIOError, "rank 1 aborted"));
    EXPECT_NE(st[r].message().find("disk on fire"), std::string::npos) << st[r].ToString();
  }
}

TEST(ThreadCommTest, MismatchedCollectivesFail) {
  auto st = OnRanks(2, [](Communicator& c) -> Status {
    if (c.rank() == 0) return c.Barrier(5s);
    return c.AllGather("x", 5s).status();
  });
  EXPECT_FALSE(st[0].ok());
  EXPECT_FALSE(st[1].ok());
  EXPECT_NE(st[0].message().find("called"), std::string::npos) << st[0].ToString();
}

TEST(SingleProcessCommTest, Collectives) {
  auto c = NewSingleProcessCommunicator();
  EXPECT_EQ(c->size(), 1);
  SP_EXPECT_OK(c->Barrier(1s));
  std::string b = "x";
  SP_EXPECT_OK(c->Broadcast(&b, 0, 1s));
  EXPECT_EQ(b, "x");
  auto all = c->AllGather("y", 1s);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, std::vector<std::string>{"y"});
  EXPECT_FALSE(c->Broadcast(&b, 1, 1s).ok());
  c->Abort(IOError("gone"));
  EXPECT_THAT(c->Barrier(1s), StatusIs(StatusCode::kIOError));
}

TEST(LayoutTest, SplitDimUneven) {
  std::vector<int64_t> offs, sizes;
  for (int i = 0; i < 4; ++i) {
    auto s = SplitDim({10, 3}, 0, 4, i);
    ASSERT_TRUE(s.ok());
    offs.push_back(s->offsets[0]);
    sizes.push_back(s->sizes[0]);
    EXPECT_EQ(s->sizes[1], 3);
  }
  EXPECT_EQ(offs, (std::vector<int64_t>{0, 2, 5, 7}));
  EXPECT_EQ(sizes, (std::vector<int64_t>{2, 3, 2, 3}));
  EXPECT_THAT(SplitDim({10}, 1, 2, 0), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(SplitDim({10}, 0, 2, 2), StatusIs(StatusCode::kInvalidArgument));
}

TEST(LayoutTest, ValidateLayoutsRejectsOverlapGapsAndBounds) {
  auto half = [](int i) { return SplitDim({8, 2}, 0, 2, i).value(); };
  std::vector<ShardLayout> good = {{{"w", half(0)}}, {{"w", half(1)}}};
  SP_EXPECT_OK(ValidateLayouts(good));
  std::vector<ShardLayout> overlap = {{{"w", half(0)}}, {{"w", half(0)}}};
  Status s = ValidateLayouts(overlap);
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "\"w\""));
  ShardSpec short1 = half(1);
  short1.sizes[0] = 3;
  s = ValidateLayouts({{{"w", half(0)}}, {{"w", short1}}});
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "cover"));
  ShardSpec out = half(1);
  out.offsets[0] = 6;
  s = ValidateLayouts({{{"w", half(0)}}, {{"w", out}}});
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "outside"));
  ShardSpec bad_rep = half(0);
  bad_rep.replicas = {0, 1};  // rank 1 holds another box
  s = ValidateLayouts({{{"w", bad_rep}}, {{"w", half(1)}}});
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
}

TEST(LayoutTest, AssignWritesBalancesBytesAndCoversEachShardOnce) {
  // 6 tensors replicated on ranks {1, 3, 4}: every member computes the same assignment.
  std::vector<std::byte> mem(64 * 8);
  std::vector<dist::LocalShard> shards;
  for (int i = 0; i < 6; ++i) {
    Shape shape{int64_t{8} * (i + 1)};
    shards.push_back({"t" + std::to_string(i), TensorView(mem.data(), DType::kU8, shape),
                      ShardSpec{shape, {0}, shape, {1, 3, 4}}});
  }
  std::vector<int> owner(6, -1);
  std::vector<uint64_t> load(5);
  for (int r : {1, 3, 4}) {
    for (size_t i : dist::AssignWrites(shards, r)) {
      EXPECT_EQ(owner[i], -1) << "shard " << i << " written twice";
      owner[i] = r;
      load[r] += shards[i].view.nbytes();
    }
  }
  for (int o : owner) EXPECT_NE(o, -1);
  EXPECT_EQ(load[1] + load[3] + load[4], 8u * 21);
  EXPECT_LE(std::max({load[1], load[3], load[4]}) - std::min({load[1], load[3], load[4]}), 48u);
}

TEST(RegionTest, CopyRegionAndByteRuns) {
  // A 4x5 source; copy its box rows 1..3, cols 2..5 into a 3x4 destination at (1, 0).
  std::vector<uint8_t> src(20), dst(12, 0);
  for (int i = 0; i < 20; ++i) src[i] = static_cast<uint8_t>(i);
  Shape ss{4, 5}, so{1, 2}, ds{3, 4}, dof{1, 0};
  engine::CopyRegion({reinterpret_cast<std::byte*>(src.data()), ss, so, 0},
                     {reinterpret_cast<std::byte*>(dst.data()), ds, dof, 0}, {2, 3}, 1);
  std::vector<uint8_t> want = {0, 0, 0, 0, 7, 8, 9, 0, 12, 13, 14, 0};
  EXPECT_EQ(dst, want);
  auto runs = engine::BoxByteRuns(ss, so, {2, 3}, 2, 100);
  EXPECT_EQ(runs, (std::vector<std::pair<uint64_t, uint64_t>>{{14, 20}, {24, 30}}));
  runs = engine::BoxByteRuns(ss, {1, 0}, {2, 5}, 1, 100);  // whole rows merge
  EXPECT_EQ(runs, (std::vector<std::pair<uint64_t, uint64_t>>{{5, 15}}));
  runs = engine::BoxByteRuns(ss, so, {2, 3}, 1, 1);  // capped: one spanning range
  EXPECT_EQ(runs, (std::vector<std::pair<uint64_t, uint64_t>>{{7, 15}}));
}

}  // namespace
}  // namespace savepoint
