// Crash safety of delta saves (synchronous and asynchronous) and compaction: the process "dies"
// after every possible number of file-system mutations (FaultInjectionFileSystem::CrashAfter),
// then power is lost (MemFileSystem::SimulatePowerLoss). The newest committed chain must still
// load exactly, and the interrupted checkpoint must be absent or complete. A full disk during an
// asynchronous table save fails its handle and commits nothing.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "io/fault_fs.h"
#include "io/mem_fs.h"
#include "savepoint/async.h"
#include "savepoint/sparse.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using Ref = std::map<int64_t, float>;  // id -> its one-float embedding

State StateOf(const Ref& ref, const std::vector<int64_t>& only = {},
              const std::vector<int64_t>& deleted = {}) {
  std::vector<int64_t> ids;
  for (const auto& [id, v] : ref) {
    if (only.empty() || std::find(only.begin(), only.end(), id) != only.end()) ids.push_back(id);
  }
  const int64_t n = static_cast<int64_t>(ids.size());
  Tensor idt = Tensor::Empty(DType::kI64, {n}).value();
  Tensor emb = Tensor::Empty(DType::kF32, {n, 1}).value();
  for (int64_t i = 0; i < n; ++i) {
    idt.as<int64_t>()[i] = ids[i];
    emb.as<float>()[i] = ref.at(ids[i]);
  }
  Tensor del = Tensor::Empty(DType::kI64, {static_cast<int64_t>(deleted.size())}).value();
  std::copy(deleted.begin(), deleted.end(), del.as<int64_t>().begin());
  std::vector<std::pair<std::string, Tensor>> slots;
  slots.emplace_back("embedding", std::move(emb));
  State s;
  EXPECT_TRUE(
      s.PutTable("emb",
                 SparseTable::FromTensors(std::move(idt), std::move(slots), std::move(del)).value())
          .ok());
  return s;
}

Result<Ref> Loaded(const std::string& path, FileSystem* fs) {
  SP_ASSIGN_OR_RETURN(State s, LoadSparse(path, {}, {.fs = fs, .direct_io = false}));
  const SparseTable* t = s.FindTable("emb");
  Ref out;
  for (int64_t i = 0; i < t->num_rows(); ++i) {
    out[t->ids()[i]] = reinterpret_cast<const float*>(t->FindSlot("embedding")->data())[i];
  }
  return out;
}

// The chain /ck/base <- /ck/d1, committed and durable; `ref1` is what d1 loads as.
void MakeChain(MemFileSystem* mem, Ref* ref1) {
  Ref ref0;
  for (int64_t id = -50; id < 50; ++id) ref0[id * 977] = static_cast<float>(id);
  IoOptions io{.fs = mem, .direct_io = false};
  ASSERT_TRUE(SaveSparse(StateOf(ref0), "/ck/base", {}, io).ok());
  *ref1 = ref0;
  (*ref1)[977] = 100.0f;
  ref1->erase(0);
  ASSERT_TRUE(SaveSparse(StateOf(*ref1, {977}, {0}), "/ck/d1", {.base = "/ck/base"}, io).ok());
}

// Runs `op` (a save of /ck/new through `fs`) crashing after every number of mutations in turn;
// after each crash and power loss, /ck/d1 must load as before and /ck/new be absent or load as
// `want`.
void SweepCrashes(const std::function<Status(FileSystem*)>& op, const Ref& want) {
  uint64_t mutations = 0;
  {
    MemFileSystem mem;
    Ref ref1;
    MakeChain(&mem, &ref1);
    FaultInjectionFileSystem fault(&mem);
    SP_ASSERT_OK(op(&fault));
    mutations = fault.mutation_count();
  }
  ASSERT_GT(mutations, 0u);
  for (uint64_t n = 0; n <= mutations; ++n) {
    SCOPED_TRACE(fmt::format("crash after {} of {} mutations", n, mutations));
    MemFileSystem mem;
    Ref ref1;
    MakeChain(&mem, &ref1);
    FaultInjectionFileSystem fault(&mem);
    fault.CrashAfter(n);
    const Status s = op(&fault);
    mem.SimulatePowerLoss();
    SP_ASSERT_OK_AND_ASSIGN(Ref chain, Loaded("/ck/d1", &mem));
    EXPECT_TRUE(chain == ref1);
    if (mem.Exists("/ck/new/MANIFEST")) {
      SP_ASSERT_OK_AND_ASSIGN(Ref got, Loaded("/ck/new", &mem));
      EXPECT_TRUE(got == want);
    } else {
      EXPECT_FALSE(s.ok() && n == mutations) << "a save that succeeded left nothing";
    }
  }
}

TEST(SparseCrash, DeltaSaveIsAllOrNothing) {
  Ref ref1, ref2;
  {
    MemFileSystem mem;
    MakeChain(&mem, &ref1);
  }
  ref2 = ref1;
  ref2[5] = 5.5f;
  SweepCrashes(
      [&](FileSystem* fs) {
        return SaveSparse(StateOf(ref2, {5}), "/ck/new", {.base = "/ck/d1"},
                          {.fs = fs, .direct_io = false});
      },
      ref2);
}

// An asynchronous delta (Checkpointer::SaveAsync with SparseSaveOptions) through `fs`, waited.
Status SaveDeltaAsync(const Ref& ref, FileSystem* fs) {
  SP_ASSIGN_OR_RETURN(std::unique_ptr<Checkpointer> ckpt,
                      Checkpointer::Create({.staging_bytes = 1 << 20, .slab_bytes = 64 << 10},
                                           {.fs = fs, .direct_io = false}));
  SP_ASSIGN_OR_RETURN(SaveHandle h, ckpt->SaveAsync(StateOf(ref, {5}), "/ck/new",
                                                    SparseSaveOptions{.base = "/ck/d1"}));
  return h.Wait();
}

TEST(SparseCrash, AsyncDeltaSaveIsAllOrNothing) {
  Ref ref1;
  {
    MemFileSystem mem;
    MakeChain(&mem, &ref1);
  }
  Ref ref2 = ref1;
  ref2[5] = 5.5f;
  SweepCrashes([&](FileSystem* fs) { return SaveDeltaAsync(ref2, fs); }, ref2);
}

TEST(SparseCrash, FullDiskFailsAnAsyncDeltaAndCommitsNothing) {
  MemFileSystem mem;
  Ref ref1;
  MakeChain(&mem, &ref1);
  FaultInjectionFileSystem fault(&mem);
  fault.FailNth(FaultInjectionFileSystem::Op::kWrite, 1, ENOSPC);
  Ref ref2 = ref1;
  ref2[5] = 5.5f;
  const Status s = SaveDeltaAsync(ref2, &fault);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.ToString().find("/ck/new"), std::string::npos) << s.ToString();
  EXPECT_FALSE(mem.Exists("/ck/new"));
  SP_ASSERT_OK_AND_ASSIGN(Ref chain, Loaded("/ck/d1", &mem));
  EXPECT_TRUE(chain == ref1);
}

TEST(SparseCrash, CompactionIsAllOrNothing) {
  Ref ref1;
  {
    MemFileSystem mem;
    MakeChain(&mem, &ref1);
  }
  for (uint64_t batch : {uint64_t{0}, uint64_t{256}}) {  // one part; about six
    SCOPED_TRACE(fmt::format("parts of {} bytes", batch));
    SweepCrashes(
        [&](FileSystem* fs) {
          return CompactSparse("/ck/d1", "/ck/new", {}, {}, {.fs = fs, .direct_io = false}, batch);
        },
        ref1);
  }
}

TEST(SparseCrash, FullDiskFailsACompactionInPartsAndCommitsNothing) {
  for (int nth : {1, 4, 9}) {
    MemFileSystem mem;
    Ref ref1;
    MakeChain(&mem, &ref1);
    FaultInjectionFileSystem fault(&mem);
    fault.FailNth(FaultInjectionFileSystem::Op::kWrite, nth, ENOSPC);
    const Status s =
        CompactSparse("/ck/d1", "/ck/new", {}, {}, {.fs = &fault, .direct_io = false}, 256);
    EXPECT_FALSE(s.ok()) << "write " << nth;
    EXPECT_NE(s.ToString().find("compact /ck/d1 into /ck/new"), std::string::npos) << s.ToString();
    EXPECT_FALSE(mem.Exists("/ck/new"));
    SP_ASSERT_OK_AND_ASSIGN(Ref chain, Loaded("/ck/d1", &mem));
    EXPECT_TRUE(chain == ref1);
  }
}

}  // namespace
}  // namespace savepoint
