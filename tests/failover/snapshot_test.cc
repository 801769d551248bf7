// Shared-memory snapshots (docs/FAILOVER.md, "Snapshots"): with data parallel = 1 a dead rank has
// no replica, and its part of the dump comes from its last committed snapshot. In-process jobs of
// harness.h; the snapshot directory is a test directory (tmpfs is not needed for correctness).
#include "failover/rpc/snapshot.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include "failover/harness.h"
#include "savepoint/manager.h"
#include "savepoint/sparse.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

using namespace failover_harness;
namespace fs = std::filesystem;

// Data parallel = 1: rank r alone holds rows [r * kElems, (r + 1) * kElems) of w.
void OwnSlices(std::vector<Rank>& ranks) {
  const int world = static_cast<int>(ranks.size());
  for (int r = 0; r < world; ++r) {
    ranks[r].layout["w"] = SplitDim({world * kElems}, 0, world, r, {r}).value();
    ranks[r].groups = {{r}};
  }
}

// The collective the ranks join after every step (as tensor parallelism's all-reduces): it keeps
// them in step; a rank whose peer died waits in it until the timeout, then gives up.
class Lockstep {
 public:
  explicit Lockstep(int world) : world_(world) {}
  bool Arrive(int64_t step) {
    std::unique_lock lock(mu_);
    ++arrived_[step];
    cv_.notify_all();
    return cv_.wait_for(lock, 1500ms, [&] { return arrived_[step] == world_; });
  }

 private:
  const int world_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int64_t, int> arrived_;
};

// The job's snapshot run directory under `base` ("" when there is none).
std::string RunDir(const std::string& base) {
  if (!fs::exists(base)) return "";
  for (const auto& e : fs::directory_iterator(base)) {
    if (e.path().filename().string().starts_with("savepoint-snapshots-")) return e.path().string();
  }
  return "";
}

// The committed snapshot directories of `rank` (names), sorted.
std::vector<std::string> Snapshots(const std::string& base, int rank) {
  std::vector<std::string> out;
  const fs::path dir = fs::path(RunDir(base)) / ("rank_" + std::to_string(rank));
  if (RunDir(base).empty() || !fs::exists(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (fs::exists(e.path() / "MANIFEST")) out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Waits until `rank` committed its snapshot of `step` (a rank dying later keeps it).
void WaitForSnapshot(const std::string& base, int rank, int64_t step) {
  const std::string name = "step_" + std::to_string(step) + "_1_" + std::to_string(step);
  for (int i = 0; i < 2000; ++i) {
    std::vector<std::string> have = Snapshots(base, rank);
    if (std::find(have.begin(), have.end(), name) != have.end()) return;
    std::this_thread::sleep_for(5ms);
  }
  ADD_FAILURE() << "rank " << rank << " wrote no snapshot of step " << step;
}

// A rank of a lockstep job that dies after `step` once `ready` returns (e.g. its snapshot is in).
std::function<bool(Rank&)> LockstepDieAfter(Lockstep& ls, int64_t step,
                                            std::function<void(Rank&)> ready) {
  return [&ls, step, ready](Rank& r) {
    if (r.step < step) return ls.Arrive(r.step);
    ready(r);
    r.agent->Abandon();
    return false;
  };
}

void ExpectWeights(const std::string& dump, int64_t step, int rows) {
  SP_ASSERT_OK_AND_ASSIGN(State loaded, Load(dump));
  const TensorView* w = loaded.FindTensor("w");
  ASSERT_NE(w, nullptr);
  ASSERT_EQ(w->shape(), (Shape{rows}));
  for (int i = 0; i < rows; ++i) {
    EXPECT_EQ(reinterpret_cast<const float*>(w->data())[i], WeightAt(step, i)) << "row " << i;
  }
  EXPECT_EQ(loaded.FindValue("failover.step")->as_int(), step);
  EXPECT_EQ(loaded.FindValue("loader.position")->as_int(), step * 32);
}

TEST(SnapshotTest, RankWithoutReplicaIsDumpedFromItsSnapshot) {
  testing::TempDir dir, shm;
  std::vector<Rank> ranks(2);
  OwnSlices(ranks);
  Lockstep ls(2);
  ranks[0].at_step_end = [&ls](Rank& r) { return ls.Arrive(r.step); };
  ranks[1].at_step_end =
      LockstepDieAfter(ls, 6, [&](Rank& r) { WaitForSnapshot(shm.path(), r.rank, 6); });
  ControllerOptions co = Options(2, dir.path());
  co.snapshot_dir = shm.path();
  SP_ASSERT_OK_AND_ASSIGN(JobOutcome out, RunJob(ranks, co, 1000));
  ASSERT_TRUE(out.failure);
  EXPECT_EQ(out.failed_rank, 1);
  ASSERT_TRUE(out.dumped) << out.dump_status.ToString();
  EXPECT_EQ(out.dump_step, 6);
  EXPECT_EQ(out.writers, std::vector<int>{0});
  EXPECT_EQ(out.snapshot_writers, std::vector<int>{1});
  ExpectWeights(out.dump_path, 6, 2 * kElems);
  // The manager resumes from it, and the snapshots' memory was given back.
  ManagerOptions mo;
  mo.naming.directory = dir.path();
  SP_ASSERT_OK_AND_ASSIGN(auto manager, CheckpointManager::Open(mo));
  ASSERT_TRUE(manager->Latest().has_value());
  EXPECT_EQ(manager->Latest()->step, 6);
  EXPECT_EQ(RunDir(shm.path()), "");
}

TEST(SnapshotTest, WithoutSnapshotsTheSameFailureHasNoDump) {
  testing::TempDir dir;
  std::vector<Rank> ranks(2);
  OwnSlices(ranks);
  Lockstep ls(2);
  ranks[0].at_step_end = [&ls](Rank& r) { return ls.Arrive(r.step); };
  ranks[1].at_step_end = LockstepDieAfter(ls, 6, [](Rank&) {});
  SP_ASSERT_OK_AND_ASSIGN(JobOutcome out, RunJob(ranks, Options(2, dir.path()), 1000));
  ASSERT_TRUE(out.failure);
  EXPECT_FALSE(out.dumped);
  EXPECT_NE(out.dump_status.message().find("no replica"), std::string::npos)
      << out.dump_status.ToString();
}

// Ranks 0 and 1 on host "node-a", rank 2 on "node-b" (neither the controller's host), data
// parallel = 1 and kept in step; `victim` dies after its snapshot of step 6 was reported.
Result<JobOutcome> RunOnTwoHosts(const std::string& dir, const std::string& shm, int victim) {
  std::vector<Rank> ranks(3);
  OwnSlices(ranks);
  Lockstep ls(3);
  for (int r = 0; r < 3; ++r) {
    ranks[r].host = r < 2 ? "node-a" : "node-b";
    ranks[r].at_step_end = [&ls](Rank& me) { return ls.Arrive(me.step); };
  }
  ranks[victim].at_step_end = LockstepDieAfter(ls, 6, [&](Rank& me) {
    WaitForSnapshot(shm, me.rank, 6);
    std::this_thread::sleep_for(200ms);  // a heartbeat reports it
  });
  ControllerOptions co = Options(3, dir);
  co.snapshot_dir = shm;
  return RunJob(ranks, co, 1000);
}

TEST(SnapshotTest, SurvivorOfTheDeadRanksHostWritesItsSnapshot) {
  testing::TempDir dir, shm;
  SP_ASSERT_OK_AND_ASSIGN(JobOutcome out, RunOnTwoHosts(dir.path(), shm.path(), 1));
  ASSERT_TRUE(out.dumped) << out.dump_status.ToString();
  EXPECT_EQ(out.dump_step, 6);
  EXPECT_EQ(out.writers, (std::vector<int>{0, 2}));
  EXPECT_EQ(out.snapshot_writers, std::vector<int>{1});  // written by rank 0, its host-mate
  ExpectWeights(out.dump_path, 6, 3 * kElems);
}

TEST(SnapshotTest, DeadRankAloneOnItsHostHasNoReader) {
  testing::TempDir dir, shm;
  SP_ASSERT_OK_AND_ASSIGN(JobOutcome out, RunOnTwoHosts(dir.path(), shm.path(), 2));
  ASSERT_TRUE(out.failure);
  EXPECT_FALSE(out.dumped);
  EXPECT_NE(out.dump_status.message().find("no snapshot"), std::string::npos)
      << out.dump_status.ToString();
}

// A job of one rank under snapshots that dies after step `die_after`, once that step's snapshot
// is committed (no other is written after it) and `damage` has run on the run directory.
Result<JobOutcome> RunSingleRank(const std::string& dir, const std::string& shm, int64_t die_after,
                                 const std::function<void(const fs::path&)>& damage) {
  std::vector<Rank> ranks(1);
  ranks[0].at_step_end = [&](Rank& r) {
    if (r.step < die_after) return true;
    WaitForSnapshot(shm, 0, die_after);
    damage(RunDir(shm));
    r.agent->Abandon();
    return false;
  };
  ControllerOptions co = Options(1, dir);
  co.snapshot_dir = shm;
  return RunJob(ranks, co, 1000);
}

TEST(SnapshotTest, SingleRankJobIsDumpedFromItsSnapshotAlone) {
  testing::TempDir dir, shm;
  SP_ASSERT_OK_AND_ASSIGN(JobOutcome out,
                          RunSingleRank(dir.path(), shm.path(), 9, [](const fs::path&) {}));
  ASSERT_TRUE(out.dumped) << out.dump_status.ToString();
  EXPECT_EQ(out.dump_step, 9);
  EXPECT_TRUE(out.writers.empty());
  EXPECT_EQ(out.snapshot_writers, std::vector<int>{0});
  EXPECT_EQ(fs::path(out.dump_path).filename(), FailureDumpName("ckpt", 1, 9));
  ExpectWeights(out.dump_path, 9, kElems);
}

TEST(SnapshotTest, TornSnapshotIsNeverUsed) {
  testing::TempDir dir, shm;
  // The remains of a crash mid-snapshot.
  auto torn = [](const fs::path& run) {
    const fs::path rank_dir = run / "rank_0";
    fs::create_directories(rank_dir / "step_8_1_8");  // no MANIFEST: never committed
    std::ofstream(rank_dir / "step_8_1_8" / "data-0-00000.spd") << "torn";
    fs::create_directories(rank_dir / ".step_9_1_9.tmp-1234");  // a Save's temporary
  };
  SP_ASSERT_OK_AND_ASSIGN(JobOutcome out, RunSingleRank(dir.path(), shm.path(), 7, torn));
  ASSERT_TRUE(out.dumped) << out.dump_status.ToString();
  EXPECT_EQ(out.dump_step, 7);
  ExpectWeights(out.dump_path, 7, kElems);
}

TEST(SnapshotTest, CorruptSnapshotCommitsNothing) {
  testing::TempDir dir, shm;
  // Flips the first byte of w (the only tensor: its extent follows the 4096-byte header) in every
  // snapshot's data file.
  auto corrupt = [](const fs::path& run) {
    for (const auto& e : fs::recursive_directory_iterator(run)) {
      if (e.path().extension() != ".spd") continue;
      std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(4096);
      char c = 0;
      f.get(c);
      f.seekp(4096);
      f.put(static_cast<char>(c ^ 0x40));
    }
  };
  SP_ASSERT_OK_AND_ASSIGN(JobOutcome out, RunSingleRank(dir.path(), shm.path(), 5, corrupt));
  ASSERT_TRUE(out.failure);
  EXPECT_FALSE(out.dumped);
  EXPECT_NE(out.dump_status.message().find("snapshot"), std::string::npos)
      << out.dump_status.ToString();
  for (const auto& e : fs::directory_iterator(dir.path())) ADD_FAILURE() << "left " << e.path();
}

TEST(SnapshotTest, ReadSnapshotRefusesAForeignOrMalformedRecord) {
  testing::TempDir shm;
  std::vector<float> w(kElems, 1.0f);
  auto save = [&](const std::string& name, Json record) {
    State s;
    SP_ASSERT_OK(s.PutView("w", TensorView(w.data(), DType::kF32, {kElems})));
    s.metadata() = Json::object();
    if (!record.is_null()) s.metadata()["failover.snapshot"] = std::move(record);
    SP_ASSERT_OK(Save(s, shm.path() + "/rank_0/" + name));
  };
  save("step_3_1_3", Json());                                                     // no record
  save("step_4_1_4", {{"rank", 1}, {"world", 2}, {"layout", Json::object()}});    // another rank's
  save("step_5_1_5", {{"rank", 0}, {"world", 1}, {"layout", "rows"}});            // bad layout
  save("step_6_1_6", {{"rank", "0"}, {"world", 1}, {"layout", Json::object()}});  // bad rank
  failover::StepInfo at;
  for (int64_t step : {3, 4, 5, 6}) {
    Result<DumpSource> r = failover::ReadSnapshot(shm.path(), 0, step, &at, {});
    EXPECT_THAT(r, StatusIs(StatusCode::kCorruption)) << step << ": " << r.status().ToString();
  }
  EXPECT_EQ(failover::ReadSnapshot(shm.path(), 0, 7, &at, {}).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(failover::ReadSnapshot(shm.path(), 1, 3, &at, {}).status().code(),
            StatusCode::kNotFound);
}

// A layout entry that is a box of a stored tensor of another name (ShardSpec::tensor) comes back
// from the record; a "tensor" that is not a string is Corruption.
TEST(SnapshotTest, RecordCarriesTheStoredTensorOfABox) {
  testing::TempDir shm;
  std::vector<float> w(kElems, 1.0f);
  auto save = [&](const std::string& name, const Json& tensor) {
    State s;
    SP_ASSERT_OK(s.PutView("w.second", TensorView(w.data(), DType::kF32, {kElems})));
    Json spec = {{"global_shape", {2 * kElems}},
                 {"offsets", {kElems}},
                 {"sizes", {kElems}},
                 {"replicas", {0}},
                 {"tensor", tensor}};
    s.metadata() = {
        {"failover.snapshot", {{"rank", 0}, {"world", 1}, {"layout", {{"w.second", spec}}}}}};
    SP_ASSERT_OK(Save(s, shm.path() + "/rank_0/" + name));
  };
  save("step_3_1_3", "w");
  save("step_4_1_4", 5);
  failover::StepInfo at;
  SP_ASSERT_OK_AND_ASSIGN(DumpSource d, failover::ReadSnapshot(shm.path(), 0, 3, &at, {}));
  ASSERT_EQ(d.layout.count("w.second"), 1u);
  EXPECT_EQ(d.layout.at("w.second").tensor, "w");
  EXPECT_EQ(d.layout.at("w.second").offsets, (Shape{kElems}));
  EXPECT_THAT(failover::ReadSnapshot(shm.path(), 0, 4, &at, {}), StatusIs(StatusCode::kCorruption));
}

TEST(SnapshotTest, FailingSnapshotsDoNotStopTraining) {
  testing::TempDir dir, shm;
  std::vector<Rank> ranks(1);
  ranks[0].at_step_end = [&](Rank& r) {
    // As a wiped /dev/shm would (the snapshot thread may be writing meanwhile: retry).
    for (std::error_code ec; r.step == 3 && !RunDir(shm.path()).empty();) {
      fs::remove_all(RunDir(shm.path()), ec);
    }
    return true;
  };
  ControllerOptions co = Options(1, dir.path());
  co.snapshot_dir = shm.path();
  SP_ASSERT_OK_AND_ASSIGN(JobOutcome out, RunJob(ranks, co, 10));
  EXPECT_FALSE(out.failure);
  SP_EXPECT_OK(ranks[0].result);
  EXPECT_EQ(ranks[0].step, 10);
}

TEST(SnapshotTest, EveryNStepsKeepsTwoAndIsRemovedAtTheEnd) {
  testing::TempDir dir, shm;
  std::vector<Rank> ranks(2);
  std::vector<std::vector<std::string>> seen(2);
  for (int r = 0; r < 2; ++r) {
    ranks[r].at_step_end = [&, r](Rank& me) {
      if (me.step == 13) {
        WaitForSnapshot(shm.path(), r, 12);
        seen[r] = Snapshots(shm.path(), r);
      }
      return true;
    };
  }
  ControllerOptions co = Options(2, dir.path());
  co.snapshot_dir = shm.path();
  co.snapshot_every = 4;
  SP_ASSERT_OK_AND_ASSIGN(JobOutcome out, RunJob(ranks, co, 15));
  EXPECT_FALSE(out.failure);
  for (int r = 0; r < 2; ++r) {
    SP_EXPECT_OK(ranks[r].result);
    EXPECT_EQ(seen[r], (std::vector<std::string>{"step_12_1_12", "step_8_1_8"})) << "rank " << r;
  }
  EXPECT_EQ(RunDir(shm.path()), "");
  EXPECT_EQ(FailoverController::Start([&] {
              ControllerOptions bad = co;
              bad.snapshot_every = 0;
              return bad;
            }())
                .status()
                .code(),
            StatusCode::kInvalidArgument);
}

// Sparse tables in dumps: every rank holds the rows of its own slices (RecIS's partition) beside
// the data-parallel w. Row j of rank r's table has id begin + j % 10 + 65536 * (j / 10) and,
// after step s, the embedding TableValue(s, id, k).
constexpr int kTableRows = 20, kTableDim = 4;
float TableValue(int64_t step, int64_t id, int k) {
  return static_cast<float>(step * 10 + id % 97) + 0.25f * k;
}

struct TableOfRank {
  std::vector<int64_t> ids;
  std::vector<float> emb = std::vector<float>(kTableRows * kTableDim);
  void Set(int64_t step) {
    for (int j = 0; j < kTableRows; ++j) {
      for (int k = 0; k < kTableDim; ++k) emb[j * kTableDim + k] = TableValue(step, ids[j], k);
    }
  }
};

// A job of `world` ranks with tables; `victim` dies after its snapshot of step 6 was reported
// (with `shm`) or after step 6 (without).
Result<JobOutcome> RunTables(const std::string& dir, const std::string& shm, int world, int victim,
                             bool own_groups = true) {
  std::vector<Rank> ranks(world);
  std::vector<TableOfRank> tables(world);
  Lockstep ls(world);
  for (int r = 0; r < world; ++r) {
    const SliceRange range = GenSlice(r, world).value();
    for (int j = 0; j < kTableRows; ++j)
      tables[r].ids.push_back(range.begin + j % 10 + 65536 * (j / 10));
    tables[r].Set(0);
    ranks[r].mid_update = [&tables](Rank& me) {  // the optimizer updates the rows too
      tables[me.rank].Set(me.step + 1);
      return true;
    };
    ranks[r].source_hook = [&tables](Rank& me) -> Result<DumpSource> {
      DumpSource d = SourceOf(me);
      TableOfRank& t = tables[me.rank];
      SP_ASSIGN_OR_RETURN(
          SparseTable table,
          SparseTable::FromViews(
              TensorView(t.ids.data(), DType::kI64, {kTableRows}),
              {{"embedding", TensorView(t.emb.data(), DType::kF32, {kTableRows, kTableDim})}}));
      SP_RETURN_IF_ERROR(d.state.PutTable("emb", std::move(table)));
      return d;
    };
    State probe;  // the groups a rank with a table reports: w's and its own
    SP_RETURN_IF_ERROR(probe.PutTable(
        "emb",
        SparseTable::FromViews(TensorView(tables[r].ids.data(), DType::kI64, {kTableRows}), {})
            .value()));
    SP_RETURN_IF_ERROR(probe.PutView("w", TensorView(ranks[r].w.data(), DType::kF32, {kElems})));
    SP_ASSIGN_OR_RETURN(ranks[r].groups, ReplicaGroupsOf(probe, {}, r, world));
    if (!own_groups) ranks[r].groups.clear();  // data parallel: as if the tables were replicas
    ranks[r].at_step_end = [&ls](Rank& me) { return ls.Arrive(me.step); };
  }
  ranks[victim].at_step_end = LockstepDieAfter(ls, 6, [&](Rank& me) {
    if (shm.empty()) return;
    WaitForSnapshot(shm, me.rank, 6);
    std::this_thread::sleep_for(200ms);  // a heartbeat reports it
  });
  ControllerOptions co = Options(world, dir);
  co.snapshot_dir = shm;
  return RunJob(ranks, co, 1000);
}

TEST(SparseDumpTest, EveryRanksTableIsDumpedAsOfTheDumpsStep) {
  testing::TempDir dir, shm;
  SP_ASSERT_OK_AND_ASSIGN(JobOutcome out, RunTables(dir.path(), shm.path(), 3, 2));
  ASSERT_TRUE(out.failure);
  ASSERT_TRUE(out.dumped) << out.dump_status.ToString();
  EXPECT_EQ(out.dump_step, 6);
  EXPECT_EQ(out.writers, (std::vector<int>{0, 1}));
  EXPECT_EQ(out.snapshot_writers, std::vector<int>{2});
  SP_ASSERT_OK_AND_ASSIGN(State dump, LoadSparse(out.dump_path));
  const SparseTable* emb = dump.FindTable("emb");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->num_rows(), 3 * kTableRows);
  const float* e = reinterpret_cast<const float*>(emb->FindSlot("embedding")->data());
  for (int64_t i = 0; i < emb->num_rows(); ++i) {
    for (int k = 0; k < kTableDim; ++k) {
      EXPECT_EQ(e[i * kTableDim + k], TableValue(6, emb->ids()[i], k)) << "id " << emb->ids()[i];
    }
  }
  EXPECT_EQ(dump.FindValue("failover.step")->as_int(), 6);
  // Resharded: 2 loaders get every row between them.
  int64_t rows = 0;
  for (int i = 0; i < 2; ++i) {
    SP_ASSERT_OK_AND_ASSIGN(State part, LoadSparse(out.dump_path, {.shard_id = i, .shard_num = 2}));
    rows += part.FindTable("emb")->num_rows();
  }
  EXPECT_EQ(rows, 3 * kTableRows);
}

TEST(SparseDumpTest, ADeadRanksTableWithoutSnapshotMeansNoDump) {
  testing::TempDir dir;
  SP_ASSERT_OK_AND_ASSIGN(JobOutcome out, RunTables(dir.path(), "", 3, 1));
  ASSERT_TRUE(out.failure);
  EXPECT_FALSE(out.dumped);
  EXPECT_THAT(out.dump_status, StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_NE(out.dump_status.message().find("no replica"), std::string::npos)
      << out.dump_status.ToString();
}

TEST(SparseDumpTest, TablesOutsideTheReportedGroupsFailTheDump) {
  testing::TempDir dir;
  SP_ASSERT_OK_AND_ASSIGN(JobOutcome out, RunTables(dir.path(), "", 3, 1, /*own_groups=*/false));
  ASSERT_TRUE(out.failure);
  EXPECT_FALSE(out.dumped);  // rather than a dump without ranks 1 and 2's rows
  EXPECT_NE(out.dump_status.message().find("holds sparse table \"emb\" but writes no group {0}"),
            std::string::npos)
      << out.dump_status.ToString();
}

}  // namespace
}  // namespace savepoint
