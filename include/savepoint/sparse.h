// Sparse embedding tables: int64 ids, each with one row in every slot (the embedding and its
// optimizer slots), partitioned by id as RecIS does, saved sharded and incrementally, and loaded
// into any number of shards. Design and semantics: docs/SPARSE.md; on-disk form: docs/FORMAT.md
// §11.
//
// The partition: an id belongs to slice SliceOf(id) = id mod 65536, taken as the non-negative
// residue (ids are int64 hashes; negative ids are valid and land in slices like any other). Shard
// i of n owns the contiguous slice range GenSlice(i, n) (65536 / n slices each, the first
// 65536 % n of them one more), as RecIS's gen_slice computes it.
//
// A SparseTable is ids (I64, shape [rows], unique) plus named slots, each a tensor of any dtype
// whose dim 0 is rows (row r belongs to ids[r]), and, in a delta (incremental save), the ids
// deleted since the base. It either borrows the caller's memory (FromViews: nothing is copied on
// save when the rows are already in storage order, see SaveSparse) or owns it (FromTensors, and
// every table a load returns). Tables live in a State beside tensors and values
// (State::PutTable).
//
// Thread safety: SparseTable and DirtySet const methods may be called concurrently; DirtySet's
// mutators are internally locked; everything else needs external locking. The functions are
// reentrant for distinct paths.
#ifndef SAVEPOINT_SPARSE_H_
#define SAVEPOINT_SPARSE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "savepoint/checkpoint.h"
#include "savepoint/comm.h"
#include "savepoint/distributed.h"
#include "savepoint/export.h"
#include "savepoint/state.h"
#include "savepoint/status.h"
#include "savepoint/tensor.h"

namespace savepoint {

// --- The id partition (RecIS's). ---

inline constexpr int64_t kNumSlices = 65536;

// The slice of `id`: id mod 65536 as the non-negative residue (so -1 is in slice 65535).
inline int64_t SliceOf(int64_t id) {
  return static_cast<int64_t>(static_cast<uint64_t>(id) & 0xFFFF);
}

// A half-open range of slices [begin, end).
struct SAVEPOINT_API SliceRange {
  int64_t begin = 0;
  int64_t end = kNumSlices;
  bool Contains(int64_t slice) const { return slice >= begin && slice < end; }
  friend bool operator==(const SliceRange&, const SliceRange&) = default;
};

// The slices shard `index` of `shards` owns (RecIS gen_slice): 65536 / shards each, the first
// 65536 % shards one more. InvalidArgument unless 1 <= shards <= 65536 and 0 <= index < shards.
SAVEPOINT_API Result<SliceRange> GenSlice(int index, int shards);

// Coalesced tables (RecIS): several child tables share one table, the child index in the top 12
// bits of the id.
inline constexpr int kChildBits = 12;
inline int ChildOf(int64_t id) {
  return static_cast<int>(static_cast<uint64_t>(id) >> (64 - kChildBits));
}

// --- Tables. ---

class SAVEPOINT_API SparseTable {
 public:
  // One slot: a name (unique in the table) and a tensor whose dim 0 is the table's rows.
  struct Slot {
    std::string name;
    TensorView view;
  };

  SparseTable() = default;
  SparseTable(SparseTable&&) noexcept = default;
  SparseTable& operator=(SparseTable&&) noexcept = default;

  // When the uniqueness of a table's ids is checked.
  enum class IdCheck {
    kNow,  // by FromViews (Validate)
    // By the save that sorts the table into storage order (SaveSparse, SaveSparseDistributed,
    // Checkpointer::SaveAsync: InvalidArgument "ids: id X appears twice"; for an asynchronous
    // save of a large hash-ordered table, from its SaveHandle), which finds duplicates as it
    // sorts, so a table whose views are made anew for every save is not indexed twice. Other
    // uses of the table (MakeDelta) take the caller's word. Every other check is made now.
    kAtSave,
  };

  // A table borrowing the caller's memory: `ids` (I64 [rows]), `slots` (dim 0 = rows) and, for a
  // delta, `deleted` (I64 [n]; an empty view = none). The caller keeps the memory alive and
  // unchanged while the table is used. Fails as Validate does (see `id_check`).
  static Result<SparseTable> FromViews(TensorView ids, std::vector<Slot> slots,
                                       TensorView deleted = {}, IdCheck id_check = IdCheck::kNow);
  // A table owning its tensors (slot names paired with tensors). Fails as Validate does.
  static Result<SparseTable> FromTensors(Tensor ids,
                                         std::vector<std::pair<std::string, Tensor>> slots,
                                         Tensor deleted = {});

  int64_t num_rows() const { return ids_.shape().empty() ? 0 : ids_.shape()[0]; }
  const TensorView& ids_view() const { return ids_; }
  std::span<const int64_t> ids() const;
  // Ids deleted since the base (deltas only; empty otherwise).
  std::span<const int64_t> deleted() const;
  const std::vector<Slot>& slots() const { return slots_; }
  // nullptr when absent.
  const TensorView* FindSlot(std::string_view name) const;
  // Bytes of one row of slot `s` (0 for a table without rows).
  static uint64_t RowBytes(const TensorView& s);

  // OK when: ids is I64 of rank 1; deleted is I64 of rank 1 (or empty); every slot has a valid
  // name unique in the table, rank >= 1 and dim 0 equal to the number of ids; no id appears twice
  // in ids, nor in deleted, nor in both. InvalidArgument naming the slot or the id otherwise.
  // Ids in ascending order (by value, or by (slice, id) as checkpoints store them) are checked in
  // one pass; others through a hash index of them.
  Status Validate() const;

 private:
  friend class State;
  // Validate, the uniqueness of ids included or not.
  Status Check(bool unique_ids) const;

  TensorView ids_;
  TensorView deleted_;
  std::vector<Slot> slots_;
  std::vector<Tensor> owned_;  // backing memory of an owning table
  bool validated_ = false;     // made by a factory that validated it (State::PutTable skips it)
};

// Ids touched (inserted or updated) and deleted since the last save, for incremental saves: the
// training loop records them as it goes; MakeDelta turns them into the table a delta save takes.
// Touching an id forgets an earlier deletion of it and deleting one forgets an earlier touch.
// Thread-safe.
class SAVEPOINT_API DirtySet {
 public:
  void Touch(std::span<const int64_t> ids);
  void Delete(std::span<const int64_t> ids);
  // The recorded ids, sorted.
  std::vector<int64_t> touched() const;
  std::vector<int64_t> deleted() const;
  // Forgets everything (after a successful save).
  void Clear();

 private:
  mutable std::mutex mu_;
  std::unordered_set<int64_t> touched_;
  std::unordered_set<int64_t> deleted_;
};

// The delta of `table` for an incremental save: an owning table with the rows of `touched` (ids
// that must be in `table`, NotFound naming the first that is not) and `deleted` as its deleted
// ids.
SAVEPOINT_API Result<SparseTable> MakeDelta(const SparseTable& table,
                                            std::span<const int64_t> touched,
                                            std::span<const int64_t> deleted);
// The same from a DirtySet.
SAVEPOINT_API Result<SparseTable> MakeDelta(const SparseTable& table, const DirtySet& dirty);

// --- Save. ---

struct SAVEPOINT_API SparseSaveOptions {
  // How the checkpoint is written (chunk_bytes, overwrite, compression, key, ...). A distributed
  // save passes it to SaveDistributed (which does not compress).
  SaveOptions save = {};
  // Empty: a full save. Otherwise the path of the previous checkpoint of the chain (a full one or a
  // delta): this save is a delta, each table holding only its rows touched since then plus the ids
  // deleted since (SparseTable's `deleted`). Every table must exist in the base with the same
  // slots (names, dtypes, row shapes); tables of the base absent here carry over unchanged. The
  // base is read (its manifest) to record its checkpoint id. Default: empty.
  std::string base = {};
  // Threads that sort and write the rows (RecIS's `concurrency`); 0 = IoOptions::io_threads.
  // Default: 0.
  int concurrency = 0;
  // Distributed saves: timeout of the collectives. Default: 10 minutes.
  Timeout timeout = std::chrono::minutes(10);
  // Distributed saves: this rank's rows are those of shard `shard_id` of `shard_num` (ids in
  // GenSlice(shard_id, shard_num)), when that is not its place in the communicator, e.g. in a
  // failure dump, where writer i may write the rows of dead rank j. shard_num must equal the
  // communicator's size and every rank name a different shard (InvalidArgument otherwise); the
  // checkpoint is as if rank shard_id had saved them. A one-process save must leave both at their
  // defaults (InvalidArgument). Default: -1 and 0 (the rank and size in the communicator).
  int shard_id = -1;
  int shard_num = 0;
};

// Saves `state` (tensors, values, metadata and tables) as one checkpoint at `path`. Each table is
// stored as tensors whose rows are ordered by (slice, id) (docs/FORMAT.md §11): a table whose
// rows are already in that order is written straight from its memory, any other is sorted into
// owned buffers first. Errors: those of Save, InvalidArgument for an invalid table, a delta
// without `base` or deletions in a full save, and the base's errors (NotFound, Corruption) naming
// it.
SAVEPOINT_API Status SaveSparse(const State& state, const std::string& path,
                                const SparseSaveOptions& options = {}, const IoOptions& io = {});

// Sharded save, called by every rank of `comm`: rank r passes the rows it owns, whose ids must
// all lie in GenSlice(r, comm.size()) (InvalidArgument naming the id otherwise), and its dense
// tensors with their `layout` (as SaveDistributed). Every rank writes its own rows, in its own
// data file, replica-free; every rank must hold the same tables with the same slots (dtypes, row
// shapes). Values and metadata come from rank 0. Returns the same status on every rank.
SAVEPOINT_API Status SaveSparseDistributed(Communicator& comm, const State& local,
                                           const ShardLayout& layout, const std::string& path,
                                           const SparseSaveOptions& options = {},
                                           const IoOptions& io = {});

// --- Load. ---

struct SAVEPOINT_API SparseLoadOptions {
  // How the chain is read: verify_checksums and key (every link must take the same key). mmap,
  // names, stats and progress must be left at their defaults (InvalidArgument). Default: {}.
  LoadOptions load = {};
  // This loader is shard `shard_id` of `shard_num`: it gets the rows whose slice lies in
  // GenSlice(shard_id, shard_num), whatever number of shards saved them. Default: 0 of 1 (every
  // row).
  int shard_id = 0;
  int shard_num = 1;
  // Tables to load: exact names or glob patterns (MatchesName); empty = all. A pattern that
  // matches no table is NotFound. Default: empty.
  std::vector<std::string> tables = {};
  // Slots to load, by name or pattern, in every table loaded; empty = all (e.g. {"embedding"}
  // loads the embeddings without optimizer slots: a warm start). A pattern that matches no slot
  // of any loaded table is NotFound. Default: empty.
  std::vector<std::string> slots = {};
  // Saved table name -> name in the returned State. Default: empty (names kept).
  std::map<std::string, std::string> rename = {};
  // Required dtype of slots, by slot name: a loaded slot of another dtype is InvalidArgument
  // naming the table, the slot and both dtypes. Default: empty (any).
  std::map<std::string, DType> slot_dtypes = {};
  // Whether to load the dense tensors (every one, whole) and the values and metadata too.
  // Default: true.
  bool dense = true;
};

// Loads the checkpoint at `path` with its delta chain applied (base first, each delta in turn:
// a delta's rows replace the earlier ones of the same id, its deletions remove ids), into a new
// State. Tables are owned, rows ordered by (slice, id). Errors name the link of the chain:
// NotFound (a missing base), Corruption (a base replaced by another checkpoint, a chain with a
// gap, a delta of a table or slot its base lacks, a checksum), InvalidArgument (options).
SAVEPOINT_API Result<State> LoadSparse(const std::string& path,
                                       const SparseLoadOptions& options = {},
                                       const IoOptions& io = {});

// Like LoadSparse, adding what it loads to `into` (AlreadyExists on a name `into` already has):
// loads from several checkpoints into one state, e.g. a RecIS model bank.
SAVEPOINT_API Status LoadSparseInto(const std::string& path, State& into,
                                    const SparseLoadOptions& options = {},
                                    const IoOptions& io = {});

// Receives one batch of a table from LoadSparseBatches: the table's name (after
// SparseLoadOptions::rename) and its rows of one slice range, owned, in storage order. A non-OK
// status stops the load, which returns it.
using SparseBatchSink = std::function<Status(const std::string& table, SparseTable batch)>;

// Default batch size of LoadSparseBatches and CompactSparse: 256 MiB.
inline constexpr uint64_t kDefaultSparseBatchBytes = uint64_t{256} << 20;

// Like LoadSparse, but hands the tables to `sink` in batches instead of building them, so that
// they can be put into the caller's own structures (e.g. RecIS hash tables) without a second whole
// copy: each selected table in turn (name order), in consecutive slice ranges of this shard's
// range, each batch about `batch_bytes` of rows (the split assumes rows spread over the slices as
// hashed ids do; a slice is never split); 0 = each table in one batch. A table with no rows here
// gets one empty batch; no other batch is empty. Memory beyond what `sink` keeps: about twice a
// batch (a batch and the chain's rows it is merged from). Returns the dense tensors, values and
// metadata (when options.dense; else an empty State). Errors: as LoadSparse; InvalidArgument for
// an empty sink; the sink's own error, in context.
SAVEPOINT_API Result<State> LoadSparseBatches(const std::string& path, const SparseBatchSink& sink,
                                              const SparseLoadOptions& options = {},
                                              uint64_t batch_bytes = kDefaultSparseBatchBytes,
                                              const IoOptions& io = {});

// What the delta chain ending at `path` is, newest first (no data read).
struct SAVEPOINT_API SparseChainLink {
  std::string path;
  uint64_t checkpoint_id = 0;
  int64_t depth = 0;  // 0 for a full checkpoint, the base's depth + 1 for a delta
};
SAVEPOINT_API Result<std::vector<SparseChainLink>> SparseChain(const std::string& path,
                                                               const IoOptions& io = {});

// Folds the chain ending at `src` into a full checkpoint at `dst` (every table whole, the dense
// tensors, values and metadata of `src`), committed atomically like any save: a crash leaves
// either no `dst` or a complete one, and no link of the chain changes. dst may be src itself
// (options.save.overwrite: the compacted checkpoint replaces the head, as the manager does); a
// lower link of the chain is InvalidArgument. It streams: the tables are merged and written in
// parts of about `batch_bytes` (slice ranges, each in its own data file, as the saving ranks of a
// distributed save write theirs; at most 4096 parts), so that it holds about twice a part, plus
// src's dense tensors, whatever the size of the chain; the ids are read twice (once to place the
// parts). 0 = one part. A compressed compaction (options.save.compression) loads the chain whole
// instead: distributed writes do not compress. options.timeout is not used (no collectives);
// shard_id / shard_num must stay at their defaults (InvalidArgument).
SAVEPOINT_API Status CompactSparse(const std::string& src, const std::string& dst,
                                   const SparseSaveOptions& options = {},
                                   const LoadOptions& load = {}, const IoOptions& io = {},
                                   uint64_t batch_bytes = kDefaultSparseBatchBytes);

// Compaction policy: whether a chain of `depth` deltas holding `delta_bytes` of table data on a
// base of `base_bytes` should be compacted (depth > max_depth, or delta_bytes > ratio *
// base_bytes).
struct SAVEPOINT_API CompactionPolicy {
  int64_t max_depth = 8;         // Default: 8.
  double max_delta_ratio = 0.5;  // Default: 0.5.
};
SAVEPOINT_API bool ShouldCompact(int64_t depth, uint64_t delta_bytes, uint64_t base_bytes,
                                 const CompactionPolicy& policy = {});

}  // namespace savepoint

#endif  // SAVEPOINT_SPARSE_H_
