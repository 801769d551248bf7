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

// The options without their topology (what the readers take), or InvalidArgument for a
// communicator: loads read each rank's boxes on their own.
Result<LoadOptions> WithoutTopology(const LoadOptions& options, const std::string& path) {
  if (options.topology.comm != nullptr) {
    return InvalidArgumentError(fmt::format(
        "load {}: LoadOptions.topology.comm is set: loads take no communicator (each rank reads "
        "its own boxes, topology.layout)",
        path));
  }
  LoadOptions o = options;
  o.topology = {};
  return o;
}

}  // namespace

Result<State> Load(const std::string& path, const LoadOptions& options, const IoOptions& io) {
  if (options.topology.comm != nullptr || options.topology.layout != nullptr) {
    SP_ASSIGN_OR_RETURN(LoadOptions o, WithoutTopology(options, path));
    if (options.topology.layout != nullptr) {
      return LoadDistributedAlloc(path, *options.topology.layout, o, io);
    }
  }
  SP_ASSIGN_OR_RETURN(std::unique_ptr<store::Reader> reader,
                      store::OpenRead(path, options.format, options, io));
  return reader->Read(options.names);
}

Status LoadInto(const std::string& path, State& targets, const LoadOptions& options,
                const IoOptions& io) {
  if (options.topology.comm == nullptr && options.topology.layout == nullptr) {
    return engine::LoadInto(path, targets, options, io);
  }
  SP_ASSIGN_OR_RETURN(LoadOptions o, WithoutTopology(options, path));
  if (options.topology.layout == nullptr) return engine::LoadInto(path, targets, o, io);
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
