// Internal building blocks of a save, shared by the synchronous Save (writer.cc) and the
// asynchronous Checkpointer (async_saver.cc). The commit protocol they implement is documented at
// the top of writer.cc and in docs/FORMAT.md §5.
#ifndef SAVEPOINT_ENGINE_WRITER_H_
#define SAVEPOINT_ENGINE_WRITER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "format/manifest.h"
#include "savepoint/checkpoint.h"

namespace savepoint::engine {

// One chunk of one tensor: `len` bytes from `src`, to be stored at `file_offset`; its CRC32C is
// stored into `*crc` (a slot of the manifest) once computed.
struct ChunkTask {
  const std::byte* src;
  uint64_t len;
  uint64_t file_offset;
  uint32_t* crc;
};

// Where a save goes: the final path and the hidden temporary directory (already created).
struct SaveTarget {
  FileSystem* fs = nullptr;
  std::string path;
  std::string tmp;
};

// Checks chunk_bytes and io_threads.
Status CheckSaveOptions(const SaveOptions& o);

// Steps 1-2 of the protocol: validates the path, refuses an existing checkpoint unless
// overwriting, creates missing parents durably, creates the temporary directory.
Result<SaveTarget> BeginSave(const std::string& raw_path, const SaveOptions& o);

// A manifest with a fresh id, the creation time, the writer and chunk size, the values and
// metadata of `state`, and every tensor laid out in data file 0. Returns the chunk tasks that
// fill the file (CRC slots point into the manifest, so it must not move while they are used).
Result<std::vector<ChunkTask>> PlanSave(const State& state, uint64_t chunk_bytes,
                                        format::Manifest* m);

// Creates data file 0 (m.files[0]) in the temporary directory and writes its header. The header
// is stamped with `file_index`, the index the file will have in the final manifest (a multi-rank
// save plans each rank's file as files[0] of a local manifest; the global one lists them all).
Result<std::unique_ptr<WritableFile>> CreateDataFile(const SaveTarget& t, const format::Manifest& m,
                                                     bool direct_io, uint32_t file_index = 0);

// Writes the chunk tasks into `f` on `io_threads` threads (aligned staging buffers of
// `chunk_bytes` each), storing every chunk's CRC32C into its slot.
Status WriteChunkTasks(const std::vector<ChunkTask>& tasks, WritableFile* f, int io_threads,
                       uint64_t chunk_bytes);

// Steps 4-6: syncs and closes the data file (unless `data` is null), writes and syncs MANIFEST,
// syncs the directory.
Status FinishFiles(const SaveTarget& t, WritableFile* data, const format::Manifest& m);

// Steps 7-10: renames into place and syncs the parent.
Status CommitSave(const SaveTarget& t, bool overwrite);

// Removes the temporary directory after a failure (best effort).
void AbandonSave(const SaveTarget& t);

}  // namespace savepoint::engine

#endif  // SAVEPOINT_ENGINE_WRITER_H_
