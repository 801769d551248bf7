// Multi-process checks of the distributed save and load, run under mpirun by ctest (label mpi):
//   dist_mpi_check roundtrip DIR   save with every rank (DP x TP), load into other layouts
//                                  (world size + 1, other split dims), a bad layout and a failing
//                                  rank leave no checkpoint and reach every rank
//                                  a late rank makes the others time out, naming it
//   dist_mpi_check kill DIR        the last rank kills itself (SIGKILL) while writing its data:
//                                  the job must end (mpirun exits non-zero) with no commit
// Exits 0 when every check passed on this rank.
#include <fmt/format.h>

#include <csignal>
#include <cstring>
#include <map>
#include <thread>

#include "engine/box.h"
#include "io/fault_fs.h"
#include "savepoint/distributed.h"
#include "savepoint/mpi.h"
#include "savepoint/savepoint.h"
#include "testutil/forwarding_fs.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using namespace std::chrono_literals;
using Globals = std::map<std::string, Tensor>;

// The global tensors, identical on every rank (derived from the seed).
Globals MakeGlobals(uint64_t seed) {
  Globals g;
  std::pair<DType, Shape> specs[] = {{DType::kF32, {37, 19}},
                                     {DType::kU8, {4099}},
                                     {DType::kBF16, {5, 6, 7}},
                                     {DType::kF64, {64, 130}}};
  int i = 0;
  for (auto& [dt, shape] : specs) {
    Tensor t = Tensor::Empty(dt, shape).value();
    testing::FillPattern(t.view(), seed + i);
    g.emplace(fmt::format("layer{}.w", i++), std::move(t));
  }
  Tensor u = Tensor::Empty(DType::kI32, {5}).value();
  testing::FillPattern(u.view(), seed + 99);
  g.emplace("unsharded", std::move(u));
  return g;
}

// Rank `rank` of `world` in a DP x TP layout (tp parts along dim (i + shift) % rank).
ShardLayout Layout(const Globals& g, int world, int rank, int tp, int shift) {
  ShardLayout l;
  int i = 0;
  for (const auto& [name, t] : g) {
    if (name == "unsharded") continue;
    std::vector<int> reps;
    for (int q = rank % tp; q < world; q += tp) reps.push_back(q);
    int dim = (i++ + shift) % static_cast<int>(t.shape().size());
    l[name] = SplitDim(t.shape(), dim, tp, rank % tp, reps).value();
  }
  return l;
}

State Slice(const Globals& g, const ShardLayout& l) {
  State s;
  for (const auto& [name, t] : g) {
    auto it = l.find(name);
    Shape sizes = it == l.end() ? t.shape() : it->second.sizes;
    Shape offs = it == l.end() ? Shape(t.shape().size(), 0) : it->second.offsets;
    Tensor local = Tensor::Empty(t.dtype(), sizes).value();
    engine::CopyRegion({t.data(), t.shape(), offs, 0},
                       {local.data(), sizes, Shape(sizes.size(), 0), 0}, sizes,
                       DTypeSize(t.dtype()));
    s.Put(name, std::move(local)).IgnoreError();
  }
  s.PutValue("step", Value(int64_t{7})).IgnoreError();
  return s;
}

int failures = 0;
void Check(bool ok, const std::string& what, int rank) {
  if (!ok) {
    ++failures;
    fmt::print(stderr, "rank {}: FAILED: {}\n", rank, what);
  }
}

bool Equal(const State& a, const State& b) { return testing::StatesEqual(a, b); }

void RoundTrip(Communicator& c, const std::string& dir) {
  const int n = c.size(), r = c.rank();
  Globals g = MakeGlobals(1234);
  int tp = n % 2 == 0 ? 2 : n;
  ShardLayout mine = Layout(g, n, r, tp, 0);
  DistributedSaveOptions o;
  o.save.overwrite = true;
  o.timeout = 60s;
  std::string path = dir + "/ckpt";
  Status s = SaveDistributed(c, Slice(g, mine), mine, path, o);
  Check(s.ok(), "save: " + s.ToString(), r);
  // Load as ranks r, r + n, ... of a job of n + 1 ranks with another split.
  for (int target = r; target < n + 1; target += n) {
    ShardLayout l = Layout(g, n + 1, target, n + 1, 1);
    const Shape& us = g["unsharded"].shape();
    l["unsharded"] = ShardSpec{us, Shape(us.size(), 0), us, {}};
    Result<State> got = LoadDistributedAlloc(path, l);
    Check(got.ok() && Equal(Slice(g, l), *got),
          fmt::format("load as rank {} of {}: {}", target, n + 1, got.status().ToString()), r);
  }
  if (r == 0) {
    Result<State> full = Load(path);
    Check(full.ok() && Equal(Slice(g, {}), *full), "full load: " + full.status().ToString(), r);
  }
  // Every rank claims the same box of "layer0.w": rejected everywhere, nothing written.
  ShardLayout bad = mine;
  bad["layer0.w"] = SplitDim(g["layer0.w"].shape(), 0, 2, 0).value();
  s = SaveDistributed(c, Slice(g, bad), bad, dir + "/bad", o);
  Check(n == 1 || s.code() == StatusCode::kInvalidArgument, "bad layout: " + s.ToString(), r);
  Check(n == 1 || !DefaultFileSystem()->Exists(dir + "/bad"), "bad layout left a checkpoint", r);
}

// The last rank fails its second data write: every rank gets the error, nothing is committed.
void FailingRank(Communicator& c, const std::string& dir) {
  const int n = c.size(), r = c.rank();
  if (n == 1) return;
  State s;
  for (int i = 0; i < n; ++i)
    s.Put(fmt::format("p{}", i), Tensor::Zeros(DType::kU8, {9000}).value()).IgnoreError();
  FaultInjectionFileSystem faulty(DefaultFileSystem());
  faulty.FailNth(FaultInjectionFileSystem::Op::kWrite, 2, EIO);
  DistributedSaveOptions o;
  o.timeout = 60s;
  IoOptions io;
  if (r == n - 1) io.fs = &faulty;
  Status st = SaveDistributed(c, s, {}, dir + "/fail", o, io);
  Check(st.code() == StatusCode::kIOError &&
            st.message().find(fmt::format("rank {}", n - 1)) != std::string::npos,
        "failing rank: " + st.ToString(), r);
  c.Barrier(60s).IgnoreError();
  Check(!DefaultFileSystem()->Exists(dir + "/fail"), "failed save was committed", r);
}

// The last rank arrives 4 s late; the others time out after 1 s: every rank fails (the late
// one finds the group broken), rank 0's error names the late rank, nothing is committed. Leaves
// the group broken, so it runs last. The ranks line up first; the coordinator then starts 250 ms
// after the others (as a descheduled coordinator would on a loaded machine), while they already
// wait for its verdict: they must wait for it rather than time out first and name rank 0.
void LateRank(Communicator& c, const std::string& dir) {
  const int n = c.size(), r = c.rank();
  if (n == 1) return;
  State s;
  s.Put("p", Tensor::Zeros(DType::kU8, {100}).value()).IgnoreError();
  DistributedSaveOptions o;
  o.timeout = 1s;
  c.Barrier(60s).IgnoreError();
  if (r == 0) std::this_thread::sleep_for(250ms);
  if (r == n - 1) std::this_thread::sleep_for(4s);
  Status st = SaveDistributed(c, s, {}, dir + "/late", o);
  Check(!st.ok(), "late rank: save succeeded", r);
  if (r == 0) {
    Check(st.code() == StatusCode::kDeadlineExceeded &&
              st.message().find(fmt::format("ranks [{}]", n - 1)) != std::string::npos,
          "late rank: " + st.ToString(), r);
  }
  Check(!DefaultFileSystem()->Exists(dir + "/late"), "late rank: committed", r);
}

// Kills this process at its first data-file write.
class KillingFs final : public testing::ForwardingFileSystem {
 public:
  using ForwardingFileSystem::ForwardingFileSystem;
  void OnWrite(const std::string& path, uint64_t) override {
    if (path.find("/data-") != std::string::npos) std::raise(SIGKILL);
  }
};

int Kill(Communicator& c, const std::string& dir) {
  Globals g = MakeGlobals(5);
  ShardLayout mine = Layout(g, c.size(), c.rank(), c.size(), 0);
  KillingFs killer(DefaultFileSystem());
  DistributedSaveOptions o;
  o.timeout = 20s;
  IoOptions io;
  if (c.rank() == c.size() - 1) io.fs = &killer;
  Status s = SaveDistributed(c, Slice(g, mine), mine, dir + "/ckpt", o, io);
  fmt::print(stderr, "rank {}: save returned {}\n", c.rank(), s.ToString());
  return s.ok() ? 0 : 1;
}

}  // namespace
}  // namespace savepoint

int main(int argc, char** argv) {
  using namespace savepoint;
  if (argc != 3) {
    fmt::print(stderr, "usage: {} roundtrip|kill DIR\n", argv[0]);
    return 2;
  }
  auto comm = NewMpiCommunicator();
  if (!comm.ok()) {
    fmt::print(stderr, "{}\n", comm.status().ToString());
    return 2;
  }
  Communicator& c = **comm;
  std::string mode = argv[1], dir = argv[2];
  if (c.rank() == 0) DefaultFileSystem()->CreateDirs(dir).IgnoreError();
  c.Barrier(std::chrono::seconds(60)).IgnoreError();
  if (mode == "kill") return Kill(c, dir);
  RoundTrip(c, dir);
  FailingRank(c, dir);
  LateRank(c, dir);
  fmt::print("rank {} of {}: {}\n", c.rank(), c.size(), failures == 0 ? "OK" : "FAILED");
  return failures == 0 ? 0 : 1;
}
