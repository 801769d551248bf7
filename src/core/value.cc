#include "savepoint/value.h"

#include <cstring>

namespace savepoint {

bool operator==(const Value& a, const Value& b) {
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case ValueKind::kInt:
      return a.as_int() == b.as_int();
    case ValueKind::kFloat: {  // bitwise, so NaN == NaN and -0.0 != 0.0
      const double x = a.as_float(), y = b.as_float();
      return std::memcmp(&x, &y, sizeof x) == 0;
    }
    case ValueKind::kBool:
      return a.as_bool() == b.as_bool();
    case ValueKind::kString:
      return a.as_string() == b.as_string();
    case ValueKind::kBytes:
      return a.as_bytes() == b.as_bytes();
    case ValueKind::kJson:
      return a.as_json() == b.as_json();
  }
  return false;
}

std::string_view ValueKindName(ValueKind kind) {
  switch (kind) {
    case ValueKind::kInt:
      return "int";
    case ValueKind::kFloat:
      return "float";
    case ValueKind::kBool:
      return "bool";
    case ValueKind::kString:
      return "string";
    case ValueKind::kBytes:
      return "bytes";
    case ValueKind::kJson:
      return "json";
  }
  return "unknown";
}

}  // namespace savepoint
