// The public Load, LoadInto and Verify: the store of the checkpoint's format
// (LoadOptions::format; kAuto detects it) reads it (src/store/). A native checkpoint with sparse
// tables is read with every table whole, its delta chain applied. With LoadOptions::topology's
// layout, Load and LoadInto read this rank's boxes (LoadDistributedAlloc, LoadDistributed).
#include <fmt/format.h>

#include <memory>

#include "engine/reader.h"
#include "savepoint/checkpoint.h"
#include "savepoint/distributed.h"
#include "store/store.h"

namespace savepoint {
namespace {

bool HasTopology(const Topology& t) {
  return t.comm != nullptr || t.layout != nullptr || t.timeout != Topology{}.timeout;
}

// The options of a read of this rank's boxes (topology cleared), or InvalidArgument naming what
// such a read cannot honour.
Result<LoadOptions> BoxOptions(const LoadOptions& options, const std::string& path) {
  const Topology& t = options.topology;
  const Format f = options.format;
  const char* field =
      t.comm != nullptr ? "topology.comm is set: loads take no communicator (each rank reads its "
                          "own boxes, topology.layout)"
      : t.timeout != Topology{}.timeout
          ? "topology.timeout is set: only saves of ranks wait on collectives"
      : t.layout == nullptr    ? "topology is set without a layout"
      : !options.names.empty() ? "names is set: with topology.layout the layout names the tensors"
      : f != Format::kAuto && f != Format::kNative
          ? "format: topology.layout reads native checkpoints only"
          : nullptr;
  if (field != nullptr) {
    return InvalidArgumentError(fmt::format("load {}: LoadOptions.{}", path, field));
  }
  LoadOptions o = options;
  o.topology = {};
  return o;
}

}  // namespace

Result<State> Load(const std::string& path, const LoadOptions& options, const IoOptions& io) {
  if (HasTopology(options.topology)) {
    SP_ASSIGN_OR_RETURN(LoadOptions o, BoxOptions(options, path));
    return LoadDistributedAlloc(path, *options.topology.layout, o, io);
  }
  SP_ASSIGN_OR_RETURN(std::unique_ptr<store::Reader> reader,
                      store::OpenRead(path, options.format, options, io));
  return reader->Read(options.names);
}

Status LoadInto(const std::string& path, State& targets, const LoadOptions& options,
                const IoOptions& io) {
  if (!HasTopology(options.topology)) return engine::LoadInto(path, targets, options, io);
  SP_ASSIGN_OR_RETURN(LoadOptions o, BoxOptions(options, path));
  return LoadDistributed(path, targets, *options.topology.layout, o, io);
}

Status Verify(const std::string& path, const LoadOptions& options, const IoOptions& io) {
  if (!options.names.empty() || options.mmap || options.map_mode != MapMode::kReadOnly) {
    return InvalidArgumentError(fmt::format(
        "verify {}: LoadOptions.names, mmap and map_mode do not apply (every entry is verified, "
        "by reading it)",
        path));
  }
  SP_ASSIGN_OR_RETURN(std::unique_ptr<store::Reader> reader,
                      store::OpenRead(path, options.format, options, io));
  return reader->Verify(options.stats);
}

}  // namespace savepoint
