#include "engine/select.h"

#include <fmt/format.h>
#include <fnmatch.h>

namespace savepoint::engine {
namespace {

bool IsPattern(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

}  // namespace

bool MatchesName(const std::string& pattern, const std::string& name) {
  return IsPattern(pattern) ? fnmatch(pattern.c_str(), name.c_str(), 0) == 0 : pattern == name;
}

bool Selected(const std::vector<std::string>& names, const std::string& name) {
  if (names.empty()) return true;
  for (const std::string& n : names) {
    if (MatchesName(n, name)) return true;
  }
  return false;
}

Result<std::vector<bool>> SelectTensors(const std::vector<std::string>& names,
                                        const std::vector<std::string>& tensors,
                                        const State& values, std::string_view where) {
  std::vector<bool> keep(tensors.size(), names.empty());
  for (const std::string& n : names) {
    bool hit = false;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (MatchesName(n, tensors[i])) keep[i] = hit = true;
    }
    for (const auto& [vn, e] : values.entries()) hit = hit || MatchesName(n, vn);
    if (!hit) return NotFoundError(fmt::format("{}: nothing matches {:?}", where, n));
  }
  return keep;
}

}  // namespace savepoint::engine
