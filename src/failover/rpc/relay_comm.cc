// The relayed communicator of a dump's writers (relay_comm.h).
#include "failover/rpc/relay_comm.h"

#include <fmt/format.h>

#include "failover/rpc/common.h"

namespace savepoint::failover {
namespace {

class RelayCommunicator final : public Communicator {
 public:
  RelayCommunicator(rpc::Failover::Stub* stub, std::string token, std::string dump_id, int writer,
                    int writers)
      : stub_(stub),
        token_(std::move(token)),
        dump_id_(std::move(dump_id)),
        writer_(writer),
        writers_(writers) {}

  int rank() const override { return writer_; }
  int size() const override { return writers_; }

  Status Barrier(Timeout timeout) override { return Exchange("Barrier", {}, timeout).status(); }
  Status Broadcast(std::string* bytes, int root, Timeout timeout) override {
    SP_RETURN_IF_ERROR(CheckRoot("Broadcast", root));
    SP_ASSIGN_OR_RETURN(std::vector<std::string> all,
                        Exchange("Broadcast", writer_ == root ? *bytes : "", timeout));
    *bytes = std::move(all[root]);
    return Status::OK();
  }
  Result<std::vector<std::string>> Gather(std::string_view bytes, int root,
                                          Timeout timeout) override {
    SP_RETURN_IF_ERROR(CheckRoot("Gather", root));
    SP_ASSIGN_OR_RETURN(std::vector<std::string> all, Exchange("Gather", bytes, timeout));
    if (writer_ != root) all.clear();
    return all;
  }
  Result<std::vector<std::string>> AllGather(std::string_view bytes, Timeout timeout) override {
    return Exchange("AllGather", bytes, timeout);
  }
  void Abort(const Status& reason) override {
    if (broken_.ok()) broken_ = reason.ok() ? InternalError("aborted") : reason;
    rpc::CollectiveRequest req;
    req.set_dump_id(dump_id_);
    req.set_writer(writer_);
    req.set_abort(true);
    req.set_abort_reason(reason.ToString());
    rpc::CollectiveReply reply;
    grpc::ClientContext ctx;
    ctx.AddMetadata(kTokenKey, token_);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    stub_->Collective(&ctx, req, &reply).ok();  // best effort: never blocks for long
  }

 private:
  Status CheckRoot(std::string_view op, int root) const {
    if (root >= 0 && root < writers_) return Status::OK();
    return InvalidArgumentError(fmt::format("{}: root {} of {} writers", op, root, writers_));
  }

  // The all-gather every collective is made of.
  Result<std::vector<std::string>> Exchange(std::string_view op, std::string_view bytes,
                                            Timeout timeout) {
    if (!broken_.ok()) return broken_;
    rpc::CollectiveRequest req;
    req.set_dump_id(dump_id_);
    req.set_writer(writer_);
    req.set_seq(seq_++);
    req.set_data(std::string(bytes));
    req.set_timeout_ms(timeout.count());
    rpc::CollectiveReply reply;
    grpc::ClientContext ctx;
    ctx.AddMetadata(kTokenKey, token_);
    // The controller answers at its own deadline; ours only guards against a lost controller.
    ctx.set_deadline(std::chrono::system_clock::now() + timeout + std::chrono::seconds(5));
    Status s = FromGrpc(stub_->Collective(&ctx, req, &reply), fmt::format("dump {}", op));
    if (s.ok()) s = FromWire(reply.code(), reply.message());
    if (s.ok() && reply.data_size() != writers_) {
      s = InternalError(
          fmt::format("{}: {} contributions for {} writers", op, reply.data_size(), writers_));
    }
    if (!s.ok()) {
      broken_ = s;
      return s;
    }
    return std::vector<std::string>(reply.data().begin(), reply.data().end());
  }

  rpc::Failover::Stub* stub_;
  const std::string token_;
  const std::string dump_id_;
  const int writer_;
  const int writers_;
  uint64_t seq_ = 0;
  Status broken_;
};

}  // namespace

std::unique_ptr<Communicator> NewRelayCommunicator(rpc::Failover::Stub* stub, std::string token,
                                                   std::string dump_id, int writer, int writers) {
  return std::make_unique<RelayCommunicator>(stub, std::move(token), std::move(dump_id), writer,
                                             writers);
}

}  // namespace savepoint::failover
