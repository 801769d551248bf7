// Category names and the std::mt19937_64 adapter (savepoint/stateful.h).
#include "savepoint/stateful.h"

#include <fmt/format.h>

#include <sstream>

namespace savepoint {
namespace {

constexpr std::pair<Category, std::string_view> kNames[] = {
    {Category::kDense, "dense"},      {Category::kSparse, "sparse"},
    {Category::kExtra, "extra"},      {Category::kOptimizer, "optimizer"},
    {Category::kIoState, "io_state"},
};

}  // namespace

std::string_view CategoryName(Category category) {
  for (const auto& [c, n] : kNames) {
    if (c == category) return n;
  }
  return "unknown";
}

Result<Category> ParseCategory(std::string_view name) {
  for (const auto& [c, n] : kNames) {
    if (n == name) return c;
  }
  return InvalidArgumentError(
      fmt::format("unknown category {:?} (dense, sparse, extra, optimizer, io_state or *)", name));
}

Status Mt19937Stateful::SaveState(State& out) {
  std::ostringstream text;
  text << *engine_;
  return out.PutValue("engine", text.str());
}

Status Mt19937Stateful::LoadState(const State& in) {
  const Value* v = in.FindValue("engine");
  if (v == nullptr || v->kind() != ValueKind::kString) {
    return InvalidArgumentError("RNG state: value \"engine\" is missing or not a string");
  }
  std::istringstream text(v->as_string());
  std::mt19937_64 engine;
  text >> engine;
  if (text.fail()) return InvalidArgumentError("RNG state: \"engine\" does not parse");
  *engine_ = engine;
  return Status::OK();
}

}  // namespace savepoint
