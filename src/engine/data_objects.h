// Object storage's checks of a save's commit (docs/FORMAT.md §5.1, steps 3 and 5): a checkpoint in
// a bucket is committed in place, so before and after its MANIFEST is written the save checks
// that every data object it lists is still the one it wrote. Stateless; thread-safe as the file
// system is.
#ifndef SAVEPOINT_ENGINE_DATA_OBJECTS_H_
#define SAVEPOINT_ENGINE_DATA_OBJECTS_H_

#include <string>
#include <string_view>

#include "engine/writer.h"
#include "format/manifest.h"
#include "savepoint/filesystem.h"

namespace savepoint::engine {

// Every data object of `m` under t.tmp is there with its size and the header this save wrote
// (checkpoint id, index, format version): another process may have removed one, and on a store
// whose conditional writes race (as some S3 servers' have) another save of the same prefix may
// have replaced one. Checked on up to 16 threads (an open and a ranged read of 4 KiB each).
// IOError naming an object that is gone or not this save's (the first in the manifest's order of
// those checked: the checks stop at the first error).
Status CheckDataObjects(const SaveTarget& t, const format::Manifest& m);

// Removes the MANIFEST at `path` when its first bytes are `header`, the header of the one this
// save wrote (on a store whose conditional writes race it may be another save's). Errors are
// ignored: the save fails anyway.
void RemoveOwnManifest(FileSystem* fs, const std::string& path, std::string_view header);

}  // namespace savepoint::engine

#endif  // SAVEPOINT_ENGINE_DATA_OBJECTS_H_
