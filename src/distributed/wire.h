// A compact little-endian encoding for the messages ranks exchange during a distributed save
// (per-rank shard descriptors, verdicts). Decoding treats bytes as untrusted: every read is bounds
// checked and every count is capped by the bytes that remain.
#ifndef SAVEPOINT_DISTRIBUTED_WIRE_H_
#define SAVEPOINT_DISTRIBUTED_WIRE_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "savepoint/status.h"
#include "savepoint/tensor.h"
#include "util/varint.h"

namespace savepoint::dist {

// Fixed-size integers are little-endian; V64 is an unsigned LEB128 varint (util/varint.h), which
// the per-shard fields use: a 16,384-rank save sends millions.
class WireWriter {
 public:
  void U32(uint32_t v) {
    char b[4];
    for (int i = 0; i < 4; ++i) b[i] = static_cast<char>(v >> (8 * i));
    out_.append(b, 4);
  }
  void U64(uint64_t v) {
    U32(static_cast<uint32_t>(v));
    U32(static_cast<uint32_t>(v >> 32));
  }
  void V64(uint64_t v) {
    char b[kMaxVarintBytes];
    out_.append(b, static_cast<size_t>(PutVarint(v, b) - b));
  }
  void Raw(std::string_view s) { out_.append(s); }
  void Str(std::string_view s) {
    U64(s.size());
    out_.append(s);
  }
  void VStr(std::string_view s) {
    V64(s.size());
    out_.append(s);
  }
  // A count and the dims, as varints (negative dims take 10 bytes).
  void Dims(const int64_t* d, size_t n) {
    V64(n);
    for (size_t i = 0; i < n; ++i) V64(static_cast<uint64_t>(d[i]));
  }
  void Dims(const Shape& s) { Dims(s.data(), s.size()); }
  std::string& bytes() { return out_; }

 private:
  std::string out_;
};

class WireReader {
 public:
  WireReader(std::string_view in, std::string where) : in_(in), where_(std::move(where)) {}
  Result<uint32_t> U32() {
    if (in_.size() < 4) return Truncated();
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<uint8_t>(in_[i])} << (8 * i);
    in_.remove_prefix(4);
    return v;
  }
  Result<uint64_t> U64() {
    if (in_.size() < 8) return Truncated();
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<uint8_t>(in_[i])} << (8 * i);
    in_.remove_prefix(8);
    return v;
  }
  Result<uint64_t> V64() {
    uint64_t v;
    if (!Next(&v)) return Truncated();
    return v;
  }
  // V64 without a Result, for the per-shard fields: false when the bytes end or the varint is
  // malformed (then Truncated() is the error to return).
  bool Next(uint64_t* out) {
    size_t at = 0;
    if (!GetVarint(in_, &at, out)) return false;
    in_.remove_prefix(at);
    return true;
  }
  // A count (fixed, or a varint) of items of at least `min_item_bytes` each: capped by what
  // remains.
  Result<uint64_t> Count(uint64_t min_item_bytes) {
    SP_ASSIGN_OR_RETURN(uint64_t n, U64());
    return Capped(n, min_item_bytes);
  }
  Result<uint64_t> VCount(uint64_t min_item_bytes) {
    SP_ASSIGN_OR_RETURN(uint64_t n, V64());
    return Capped(n, min_item_bytes);
  }
  // `n` bytes that point into the decoded bytes (valid while they are).
  Result<std::string_view> Raw(uint64_t n) {
    if (n > in_.size()) return Truncated();
    std::string_view s = in_.substr(0, n);
    in_.remove_prefix(n);
    return s;
  }
  Result<std::string_view> View() {
    SP_ASSIGN_OR_RETURN(uint64_t n, U64());
    return Raw(n);
  }
  Result<std::string_view> VView() {
    SP_ASSIGN_OR_RETURN(uint64_t n, V64());
    return Raw(n);
  }
  Result<std::string> Str() {
    SP_ASSIGN_OR_RETURN(std::string_view s, View());
    return std::string(s);
  }
  // Dims (WireWriter::Dims) into out[0..*n), at most kMaxRank of them; false when malformed.
  bool NextDims(int64_t* out, size_t* n) {
    uint64_t count, v;
    if (!Next(&count) || count > kMaxRank) return false;
    size_t at = 0;  // (read in place: the view is moved on once)
    for (uint64_t d = 0; d < count; ++d) {
      if (!GetVarint(in_, &at, &v)) return false;
      out[d] = static_cast<int64_t>(v);
    }
    in_.remove_prefix(at);
    *n = static_cast<size_t>(count);
    return true;
  }
  // Raw(n) for a varint n, without a Result.
  bool NextView(std::string_view* out) {
    uint64_t n;
    if (!Next(&n) || n > in_.size()) return false;
    *out = in_.substr(0, n);
    in_.remove_prefix(n);
    return true;
  }
  // Whether the next bytes are `bytes` (then they are skipped).
  bool Skip(std::string_view bytes) {
    if (!in_.starts_with(bytes)) return false;
    in_.remove_prefix(bytes.size());
    return true;
  }
  // U32 without a Result.
  bool Next32(uint32_t* out) {
    if (in_.size() < 4) return false;
    std::memcpy(out, in_.data(), 4);  // (savepoint's hosts are little-endian: format/endian.h)
    in_.remove_prefix(4);
    return true;
  }
  bool done() const { return in_.empty(); }
  // Where the next field begins.
  const char* at() const { return in_.data(); }
  Status Truncated() const { return InternalError(where_ + ": message truncated or malformed"); }

 private:
  Result<uint64_t> Capped(uint64_t n, uint64_t min_item_bytes) const {
    if (n > in_.size() / (min_item_bytes == 0 ? 1 : min_item_bytes)) return Truncated();
    return n;
  }
  std::string_view in_;
  std::string where_;
};

// Decodes a status (EncodeStatus) into *out; the return value says whether the bytes were
// well-formed. An unknown code becomes kInternal.
inline Status ReadStatus(WireReader& r, Status* out) {
  SP_ASSIGN_OR_RETURN(uint64_t code, r.U64());
  SP_ASSIGN_OR_RETURN(std::string msg, r.Str());
  if (code > static_cast<uint64_t>(kLastStatusCode)) {
    code = static_cast<uint64_t>(StatusCode::kInternal);
  }
  *out = code == 0 ? Status::OK() : Status(static_cast<StatusCode>(code), std::move(msg));
  return Status::OK();
}

// The error for a malformed message `what` of rank `rank`.
inline Status Malformed(std::string_view what, int rank, const Status& s) {
  return InternalError(std::string(what) + " of rank " + std::to_string(rank) + ": " +
                       std::string(s.message()));
}

}  // namespace savepoint::dist

#endif  // SAVEPOINT_DISTRIBUTED_WIRE_H_
