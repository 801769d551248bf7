// Which entries a list of names and glob patterns selects (LoadOptions::names and the same option
// of other loaders, e.g. SafetensorsLoadOptions::names), and copying the selected values.
#ifndef SAVEPOINT_ENGINE_SELECT_H_
#define SAVEPOINT_ENGINE_SELECT_H_

#include <string>
#include <string_view>
#include <vector>

#include "savepoint/state.h"
#include "savepoint/status.h"

namespace savepoint::engine {

// Whether `names` selects `name` (an empty list selects everything), by savepoint::MatchesName
// (savepoint/checkpoint.h): the one name rule, which Python calls too. The cases of
// tests/testutil/name_patterns.tsv are checked from C++ and from Python.
bool Selected(const std::vector<std::string>& names, const std::string& name);

// For each of `tensors`, whether `names` selects it. A name or pattern that matches neither a
// tensor nor a value of `values` fails with NotFound "<where>: nothing matches <name>".
Result<std::vector<bool>> SelectTensors(const std::vector<std::string>& names,
                                        const std::vector<std::string>& tensors,
                                        const State& values, std::string_view where);

// Copies the values (not the tensors) of `from` that `names` selects (all of them when empty) into
// `to`, replacing values of the same names, and sets `to`'s metadata to `from`'s. InvalidArgument
// naming the entry when `to` holds a tensor under a value's name.
Status CopyValues(const State& from, State* to, const std::vector<std::string>& names = {});

}  // namespace savepoint::engine

#endif  // SAVEPOINT_ENGINE_SELECT_H_
