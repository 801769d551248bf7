// The first bytes of the single-file checkpoints savepoint reads and writes (safetensors and
// MindSpore `.ckpt`), for callers that must tell such a file from someone else's before touching
// it (DeleteCheckpoint removes only what is a checkpoint). A match says "looks like one", not
// "is valid": the readers (src/interop/) check the rest.
#ifndef SAVEPOINT_FORMAT_FILE_MAGIC_H_
#define SAVEPOINT_FORMAT_FILE_MAGIC_H_

#include <cstdint>
#include <string_view>

#include "format/endian.h"

namespace savepoint::format {

// MindSpore's encrypted `.ckpt` blocks start with one of these (4 bytes, little-endian).
inline constexpr uint32_t kMindSporeMagicGcm = 0x7F3A5ED8;
inline constexpr uint32_t kMindSporeMagicCbc = 0x7F3A5ED9;
inline constexpr uint32_t kMindSporeMagicSm4 = 0x7F3A5EDA;

// Bytes of a file's head that LooksLikeCheckpointFile needs (fewer when the file is shorter).
inline constexpr uint64_t kFileMagicBytes = 9;

// Whether a file of `size` bytes whose first bytes are `head` looks like a checkpoint file:
//  - `ckpt` (a name ending in ".ckpt"): empty (a checkpoint of nothing), a protobuf Checkpoint
//    (first byte 0x0a: field 1, length-delimited) or an encrypted one (a MindSpore magic);
//  - otherwise safetensors: an 8-byte little-endian header length N with 2 <= N <= size - 8 and
//    a header that starts with '{'.
inline bool LooksLikeCheckpointFile(std::string_view head, uint64_t size, bool ckpt) {
  if (ckpt) {
    if (size == 0) return true;
    if (!head.empty() && head[0] == '\x0a') return true;
    if (head.size() < 4) return false;
    const uint32_t magic = GetU32(head, 0);
    return magic == kMindSporeMagicGcm || magic == kMindSporeMagicCbc ||
           magic == kMindSporeMagicSm4;
  }
  if (head.size() < kFileMagicBytes || size < kFileMagicBytes) return false;
  const uint64_t n = GetU64(head, 0);
  return n >= 2 && n <= size - 8 && head[8] == '{';
}

}  // namespace savepoint::format

#endif  // SAVEPOINT_FORMAT_FILE_MAGIC_H_
