#include "savepoint/value.h"

#include <cstring>

namespace savepoint {

bool operator==(const Value& a, const Value& b) {
  if (a.kind() != b.kind()) return false;
  if (a.kind() == ValueKind::kFloat) {  // bitwise, so NaN == NaN and -0.0 != 0.0
    double x = a.as_float(), y = b.as_float();
    return std::memcmp(&x, &y, sizeof x) == 0;
  }
  return a.v_ == b.v_;
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
