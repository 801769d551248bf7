// Faults during save: every failing call (EIO, ENOSPC, short write) must surface as an error,
// commit nothing torn, leave the previous checkpoint loadable, and not block the next save.
// Power loss (MemFileSystem::SimulatePowerLoss) at every step of the commit protocol must keep
// the last committed checkpoint.
#include <fmt/format.h>

#include <cerrno>

#include "io/fault_fs.h"
#include "io/mem_fs.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

using Op = FaultInjectionFileSystem::Op;
using testing::RandomState;
using testing::StatesEqual;

constexpr Op kMutatingOps[] = {Op::kCreate,    Op::kWrite,     Op::kSync,
                               Op::kClose,     Op::kCreateDir, Op::kRemoveFile,
                               Op::kRemoveDir, Op::kRename,    Op::kSyncDir};

// One scenario: checkpoint A committed at /root/a, then a save of B through a fault wrapper.
struct World {
  MemFileSystem mem;
  FaultInjectionFileSystem fault{&mem};
  State a = RandomState(11, 6, 200 << 10);
  State b = RandomState(22, 6, 200 << 10);
  // Format of B's save: version 2 packs B's small tensors, so the save makes fewer writes;
  // version 1 writes each tensor on its own.
  uint32_t version = 2;

  explicit World(uint32_t format_version = 2) : version(format_version) {
    SaveOptions so;
    so.chunk_bytes = 16 << 10;
    EXPECT_TRUE(Save(a, "/root/a", so, {.fs = &mem}).ok());
  }
  Status SaveB(const std::string& path, bool overwrite = false) {
    SaveOptions so;
    so.chunk_bytes = 16 << 10;
    so.overwrite = overwrite;
    so.format_version = version;
    return Save(b, path, so, {.fs = &fault, .io_threads = 3});
  }
  Result<State> LoadPath(const std::string& path) { return Load(path, {}, {.fs = &mem}); }
  // Every directory under /root that is not hidden debris.
  std::vector<std::string> Visible() {
    std::vector<std::string> out;
    for (const auto& e : mem.ListDir("/root").value()) out.push_back(e.name);
    std::sort(out.begin(), out.end());
    return out;
  }
};

uint64_t CountOps(Op op, bool overwrite, uint32_t version = 2) {
  World w(version);
  EXPECT_TRUE(w.SaveB(overwrite ? "/root/a" : "/root/b", overwrite).ok());
  return w.fault.count(op);
}

void ExpectAIntact(World& w) {
  Result<State> a = w.LoadPath("/root/a");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_TRUE(StatesEqual(w.a, *a));
}

TEST(FaultInjection, EveryFailingCallReturnsErrorAndKeepsOldCheckpoint) {
  int scenarios = 0;
  for (uint32_t version : {1u, 2u, 3u}) {
    for (Op op : kMutatingOps) {
      uint64_t n_calls = CountOps(op, false, version);
      for (uint64_t n = 1; n <= n_calls; ++n) {
        for (int err : {EIO, ENOSPC}) {
          SCOPED_TRACE(fmt::format("format version {}: fail call {} of {} with {}", version, n,
                                   FaultInjectionFileSystem::OpName(op), err));
          World w(version);
          w.fault.FailNth(op, n, err);
          Status s = w.SaveB("/root/b");
          ASSERT_FALSE(s.ok());
          EXPECT_EQ(s.code(), err == ENOSPC ? StatusCode::kNoSpace : StatusCode::kIOError)
              << s.ToString();
          EXPECT_NE(s.message().find("/root/b"), std::string::npos) << s.ToString();
          ExpectAIntact(w);
          Result<State> b = w.LoadPath("/root/b");
          // Only a failed sync of the parent after the rename can leave B visible, and then whole.
          if (b.ok()) {
            EXPECT_TRUE(op == Op::kSyncDir) << s.ToString();
            EXPECT_TRUE(StatesEqual(w.b, *b));
          } else {
            EXPECT_THAT(b, StatusIs(StatusCode::kNotFound));
            EXPECT_EQ(w.Visible(), std::vector<std::string>{"a"}) << "debris left behind";
            w.fault.Reset();
            SP_EXPECT_OK(w.SaveB("/root/b"));  // the next save works
          }
          ++scenarios;
        }
      }
    }
  }
  EXPECT_GT(scenarios, 60);
}

TEST(FaultInjection, ShortWritesAreErrors) {
  for (uint32_t version : {1u, 2u, 3u}) {
    uint64_t writes = CountOps(Op::kWrite, false, version);
    ASSERT_GT(writes, version == 1 ? 5u : 2u);
    for (uint64_t n = 1; n <= writes; ++n) {
      SCOPED_TRACE(fmt::format("format version {}: short write {}", version, n));
      World w(version);
      w.fault.ShortWriteNth(n, ENOSPC);
      Status s = w.SaveB("/root/b");
      EXPECT_THAT(s, StatusIs(StatusCode::kNoSpace));
      ExpectAIntact(w);
      EXPECT_THAT(w.LoadPath("/root/b"), StatusIs(StatusCode::kNotFound));
    }
  }
}

TEST(FaultInjection, OverwriteFailuresKeepOneWholeCheckpoint) {
  for (Op op : kMutatingOps) {
    uint64_t n_calls = CountOps(op, true);
    for (uint64_t n = 1; n <= n_calls; ++n) {
      SCOPED_TRACE(fmt::format("fail call {} of {}", n, FaultInjectionFileSystem::OpName(op)));
      World w;
      w.fault.FailNth(op, n, EIO);
      Status s = w.SaveB("/root/a", /*overwrite=*/true);
      SP_ASSERT_OK(GarbageCollect("/root", GcOptions{.fs = &w.mem}).status());
      Result<State> now = w.LoadPath("/root/a");
      ASSERT_TRUE(now.ok()) << now.status().ToString();
      // Removing the replaced checkpoint is best effort: its failure does not fail the save.
      if (s.ok()) {
        EXPECT_TRUE(StatesEqual(w.b, *now));
      }
      EXPECT_TRUE(StatesEqual(w.a, *now) || StatesEqual(w.b, *now));
      EXPECT_EQ(w.Visible(), std::vector<std::string>{"a"});
    }
  }
}

// Crash at every mutation, then lose everything that was not synced.
void PowerLossSweep(bool overwrite) {
  std::string target = overwrite ? "/root/a" : "/root/b";
  uint64_t total = [&] {
    World w;
    EXPECT_TRUE(w.SaveB(target, overwrite).ok());
    return w.fault.mutation_count();
  }();
  ASSERT_GT(total, 10u);
  int b_survived = 0;
  for (uint64_t k = 0; k <= total; ++k) {
    SCOPED_TRACE(fmt::format("crash after {} of {} mutations", k, total));
    World w;
    w.fault.CrashAfter(k);
    Status s = w.SaveB(target, overwrite);
    // An overwrite's removal of the replaced checkpoint is best effort, after the commit.
    if (!overwrite || k >= total) {
      EXPECT_EQ(s.ok(), k >= total) << s.ToString();
    }
    w.mem.SimulatePowerLoss();
    SP_ASSERT_OK(GarbageCollect("/root", GcOptions{.fs = &w.mem}).status());
    Result<State> b = w.LoadPath(target);
    if (!overwrite) {
      ExpectAIntact(w);
      if (b.ok()) {
        EXPECT_TRUE(StatesEqual(w.b, *b));
        ++b_survived;
      } else {
        EXPECT_THAT(b, StatusIs(StatusCode::kNotFound));
      }
    } else {
      ASSERT_TRUE(b.ok()) << b.status().ToString();
      bool is_b = StatesEqual(w.b, *b);
      EXPECT_TRUE(is_b || StatesEqual(w.a, *b));
      EXPECT_TRUE(is_b || !s.ok()) << "a save reported durable was lost";
      b_survived += is_b;
    }
    if (k >= total) {
      EXPECT_GT(b_survived, 0) << "a completed save did not survive power loss";
    }
    std::vector<std::string> expect = {"a"};
    if (!overwrite && b.ok()) expect.push_back("b");
    EXPECT_EQ(w.Visible(), expect);
  }
}

TEST(PowerLoss, AtEveryStepOfTheCommitProtocol) { PowerLossSweep(false); }
TEST(PowerLoss, AtEveryStepOfAnOverwrite) { PowerLossSweep(true); }

TEST(PowerLoss, DeleteIsAllOrNothing) {
  uint64_t total = [&] {
    World probe;
    EXPECT_TRUE(DeleteCheckpoint("/root/a", &probe.fault).ok());
    return probe.fault.mutation_count();
  }();
  for (uint64_t k = 0; k <= total; ++k) {
    World v;
    v.fault.CrashAfter(k);
    DeleteCheckpoint("/root/a", &v.fault).IgnoreError();
    v.mem.SimulatePowerLoss();
    SP_ASSERT_OK(GarbageCollect("/root", GcOptions{.fs = &v.mem}).status());
    Result<State> a = v.LoadPath("/root/a");
    if (a.ok()) {
      EXPECT_TRUE(StatesEqual(v.a, *a));
    } else {
      EXPECT_THAT(a, StatusIs(StatusCode::kNotFound));
    }
    if (k >= total) {
      EXPECT_FALSE(a.ok());
    }
    EXPECT_LE(v.Visible().size(), 1u);
  }
}

// `savepoint merge` into a directory whose parents do not exist yet: every commit goes through the
// one durable-commit helper, so the new parents are synced before the merge reports success.
// (Regression: merge created them without syncing, and a power loss right after a successful
// merge could lose the whole output.)
TEST(PowerLoss, MergeIntoNewParentDirectories) {
  const std::string dst = "/root/new/deeper/merged";
  // The merge reads and writes through one file system: the fault-injecting one, whose reads pass
  // straight through to w.mem (only mutations are counted and crashed).
  auto merge = [&](World& w) { return MergeToSafetensors("/root/a", dst, {}, {.fs = &w.fault}); };
  uint64_t total = [&] {
    World w;
    EXPECT_TRUE(merge(w).ok());
    return w.fault.mutation_count();
  }();
  for (uint64_t k = 0; k <= total; ++k) {
    SCOPED_TRACE(fmt::format("crash after {} of {} mutations", k, total));
    World w;
    w.fault.CrashAfter(k);
    Status s = merge(w);
    w.mem.SimulatePowerLoss();
    ExpectAIntact(w);
    Result<State> merged =
        LoadSafetensors(JoinPath(dst, kSafetensorsSingleFile), {}, {.fs = &w.mem});
    if (s.ok()) {
      ASSERT_TRUE(merged.ok()) << "a merge that returned OK was lost: "
                               << merged.status().ToString();
    }
    if (merged.ok()) {
      EXPECT_EQ(merged->tensor_bytes(), w.a.tensor_bytes());
    }
  }
}

}  // namespace
}  // namespace savepoint
