// Binding of the RecIS checkpoint import (savepoint/recis.h) for savepoint/_recis_import.py:
// LoadRecisCheckpoint, handing the tables and dense tensors to Python without a copy. The GIL is
// released while the directory is read.
#include "savepoint/recis.h"

#include <nanobind/ndarray.h>

#include "common.h"

namespace savepoint::python {
namespace {

// (name, dtype name, shape, uint8 numpy array of its bytes) of `t`, kept alive by `owner`.
nb::tuple Bytes(std::string_view name, const TensorView& t, nb::handle owner) {
  nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>> bytes(reinterpret_cast<uint8_t*>(t.data()),
                                                     {static_cast<size_t>(t.nbytes())}, owner);
  return nb::make_tuple(nb::str(name.data(), name.size()), nb::str(DTypeName(t.dtype()).data()),
                        nb::tuple(nb::cast(t.shape())), bytes.cast());
}

// (tensors [(name, dtype, shape, bytes)], tables [(name, ids ("ids", dtype, shape, bytes),
// [(slot, dtype, shape, bytes)])], metadata JSON, directory read, shard_num, [skipped lines]).
nb::tuple LoadRecisPy(const std::string& dir, int io_threads) {
  Result<RecisCheckpoint> r =
      Unlocked([&] { return LoadRecisCheckpoint(dir, {}, {.io_threads = io_threads}); });
  RecisCheckpoint c = Take(std::move(r));
  std::string metadata = DumpJson(c.state.metadata());
  auto* owned = new State(std::move(c.state));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<State*>(p); });
  nb::list tensors;
  for (const auto& [name, e] : owned->entries()) {
    if (!e.is_tensor()) continue;
    tensors.append(Bytes(name, e.tensor(), owner));
  }
  nb::list tables;
  for (const auto& [name, t] : owned->tables()) {
    nb::list slots;
    for (const SparseTable::Slot& s : t->slots()) {
      slots.append(Bytes(s.name, s.view, owner));
    }
    tables.append(nb::make_tuple(nb::str(name.data(), name.size()),
                                 Bytes("ids", t->ids_view(), owner), slots));
  }
  nb::list skipped;
  for (const std::string& s : c.skipped) skipped.append(nb::str(s.data(), s.size()));
  return nb::make_tuple(tensors, tables, metadata, c.path, c.shard_num, skipped);
}

}  // namespace

void BindRecis(nb::module_& m) {
  m.def("load_recis", &LoadRecisPy, nb::arg("dir"), nb::arg("io_threads"),
        "LoadRecisCheckpoint: (tensors [(name, dtype, shape, bytes)], tables [(name, ids, "
        "[slots])], metadata JSON, directory read, shard_num, [skipped]), no copy.");
}

}  // namespace savepoint::python
