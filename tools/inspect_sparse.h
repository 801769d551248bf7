// The sparse-table part of `savepoint inspect` (cmd_inspect_sparse.cc): a checkpoint's tables
// (rows, slots, the slice range and rows of each data file) and its delta chain, from manifests
// alone. docs/CLI.md, "Sparse tables".
#ifndef SAVEPOINT_TOOLS_INSPECT_SPARSE_H_
#define SAVEPOINT_TOOLS_INSPECT_SPARSE_H_

#include "savepoint/savepoint.h"

namespace savepoint::cli {

// Whether the checkpoint holds sparse tables (the value "savepoint.sparse", FORMAT.md §11).
bool HasSparseTables(const CheckpointReader& r);

// Prints the tables, their files and the delta chain (human output of inspect).
void PrintSparseTables(const CheckpointReader& r);

// {"depth", "base", "tables": [...], "chain": [...] or "chain_error"} (inspect --json "sparse").
Json SparseTablesJson(const CheckpointReader& r);

}  // namespace savepoint::cli

#endif  // SAVEPOINT_TOOLS_INSPECT_SPARSE_H_
