// Communicators inside one process: a group of one, and a group of threads for tests.
//
// The thread group keeps one "round" per collective sequence number: each rank deposits its
// contribution into round k (its k-th collective), waits until the ranks it needs have deposited,
// reads the result and leaves; the last to leave frees the round. Who waits for whom follows
// MPI's point-to-point collectives (src/distributed/mpi), so tests see the same timing as mpirun
// jobs: Barrier and AllGather wait for every rank; Gather's root waits for every rank while the
// others return once they deposited (an eager send); Broadcast's root returns at once while the
// others wait for the root. A timeout or Abort marks the whole group broken (c10d semantics: after
// a timeout the group is unusable), which wakes every waiter.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>

#include "savepoint/comm.h"

namespace savepoint {
namespace {

class SingleProcessCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Status Barrier(Timeout) override { return broken_; }
  Status Broadcast(std::string*, int root, Timeout) override {
    if (root != 0) return InvalidArgumentError(fmt::format("Broadcast: root {} of 1 rank", root));
    return broken_;
  }
  Result<std::vector<std::string>> Gather(std::string_view bytes, int root, Timeout) override {
    return AllGatherOrError(bytes, root);
  }
  Result<std::vector<std::string>> AllGather(std::string_view bytes, Timeout) override {
    return AllGatherOrError(bytes, 0);
  }
  void Abort(const Status& reason) override {
    if (broken_.ok()) broken_ = reason.ok() ? InternalError("aborted") : reason;
  }

 private:
  Result<std::vector<std::string>> AllGatherOrError(std::string_view bytes, int root) {
    if (root != 0) return InvalidArgumentError(fmt::format("Gather: root {} of 1 rank", root));
    if (!broken_.ok()) return broken_;
    return std::vector<std::string>{std::string(bytes)};
  }
  Status broken_;
};

// State shared by the communicators of one thread group.
struct Group {
  struct Round {
    std::string op;  // the first arrival's operation, to detect mismatched calls
    int root = 0;
    std::vector<std::optional<std::string>> in;
    int arrived = 0;
    int left = 0;
  };
  explicit Group(int n) : size(n) {}
  const int size;
  std::mutex mu;
  std::condition_variable cv;
  Status broken;  // non-OK once the group is broken (timeout, abort, mismatch)
  std::map<uint64_t, Round> rounds;
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<Group> g, int rank) : g_(std::move(g)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return g_->size; }

  Status Barrier(Timeout timeout) override {
    return Collective("Barrier", 0, {}, timeout).status();
  }
  Status Broadcast(std::string* bytes, int root, Timeout timeout) override {
    SP_ASSIGN_OR_RETURN(std::vector<std::string> all,
                        Collective("Broadcast", root, rank_ == root ? *bytes : "", timeout));
    if (rank_ != root) *bytes = std::move(all[root]);
    return Status::OK();
  }
  Result<std::vector<std::string>> Gather(std::string_view bytes, int root,
                                          Timeout timeout) override {
    SP_ASSIGN_OR_RETURN(std::vector<std::string> all, Collective("Gather", root, bytes, timeout));
    if (rank_ != root) all.clear();
    return all;
  }
  Result<std::vector<std::string>> AllGather(std::string_view bytes, Timeout timeout) override {
    return Collective("AllGather", 0, bytes, timeout);
  }
  void Abort(const Status& reason) override {
    std::lock_guard<std::mutex> lock(g_->mu);
    Break(reason.WithContext(fmt::format("rank {} aborted the group", rank_)));
  }

 private:
  // Marks the group broken (first reason wins) and wakes every waiter. Caller holds g_->mu.
  void Break(Status reason) {
    if (g_->broken.ok()) g_->broken = reason.ok() ? InternalError("group aborted") : reason;
    g_->cv.notify_all();
  }

  Result<std::vector<std::string>> Collective(std::string_view op, int root, std::string_view bytes,
                                              Timeout timeout) {
    if (root < 0 || root >= g_->size) {
      return InvalidArgumentError(fmt::format("{}: root {} of {} ranks", op, root, g_->size));
    }
    uint64_t seq = seq_++;
    std::string what = fmt::format("{} #{} on rank {}", op, seq, rank_);
    std::unique_lock<std::mutex> lock(g_->mu);
    if (!g_->broken.ok()) return g_->broken.WithContext(what);
    Group::Round& r = g_->rounds[seq];
    if (r.in.empty()) {
      r.op = std::string(op), r.root = root, r.in.resize(g_->size);
    } else if (r.op != op || r.root != root) {
      Break(
          InternalError(fmt::format("collective #{}: rank {} called {} (root {}) but another "
                                    "rank called {} (root {})",
                                    seq, rank_, op, root, r.op, r.root)));
      return g_->broken;
    }
    r.in[rank_] = std::string(bytes);
    ++r.arrived;
    g_->cv.notify_all();
    bool done = g_->cv.wait_for(
        lock, timeout, [&] { return !g_->broken.ok() || Missing(g_->rounds[seq]).empty(); });
    Group::Round& round = g_->rounds[seq];
    if (Missing(round).empty()) return Leave(seq, round);
    if (!done) Break(DeadlineExceededError(TimeoutMessage(what, round, timeout)));
    return g_->broken.WithContext(what);
  }

  // The ranks this rank still waits for in round `r` (see the file comment).
  std::vector<int> Missing(const Group::Round& r) const {
    std::vector<int> missing;
    const bool root = rank_ == r.root;
    if ((r.op == "Gather" && !root) || (r.op == "Broadcast" && root)) return missing;
    for (int i = 0; i < g_->size; ++i) {
      bool needed = r.op != "Broadcast" || i == r.root;
      if (needed && !r.in[i]) missing.push_back(i);
    }
    return missing;
  }

  std::string TimeoutMessage(const std::string& what, const Group::Round& r, Timeout t) const {
    std::vector<int> missing = Missing(r);
    return fmt::format("{}: timed out after {} ms waiting for ranks [{}]", what, t.count(),
                       fmt::join(missing, ", "));
  }

  // Copies the round's result out and frees it when the last rank leaves. Caller holds g_->mu.
  std::vector<std::string> Leave(uint64_t seq, Group::Round& r) {
    std::vector<std::string> out;
    out.reserve(r.in.size());
    for (const auto& s : r.in) out.push_back(s.value_or(""));
    if (++r.left == g_->size) g_->rounds.erase(seq);
    return out;
  }

  std::shared_ptr<Group> g_;
  const int rank_;
  uint64_t seq_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> NewSingleProcessCommunicator() {
  return std::make_unique<SingleProcessCommunicator>();
}

std::vector<std::unique_ptr<Communicator>> NewThreadCommunicators(int n) {
  std::vector<std::unique_ptr<Communicator>> out;
  if (n < 1 || n > 4096) return out;
  auto g = std::make_shared<Group>(n);
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<ThreadCommunicator>(g, r));
  return out;
}

}  // namespace savepoint
