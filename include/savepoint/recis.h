// Checkpoint directories written by RecIS (alibaba/RecIS, its C++ Saver behind
// recis.framework.checkpoint_manager.Saver), read into a State with sparse tables, so that
// `savepoint convert SRC DST --from recis` imports them as native checkpoints (docs/INTEROP.md).
//
// The layout read (RecIS csrc/serialize: name.cc, save_bundle.cc, write_block.cc, table_writer.cc,
// index_info.cc, embedding/slice_info.cc):
//  - `model-%06d-of-%06d.safetensors`: writer `w` of `parallel` writers of shard `s` of
//    `shard_num` is file `s * parallel + w` of `parallel * shard_num`. Each is a safetensors file
//    (header: the blocks in write order, padded with spaces, no `__metadata__`).
//  - `index`: JSON {"file_index": {file name: file number}, "block_index": {block: file number}}
//    (shard 0 merges every shard's `ckpt-%07d.index` into it).
//  - A hash table `T` (its shared name; each child of a coalesced table is its own table) with
//    slots `S` (the embedding and the optimizer slots) is written by every shard `i` of `n` as
//    one id block (I64 [rows]) and one block per slot ([rows, ...], the rows of the ids in the
//    same order), named `T.id/part_i_n` and `T.S/part_i_n` in the index and in the file.
//    `tensorkey.json` maps each such name to RecIS's own `T@S^<slice>`, where the slice range of
//    the shard is `begin@end@size` (begin and end zero-padded to the width of size).
//  - A dense tensor `X` (the non-table entries of the sparse state, written by shard 0 only) is
//    block `X^ ` (a space: the empty slice) in the index and in the file.
//  - `model.pt`, `extra.pt`, `io_state_<shard>.pt` are torch pickles (the dense parameters, the
//    registered objects, the IO states) and `io_state_count` their worker count; `<output_dir>/
//    checkpoint` lists the checkpoint ids, newest last.
//
// Mapping: each table becomes one SparseTable named T whose rows are those of every shard's
// blocks (slot names kept); each dense block a tensor named X. The torch pickles cannot be read
// here: they are reported in RecisCheckpoint::skipped (savepoint.recis.import_checkpoint in Python
// adds model.pt's tensors). The State's metadata is {"recis": {"source", "shard_num", "skipped"}}.
//
// Every input is untrusted: the index and tensorkey.json are size-capped, file names in the
// index must be plain names in the directory (no "/", not "." or ".."), every safetensors header
// is validated (InspectSafetensors), sizes use checked arithmetic, and an inconsistent directory
// is refused naming the file and block: a missing file (NotFound), a block the index names but
// its file lacks (NotFound), an id block that is not I64 [rows] or a slot whose rows differ from
// its id block's, a slot whose dtype or row shape differs between shards, a shard without its id
// block or missing from a table, an id in two blocks, a malformed block name or slice string
// (Corruption).
//
// Thread safety: reentrant.
#ifndef SAVEPOINT_RECIS_H_
#define SAVEPOINT_RECIS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "savepoint/checkpoint.h"
#include "savepoint/export.h"
#include "savepoint/io_options.h"
#include "savepoint/sparse.h"
#include "savepoint/state.h"
#include "savepoint/status.h"

namespace savepoint {

struct SAVEPOINT_API RecisLoadOptions {
  // Largest `index`, `tensorkey.json` and `checkpoint` file accepted (ResourceExhausted
  // otherwise). Default: 64 MiB.
  uint64_t max_index_bytes = uint64_t{64} << 20;
  // Most data files and blocks the index may name (Corruption otherwise). Defaults: 65536 files,
  // 4,194,304 blocks.
  uint64_t max_files = 65536;
  uint64_t max_blocks = uint64_t{1} << 22;
  // Reports the bytes of blocks read (when set).
  ProgressFn progress = nullptr;
};

// A RecIS checkpoint read into memory.
struct SAVEPOINT_API RecisCheckpoint {
  // The tables (owned), the dense tensors (owned) and the metadata (see the file comment).
  State state;
  // The directory read: `dir` itself, or the newest checkpoint listed in `dir/checkpoint`.
  std::string path;
  // Shards that wrote the tables (n of `part_i_n`); 0 when there are no tables.
  int shard_num = 0;
  // Data files read.
  int files = 0;
  // What was not imported, one line each ("model.pt: torch pickle (dense parameters) ...").
  std::vector<std::string> skipped;
};

// Whether `dir` looks like a RecIS checkpoint: it holds a file `index` and at least one
// `model-*-of-*.safetensors` file.
SAVEPOINT_API bool IsRecisCheckpoint(const std::string& dir, FileSystem* fs = nullptr);

// Reads the RecIS checkpoint at `dir` (or, when `dir` has no `index` but a `checkpoint` list, the
// newest listed one under it) whole into memory. Errors: see the file comment.
SAVEPOINT_API Result<RecisCheckpoint> LoadRecisCheckpoint(const std::string& dir,
                                                          const RecisLoadOptions& options = {},
                                                          const IoOptions& io = {});

struct SAVEPOINT_API RecisImportOptions {
  // How the RecIS directory is read. Default: {}.
  RecisLoadOptions load = {};
  // How the native checkpoint is written (overwrite, compression, key, ...; `base` must be empty:
  // an import is a full checkpoint). Default: {}.
  SparseSaveOptions save = {};
};

// Reads the RecIS checkpoint at `src_dir` and saves it as the native checkpoint `dst`
// (SaveSparse). Returns what was read, without the State (its `state` is empty).
SAVEPOINT_API Result<RecisCheckpoint> ImportRecis(const std::string& src_dir,
                                                  const std::string& dst,
                                                  const RecisImportOptions& options = {},
                                                  const IoOptions& io = {});

}  // namespace savepoint

#endif  // SAVEPOINT_RECIS_H_
