// Binding of the RecIS checkpoint import (savepoint/recis.h) for savepoint/_recis_import.py:
// LoadRecisCheckpoint, handing the tables and dense tensors to Python without a copy. The GIL is
// released while the directory is read.
#include "savepoint/recis.h"

#include "common.h"
#include "tables.h"

namespace savepoint::python {
namespace {

// (SparseStateToPython of the state read, directory read, shard_num, [skipped lines]).
nb::tuple LoadRecisPy(const std::string& dir, int io_threads) {
  Result<RecisCheckpoint> r =
      Unlocked([&] { return LoadRecisCheckpoint(dir, {}, {.io_threads = io_threads}); });
  RecisCheckpoint c = Take(std::move(r));
  nb::list skipped;
  for (const std::string& s : c.skipped) skipped.append(nb::str(s.data(), s.size()));
  return nb::make_tuple(SparseStateToPython(std::move(c.state)), c.path, c.shard_num, skipped);
}

}  // namespace

void BindRecis(nb::module_& m) {
  m.def("load_recis", &LoadRecisPy, nb::arg("dir"), nb::arg("io_threads"),
        "LoadRecisCheckpoint: ((tensors, values, metadata JSON, tables) as load_sparse, "
        "directory read, shard_num, [skipped]), no copy.");
}

}  // namespace savepoint::python
