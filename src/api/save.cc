// The public save entry points: each builds one engine::WriteRequest and hands it to the store
// seam (src/store/): Save to the store of its format (SaveOptions::format; its topology moves
// into the request, so that Save of a rank is SaveDistributed), the others to the
// native store, which flattens sparse tables (SaveSparse*; SaveDistributed refuses tables, so
// that every rank runs the same collectives) and writes through engine::Write for one process or
// dist::Write for the ranks of a Communicator.
#include <fmt/format.h>

#include "engine/request.h"
#include "savepoint/checkpoint.h"
#include "savepoint/distributed.h"
#include "savepoint/sparse.h"
#include "store/store.h"

namespace savepoint {
namespace {

engine::WriteRequest Request(const State& state, const std::string& path, const SaveOptions& o,
                             const IoOptions& io) {
  engine::WriteRequest r;
  r.path = path;
  r.state = &state;
  r.options = o;
  r.io = io;
  return r;
}

engine::WriteRequest Request(Communicator& comm, const State& local, const ShardLayout& layout,
                             const std::string& path, const SaveOptions& o, Timeout timeout,
                             const IoOptions& io) {
  engine::WriteRequest r = Request(local, path, o, io);
  r.topology = {.comm = &comm, .layout = &layout, .timeout = timeout};
  return r;
}

}  // namespace

Status Save(const State& state, const std::string& path, const SaveOptions& o,
            const IoOptions& io) {
  const Format format = o.format == Format::kAuto ? TargetFormat(path) : o.format;
  engine::WriteRequest r = Request(state, path, o, io);
  if (o.topology.comm == nullptr && o.topology.layout != nullptr) {
    return InvalidArgumentError(fmt::format(
        "save {}: SaveOptions.topology.layout needs topology.comm (the ranks saving together)",
        path));
  }
  if (o.topology.comm == nullptr && o.topology.timeout != Topology{}.timeout) {
    return InvalidArgumentError(fmt::format(
        "save {}: SaveOptions.topology.timeout applies to saves of ranks (topology.comm)", path));
  }
  if (o.topology.comm != nullptr) {
    static const ShardLayout kWhole;  // every tensor whole, replicated
    r.topology = o.topology;
    if (r.topology.layout == nullptr) r.topology.layout = &kWhole;
    r.options.topology = {};
  }
  if (format == Format::kNative) {
    r.options.format = Format::kNative;
    return store::WriteNative(r);
  }
  SP_ASSIGN_OR_RETURN(std::unique_ptr<store::Writer> w, store::OpenWrite(r, format));
  return w->Commit(state);
}

Status SaveSparse(const State& state, const std::string& path, const SparseSaveOptions& o,
                  const IoOptions& io) {
  return store::WriteNative(Request(state, path, o.save, io), &o);
}

Status SaveDistributed(Communicator& comm, const State& local, const ShardLayout& layout,
                       const std::string& path, const DistributedSaveOptions& o,
                       const IoOptions& io) {
  return store::WriteNative(Request(comm, local, layout, path, o.save, o.timeout, io));
}

Status SaveSparseDistributed(Communicator& comm, const State& local, const ShardLayout& layout,
                             const std::string& path, const SparseSaveOptions& o,
                             const IoOptions& io) {
  return store::WriteNative(Request(comm, local, layout, path, o.save, o.timeout, io), &o);
}

}  // namespace savepoint
