// MindSpore `.ckpt` entries <-> a State (the mapping of savepoint/mindspore.h): grouping a scanned
// file's values into entries, planning the reads that fill a State, and laying a State out as a
// file.
#ifndef SAVEPOINT_INTEROP_CKPT_ENTRIES_H_
#define SAVEPOINT_INTEROP_CKPT_ENTRIES_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "interop/byte_layout.h"
#include "interop/ckpt_wire.h"
#include "savepoint/state.h"

namespace savepoint::interop::ckpt {

// MindSpore splits tensors larger than this into pieces along their first dimension.
inline constexpr uint64_t kSplitBytes = uint64_t{512} << 20;
// Largest string entry read (its UCS-4 bytes).
inline constexpr uint64_t kMaxStringBytes = uint64_t{64} << 20;

// Consecutive values of one name: a tensor in pieces, or a hash map in slices.
struct Entry {
  std::string name;
  bool map = false;
  std::vector<const ValueRecord*> values;
};

// Groups consecutive values of the same name. Corruption when a name comes back later, or when
// its pieces disagree (kind, type, dims).
Result<std::vector<Entry>> GroupEntries(const Scan& scan, const std::string& path);

// Decodes the savepoint.metadata entry of `entries` (when there is one) into `out`: its metadata
// and its values (bytes and JSON values). Corruption when it is not the JSON savepoint writes.
Status ReadSavepointEntry(const RandomAccessFile& file, const std::vector<Entry>& entries,
                          const std::string& path, State* out);

// The dtype and shape of a tensor entry (its pieces together; Int4 as I8): InvalidArgument for a
// hash map or a type savepoint has no dtype for, Corruption when the bytes do not match the dims.
// Its bytes are the concatenation of its values' tensors[0] contents, in order.
Result<std::pair<DType, Shape>> TensorEntryInfo(const Entry& e, const std::string& path);

// One contiguous read of tensor bytes into memory.
struct Read {
  std::byte* dst = nullptr;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  const std::string* entry = nullptr;  // for errors
};

struct LoadPlan {
  State state;              // the selected tensors, allocated, not yet filled
  std::vector<Read> reads;  // what fills them
  uint64_t tensor_bytes = 0;
  std::vector<Entry> strings;     // the selected string entries (and the metadata entry)
  std::deque<std::string> names;  // storage of Read::entry
};

// Plans the load of the entries `names` selects (empty = all); reads the savepoint.metadata entry
// (metadata, bytes and JSON values) on the way. Corruption for sizes that do not
// match shapes; InvalidArgument for an unknown type; NotFound for a name that matches nothing.
Result<LoadPlan> PlanLoad(const Scan& scan, const RandomAccessFile& file,
                          const std::vector<std::string>& names, const std::string& path);

// After the reads: decodes the selected string entries into values.
Status FinishLoad(const RandomAccessFile& file, const std::string& path, LoadPlan* plan);

// Lays `state` out as a `.ckpt` payload (no trailer) in `layout`, borrowing the tensors' bytes.
Status PlanSave(const State& state, ByteLayout* layout);

}  // namespace savepoint::interop::ckpt

#endif  // SAVEPOINT_INTEROP_CKPT_ENTRIES_H_
