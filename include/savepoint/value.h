// Non-tensor values stored in a checkpoint: step counters, learning rates, flags, strings,
// opaque bytes (e.g. a serialized RNG state) and JSON documents (user metadata).
//
// Thread safety: plain value type.
#ifndef SAVEPOINT_VALUE_H_
#define SAVEPOINT_VALUE_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "savepoint/export.h"

namespace savepoint {

using Json = nlohmann::json;

// Opaque bytes, distinct from text.
struct SAVEPOINT_API Bytes {
  std::vector<uint8_t> data;
  friend bool operator==(const Bytes&, const Bytes&) = default;
};

// Kinds of Value. On disk each kind is written by its name ("int", "float", ...); never rename.
enum class ValueKind { kInt, kFloat, kBool, kString, kBytes, kJson };

// One non-tensor value. Floats keep every bit (NaN payloads excepted), including inf and -0.0.
class SAVEPOINT_API Value {
 public:
  Value() : v_(int64_t{0}) {}
  Value(int64_t v) : v_(v) {}                   // NOLINT: implicit by design, like a literal
  Value(int v) : v_(int64_t{v}) {}              // NOLINT
  Value(double v) : v_(v) {}                    // NOLINT
  Value(bool v) : v_(v) {}                      // NOLINT
  Value(std::string v) : v_(std::move(v)) {}    // NOLINT
  Value(const char* v) : v_(std::string(v)) {}  // NOLINT
  Value(Bytes v) : v_(std::move(v)) {}          // NOLINT
  // A JSON document. Use Value::FromJson to make the intent explicit.
  static Value FromJson(Json j) {
    Value v;
    v.v_ = std::move(j);
    return v;
  }

  ValueKind kind() const { return static_cast<ValueKind>(v_.index()); }
  bool is_int() const { return kind() == ValueKind::kInt; }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  double as_float() const { return std::get<double>(v_); }
  bool as_bool() const { return std::get<bool>(v_); }
  const std::string& as_string() const { return std::get<std::string>(v_); }
  const Bytes& as_bytes() const { return std::get<Bytes>(v_); }
  const Json& as_json() const { return std::get<Json>(v_); }

 private:
  std::variant<int64_t, double, bool, std::string, Bytes, Json> v_;
};

// Same kind and same value; floats compare bitwise (NaN == NaN, -0.0 != 0.0).
SAVEPOINT_API bool operator==(const Value& a, const Value& b);

// Stable on-disk name of a kind ("int", "float", "bool", "string", "bytes", "json").
SAVEPOINT_API std::string_view ValueKindName(ValueKind kind);

}  // namespace savepoint

#endif  // SAVEPOINT_VALUE_H_
