// The manager's delta chains: a delta on the newest checkpoint, retention keeping the bases of
// kept deltas, and the background compaction (run under TSan in CI, beside the manager's mutex).
#include "manager/chains.h"

#include <gtest/gtest.h>

#include <map>

#include "io/mem_fs.h"
#include "testutil/sparse_tables.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

// Rows of ids [0, n) whose values depend on id and version.
State TableState(const std::vector<int64_t>& ids, float version,
                 std::vector<int64_t> deleted = {}) {
  testing::TableSlot slot{"embedding", DType::kF32, 4, [version](int64_t id, auto row) {
                            auto* f = reinterpret_cast<float*>(row.data());
                            for (int k = 0; k < 4; ++k) f[k] = version * 1000 + id + k;
                          }};
  State s;
  EXPECT_TRUE(s.PutTable("emb", testing::MakeTable(ids, {slot}, deleted)).ok());
  return s;
}

std::map<int64_t, float> Rows(const State& s) {
  std::map<int64_t, float> out;
  const SparseTable* t = s.FindTable("emb");
  if (t == nullptr) return out;
  const float* f = reinterpret_cast<const float*>(t->slots()[0].view.data());
  for (size_t i = 0; i < t->ids().size(); ++i) out[t->ids()[i]] = f[i * 4];
  return out;
}

std::vector<int64_t> Steps(CheckpointManager& m) { return m.AllSteps(); }

// `async`: the saves, deltas included, go through the async Checkpointer and are committed (and
// the chain compacted) when reaped.
void DeltasKeepBasesAndCompact(bool async) {
  MemFileSystem fs;
  ManagerOptions o;
  o.naming.directory = "/ckpt";
  o.io.fs = &fs;
  o.async_save.enabled = async;
  o.async_save.checkpointer.slab_bytes = 64 << 10;
  o.retention.keep_last_n = 1;
  o.sparse.compaction.max_depth = 2;
  o.sparse.compaction.max_delta_ratio = 1e9;
  auto m = CheckpointManager::Open(o).value();
  std::map<int64_t, float> ref;
  std::vector<int64_t> all;
  for (int64_t i = 0; i < 100; ++i) all.push_back(i * 7 - 300);
  ASSERT_TRUE(m->Save(1, TableState(all, 1)).ok());
  for (int64_t id : all) ref[id] = 1000 + id;
  SaveArgs delta;
  delta.delta = true;
  for (int64_t step = 2; step <= 4; ++step) {
    const std::vector<int64_t> touched = {all[step], all[step + 10]};
    const std::vector<int64_t> gone = {all[50 + step]};
    Result<bool> saved = m->Save(step, TableState(touched, step, gone), delta);
    ASSERT_TRUE(saved.ok()) << saved.status().ToString();
    for (int64_t id : touched) ref[id] = step * 1000 + id;
    ref.erase(gone[0]);
    std::vector<int64_t> kept;  // keep_last_n = 1, but the newest delta needs its whole chain
    for (int64_t s = 1; s <= step; ++s) kept.push_back(s);
    if (step < 4 && async) {  // step's own save may still be in flight
      std::vector<int64_t> committed = kept;
      if (Steps(*m) != kept) committed.pop_back();
      EXPECT_EQ(Steps(*m), committed);
    } else if (step < 4) {
      EXPECT_EQ(Steps(*m), kept);
    }
  }
  SP_ASSERT_OK(m->Wait());  // step 4's chain (3 deltas > 2) is compacted, its bases deleted
  EXPECT_EQ(Steps(*m), (std::vector<int64_t>{4}));
  Result<std::vector<SparseChainLink>> chain = SparseChain("/ckpt/ckpt-1_4", {.fs = &fs});
  ASSERT_TRUE(chain.ok()) << chain.status().ToString();
  EXPECT_EQ(chain->size(), 1u);
  EXPECT_FALSE(fs.Exists("/ckpt/ckpt-1_1"));
  Result<State> restored = m->Restore();
  ASSERT_TRUE(restored.ok()) << restored.status().ToString();
  EXPECT_EQ(Rows(*restored), ref);
  SP_ASSERT_OK(m->Close());
}

TEST(ManagerChains, DeltasKeepBasesAndCompactInTheBackground) { DeltasKeepBasesAndCompact(false); }

TEST(ManagerChains, AsyncDeltasKeepBasesAndCompactInTheBackground) {
  DeltasKeepBasesAndCompact(true);
}

// `async`: through the async Checkpointer (a compaction deferred for the upload must not rewrite
// the base of a delta in flight).
void DeltasAreUploadedThenCompacted(bool async) {
  MemFileSystem fs;
  MemFileSystem remote;
  ManagerOptions o;
  o.naming.directory = "/ckpt";
  o.io.fs = &fs;
  o.async_save.enabled = async;
  o.async_save.checkpointer.slab_bytes = 64 << 10;
  o.retention.keep_last_n = 1;
  o.sparse.compaction.max_depth = 0;  // every delta is compacted
  o.remote.location = "/bucket/run";
  o.remote.fs = &remote;
  o.remote.upload_every_n_steps = 2;  // step 1 is not due, but it is step 2's base
  o.remote.retention.keep_last_n = 1;
  std::vector<int64_t> all;
  for (int64_t i = 0; i < 50; ++i) all.push_back(i * 3);
  std::map<int64_t, float> ref;
  {
    auto m = CheckpointManager::Open(o).value();
    ASSERT_TRUE(m->Save(1, TableState(all, 1)).ok());
    SaveArgs delta;
    delta.delta = true;
    ASSERT_TRUE(m->Save(2, TableState({all[4]}, 2, {all[9]}), delta).ok());
    SP_ASSERT_OK(m->Wait());
    for (int64_t id : all) ref[id] = 1000 + id;
    ref[all[4]] = 2000 + all[4];
    ref.erase(all[9]);
    // Remote: the delta and its base, which the remote retention keeps for it.
    std::vector<std::string> names;
    for (const CheckpointRecord& r : m->Remote()) names.push_back(r.name);
    EXPECT_EQ(names, (std::vector<std::string>{"ckpt-1_1", "ckpt-1_2"}));
    // Local: compacted once uploaded, so its base went.
    EXPECT_EQ(SparseChain("/ckpt/ckpt-1_2", {.fs = &fs}).value().size(), 1u);
    EXPECT_FALSE(fs.Exists("/ckpt/ckpt-1_1"));
    EXPECT_EQ(Steps(*m), (std::vector<int64_t>{1, 2}));  // both tiers: 1 is remote only
    SP_ASSERT_OK(m->Close());
  }
  SP_ASSERT_OK(fs.RemoveAll("/ckpt"));  // a new node: the chain is read from the remote
  auto m = CheckpointManager::Open(o).value();
  Result<State> restored = m->Restore();
  ASSERT_TRUE(restored.ok()) << restored.status().ToString();
  EXPECT_EQ(Rows(*restored), ref);
  EXPECT_EQ(SparseChain("/bucket/run/ckpt-1_2", {.fs = &remote}).value().size(), 2u);
}

TEST(ManagerChains, DeltasAreUploadedAfterTheirBasesAndCompactedAfterTheUpload) {
  DeltasAreUploadedThenCompacted(false);
}

TEST(ManagerChains, AsyncDeltasAreUploadedAfterTheirBasesAndCompactedAfterTheUpload) {
  DeltasAreUploadedThenCompacted(true);
}

}  // namespace
}  // namespace savepoint
