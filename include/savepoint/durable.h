// Small files written all or nothing, durably, through savepoint's commit protocol.
//
// Thread safety: different paths may be written concurrently.
#ifndef SAVEPOINT_DURABLE_H_
#define SAVEPOINT_DURABLE_H_

#include <string>
#include <string_view>

#include "savepoint/export.h"
#include "savepoint/filesystem.h"
#include "savepoint/status.h"

namespace savepoint {

// Writes a small file whole at `path` through savepoint's commit protocol (docs/FORMAT.md §5:
// hidden temporary, fsync, rename, directory sync): after a crash the path holds the old file or
// the new one, never a torn one, and the new one is durable once this returns OK. `overwrite`:
// replace an existing file (else AlreadyExists). Missing parent directories are created. The
// checkpoint manager's index and savepoint.recis's `checkpoint` list are written this way.
SAVEPOINT_API Status WriteFileDurably(FileSystem* fs, const std::string& path,
                                      std::string_view contents, bool overwrite);

}  // namespace savepoint

#endif  // SAVEPOINT_DURABLE_H_
