// Building owning sparse tables for tests: ids plus slots whose rows a callback fills per id.
#ifndef SAVEPOINT_TESTS_TESTUTIL_SPARSE_TABLES_H_
#define SAVEPOINT_TESTS_TESTUTIL_SPARSE_TABLES_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "savepoint/sparse.h"

namespace savepoint::testing {

// One slot of a test table: rows of `width` elements of `dtype` (shape [rows, width]; width < 0:
// shape [rows], one element per row), the row of each id written by `fill(id, row)`.
struct TableSlot {
  std::string name;
  DType dtype = DType::kF32;
  int64_t width = -1;
  std::function<void(int64_t id, std::span<std::byte> row)> fill;
};

// An owning table of rows `ids` (in the given order) with `slots` and, for a delta, `deleted`.
// Aborts on an invalid table (a duplicate id, ...): tests build valid ones.
SparseTable MakeTable(std::span<const int64_t> ids, const std::vector<TableSlot>& slots,
                      std::span<const int64_t> deleted = {});

}  // namespace savepoint::testing

#endif  // SAVEPOINT_TESTS_TESTUTIL_SPARSE_TABLES_H_
