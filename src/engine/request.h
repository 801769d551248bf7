// The one internal write request: everything a save needs to know, built by the public entry
// points (src/api/save.cc) and by sparse tables (src/sparse/save.cc), and taken by the engine's
// writer (engine::Write, one process) and the distributed protocol (dist::Write, ranks of a
// Communicator). It borrows everything it points to; the caller keeps those alive until the write
// returns.
#ifndef SAVEPOINT_ENGINE_REQUEST_H_
#define SAVEPOINT_ENGINE_REQUEST_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <string_view>

#include "savepoint/checkpoint.h"
#include "savepoint/comm.h"
#include "savepoint/distributed.h"
#include "savepoint/io_options.h"
#include "savepoint/state.h"

namespace savepoint::engine {

// Rows of a tensor stored in another order than they lie in memory: row i of the stored tensor
// is row perm[i] of `base` (its rows of row_bytes bytes). Sparse tables are sorted into storage
// order this way while they are written (src/sparse/save.cc), chunk by chunk in the writer
// threads, instead of into a sorted copy before the write. The memory is the caller's and
// outlives the save.
struct RowGather {
  const std::byte* base = nullptr;
  const int64_t* perm = nullptr;  // rows of the stored tensor
  uint64_t rows = 0;
  uint64_t row_bytes = 0;
};
// Tensor name -> how its rows are gathered.
using RowGathers = std::map<std::string, RowGather, std::less<>>;

// Tensors whose bytes, and whose row gathers' permutations, exist only once `prepare` has run:
// an asynchronous save of a hash-ordered sparse table copies the rows as they lie while its caller
// waits and sorts them afterwards (src/sparse/stage.h). The asynchronous saver stages every other
// tensor, returns to its caller, then runs `prepare` and writes these on its background threads;
// the synchronous writers run `prepare` first. PlanSave lays these tensors out after all others.
struct LateTensors {
  std::set<std::string, std::less<>> names;
  std::function<Status()> prepare;  // called once, on any one thread; may be empty
};

// Who writes: one process (comm == nullptr), or every rank of `comm`, each with its own tensors
// placed by `layout` (required with comm: the public Save puts an empty layout there when the
// caller gave none). The public options' type; in a request, options.topology is always unset.
using Topology = savepoint::Topology;

// InvalidArgument "{what}: {field}.topology is set: ..." when `t` has comm or layout set or a
// timeout other than the default, for the calls that do not take a topology in their options.
inline Status RefuseTopology(const Topology& t, std::string_view what, std::string_view field) {
  if (t.comm == nullptr && t.layout == nullptr && t.timeout == Topology{}.timeout) {
    return Status::OK();
  }
  return InvalidArgumentError(std::string(what) + ": " + std::string(field) +
                              ".topology is set, but this call takes no topology (Save, Load and "
                              "LoadInto do)");
}

struct WriteRequest {
  std::string path;              // the checkpoint directory to commit
  const State* state = nullptr;  // tensors, values and metadata (sparse tables already flattened)
  // Tensors whose rows are gathered into storage order as they are written (each named tensor's
  // memory is its gather's base, at least kPackBelowBytes long, so never packed). Default: none.
  const RowGathers* gathers = nullptr;
  // Tensors written after `late->prepare` has run (LateTensors). Default: none.
  const LateTensors* late = nullptr;
  Topology topology;
  SaveOptions options;  // chunking, codec, key, overwrite, stats and progress of this call
  IoOptions io;         // file system, threads, O_DIRECT
};

}  // namespace savepoint::engine

#endif  // SAVEPOINT_ENGINE_REQUEST_H_
