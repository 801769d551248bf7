// The public save entry points: each builds one engine::WriteRequest. A State with sparse tables
// goes through sparse::Flatten first (Save, SaveSparse*; SaveDistributed refuses tables, so that
// every rank runs the same collectives), then the writer of its topology: engine::Write for one
// process, dist::Write for the ranks of a Communicator.
// This file is the one place above engine/, distributed/ and sparse/ that joins them.
#include "sparse/save.h"

#include <fmt/format.h>

#include "distributed/write.h"
#include "engine/request.h"
#include "engine/writer.h"
#include "savepoint/checkpoint.h"
#include "savepoint/distributed.h"
#include "savepoint/sparse.h"

namespace savepoint {
namespace {

Status WriteFlat(const engine::WriteRequest& r) {
  return r.topology.comm == nullptr ? engine::Write(r) : dist::Write(r);
}

// Writes `r` as a checkpoint with sparse tables (docs/FORMAT.md §11), with table options `o`.
Status WriteSparse(const engine::WriteRequest& r, const SparseSaveOptions& o) {
  sparse::Flat flat;
  SP_RETURN_IF_ERROR(sparse::Flatten(r, o, &flat));
  return WriteFlat(flat.request);
}

// Writes `r`, through WriteSparse (default table options) when r.state holds tables.
Status Submit(const engine::WriteRequest& r) {
  if (r.state->tables().empty()) return WriteFlat(r);
  return WriteSparse(r, {.save = r.options, .timeout = r.topology.timeout});
}

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
  return Submit(Request(state, path, o, io));
}

Status SaveSparse(const State& state, const std::string& path, const SparseSaveOptions& o,
                  const IoOptions& io) {
  return WriteSparse(Request(state, path, o.save, io), o);
}

Status SaveDistributed(Communicator& comm, const State& local, const ShardLayout& layout,
                       const std::string& path, const DistributedSaveOptions& o,
                       const IoOptions& io) {
  return dist::Write(Request(comm, local, layout, path, o.save, o.timeout, io));
}

Status SaveSparseDistributed(Communicator& comm, const State& local, const ShardLayout& layout,
                             const std::string& path, const SparseSaveOptions& o,
                             const IoOptions& io) {
  return WriteSparse(Request(comm, local, layout, path, o.save, o.timeout, io), o);
}

}  // namespace savepoint
