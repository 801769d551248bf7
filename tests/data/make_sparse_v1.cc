// Generator of tests/data/sparse_v1/, checkpoints with sparse tables in description format 1
// (docs/FORMAT.md §11: a dense I64 [65536] slice_rows tensor per table), written by the last build
// that wrote format 1 (git ee75654). Kept for reference; not built. src/sparse/format_v1_test.cc
// loads them and checks every row against SparseV1Row.
//
//   c++ -std=c++20 -I<old tree>/include make_sparse_v1.cc -L<old build>/src -lsavepoint
//   ./a.out tests/data/sparse_v1
//
// full/   one process, table "emb" (slots "embedding" F32 [3], "count" I64) of kFullIds
// delta/  a delta on full/: the ids of kTouched rewritten (version 1), kDeleted deleted
// dist3/  the rows of full/ saved by 3 ranks (thread communicators), each its GenSlice(r, 3)
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "savepoint/comm.h"
#include "savepoint/savepoint.h"
#include "savepoint/sparse.h"

using namespace savepoint;

// Ids in many slices, negative ones included, two ids sharing slice 5.
static const std::vector<int64_t> kFullIds = {5,       65541,  -1,     -65536,  7,     70000,
                                              1 << 20, 123456, 999999, -424242, 32768, 40000,
                                              65535,   131071, 3,      17};
static const std::vector<int64_t> kTouched = {5, 70000, 555555};  // 555555 is new
static const std::vector<int64_t> kDeleted = {-1, 32768};

// Slot values of id `id` at `version` (the same formula as in src/sparse/format_v1_test.cc).
static float Emb(int64_t id, int version, int k) {
  return static_cast<float>(id % 1000) + static_cast<float>(version) * 0.5f + k;
}
static int64_t Count(int64_t id, int version) { return id * 7 + version; }

static SparseTable Table(const std::vector<int64_t>& ids, int version,
                         const std::vector<int64_t>& deleted) {
  const int64_t n = static_cast<int64_t>(ids.size());
  Tensor t = Tensor::Empty(DType::kI64, {n}).value();
  Tensor emb = Tensor::Empty(DType::kF32, {n, 3}).value();
  Tensor cnt = Tensor::Empty(DType::kI64, {n}).value();
  for (int64_t i = 0; i < n; ++i) {
    t.as<int64_t>()[i] = ids[i];
    for (int k = 0; k < 3; ++k) emb.as<float>()[i * 3 + k] = Emb(ids[i], version, k);
    cnt.as<int64_t>()[i] = Count(ids[i], version);
  }
  Tensor del = Tensor::Empty(DType::kI64, {static_cast<int64_t>(deleted.size())}).value();
  for (size_t i = 0; i < deleted.size(); ++i) del.as<int64_t>()[i] = deleted[i];
  std::vector<std::pair<std::string, Tensor>> slots;
  slots.emplace_back("embedding", std::move(emb));
  slots.emplace_back("count", std::move(cnt));
  return SparseTable::FromTensors(std::move(t), std::move(slots), std::move(del)).value();
}

static bool Save(const std::vector<int64_t>& ids, int version, const std::vector<int64_t>& del,
                 const std::string& path, const std::string& base) {
  State s;
  if (!s.PutTable("emb", Table(ids, version, del)).ok()) return false;
  if (!s.PutValue("step", int64_t{base.empty() ? 100 : 200}).ok()) return false;
  SparseSaveOptions o;
  o.base = base;
  Status st = SaveSparse(s, path, o);
  if (!st.ok()) std::fprintf(stderr, "%s\n", st.ToString().c_str());
  return st.ok();
}

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string dir = argv[1];
  if (!Save(kFullIds, 0, {}, dir + "/full", "")) return 1;
  if (!Save(kTouched, 1, kDeleted, dir + "/delta", dir + "/full")) return 1;
  auto comms = NewThreadCommunicators(3);
  std::vector<Status> st(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      const SliceRange range = GenSlice(r, 3).value();
      std::vector<int64_t> mine;
      for (int64_t id : kFullIds) {
        if (range.Contains(SliceOf(id))) mine.push_back(id);
      }
      State local;
      st[r] = local.PutTable("emb", Table(mine, 0, {}));
      if (st[r].ok()) st[r] = SaveSparseDistributed(*comms[r], local, {}, dir + "/dist3");
    });
  }
  for (auto& t : threads) t.join();
  for (const Status& s : st) {
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
  }
  return 0;
}
