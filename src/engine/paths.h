// Names savepoint gives to files inside a checkpoint directory and the checks on a checkpoint's
// path (docs/FORMAT.md, "Directory layout"). The hidden debris names of unfinished saves belong to
// the durable commit: io/debris.h.
#ifndef SAVEPOINT_ENGINE_PATHS_H_
#define SAVEPOINT_ENGINE_PATHS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "savepoint/status.h"

namespace savepoint::engine {

// "data-<rank:05>-<index:05>.spd".
std::string DataFileName(uint32_t rank, uint32_t index);

// Whether `name` is an entry a native checkpoint directory holds: MANIFEST or a data file
// "data-<digits>-<digits>.spd" (what an overwrite may remove: io::CommitOptions::owns).
bool IsCheckpointEntry(std::string_view name);

// Strips trailing slashes; rejects an empty path and final components that are ".", ".." or start
// with '.' (names starting with '.' are reserved for savepoint's hidden debris).
Result<std::string> NormalizeCheckpointPath(std::string_view path);

}  // namespace savepoint::engine

#endif  // SAVEPOINT_ENGINE_PATHS_H_
