// The safetensors header: its validating decoder and its encoder, and the mapping of a State's
// metadata and values to `__metadata__` (include/savepoint/safetensors.h documents the format and
// the mapping). No file I/O here: safetensors.cc reads and writes the bytes.
#ifndef SAVEPOINT_INTEROP_SAFETENSORS_HEADER_H_
#define SAVEPOINT_INTEROP_SAFETENSORS_HEADER_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "savepoint/safetensors.h"
#include "savepoint/state.h"
#include "savepoint/status.h"

namespace savepoint::interop {

// Bytes of the little-endian u64 header length that starts every file.
inline constexpr uint64_t kLengthPrefixBytes = 8;
// Deepest JSON nesting a valid header needs is 3 (header, tensor, shape); anything deeper than
// this is rejected before parsing. Also applies to the JSON inside the reserved metadata keys.
inline constexpr size_t kMaxHeaderJsonDepth = 64;

// Reads the header length N from the first 8 bytes of a file of `file_bytes` bytes and checks it
// against the cap and the file size. `prefix` must hold at least 8 bytes (Corruption otherwise).
Result<uint64_t> DecodeHeaderLength(std::string_view prefix, uint64_t file_bytes,
                                    std::string_view path);

// Parses and validates the JSON header (the N bytes after the length prefix) of a file of
// `file_bytes` bytes at `path`. Tensors come back in name order.
Result<SafetensorsInfo> DecodeHeader(std::string_view json, uint64_t file_bytes,
                                     std::string_view path);

// A planned file: the 8-byte length prefix plus the padded JSON header, and where each tensor goes.
struct Layout {
  std::string header;  // written at offset 0; its size is a multiple of 8
  struct Item {
    const std::string* name;  // point into the State given to PlanLayout
    const TensorView* view;
    uint64_t offset;  // absolute file offset
  };
  std::vector<Item> items;  // in file order (the reference writer's), back to back
  uint64_t file_bytes = 0;
};

// Plans the file for `state` with SafetensorsSaveOptions' mindspore_format and crc_check (the
// header then holds kCrcNumPlaceholder, for FillCrcNum). InvalidArgument for a dtype safetensors
// lacks (naming tensor and dtype), an invalid view, metadata that cannot be encoded, a header over
// the cap, and, for MindSpore's flavour, what MindSpore cannot load.
Result<Layout> PlanLayout(const State& state, std::string_view path,
                          const SafetensorsSaveOptions& options = {});

// `__metadata__` for the values and metadata of `state`.
Result<std::map<std::string, std::string>> EncodeMetadata(const State& state);

// The values and metadata described by `__metadata__` (into `out`, which holds no values yet).
Status DecodeMetadata(const std::map<std::string, std::string>& raw, std::string_view path,
                      State* out);

}  // namespace savepoint::interop

#endif  // SAVEPOINT_INTEROP_SAFETENSORS_HEADER_H_
