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

namespace savepoint::dist {

class WireWriter {
 public:
  void U64(uint64_t v) {
    char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(v >> (8 * i));
    out_.append(b, 8);
  }
  void I64(int64_t v) { U64(static_cast<uint64_t>(v)); }
  void Str(std::string_view s) {
    U64(s.size());
    out_.append(s);
  }
  void Dims(const Shape& s) {
    U64(s.size());
    for (int64_t d : s) I64(d);
  }
  std::string& bytes() { return out_; }

 private:
  std::string out_;
};

class WireReader {
 public:
  WireReader(std::string_view in, std::string where) : in_(in), where_(std::move(where)) {}
  Result<uint64_t> U64() {
    if (in_.size() < 8) return Truncated();
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<uint8_t>(in_[i])} << (8 * i);
    in_.remove_prefix(8);
    return v;
  }
  Result<int64_t> I64() {
    SP_ASSIGN_OR_RETURN(uint64_t v, U64());
    return static_cast<int64_t>(v);
  }
  // A count of items of at least `min_item_bytes` each: capped by what remains.
  Result<uint64_t> Count(uint64_t min_item_bytes) {
    SP_ASSIGN_OR_RETURN(uint64_t n, U64());
    if (n > in_.size() / (min_item_bytes == 0 ? 1 : min_item_bytes)) return Truncated();
    return n;
  }
  Result<std::string> Str() {
    SP_ASSIGN_OR_RETURN(uint64_t n, Count(1));
    std::string s(in_.substr(0, n));
    in_.remove_prefix(n);
    return s;
  }
  Result<Shape> Dims() {
    SP_ASSIGN_OR_RETURN(uint64_t n, Count(8));
    if (n > kMaxRank) return InternalError(where_ + ": rank above the maximum");
    Shape s(n);
    for (auto& d : s) {
      SP_ASSIGN_OR_RETURN(d, I64());
    }
    return s;
  }
  bool done() const { return in_.empty(); }

 private:
  Status Truncated() const { return InternalError(where_ + ": message truncated or malformed"); }
  std::string_view in_;
  std::string where_;
};

}  // namespace savepoint::dist

#endif  // SAVEPOINT_DISTRIBUTED_WIRE_H_
