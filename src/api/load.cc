// The public Load: a checkpoint with sparse tables goes to LoadSparse (every table whole, its
// delta chain applied; src/sparse/load.cc), any other to the engine (engine::LoadTensors). Like
// save.cc, the one place above engine/ and sparse/ that joins them.
#include <fmt/format.h>

#include <chrono>
#include <memory>

#include "engine/reader.h"
#include "format/manifest.h"
#include "savepoint/checkpoint.h"
#include "savepoint/sparse.h"

namespace savepoint {
namespace {

// LoadSparse, which takes no stats, with the stats filled here (bytes of the tensors and tables
// loaded; chunks are not counted).
Result<State> LoadWithTables(const std::string& path, const LoadOptions& options,
                             const IoOptions& io) {
  const auto t0 = std::chrono::steady_clock::now();
  LoadOptions lo = options;
  lo.stats = nullptr;
  SP_ASSIGN_OR_RETURN(State state, LoadSparse(path, {.load = lo}, io));
  if (options.stats != nullptr) {
    uint64_t bytes = state.tensor_bytes();
    for (const auto& [name, t] : state.tables()) {
      bytes += t->ids_view().nbytes();
      for (const SparseTable::Slot& s : t->slots()) bytes += s.view.nbytes();
    }
    *options.stats = LoadStats{};
    options.stats->bytes = options.stats->stored_bytes = bytes;
    options.stats->direct_io = io.direct_io;
    options.stats->seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return state;
}

}  // namespace

Result<State> Load(const std::string& path, const LoadOptions& options, const IoOptions& io) {
  if (!options.mmap && options.map_mode != MapMode::kReadOnly) {
    return InvalidArgumentError(fmt::format(
        "load {}: LoadOptions.map_mode is copy-on-write but mmap is false (set mmap = true)",
        path));
  }
  SP_ASSIGN_OR_RETURN(std::unique_ptr<engine::Reader> reader,
                      engine::Reader::OpenImpl(path, options, io));
  if (reader->values().FindValue(format::kSparseValueName) != nullptr) {
    reader.reset();
    return LoadWithTables(path, options, io);
  }
  return engine::LoadTensors(std::move(reader), path, options);
}

}  // namespace savepoint
