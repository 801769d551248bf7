// How sparse tables are stored in a native checkpoint (docs/FORMAT.md §11): each table is a few
// ordinary tensors whose rows are in storage order, (slice, id) ascending, described by the JSON
// value format::kSparseValueName. This header has the names of those tensors, the description's
// encoder and hostile-input-proof decoder, and the sort into storage order.
#ifndef SAVEPOINT_SPARSE_STORED_H_
#define SAVEPOINT_SPARSE_STORED_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "format/manifest.h"
#include "savepoint/sparse.h"

namespace savepoint::sparse {

// Prefix of every tensor that stores part of a table; dense entries may not use it.
inline constexpr std::string_view kTensorPrefix = "savepoint.sparse/";
// The version of the description (its "format" member) that this build writes; it reads 1 too.
//  1: each table's slice index is a dense I64 [65536] of rows per slice (one per slice).
//  2: it holds only the slices with rows, packed (PackSlice), plus a per-saving-rank index.
inline constexpr int64_t kDescFormat = 2;
inline constexpr int64_t kOldestDescFormat = 1;
// Caps on what a description may hold.
inline constexpr int64_t kMaxChainDepth = 4096;
inline constexpr size_t kMaxTables = size_t{1} << 16;
inline constexpr size_t kMaxSlots = 1024;

// Names of the tensors of one stored table.
struct StoredNames {
  std::string ids;             // I64 [rows]
  std::string counts;          // format 1: I64 [65536] rows per slice; 2: I64 [K] PackSlice
  std::string deleted;         // deltas: I64 [n], the deleted ids in storage order
  std::string deleted_counts;  // deltas: as `counts`, of the deleted ids
  std::string ranks;           // format 2: I64 [N, RankColumns] (RankColumn)
  std::vector<std::pair<std::string, std::string>> slots;  // slot name, tensor name
};

// The names a writer gives the tensors of table number `index` (in name order) of a checkpoint
// (format kDescFormat): "savepoint.sparse/<index>.<table>/ids", ".../slices", ".../ranks",
// ".../slot/<slot>", and in a delta ".../deleted" and ".../deleted_slices". Distinct for distinct
// tables and slots.
StoredNames NamesFor(size_t index, std::string_view table, const std::vector<std::string>& slots,
                     bool delta);

// Format 2's slice index: one I64 per slice that holds rows, `rows * 65536 + slice` (rows >= 1,
// below 2^47), ascending; and per saving rank r of N (which held slices GenSlice(r, N)) one row
// of the ranks tensor: where its entries start in each table tensor.
inline int64_t PackSlice(int64_t slice, int64_t rows) { return rows * kNumSlices + slice; }
inline constexpr int64_t kMaxSliceRows = (int64_t{1} << 47) - 1;
// So that a loader reads the rows of just the ranks that hold its slices, a rank's row says where
// its entries start and how many there are.
enum RankColumn : int {
  kRankSlices = 0,          // its first entry in `counts`
  kRankEntries = 1,         // its number of entries in `counts`
  kRankIds = 2,             // its first row in `ids` and the slots
  kRankDeletedSlices = 3,   // deltas: its first entry in `deleted_counts`
  kRankDeletedEntries = 4,  // deltas: its number of entries in `deleted_counts`
  kRankDeleted = 5,         // deltas: its first row in `deleted`
};
inline int64_t RankColumns(bool delta) { return delta ? 6 : 3; }
// The saving rank of N that held slice `slice` (the inverse of GenSlice).
int64_t SavingRankOf(int64_t slice, int64_t n);

// One table of a checkpoint.
struct StoredTable {
  std::string name;
  StoredNames names;
};

// The sparse description of one checkpoint.
struct Desc {
  int64_t format = kDescFormat;  // kOldestDescFormat..kDescFormat
  int64_t depth = 0;             // 0: a full checkpoint; a delta: its base's depth + 1
  std::string base;              // deltas: the base, a sibling's name or an absolute path
  uint64_t base_id = 0;          // deltas: the base's checkpoint id
  std::vector<StoredTable> tables;
  bool delta() const { return depth > 0; }
};

Json EncodeDesc(const Desc& d);

// Decodes and validates the description of the checkpoint whose manifest is `m` (`where` names it
// in messages): its JSON shape and caps, and every tensor it names against the manifest (dtypes,
// shapes, rows agreeing across slots). nullopt-like: `*found` is false when `m` has no tables.
Result<Desc> DecodeDesc(const format::Manifest& m, std::string_view where, bool* found);

// Where `base` (as a Desc records it) lies, for a delta at `path`.
std::string ResolveBase(const std::string& path, const std::string& base);
// How a delta at `path` records its base at `base_path`: the base's name when they are siblings,
// else base_path when absolute. InvalidArgument otherwise.
Result<std::string> RecordBase(const std::string& path, const std::string& base_path);

// The (slice, id) order of storage.
inline bool KeyLess(int64_t a, int64_t b) {
  const int64_t sa = SliceOf(a), sb = SliceOf(b);
  return sa != sb ? sa < sb : a < b;
}

// True when `ids` are strictly in storage order (so also unique).
bool InStorageOrder(std::span<const int64_t> ids);

// A table's rows in storage order, with their slice counts over `range`: views of the caller's
// table when it is already in that order, else of the owned copies in `owned`, except for large
// slots, which stay the caller's views and are gathered into storage order chunk by chunk while
// they are written (`gathered`, `perm`; engine::RowGather), so that sorting them overlaps the I/O.
//
// An asynchronous save stages a large hash-ordered table instead (sparse/stage.h): `late` is then
// true, the slots are copies of the caller's rows as they lay, all gathered, and `ids` and `perm`
// are memory that the save's late step fills (SortStaged) before they are written.
struct SortedTable {
  TensorView ids;
  std::vector<TensorView> slots;  // in the table's slot order
  std::vector<bool> gathered;     // per slot: slots[k] is stored through perm
  std::span<const int64_t> perm;  // storage row i is row perm[i] of the table (when unsorted)
  TensorView deleted;             // I64 [n], storage order
  Tensor slices;                  // I64 [K]: PackSlice of the slices of the range with rows
  Tensor deleted_slices;          // I64 [K']: the same of the deleted ids
  bool late = false;              // ids and perm are filled by the save's late step
  std::vector<Tensor> owned;
};

// InvalidArgument "{what} {id} (slice s) lies outside this shard's slices [b, e)" for the first of
// `ids` outside `range`.
Status CheckRange(std::span<const int64_t> ids, SliceRange range, std::string_view what);

// The permutation putting `ids` (all in `range`) in storage order into `perm`, and the ids in that
// order into `sorted` (both of ids.size()). InvalidArgument "ids: id X appears twice".
Status Order(std::span<const int64_t> ids, SliceRange range, std::span<int64_t> sorted,
             std::span<int64_t> perm);

// `ids` in storage order: the view itself when already sorted, else a sorted copy in `owned`.
Result<TensorView> SortedIds(const TensorView& v, std::span<const int64_t> ids,
                             std::vector<Tensor>* owned);

// The slice index of `ids` (in storage order): PackSlice of each slice that holds rows, as an I64
// tensor. InvalidArgument for a slice of more than kMaxSliceRows rows.
Result<Tensor> PackSlices(std::span<const int64_t> ids);
// The same from (slice, rows) pairs, slices ascending, rows >= 1.
Result<Tensor> PackedIndex(std::span<const std::pair<int64_t, int64_t>> slice_rows);

// Slots of at least this many bytes are gathered while written rather than sorted into a copy.
inline constexpr uint64_t kGatherSlotBytes = uint64_t{1} << 20;

// Sorts `t` into storage order on `threads` threads and packs its slice index (`slices`).
// InvalidArgument naming the id when an id or deleted id lies outside `range`, or an id appears
// twice (sparse/access.h).
// `known_in_order`: the caller has found InStorageOrder(t.ids()) true (the pass is not repeated).
Result<SortedTable> SortTable(const SparseTable& t, SliceRange range, int threads,
                              bool known_in_order = false);

}  // namespace savepoint::sparse

#endif  // SAVEPOINT_SPARSE_STORED_H_
