// The retention rules (manager/retention.h): which committed checkpoints a policy deletes.
#include "manager/retention.h"

#include <algorithm>

#include "testutil/testutil.h"

namespace savepoint {
namespace {

using Names = std::vector<std::string>;

CheckpointRecord Rec(std::string name, int64_t step, int64_t minute, Metrics metrics = {}) {
  CheckpointRecord r;
  r.name = std::move(name);
  r.step = step;
  r.created_ns = minute * 60'000'000'000LL;
  r.metrics = std::move(metrics);
  return r;
}

std::vector<CheckpointRecord> Ten() {
  std::vector<CheckpointRecord> rs;
  for (int i = 1; i <= 10; ++i) {
    rs.push_back(Rec("c" + std::to_string(i), i * 10, i, {{"loss", 10.0 - (i % 4)}}));
  }
  return rs;
}

manager::Policy Keep(int64_t last) {
  manager::Policy p;
  p.keep_last_n = last;
  return p;
}

TEST(ManagerRetention, KeepLastN) {
  EXPECT_EQ(manager::SelectForDeletion(Ten(), Keep(8)), (Names{"c1", "c2"}));
  EXPECT_TRUE(manager::SelectForDeletion(Ten(), Keep(20)).empty());
  manager::Policy all = Keep(1);
  all.keep_all = true;
  EXPECT_TRUE(manager::SelectForDeletion(Ten(), all).empty());
}

TEST(ManagerRetention, NewestIsNeverDeleted) {
  manager::Policy p = Keep(0);
  p.keep_every_n_steps = 1000;  // keeps nothing by itself
  std::vector<std::string> gone = manager::SelectForDeletion(Ten(), p);
  EXPECT_EQ(gone.size(), 9u);
  EXPECT_EQ(std::count(gone.begin(), gone.end(), "c10"), 0);
  EXPECT_TRUE(manager::SelectForDeletion({Rec("only", 1, 1)}, p).empty());
}

TEST(ManagerRetention, KeepOnePerNMinutes) {
  manager::Policy p = Keep(0);
  p.keep_per_minutes = 3;  // created at minutes 1..10: keep 1, 4, 7, 10
  EXPECT_EQ(manager::SelectForDeletion(Ten(), p), (Names{"c2", "c3", "c5", "c6", "c8", "c9"}));
}

TEST(ManagerRetention, KeepEveryKthStepPlusLast) {
  manager::Policy p = Keep(2);
  p.keep_every_n_steps = 40;  // steps 40, 80
  EXPECT_EQ(manager::SelectForDeletion(Ten(), p), (Names{"c1", "c2", "c3", "c5", "c6", "c7"}));
}

TEST(ManagerRetention, KeepBestKByMetric) {
  manager::Policy p = Keep(1);
  p.keep_best_n = 2;
  p.best_metric = "loss";  // loss = 10 - i%4: minimum 7 at i = 3, 7
  EXPECT_EQ(manager::SelectForDeletion(Ten(), p),
            (Names{"c1", "c2", "c4", "c5", "c6", "c8", "c9"}));
  p.best_mode = MetricMode::kMax;  // maximum 10 at i = 4, 8
  EXPECT_EQ(manager::SelectForDeletion(Ten(), p),
            (Names{"c1", "c2", "c3", "c5", "c6", "c7", "c9"}));
  p.best_metric = "accuracy";  // nobody has it: only the last
  EXPECT_EQ(manager::SelectForDeletion(Ten(), p).size(), 9u);
}

}  // namespace
}  // namespace savepoint
