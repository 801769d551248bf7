// The `.ckpt` wire format (interop/ckpt_wire.h).
#include "interop/ckpt_wire.h"

#include <fmt/format.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

#include <algorithm>
#include <cstring>
#include <span>

#include "interop/mindspore_ckpt.pb.h"

namespace savepoint::interop::ckpt {
namespace {

using google::protobuf::io::CodedOutputStream;
using WireType = google::protobuf::internal::WireFormatLite::WireType;
using google::protobuf::internal::WireFormatLite;

constexpr uint64_t kWindowBytes = uint64_t{64} << 10;

// Sequential reads of a file region through a window; bytes skipped are never read.
class Cursor {
 public:
  Cursor(const RandomAccessFile& file, uint64_t end, const std::string& path)
      : file_(file), end_(end), path_(path) {}

  uint64_t pos() const { return pos_; }

  Status Error(uint64_t at, std::string_view what) const {
    return CorruptionError(fmt::format("MindSpore checkpoint {}: {} at byte {}", path_, what, at));
  }

  Result<uint64_t> Varint(uint64_t limit, std::string_view what) {
    const uint64_t at = pos_;
    uint64_t v = 0;
    for (int i = 0; i < 10; ++i) {
      if (pos_ >= limit) return Error(at, fmt::format("truncated varint ({})", what));
      SP_RETURN_IF_ERROR(Fill(1));
      const uint8_t b = static_cast<uint8_t>(buf_[pos_ - buf_start_]);
      ++pos_;
      if (i == 9 && b > 1) break;
      v |= uint64_t{b & 0x7Fu} << (7 * i);
      if ((b & 0x80) == 0) return v;
    }
    return Error(at, fmt::format("varint longer than 64 bits ({})", what));
  }

  Result<std::string> Bytes(uint64_t n) {
    SP_RETURN_IF_ERROR(Fill(n));
    std::string out = buf_.substr(pos_ - buf_start_, n);
    pos_ += n;
    return out;
  }

  void Skip(uint64_t n) { pos_ += n; }  // callers check n against the enclosing limit

 private:
  // Makes [pos_, pos_ + n) available in buf_ (n <= the caps, well under memory limits).
  Status Fill(uint64_t n) {
    if (pos_ >= buf_start_ && pos_ + n <= buf_start_ + buf_.size()) return Status::OK();
    if (pos_ + n > end_) return Error(pos_, "unexpected end of file");
    const uint64_t len = std::min(std::max(n, kWindowBytes), end_ - pos_);
    buf_.resize(len);
    SP_RETURN_IF_ERROR(file_.ReadAt(pos_, std::as_writable_bytes(std::span(buf_))));
    buf_start_ = pos_;
    return Status::OK();
  }

  const RandomAccessFile& file_;
  const uint64_t end_;
  const std::string& path_;
  uint64_t pos_ = 0;
  uint64_t buf_start_ = 0;
  std::string buf_;
};

struct Key {
  uint32_t field = 0;
  uint32_t wire = 0;
  uint64_t at = 0;
};

Result<Key> ReadKey(Cursor& c, uint64_t limit) {
  Key k;
  k.at = c.pos();
  SP_ASSIGN_OR_RETURN(uint64_t v, c.Varint(limit, "field key"));
  k.field = static_cast<uint32_t>(v >> 3);
  k.wire = static_cast<uint32_t>(v & 7);
  if (k.field == 0 || (v >> 3) > 0x1FFFFFFF) return c.Error(k.at, "invalid field number");
  return k;
}

// The length of a length-delimited field, checked to end within `limit`.
Result<uint64_t> ReadLength(Cursor& c, uint64_t limit, std::string_view what) {
  const uint64_t at = c.pos();
  SP_ASSIGN_OR_RETURN(uint64_t n, c.Varint(limit, what));
  if (n > limit - c.pos()) {
    return c.Error(at, fmt::format("{} of {} bytes runs past its message, which ends at byte {}",
                                   what, n, limit));
  }
  return n;
}

Status SkipField(Cursor& c, const Key& k, uint64_t limit) {
  switch (k.wire) {
    case WireFormatLite::WIRETYPE_VARINT:
      return c.Varint(limit, "unknown field").status();
    case WireFormatLite::WIRETYPE_FIXED64:
    case WireFormatLite::WIRETYPE_FIXED32: {
      const uint64_t n = k.wire == WireFormatLite::WIRETYPE_FIXED64 ? 8 : 4;
      if (n > limit - c.pos()) return c.Error(k.at, "truncated fixed-size field");
      c.Skip(n);
      return Status::OK();
    }
    case WireFormatLite::WIRETYPE_LENGTH_DELIMITED: {
      SP_ASSIGN_OR_RETURN(uint64_t n, ReadLength(c, limit, "unknown field"));
      c.Skip(n);
      return Status::OK();
    }
    default:
      return c.Error(k.at, fmt::format("unsupported wire type {} (field {})", k.wire, k.field));
  }
}

Status ReadDim(Cursor& c, uint64_t limit, TensorRecord* t) {
  if (t->dims.size() >= kMaxDims)
    return c.Error(c.pos(), fmt::format("more than {} dims", kMaxDims));
  SP_ASSIGN_OR_RETURN(uint64_t d, c.Varint(limit, "dims"));
  t->dims.push_back(static_cast<int64_t>(d));
  return Status::OK();
}

// A TensorProto occupying [c.pos(), end).
Result<TensorRecord> ReadTensor(Cursor& c, uint64_t end) {
  TensorRecord t;
  t.offset = c.pos();
  bool has_type = false, has_content = false;
  while (c.pos() < end) {
    SP_ASSIGN_OR_RETURN(Key k, ReadKey(c, end));
    if (k.field == 1 && k.wire == WireFormatLite::WIRETYPE_VARINT) {
      SP_RETURN_IF_ERROR(ReadDim(c, end, &t));
    } else if (k.field == 1 && k.wire == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {  // packed
      SP_ASSIGN_OR_RETURN(uint64_t n, ReadLength(c, end, "packed dims"));
      const uint64_t stop = c.pos() + n;
      while (c.pos() < stop) SP_RETURN_IF_ERROR(ReadDim(c, stop, &t));
    } else if (k.field == 2 && k.wire == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      SP_ASSIGN_OR_RETURN(uint64_t n, ReadLength(c, end, "tensor_type"));
      if (n > kMaxTypeBytes) return c.Error(k.at, fmt::format("tensor_type of {} bytes", n));
      SP_ASSIGN_OR_RETURN(t.type, c.Bytes(n));
      has_type = true;
    } else if (k.field == 3 && k.wire == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      SP_ASSIGN_OR_RETURN(t.content_bytes, ReadLength(c, end, "tensor_content"));
      t.content_offset = c.pos();
      c.Skip(t.content_bytes);
      has_content = true;
    } else {
      SP_RETURN_IF_ERROR(SkipField(c, k, end));
    }
  }
  if (!has_type) return c.Error(t.offset, "tensor without tensor_type");
  if (!has_content) return c.Error(t.offset, "tensor without tensor_content");
  return t;
}

// A Checkpoint.Value occupying [c.pos(), end).
Result<ValueRecord> ReadValue(Cursor& c, uint64_t end) {
  ValueRecord v;
  v.offset = c.pos();
  bool has_tag = false;
  int kinds = 0;
  while (c.pos() < end) {
    SP_ASSIGN_OR_RETURN(Key k, ReadKey(c, end));
    if (k.wire != WireFormatLite::WIRETYPE_LENGTH_DELIMITED || k.field > 3) {
      SP_RETURN_IF_ERROR(SkipField(c, k, end));
      continue;
    }
    SP_ASSIGN_OR_RETURN(uint64_t n, ReadLength(c, end, "value field"));
    const uint64_t stop = c.pos() + n;
    if (k.field == 1) {
      if (n > kMaxTagBytes) return c.Error(k.at, fmt::format("name of {} bytes", n));
      SP_ASSIGN_OR_RETURN(v.tag, c.Bytes(n));
      has_tag = true;
    } else if (k.field == 2) {
      SP_ASSIGN_OR_RETURN(TensorRecord t, ReadTensor(c, stop));
      v.tensors = {std::move(t)};
      v.map = false;
      ++kinds;
    } else {
      v.tensors.clear();
      v.map = true;
      ++kinds;
      while (c.pos() < stop) {
        SP_ASSIGN_OR_RETURN(Key mk, ReadKey(c, stop));
        if (mk.field != 1 || mk.wire != WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
          SP_RETURN_IF_ERROR(SkipField(c, mk, stop));
          continue;
        }
        if (v.tensors.size() >= kMaxMapTensors) return c.Error(mk.at, "too many map tensors");
        SP_ASSIGN_OR_RETURN(uint64_t m, ReadLength(c, stop, "map tensor"));
        SP_ASSIGN_OR_RETURN(TensorRecord t, ReadTensor(c, c.pos() + m));
        v.tensors.push_back(std::move(t));
      }
    }
  }
  if (!has_tag) return c.Error(v.offset, "value without a name (tag)");
  if (kinds != 1) {
    return c.Error(v.offset,
                   fmt::format("value {:?} holds {} tensors or maps (one expected)", v.tag, kinds));
  }
  return v;
}

// Detects the trailer in the file's last 17 bytes.
Status ReadTrailer(const RandomAccessFile& file, const std::string& path, Scan* s) {
  s->payload_end = s->file_bytes;
  if (s->file_bytes < kCrcTrailerBytes) return Status::OK();
  unsigned char t[kCrcTrailerBytes];
  SP_RETURN_IF_ERROR(
      file.ReadAt(s->file_bytes - kCrcTrailerBytes, std::as_writable_bytes(std::span(t))));
  if (std::memcmp(t, kCrcMagic, kCrcMagicBytes) != 0) return Status::OK();
  uint64_t crc = 0;
  for (uint64_t i = kCrcMagicBytes; i < kCrcTrailerBytes; ++i) crc = (crc << 8) | t[i];
  if (crc > 0xFFFFFFFFu) {
    return CorruptionError(fmt::format(
        "MindSpore checkpoint {}: CRC trailer holds {}, which is not a CRC-32", path, crc));
  }
  s->has_crc = true;
  s->stored_crc = static_cast<uint32_t>(crc);
  s->payload_end = s->file_bytes - kCrcTrailerBytes;
  return Status::OK();
}

void PutVarint(std::string* out, uint64_t v) {
  uint8_t buf[10];
  uint8_t* end = CodedOutputStream::WriteVarint64ToArray(v, buf);
  out->append(reinterpret_cast<const char*>(buf), end - buf);
}

void PutKey(std::string* out, int field, WireType wire) {
  PutVarint(out, WireFormatLite::MakeTag(field, wire));
}

// Size of a length-delimited field of `n` bytes (key of a field below 16 + length + bytes).
uint64_t FieldSize(uint64_t n) { return 1 + CodedOutputStream::VarintSize64(n) + n; }

}  // namespace

Result<Scan> ScanFile(const RandomAccessFile& file, const std::string& path) {
  Scan s;
  s.file_bytes = file.size();
  SP_RETURN_IF_ERROR(ReadTrailer(file, path, &s));
  Cursor c(file, s.payload_end, path);
  while (c.pos() < s.payload_end) {
    SP_ASSIGN_OR_RETURN(Key k, ReadKey(c, s.payload_end));
    if (k.field != 1 || k.wire != WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      SP_RETURN_IF_ERROR(SkipField(c, k, s.payload_end));
      continue;
    }
    if (s.values.size() >= kMaxValues) {
      return c.Error(k.at, fmt::format("more than {} values", kMaxValues));
    }
    SP_ASSIGN_OR_RETURN(uint64_t n, ReadLength(c, s.payload_end, "value"));
    SP_ASSIGN_OR_RETURN(ValueRecord v, ReadValue(c, c.pos() + n));
    s.values.push_back(std::move(v));
  }
  return s;
}

std::vector<std::string> EncodeValue(const std::string& tag, bool map,
                                     const std::vector<TensorRecord>& tensors) {
  // Each tensor's fields before its content: dims and tensor_type through the generated message
  // (field 3, the content, is added by hand so the bytes are never copied into a string).
  std::vector<std::string> heads;
  uint64_t body = 0;  // the TensorProto fields or the MapTensorProto's, whole
  std::vector<uint64_t> sizes;
  for (const TensorRecord& t : tensors) {
    mindspore::TensorProto proto;
    for (int64_t d : t.dims) proto.add_dims(d);
    proto.set_tensor_type(t.type);
    std::string head = proto.SerializePartialAsString();
    PutKey(&head, 3, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
    PutVarint(&head, t.content_bytes);
    sizes.push_back(head.size() + t.content_bytes);
    body += map ? FieldSize(sizes.back()) : sizes.back();
    heads.push_back(std::move(head));
  }
  const uint64_t value = FieldSize(tag.size()) + FieldSize(body);
  std::vector<std::string> out(tensors.size());
  std::string& first = out[0];
  PutKey(&first, 1, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);  // Checkpoint.value
  PutVarint(&first, value);
  PutKey(&first, 1, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);  // Value.tag
  PutVarint(&first, tag.size());
  first += tag;
  PutKey(&first, map ? 3 : 2, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);  // tensor | maptensor
  PutVarint(&first, body);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (map) {
      PutKey(&out[i], 1, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);  // MapTensorProto.tensor
      PutVarint(&out[i], sizes[i]);
    }
    out[i] += heads[i];
  }
  return out;
}

std::string EncodeCrcTrailer(uint32_t crc) {
  std::string out(kCrcMagic, kCrcMagicBytes);
  for (int i = 9; i >= 0; --i)
    out.push_back(static_cast<char>(i < 4 ? (crc >> (8 * i)) & 0xFF : 0));
  return out;
}

}  // namespace savepoint::interop::ckpt
