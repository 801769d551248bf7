// The fast path of an indexed head (versions 3 and 4): one pass of nlohmann's SAX parser puts
// "files" and "tensors" straight into records, and the rest of the root object into a DOM.
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "format/manifest_checks.h"

namespace savepoint::format::internal {
namespace {

using Json = nlohmann::json;

// The fields of a file entry, one bit each (kFileFields: both).
enum : uint32_t { kFileBytes = 1, kFileName = 2, kFileFields = 3 };

// The fields of a tensor entry, one bit each (kTensorFields: all of them).
enum : uint32_t {
  kChunks = 1,
  kDtype = 2,
  kName = 4,
  kSectionBytes = 8,
  kSectionCrc = 16,
  kShape = 32,
  kShards = 64,
  kStored = 128,
  kTensorFields = 255,
};

uint32_t FileField(std::string_view key) {
  if (key == "bytes") return kFileBytes;
  if (key == "name") return kFileName;
  return 0;
}

uint32_t TensorField(std::string_view key) {
  if (key == "chunks") return kChunks;
  if (key == "dtype") return kDtype;
  if (key == "name") return kName;
  if (key == "section_bytes") return kSectionBytes;
  if (key == "section_crc32c") return kSectionCrc;
  if (key == "shape") return kShape;
  if (key == "shards") return kShards;
  if (key == "stored") return kStored;
  return 0;
}

// The SAX handler. Returning false stops the parse: the head is then not one this path reads.
class Handler final : public nlohmann::json_sax<Json> {
 public:
  explicit Handler(FastHead* out) : out_(out) {}

  bool null() override { return !Entry() && Put(Json(nullptr)) != nullptr; }
  bool boolean(bool v) override {
    if (!Entry()) return Put(Json(v)) != nullptr;
    if (where_ != kTensor || field_ != kStored) return false;
    tensor_.stored = v;
    return true;
  }
  bool number_integer(number_integer_t v) override { return !Entry() && Put(Json(v)) != nullptr; }
  bool number_unsigned(number_unsigned_t v) override {
    if (!Entry()) return Put(Json(v)) != nullptr;
    return Unsigned(v);
  }
  bool number_float(number_float_t v, const string_t&) override {
    return !Entry() && Put(Json(v)) != nullptr;
  }
  bool string(string_t& v) override {
    if (!Entry()) return Put(Json(std::move(v))) != nullptr;
    if (where_ == kFile && field_ == kFileName) {
      file_.name = std::move(v);
    } else if (where_ == kTensor && (field_ == kName || field_ == kDtype)) {
      (field_ == kName ? tensor_.name : tensor_.dtype) = std::move(v);
    } else {
      return false;
    }
    return true;
  }
  bool binary(binary_t&) override { return false; }
  bool start_object(std::size_t) override;
  bool key(string_t& k) override;
  bool end_object() override;
  bool start_array(std::size_t) override;
  bool end_array() override;
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }

  // Whether the whole root object was read, with both arrays.
  bool done() const { return where_ == kDone && seen_ == 3; }

 private:
  // Where the parse is: the DOM part (kDom, at any depth), an array or one of its entries.
  enum Where { kStart, kDom, kFiles, kFile, kTensors, kTensor, kShapeArray, kDone };

  // Inside an entry (or a shape), where only the entry's own fields may come.
  bool Entry() const { return where_ == kFile || where_ == kTensor || where_ == kShapeArray; }

  bool Unsigned(uint64_t v) {
    if (where_ == kShapeArray) {
      if (tensor_.shape.size() >= kMaxRank || v > uint64_t{kMaxDimension}) return false;
      tensor_.shape.push_back(static_cast<int64_t>(v));
      return true;
    }
    if (where_ == kFile) {
      if (field_ != kFileBytes) return false;
      file_.bytes = v;
      return true;
    }
    switch (field_) {
      case kChunks:
        tensor_.chunks = v;
        return true;
      case kSectionBytes:
        tensor_.section_bytes = v;
        return true;
      case kSectionCrc:
        tensor_.section_crc32c = v;
        return true;
      case kShards:
        tensor_.shards = v;
        return true;
      default:
        return false;
    }
  }

  // Adds `v` to the DOM where the parse is; its place, or null when the DOM has no root object.
  Json* Put(Json v) {
    if (where_ != kDom || stack_.empty() || expect_ != 0) return nullptr;
    Json& top = *stack_.back();
    if (top.is_object()) {  // (a key repeated: the last value stands, as in nlohmann's DOM)
      Json& slot = top[key_];
      slot = std::move(v);
      return &slot;
    }
    top.push_back(std::move(v));
    return &top.back();
  }

  FastHead* out_;
  Where where_ = kStart;
  std::vector<Json*> stack_;  // the DOM's open objects and arrays, the root first
  std::string key_;           // the last key read in the DOM
  uint32_t seen_ = 0;         // 1: "files", 2: "tensors"
  uint32_t expect_ = 0;       // the array the next start_array opens (1 or 2), else 0
  uint32_t field_ = 0;        // the entry's field whose value comes next
  uint32_t fields_ = 0;       // the entry's fields read so far
  FileRecord file_;
  TensorEntry tensor_;
};

bool Handler::start_object(std::size_t) {
  if (where_ == kStart) {
    out_->rest = Json::object();
    stack_.push_back(&out_->rest);
    where_ = kDom;
    return true;
  }
  if (where_ == kFiles || where_ == kTensors) {
    if ((where_ == kFiles ? out_->files.size() >= kMaxFiles
                          : out_->tensors.size() >= kMaxTensors)) {
      return false;
    }
    where_ = where_ == kFiles ? kFile : kTensor;
    fields_ = field_ = 0;
    file_ = FileRecord();
    tensor_ = TensorEntry();
    return true;
  }
  if (expect_ != 0) return false;
  Json* o = Put(Json::object());
  if (o == nullptr) return false;
  stack_.push_back(o);
  return true;
}

bool Handler::key(string_t& k) {
  if (where_ == kFile || where_ == kTensor) {
    field_ = where_ == kFile ? FileField(k) : TensorField(k);
    if (field_ == 0 || (fields_ & field_) != 0) return false;  // unknown, or twice
    fields_ |= field_;
    return true;
  }
  if (where_ != kDom || expect_ != 0) return false;
  if (stack_.size() == 1 && (k == "files" || k == "tensors")) {
    expect_ = k == "files" ? 1 : 2;
    if ((seen_ & expect_) != 0) return false;  // (nlohmann's DOM would keep the last)
    seen_ |= expect_;
    return true;
  }
  key_ = std::move(k);
  return true;
}

bool Handler::end_object() {
  if (where_ == kFile) {
    if (fields_ != kFileFields) return false;
    out_->files.push_back(std::move(file_));
    where_ = kFiles;
    return true;
  }
  if (where_ == kTensor) {
    if (fields_ != kTensorFields) return false;
    out_->tensors.push_back(std::move(tensor_));
    where_ = kTensors;
    return true;
  }
  if (where_ != kDom || stack_.empty()) return false;
  stack_.pop_back();
  if (stack_.empty()) where_ = kDone;
  return true;
}

bool Handler::start_array(std::size_t) {
  if (expect_ != 0) {
    where_ = expect_ == 1 ? kFiles : kTensors;
    expect_ = 0;
    return true;
  }
  if (where_ == kTensor && field_ == kShape) {
    where_ = kShapeArray;
    return true;
  }
  Json* a = Put(Json::array());
  if (a == nullptr) return false;
  stack_.push_back(a);
  return true;
}

bool Handler::end_array() {
  if (where_ == kShapeArray) {
    where_ = kTensor;
    return true;
  }
  if (where_ == kFiles || where_ == kTensors) {
    where_ = kDom;
    return true;
  }
  if (where_ != kDom || stack_.size() < 2) return false;
  stack_.pop_back();
  return true;
}

}  // namespace

bool ReadFastHead(std::string_view head, FastHead* out) {
  *out = FastHead();
  Handler h(out);
  return Json::sax_parse(head, &h) && h.done();
}

}  // namespace savepoint::format::internal
