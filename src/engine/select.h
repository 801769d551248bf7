// Which entries a list of names and glob patterns selects (LoadOptions::names and the same option
// of other loaders, e.g. SafetensorsLoadOptions::names).
#ifndef SAVEPOINT_ENGINE_SELECT_H_
#define SAVEPOINT_ENGINE_SELECT_H_

#include <string>
#include <string_view>
#include <vector>

#include "savepoint/state.h"
#include "savepoint/status.h"

namespace savepoint::engine {

// Whether `pattern` (an exact name, or a glob with '*', '?', '[...]'; '*' also matches '.')
// matches `name`.
bool MatchesName(const std::string& pattern, const std::string& name);

// Whether `names` selects `name` (an empty list selects everything).
bool Selected(const std::vector<std::string>& names, const std::string& name);

// For each of `tensors`, whether `names` selects it. A name or pattern that matches neither a
// tensor nor a value of `values` fails with NotFound "<where>: nothing matches <name>".
Result<std::vector<bool>> SelectTensors(const std::vector<std::string>& names,
                                        const std::vector<std::string>& tensors,
                                        const State& values, std::string_view where);

}  // namespace savepoint::engine

#endif  // SAVEPOINT_ENGINE_SELECT_H_
