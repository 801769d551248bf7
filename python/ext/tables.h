// Sparse tables handed over from Python (savepoint/_sparse_io.py): each table's ids, slots and
// deleted ids as tensor specs that borrow the caller's memory. Used by the sparse bindings
// (sparse.cc) and by the manager's save (manager.cc); loaded tables handed back to Python
// (sparse.cc, recis.cc).
//
// Thread safety: call with the GIL held.
#ifndef SAVEPOINT_PYTHON_TABLES_H_
#define SAVEPOINT_PYTHON_TABLES_H_

#include <nanobind/stl/optional.h>

#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "common.h"

namespace savepoint::python {

// (table name, ids as TensorSpec (its name unused), slots as TensorSpecs named by slot, deleted
// ids or None).
using TableSpec =
    std::tuple<std::string, TensorSpec, std::vector<TensorSpec>, std::optional<TensorSpec>>;

// Adds the borrowed tables to `state` (no copy); StatusError (InvalidArgument) naming the
// checkpoint `path`, the table (and the slot or id).
void AddTables(State& state, const std::vector<TableSpec>& tables, const std::string& path);

// (name, dtype name, shape, uint8 numpy array of its bytes) of `t`, kept alive by `owner`.
nb::tuple BytesOf(std::string_view name, const TensorView& t, nb::handle owner);

// A loaded State handed to Python without a copy: (tensors [(name, dtype, shape, bytes)], values,
// metadata JSON, tables [(name, ids (name, dtype, shape, bytes), [slots as the same])]); the
// arrays keep the State alive.
nb::tuple SparseStateToPython(State state);

}  // namespace savepoint::python

#endif  // SAVEPOINT_PYTHON_TABLES_H_
