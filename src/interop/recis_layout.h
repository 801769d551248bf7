// The names of a RecIS checkpoint directory (savepoint/recis.h): its `index` and `tensorkey.json`
// parsed and validated, and every block sorted into tables (one id block and slot blocks per
// shard) and dense tensors. Pure functions of the files' text: no I/O.
//
// Thread safety: reentrant.
#ifndef SAVEPOINT_INTEROP_RECIS_LAYOUT_H_
#define SAVEPOINT_INTEROP_RECIS_LAYOUT_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "savepoint/recis.h"
#include "savepoint/status.h"

namespace savepoint::interop {

inline constexpr char kRecisIndexFile[] = "index";
inline constexpr char kRecisTensorKeyFile[] = "tensorkey.json";
inline constexpr char kRecisCheckpointList[] = "checkpoint";
inline constexpr char kRecisIdSlot[] = "id";

// One block: its name (in the index and in its file) and the file holding it.
struct RecisBlock {
  std::string name;
  std::string file;
};

// RecIS's slice range of one shard (`begin@end@size`).
struct RecisSlice {
  int64_t begin = 0, end = 0, size = 0;
};

// The blocks one shard wrote for a table.
struct RecisShardBlocks {
  bool has_ids = false;
  RecisBlock ids;
  std::map<std::string, RecisBlock> slots;  // slot name -> block
  bool has_slice = false;                   // tensorkey.json gave the slice range
  RecisSlice slice;
};

struct RecisTablePlan {
  std::vector<RecisShardBlocks> shards;  // [shard_num], by shard index
};

// Everything the index names, sorted.
struct RecisPlan {
  std::vector<std::string> files;                // data files named by some block, sorted
  std::map<std::string, RecisTablePlan> tables;  // table name -> blocks
  std::map<std::string, RecisBlock> dense;       // tensor name -> block
  int shard_num = 0;                             // 0 when there are no tables
};

// Parses `begin@end@size` (decimal, 0 <= begin < end <= size). Corruption naming `what`.
Result<RecisSlice> ParseRecisSlice(std::string_view text, std::string_view what);

// The map of tensorkey.json ({part name: "T@S^begin@end@size"}); `what` names the file.
Result<std::map<std::string, std::string>> ParseRecisTensorKeys(std::string_view json,
                                                                std::string_view what,
                                                                const RecisLoadOptions& o);

// Parses the `index` text (`what` names the file) and sorts its blocks, using `tensor_keys` (may
// be empty) for the exact table and slot names and the slice ranges. Corruption naming the index
// and the block for anything malformed or inconsistent (see savepoint/recis.h).
Result<RecisPlan> PlanRecis(std::string_view index_json, std::string_view what,
                            const std::map<std::string, std::string>& tensor_keys,
                            const RecisLoadOptions& o);

// Whether `name` may name a file in the checkpoint directory: not empty, no '/' or '\\' or NUL,
// not "." or "..".
bool IsPlainFileName(std::string_view name);

}  // namespace savepoint::interop

#endif  // SAVEPOINT_INTEROP_RECIS_LAYOUT_H_
