// Bindings of the sparse embedding tables (savepoint/sparse.h) for savepoint/_sparse_io.py:
// SaveSparse and SaveSparseDistributed of tables whose ids and slots borrow the caller's memory
// (no copy), LoadSparse (a shard's rows, delta chain applied) handing back the loaded tensors and
// tables without a copy, SparseChain, CompactSparse, ShouldCompact and DirtySet. The GIL is
// released for all I/O.
#include "savepoint/sparse.h"

#include <fmt/format.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>

#include <exception>
#include <optional>

#include "common.h"
#include "tables.h"

namespace savepoint::python {
namespace {

TensorView ViewOf(const TensorSpec& spec, const std::string& what) {
  const auto& [name, address, dtype_name, shape] = spec;
  std::optional<DType> dtype = DTypeFromName(dtype_name);
  if (!dtype) throw StatusError(InvalidArgumentError(what + ": dtype " + dtype_name));
  return TensorView(reinterpret_cast<void*>(address), *dtype, shape);
}

SparseSaveOptions SaveOptionsOf(bool overwrite, bool create_parents, uint64_t chunk_bytes,
                                nb::handle key, const std::string& base, int concurrency) {
  SparseSaveOptions o;
  o.save.overwrite = overwrite;
  o.save.create_parents = create_parents;
  o.save.chunk_bytes = chunk_bytes;
  o.save.key = KeyFromPython(key, "savepoint.save key");
  o.base = base;
  o.concurrency = concurrency;
  return o;
}

nb::dict SaveSparsePy(const std::string& path, const std::vector<TensorSpec>& tensors,
                      const std::vector<ValueSpec>& values, const std::string& metadata,
                      const std::vector<TableSpec>& tables, bool overwrite, bool create_parents,
                      bool direct_io, int io_threads, uint64_t chunk_bytes,
                      const CompressionSpec& compression, nb::handle key, const std::string& base,
                      int concurrency) {
  State state = MakeState(tensors, values, metadata);
  AddTables(state, tables, path);
  SaveStats stats;
  SparseSaveOptions o =
      SaveOptionsOf(overwrite, create_parents, chunk_bytes, key, base, concurrency);
  o.save.compression = MakeCompression(compression);
  o.save.stats = &stats;
  Check(Unlocked([&] {
    return SaveSparse(state, path, o, {.io_threads = io_threads, .direct_io = direct_io});
  }));
  return SaveStatsToPython(stats);
}

nb::dict SaveSparseDistributedPy(nb::object comm, const std::string& path,
                                 const std::vector<TensorSpec>& tensors, const BoxSpecs& boxes,
                                 const std::vector<ValueSpec>& values, const std::string& metadata,
                                 const std::vector<TableSpec>& tables, bool overwrite,
                                 bool create_parents, uint64_t chunk_bytes, int io_threads,
                                 bool direct_io, double timeout_s, nb::handle key,
                                 const std::string& base, int concurrency) {
  std::unique_ptr<Communicator> communicator = MakeTorchCommunicator(std::move(comm));
  State state;
  try {  // a bad local table fails this rank before any collective: abort the others too
    state = MakeState(tensors, values, metadata);
    AddTables(state, tables, path);
  } catch (const StatusError& e) {
    communicator->Abort(
        e.status().WithContext(fmt::format("savepoint.save on rank {}", communicator->rank())));
    throw;
  }
  ShardLayout layout = LayoutFromBoxes(boxes);
  SaveStats stats;
  SparseSaveOptions o =
      SaveOptionsOf(overwrite, create_parents, chunk_bytes, key, base, concurrency);
  o.save.stats = &stats;
  o.timeout = TimeoutFromPython(timeout_s);
  Check(Unlocked([&] {
    return SaveSparseDistributed(*communicator, state, layout, path, o,
                                 {.io_threads = io_threads, .direct_io = direct_io});
  }));
  return SaveStatsToPython(stats);
}

// The options of a sparse load of shard `shard_id` of `shard_num` (tables and slots selected; the
// key named `what` in errors).
SparseLoadOptions LoadOptionsOf(int shard_id, int shard_num, const std::vector<std::string>& tables,
                                const std::vector<std::string>& slots, bool verify, nb::handle key,
                                const char* what) {
  SparseLoadOptions o;
  o.load.verify_checksums = verify;
  o.load.key = KeyFromPython(key, what);
  o.shard_id = shard_id;
  o.shard_num = shard_num;
  o.tables = tables;
  o.slots = slots;
  return o;
}

nb::tuple LoadSparsePy(const std::string& path, int shard_id, int shard_num,
                       const std::vector<std::string>& tables,
                       const std::vector<std::string>& slots,
                       const std::map<std::string, std::string>& rename,
                       const std::map<std::string, std::string>& slot_dtypes, bool dense,
                       bool verify, int io_threads, bool direct_io, nb::handle key) {
  SparseLoadOptions o =
      LoadOptionsOf(shard_id, shard_num, tables, slots, verify, key, "savepoint.load key");
  o.rename = rename;
  for (const auto& [slot, dtype_name] : slot_dtypes) {
    std::optional<DType> dtype = DTypeFromName(dtype_name);
    if (!dtype) throw StatusError(InvalidArgumentError("slot " + slot + ": dtype " + dtype_name));
    o.slot_dtypes[slot] = *dtype;
  }
  o.dense = dense;
  Result<State> r = Unlocked(
      [&] { return LoadSparse(path, o, {.io_threads = io_threads, .direct_io = direct_io}); });
  return SparseStateToPython(Take(std::move(r)));
}

// LoadSparseBatches of the tables only, each batch handed to `sink(name, ids, [slots])` (as
// load_sparse gives a table, no copy) with the GIL held; the load itself runs without it. An
// exception `sink` raises stops the load and is raised again here.
void LoadSparseBatchesPy(const std::string& path, int shard_id, int shard_num,
                         const std::vector<std::string>& tables,
                         const std::vector<std::string>& slots, uint64_t batch_bytes, bool verify,
                         int io_threads, bool direct_io, nb::handle key, nb::object sink) {
  SparseLoadOptions o = LoadOptionsOf(shard_id, shard_num, tables, slots, verify, key,
                                      "savepoint.sparse.load_into key");
  o.dense = false;
  std::optional<nb::python_error> raised;
  std::exception_ptr other;
  SparseBatchSink call = [&](const std::string& table, SparseTable batch) -> Status {
    nb::gil_scoped_acquire gil;
    try {
      State holder;
      SP_RETURN_IF_ERROR(holder.PutTable(table, std::move(batch)));
      nb::tuple handed = SparseStateToPython(std::move(holder));
      nb::tuple t = nb::cast<nb::tuple>(nb::cast<nb::list>(handed[3])[0]);
      sink(t[0], t[1], t[2]);
    } catch (nb::python_error& e) {
      raised.emplace(std::move(e));
      return InternalError("the table's __savepoint_set_table__ raised");
    } catch (...) {  // StatusError, a cast error, bad_alloc: raised again after the load
      other = std::current_exception();
      return InternalError("handing a batch to Python failed");
    }
    return Status::OK();
  };
  Result<State> r = Unlocked([&] {
    return LoadSparseBatches(path, call, o, batch_bytes,
                             {.io_threads = io_threads, .direct_io = direct_io});
  });
  if (raised) throw std::move(*raised);
  if (other) std::rethrow_exception(other);
  Take(std::move(r));
}

nb::list ChainPy(const std::string& path) {
  Result<std::vector<SparseChainLink>> r = Unlocked([&] { return SparseChain(path); });
  nb::list out;
  for (const SparseChainLink& l : Take(std::move(r))) {
    out.append(nb::make_tuple(l.path, fmt::format("{:016x}", l.checkpoint_id), l.depth));
  }
  return out;
}

// CompactSparse: the chain ending at `src` (read with `key`) folded into a full checkpoint at
// `dst` (encrypted with `dst_key`), in parts of about `batch_bytes`. Returns the save's SaveStats.
nb::dict CompactPy(const std::string& src, const std::string& dst, bool overwrite,
                   bool create_parents, uint64_t chunk_bytes, const CompressionSpec& compression,
                   nb::handle key, nb::handle dst_key, int concurrency, int io_threads,
                   bool direct_io, bool verify, uint64_t batch_bytes) {
  SaveStats stats;
  SparseSaveOptions o =
      SaveOptionsOf(overwrite, create_parents, chunk_bytes, dst_key, "", concurrency);
  o.save.compression = MakeCompression(compression);
  o.save.stats = &stats;
  LoadOptions load;
  load.verify_checksums = verify;
  load.key = KeyFromPython(key, "savepoint.compact key");
  Check(Unlocked([&] {
    return CompactSparse(src, dst, o, load, {.io_threads = io_threads, .direct_io = direct_io},
                         batch_bytes);
  }));
  return SaveStatsToPython(stats);
}

std::span<const int64_t> IdsAt(uintptr_t address, size_t count) {
  return {reinterpret_cast<const int64_t*>(address), count};
}

nb::bytes IdBytes(const std::vector<int64_t>& ids) {
  return nb::bytes(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(int64_t));
}

}  // namespace

// (name, dtype name, shape, uint8 numpy array of its bytes) of `t`, kept alive by `owner`.
nb::tuple BytesOf(std::string_view name, const TensorView& t, nb::handle owner) {
  nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>> bytes(reinterpret_cast<uint8_t*>(t.data()),
                                                     {static_cast<size_t>(t.nbytes())}, owner);
  return nb::make_tuple(nb::str(name.data(), name.size()), nb::str(DTypeName(t.dtype()).data()),
                        nb::tuple(nb::cast(t.shape())), bytes.cast());
}

// A loaded State as (tensors, values, metadata JSON, tables) without a copy: tensors as
// TensorBytesToPython gives them, tables as [(name, ids as (name, dtype, shape, bytes), [slots as
// (slot name, dtype, shape, bytes)])] in name order. One capsule keeps the State alive.
nb::tuple SparseStateToPython(State state) {
  nb::list values = ValuesToPython(state);
  std::string metadata = DumpJson(state.metadata());
  auto* owned = new State(std::move(state));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<State*>(p); });
  nb::list tensors;
  for (const auto& [name, e] : owned->entries()) {
    if (e.is_tensor()) tensors.append(BytesOf(name, e.tensor(), owner));
  }
  nb::list tables;
  for (const auto& [name, t] : owned->tables()) {
    nb::list slots;
    for (const SparseTable::Slot& s : t->slots()) slots.append(BytesOf(s.name, s.view, owner));
    tables.append(nb::make_tuple(nb::str(name.data(), name.size()),
                                 BytesOf("ids", t->ids_view(), owner), slots));
  }
  return nb::make_tuple(tensors, values, metadata, tables);
}

void AddTables(State& state, const std::vector<TableSpec>& tables, const std::string& path) {
  for (const auto& [name, ids, slots, deleted] : tables) {
    const std::string where = fmt::format("savepoint.save {}: table {:?}", path, name);
    std::vector<SparseTable::Slot> views;
    for (const TensorSpec& s : slots) {
      views.push_back({std::get<0>(s), ViewOf(s, where + " slot " + std::get<0>(s))});
    }
    TensorView del = deleted ? ViewOf(*deleted, where + " deleted") : TensorView();
    // (the ids' uniqueness is checked by the save's sort: IdCheck::kAtSave)
    Result<SparseTable> t = SparseTable::FromViews(ViewOf(ids, where + " ids"), std::move(views),
                                                   std::move(del), SparseTable::IdCheck::kAtSave);
    if (!t.ok()) throw StatusError(t.status().WithContext(where));
    Check(state.PutTable(name, std::move(t).value()).WithContext(where));
  }
}

void BindSparse(nb::module_& m) {
  m.def("save_sparse", &SaveSparsePy, nb::arg("path"), nb::arg("tensors"), nb::arg("values"),
        nb::arg("metadata"), nb::arg("tables"), nb::arg("overwrite"), nb::arg("create_parents"),
        nb::arg("direct_io"), nb::arg("io_threads"), nb::arg("chunk_bytes"), nb::arg("compression"),
        nb::arg("key").none(), nb::arg("base"), nb::arg("concurrency"),
        "SaveSparse of borrowed tensors, values and tables (GIL released); tables: [(name, ids, "
        "[slots], deleted or None)] as tensor specs. base: '' for a full save, else the delta's "
        "base. Returns SaveStats.");
  m.def("save_sparse_distributed", &SaveSparseDistributedPy, nb::arg("comm"), nb::arg("path"),
        nb::arg("tensors"), nb::arg("boxes"), nb::arg("values"), nb::arg("metadata"),
        nb::arg("tables"), nb::arg("overwrite"), nb::arg("create_parents"), nb::arg("chunk_bytes"),
        nb::arg("io_threads"), nb::arg("direct_io"), nb::arg("timeout_s"), nb::arg("key").none(),
        nb::arg("base"), nb::arg("concurrency"),
        "SaveSparseDistributed over a Python communicator (as save_distributed); each rank's "
        "tables hold the rows it owns.");
  m.def("load_sparse", &LoadSparsePy, nb::arg("path"), nb::arg("shard_id"), nb::arg("shard_num"),
        nb::arg("tables"), nb::arg("slots"), nb::arg("rename"), nb::arg("slot_dtypes"),
        nb::arg("dense"), nb::arg("verify"), nb::arg("io_threads"), nb::arg("direct_io"),
        nb::arg("key").none() = nb::none(),
        "LoadSparse: (tensors, values, metadata JSON, tables [(name, ids, [slots])]), every "
        "tensor as (name, dtype, shape, uint8 array of its bytes), no copy.");
  m.def("load_sparse_batches", &LoadSparseBatchesPy, nb::arg("path"), nb::arg("shard_id"),
        nb::arg("shard_num"), nb::arg("tables"), nb::arg("slots"), nb::arg("batch_bytes"),
        nb::arg("verify"), nb::arg("io_threads"), nb::arg("direct_io"), nb::arg("key").none(),
        nb::arg("sink"),
        "LoadSparseBatches of the tables: sink(name, ids, [slots]) per batch (GIL held), each "
        "tensor as load_sparse gives it (no copy).");
  m.def("sparse_chain", &ChainPy, nb::arg("path"),
        "The delta chain ending at path, newest first: [(path, checkpoint id hex, depth)].");
  m.def("compact_sparse", &CompactPy, nb::arg("src"), nb::arg("dst"), nb::arg("overwrite"),
        nb::arg("create_parents"), nb::arg("chunk_bytes"), nb::arg("compression"),
        nb::arg("key").none(), nb::arg("dst_key").none(), nb::arg("concurrency"),
        nb::arg("io_threads"), nb::arg("direct_io"), nb::arg("verify"), nb::arg("batch_bytes"),
        "CompactSparse(src, dst) (GIL released): the chain ending at src saved as a full "
        "checkpoint at dst. Returns SaveStats.");
  m.def(
      "should_compact",
      [](int64_t depth, uint64_t delta_bytes, uint64_t base_bytes, int64_t max_depth,
         double max_delta_ratio) {
        return ShouldCompact(depth, delta_bytes, base_bytes,
                             {.max_depth = max_depth, .max_delta_ratio = max_delta_ratio});
      },
      nb::arg("depth"), nb::arg("delta_bytes"), nb::arg("base_bytes"), nb::arg("max_depth"),
      nb::arg("max_delta_ratio"), "ShouldCompact under CompactionPolicy{max_depth, ratio}.");
  m.def("gen_slice", [](int index, int shards) {
    SliceRange r = Take(GenSlice(index, shards));
    return nb::make_tuple(r.begin, r.end);
  });

  nb::class_<DirtySet>(m, "DirtySet")
      .def(nb::init<>())
      .def(
          "touch",
          [](DirtySet& d, uintptr_t address, size_t count) { d.Touch(IdsAt(address, count)); },
          nb::arg("address"), nb::arg("count"))
      .def(
          "delete",
          [](DirtySet& d, uintptr_t address, size_t count) { d.Delete(IdsAt(address, count)); },
          nb::arg("address"), nb::arg("count"))
      .def("touched", [](const DirtySet& d) { return IdBytes(d.touched()); })
      .def("deleted", [](const DirtySet& d) { return IdBytes(d.deleted()); })
      .def("clear", &DirtySet::Clear);
}

}  // namespace savepoint::python
