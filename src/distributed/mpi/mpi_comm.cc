// The OpenMPI communicator: collectives from non-blocking point-to-point messages, polled against
// a deadline.
//
// Every collective takes the next sequence number; its messages carry the tag 1 + seq % kTagSpan,
// so messages of different collectives never match. Gather: every rank sends to the root, which
// probes each sender (so on timeout it knows who is missing). Broadcast: the root sends to every
// rank. AllGather = Gather to rank 0 + Broadcast of the packed result; Barrier = AllGather of
// nothing. Tag 0 carries abort messages (a status), probed for while any collective waits.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <mpi.h>

#include <chrono>
#include <memory>
#include <thread>

#include "distributed/wire.h"
#include "savepoint/mpi.h"

namespace savepoint {
namespace {

constexpr int kAbortTag = 0;
constexpr uint64_t kTagSpan = 30000;  // MPI guarantees tags up to 32767
using Clock = std::chrono::steady_clock;

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, bool owns_init) : comm_(comm), owns_init_(owns_init) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override {
    MPI_Comm_free(&comm_);
    if (owns_init_) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Status Barrier(Timeout timeout) override { return AllGather("", timeout).status(); }

  Status Broadcast(std::string* bytes, int root, Timeout timeout) override {
    SP_RETURN_IF_ERROR(Begin("Broadcast", root));
    return BroadcastImpl(bytes, root, Clock::now() + timeout);
  }

  Result<std::vector<std::string>> Gather(std::string_view bytes, int root,
                                          Timeout timeout) override {
    SP_RETURN_IF_ERROR(Begin("Gather", root));
    return GatherImpl(bytes, root, Clock::now() + timeout);
  }

  Result<std::vector<std::string>> AllGather(std::string_view bytes, Timeout timeout) override {
    auto deadline = Clock::now() + timeout;
    SP_RETURN_IF_ERROR(Begin("AllGather", 0));
    SP_ASSIGN_OR_RETURN(std::vector<std::string> all, GatherImpl(bytes, 0, deadline));
    dist::WireWriter w;
    for (const auto& s : all) w.Str(s);
    std::string packed = std::move(w.bytes());
    SP_RETURN_IF_ERROR(BroadcastImpl(&packed, 0, deadline));
    dist::WireReader r(packed, "MPI AllGather result");
    all.resize(size_);
    for (auto& s : all) {
      SP_ASSIGN_OR_RETURN(s, r.Str());
    }
    return all;
  }

  void Abort(const Status& reason) override {
    Break(reason.ok() ? InternalError("aborted") : reason, /*notify=*/true);
  }

 private:
  // Starts a collective: checks the group and the root, takes the next tag.
  Status Begin(std::string_view op, int root) {
    what_ = fmt::format("MPI {} #{} on rank {}", op, seq_, rank_);
    tag_ = static_cast<int>(1 + seq_++ % kTagSpan);
    if (root < 0 || root >= size_) {
      return InvalidArgumentError(fmt::format("{}: root {} of {} ranks", what_, root, size_));
    }
    PollAbort();
    return broken_.ok() ? Status::OK() : broken_.WithContext(what_);
  }

  // Marks the group broken (first reason wins); with `notify`, tells every other rank.
  void Break(const Status& reason, bool notify) {
    if (!broken_.ok()) return;
    broken_ = reason;
    if (!notify) return;
    dist::WireWriter w;
    w.U64(static_cast<uint64_t>(reason.code()));
    w.Str(fmt::format("rank {} aborted the group: {}", rank_, reason.message()));
    abort_msg_ = std::move(w.bytes());
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      MPI_Request req;
      MPI_Isend(abort_msg_.data(), static_cast<int>(abort_msg_.size()), MPI_BYTE, r, kAbortTag,
                comm_, &req);
      MPI_Request_free(&req);
    }
  }

  // Receives a pending abort message, if any, and breaks the group with its status.
  void PollAbort() {
    int flag = 0;
    MPI_Message msg;
    MPI_Status st;
    MPI_Improbe(MPI_ANY_SOURCE, kAbortTag, comm_, &flag, &msg, &st);
    if (!flag) return;
    std::string bytes = Receive(&msg, &st);
    dist::WireReader r(bytes, "MPI abort message");
    Result<uint64_t> code = r.U64();
    Result<std::string> text = r.Str();
    StatusCode c = code.ok() && *code > 0 && *code <= uint64_t(kLastStatusCode)
                       ? static_cast<StatusCode>(*code)
                       : StatusCode::kInternal;
    Break(Status(c, text.ok() ? *text : "rank aborted the group"), /*notify=*/false);
  }

  static std::string Receive(MPI_Message* msg, MPI_Status* st) {
    int n = 0;
    MPI_Get_count(st, MPI_BYTE, &n);
    std::string bytes(static_cast<size_t>(n), '\0');
    MPI_Mrecv(bytes.data(), n, MPI_BYTE, msg, MPI_STATUS_IGNORE);
    return bytes;
  }

  // Polls `step` (returns true when done) until it is done, the group breaks or the deadline
  // passes; `missing` lists the ranks still awaited, for the timeout message.
  template <typename Step, typename Missing>
  Status Poll(Clock::time_point deadline, Step&& step, Missing&& missing) {
    auto pause = std::chrono::microseconds(5);
    while (!step()) {
      PollAbort();
      if (!broken_.ok()) return broken_.WithContext(what_);
      if (Clock::now() > deadline) {
        Break(DeadlineExceededError(fmt::format("{}: timed out waiting for ranks [{}]", what_,
                                                fmt::join(missing(), ", "))),
              /*notify=*/true);
        return broken_;
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
    return Status::OK();
  }

  // Waits for sends of `buf` to complete. On failure the requests are released (MPI may still
  // complete them later), so `buf` is kept alive until the communicator is destroyed.
  Status WaitSends(std::vector<MPI_Request>& reqs, const std::vector<int>& dests,
                   std::shared_ptr<const std::string> buf, Clock::time_point deadline) {
    Status s = Poll(
        deadline,
        [&] {
          int done = 0;
          MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
          return done != 0;
        },
        [&] {
          std::vector<int> out;
          for (size_t i = 0; i < reqs.size(); ++i) {
            if (reqs[i] != MPI_REQUEST_NULL) out.push_back(dests[i]);
          }
          return out;
        });
    for (auto& r : reqs) {
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
    }
    if (!s.ok()) orphans_.push_back(std::move(buf));
    return s;
  }

  // Receives one message of this collective's tag from each rank in `from` into out[rank].
  Status ReceiveFrom(const std::vector<int>& from, std::vector<std::string>* out,
                     Clock::time_point deadline) {
    std::vector<bool> got(size_, false);
    size_t left = from.size();
    auto step = [&] {
      for (int r : from) {
        if (got[r]) continue;
        int flag = 0;
        MPI_Message msg;
        MPI_Status st;
        MPI_Improbe(r, tag_, comm_, &flag, &msg, &st);
        if (flag) (*out)[r] = Receive(&msg, &st), got[r] = true, --left;
      }
      return left == 0;
    };
    auto missing = [&] {
      std::vector<int> m;
      for (int r : from) {
        if (!got[r]) m.push_back(r);
      }
      return m;
    };
    return Poll(deadline, step, missing);
  }

  Result<std::vector<std::string>> GatherImpl(std::string_view bytes, int root,
                                              Clock::time_point deadline) {
    std::vector<std::string> out;
    if (rank_ != root) {
      auto buf = std::make_shared<const std::string>(bytes);
      std::vector<MPI_Request> req(1);
      MPI_Isend(buf->data(), static_cast<int>(buf->size()), MPI_BYTE, root, tag_, comm_, &req[0]);
      SP_RETURN_IF_ERROR(WaitSends(req, {root}, buf, deadline));
      return out;
    }
    out.resize(size_);
    out[root] = std::string(bytes);
    std::vector<int> from;
    for (int r = 0; r < size_; ++r) {
      if (r != root) from.push_back(r);
    }
    SP_RETURN_IF_ERROR(ReceiveFrom(from, &out, deadline));
    return out;
  }

  Status BroadcastImpl(std::string* bytes, int root, Clock::time_point deadline) {
    if (rank_ == root) {
      auto buf = std::make_shared<const std::string>(*bytes);
      std::vector<MPI_Request> reqs;
      std::vector<int> dests;
      for (int r = 0; r < size_; ++r) {
        if (r == root) continue;
        reqs.emplace_back();
        dests.push_back(r);
        MPI_Isend(buf->data(), static_cast<int>(buf->size()), MPI_BYTE, r, tag_, comm_,
                  &reqs.back());
      }
      return WaitSends(reqs, dests, buf, deadline);
    }
    std::vector<std::string> out(size_);
    SP_RETURN_IF_ERROR(ReceiveFrom({root}, &out, deadline));
    *bytes = std::move(out[root]);
    return Status::OK();
  }

  MPI_Comm comm_;
  bool owns_init_;
  int rank_ = 0, size_ = 1;
  uint64_t seq_ = 0;
  int tag_ = 1;
  std::string what_;
  Status broken_;
  std::string abort_msg_;  // kept alive while abort sends may be in flight
  std::vector<std::shared_ptr<const std::string>> orphans_;  // buffers of abandoned sends
};

}  // namespace

Result<std::unique_ptr<Communicator>> NewMpiCommunicator() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  bool owns = false;
  if (!initialized) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
      return InternalError("MPI_Init_thread failed");
    }
    owns = true;
  }
  MPI_Comm comm;
  if (MPI_Comm_dup(MPI_COMM_WORLD, &comm) != MPI_SUCCESS) {
    return InternalError("MPI_Comm_dup(MPI_COMM_WORLD) failed");
  }
  return std::unique_ptr<Communicator>(std::make_unique<MpiCommunicator>(comm, owns));
}

}  // namespace savepoint
