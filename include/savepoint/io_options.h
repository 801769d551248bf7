// How tensor bytes move between memory and storage: the settings of an engine instance.
//
// savepoint separates what belongs to the job from what one call may vary (as RocksDB separates
// DBOptions from WriteOptions/ReadOptions):
//  - IoOptions (this file): the file system, the I/O threads and direct I/O. A job sets them once.
//    Instances hold one copy, given when they are created: Checkpointer::Create,
//    CheckpointReader::Open, ManagerOptions::io. Free functions that move tensor bytes (Save, Load,
//    LoadInto, VerifyCheckpoint, SaveSafetensors, LoadSafetensors, SaveDistributed,
//    LoadDistributed, the merges) take it as their last argument, after the call's own options.
//  - Per-call options (SaveOptions, LoadOptions, the safetensors and distributed options): what
//    this save or load writes or selects, its statistics and its progress.
// Functions that touch only metadata (InspectSafetensors, PlanDistributedLoad, the catalog) take
// just a FileSystem*.
//
//   savepoint::IoOptions io{.fs = &my_fs, .io_threads = 8};
//   SP_RETURN_IF_ERROR(savepoint::Save(state, "/ckpt/step-10", {.overwrite = true}, io));
//   SP_ASSIGN_OR_RETURN(savepoint::State s, savepoint::Load("/ckpt/step-10", {}, io));
//
// Every field is honoured by every call that takes it, except where a call's comment says which
// field it cannot use and why.
#ifndef SAVEPOINT_IO_OPTIONS_H_
#define SAVEPOINT_IO_OPTIONS_H_

#include <string>

#include "savepoint/export.h"
#include "savepoint/filesystem.h"
#include "savepoint/status.h"

namespace savepoint {

struct SAVEPOINT_API IoOptions {
  // File system to read and write through (not owned; must outlive the calls and instances that
  // use it). Default: nullptr = DefaultFileSystem() (POSIX).
  FileSystem* fs = nullptr;
  // Threads reading or writing (and checksumming, compressing) chunks in parallel, 1..64. For a
  // Checkpointer: its background writer threads. Default: 4.
  int io_threads = 4;
  // Open data files with O_DIRECT where the file system allows it (no page-cache pollution, cold
  // reads); FileOptions::direct_io. The statistics say whether it was in effect. Default: true.
  bool direct_io = true;
};

// OK, or InvalidArgument naming the field (io_threads outside 1..64). `what` names the call in
// the message, e.g. "save /ckpt/a".
SAVEPOINT_API Status ValidateIoOptions(const IoOptions& io, const std::string& what);

// io.fs, or DefaultFileSystem() when it is null.
SAVEPOINT_API FileSystem* FileSystemOf(const IoOptions& io);

}  // namespace savepoint

#endif  // SAVEPOINT_IO_OPTIONS_H_
