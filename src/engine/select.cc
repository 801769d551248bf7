#include "engine/select.h"

#include <fmt/format.h>
#include <fnmatch.h>

#include "savepoint/checkpoint.h"

namespace savepoint {

bool MatchesName(const std::string& pattern, const std::string& name) {
  if (pattern == name) return true;  // a name always selects itself, even "layers[0].w"
  if (pattern.find_first_of("*?[") == std::string::npos) return false;
  return fnmatch(pattern.c_str(), name.c_str(), FNM_NOESCAPE) == 0;
}

}  // namespace savepoint

namespace savepoint::engine {

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

Status CopyValues(const State& from, State* to, const std::vector<std::string>& names) {
  for (const auto& [name, e] : from.entries()) {
    if (e.is_tensor() || !Selected(names, name)) continue;
    if (to->FindTensor(name) != nullptr) {
      return InvalidArgumentError(
          fmt::format("{:?} is a value in the checkpoint but a tensor in the target", name));
    }
    to->Erase(name);
    SP_RETURN_IF_ERROR(to->PutValue(name, e.value()));
  }
  to->metadata() = from.metadata();
  return Status::OK();
}

}  // namespace savepoint::engine
