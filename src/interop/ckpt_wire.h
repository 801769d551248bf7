// The protobuf wire format of MindSpore `.ckpt` files (docs/INTEROP.md): a
// bounded, streaming scanner that records where each tensor's bytes lie without reading them, and
// the encoder of the bytes that precede each tensor's content when writing.
//
// The scanner treats the file as untrusted: every length is checked against its enclosing message
// and the file, varints are at most 10 bytes, names, type strings, dims and the number of values
// are capped, and errors name the file and byte offset. Memory stays bounded by the number of
// values, never by tensor bytes.
#ifndef SAVEPOINT_INTEROP_CKPT_WIRE_H_
#define SAVEPOINT_INTEROP_CKPT_WIRE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "savepoint/filesystem.h"
#include "savepoint/status.h"

namespace savepoint::interop::ckpt {

// The CRC trailer: "crc_num" and the CRC-32 of everything before it, 10 bytes big-endian.
inline constexpr char kCrcMagic[] = "crc_num";
inline constexpr uint64_t kCrcMagicBytes = 7;
inline constexpr uint64_t kCrcTrailerBytes = 17;
// Caps on untrusted input.
inline constexpr uint64_t kMaxTagBytes = uint64_t{1} << 16;
inline constexpr uint64_t kMaxTypeBytes = 64;
inline constexpr size_t kMaxDims = 64;
inline constexpr size_t kMaxValues = size_t{1} << 22;
inline constexpr size_t kMaxMapTensors = 16;

// One TensorProto.
struct TensorRecord {
  std::string type;
  std::vector<int64_t> dims;
  uint64_t content_offset = 0;  // file offset of tensor_content's first byte
  uint64_t content_bytes = 0;
  uint64_t offset = 0;  // file offset of the message (for errors)
};

// One Checkpoint.Value: a tensor (one record) or a hash map (its keys, values, status records).
struct ValueRecord {
  std::string tag;
  bool map = false;
  std::vector<TensorRecord> tensors;
  uint64_t offset = 0;
};

struct Scan {
  uint64_t file_bytes = 0;
  uint64_t payload_end = 0;  // file_bytes without the CRC trailer
  bool has_crc = false;
  uint32_t stored_crc = 0;
  std::vector<ValueRecord> values;  // in file order
};

// Scans `file` (named `path` in errors). Corruption for malformed input.
Result<Scan> ScanFile(const RandomAccessFile& file, const std::string& path);

// The bytes of one Checkpoint message holding one Value named `tag`, up to (not including) each
// tensor's content: result[i] precedes tensors[i]'s content_bytes bytes. One tensor: a tensor
// value; several: a MapTensorProto.
std::vector<std::string> EncodeValue(const std::string& tag, bool map,
                                     const std::vector<TensorRecord>& tensors);

// The 17-byte trailer for `crc`.
std::string EncodeCrcTrailer(uint32_t crc);

}  // namespace savepoint::interop::ckpt

#endif  // SAVEPOINT_INTEROP_CKPT_WIRE_H_
