// The native store: savepoint's checkpoint directories (docs/FORMAT.md). Reads go through the
// engine's Reader (a checkpoint with sparse tables through LoadSparse: every table whole, its
// delta chain applied); writes flatten sparse tables (sparse::Flatten) and hand the request to
// the writer of its topology: engine::Write for one process, dist::Write for the ranks.
#include <fmt/format.h>

#include <chrono>
#include <memory>

#include "distributed/write.h"
#include "engine/reader.h"
#include "engine/writer.h"
#include "format/manifest.h"
#include "savepoint/sparse.h"
#include "sparse/save.h"
#include "store/formats.h"

namespace savepoint::store {
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

class NativeReader final : public Reader {
 public:
  NativeReader(std::string path, const LoadOptions& options, const IoOptions& io,
               std::unique_ptr<engine::Reader> reader)
      : path_(std::move(path)), options_(options), io_(io), reader_(std::move(reader)) {}

  Format format() const override { return Format::kNative; }
  const std::string& path() const override { return path_; }
  // Listed from the manifest when asked (a Load never asks). The tensors of a checkpoint with
  // sparse tables include the tables' stored form (docs/FORMAT.md §11).
  Result<std::vector<Entry>> Entries() override {
    std::unique_ptr<engine::Reader> owned;
    const engine::Reader* r = reader_.get();
    if (r == nullptr) {
      SP_ASSIGN_OR_RETURN(owned, engine::Reader::OpenImpl(path_, options_, io_));
      r = owned.get();
    }
    std::vector<Entry> out;
    for (const TensorInfo& t : r->tensors()) {
      out.push_back({.name = t.name, .tensor = true, .dtype = t.dtype, .shape = t.shape});
    }
    for (const auto& [name, e] : r->values().entries()) {
      if (name != format::kSparseValueName) out.push_back({.name = name});
    }
    return out;
  }

  Result<State> Read(const std::vector<std::string>& names) override {
    LoadOptions o = options_;
    o.names = names;
    SP_ASSIGN_OR_RETURN(std::unique_ptr<engine::Reader> r, Take());
    if (r->values().FindValue(format::kSparseValueName) != nullptr) {
      r.reset();
      return LoadWithTables(path_, o, io_);
    }
    return engine::LoadTensors(std::move(r), path_, o);
  }

  Status Verify(LoadStats* stats) override {
    SP_ASSIGN_OR_RETURN(std::unique_ptr<engine::Reader> r, Take());
    return r->Verify(stats);
  }

 private:
  // The engine's reader: the one opened at Open the first time, a new one after.
  Result<std::unique_ptr<engine::Reader>> Take() {
    if (reader_ != nullptr) return std::move(reader_);
    return engine::Reader::OpenImpl(path_, options_, io_);
  }

  const std::string path_;
  const LoadOptions options_;
  const IoOptions io_;
  std::unique_ptr<engine::Reader> reader_;  // until the first Read or Verify takes it
};

class NativeWriterImpl final : public Writer {
 public:
  explicit NativeWriterImpl(const engine::WriteRequest& request) : request_(request) {}
  Format format() const override { return Format::kNative; }
  Status Commit(const State& state) override {
    engine::WriteRequest r = request_;
    r.state = &state;
    return WriteNative(r);
  }

 private:
  const engine::WriteRequest request_;
};

Status WriteFlat(const engine::WriteRequest& r) {
  return r.topology.comm == nullptr ? engine::Write(r) : dist::Write(r);
}

}  // namespace

Result<std::unique_ptr<Reader>> OpenNative(const std::string& path, const LoadOptions& options,
                                           const IoOptions& io) {
  SP_ASSIGN_OR_RETURN(std::unique_ptr<engine::Reader> r,
                      engine::Reader::OpenImpl(path, options, io));
  return std::unique_ptr<Reader>(std::make_unique<NativeReader>(path, options, io, std::move(r)));
}

std::unique_ptr<Writer> NativeWriter(const engine::WriteRequest& request) {
  return std::make_unique<NativeWriterImpl>(request);
}

Status WriteNative(const engine::WriteRequest& request, const SparseSaveOptions* tables) {
  const bool flatten =
      tables != nullptr || (request.topology.comm == nullptr && !request.state->tables().empty());
  if (!flatten) return WriteFlat(request);  // (dist::Write refuses tables on every rank)
  SparseSaveOptions o;
  if (tables != nullptr) {
    o = *tables;
  } else {
    o.save = request.options;
    o.timeout = request.topology.timeout;
  }
  sparse::Flat flat;
  SP_RETURN_IF_ERROR(sparse::Flatten(request, o, &flat));
  return WriteFlat(flat.request);
}

}  // namespace savepoint::store
