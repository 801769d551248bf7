// Directories written by torch.distributed.checkpoint's own FileSystemWriter (PyTorch DCP), read
// into a State (`savepoint convert` imports them as native checkpoints; docs/INTEROP.md).
//
// Such a directory holds `.metadata`, a Python pickle of DCP's Metadata (every tensor's dtype,
// global size and chunks, and where each chunk and each non-tensor value lies), and the data
// files `__<rank>_<n>.distcp`: each tensor chunk a torch.save archive (a zip of a pickle and the
// raw storage) or, with DCP's safetensors serialization, raw bytes; each non-tensor value DCP's
// torch.save bytes of it.
//
// The pickles are untrusted input: they are read by a restricted reader that executes nothing and
// accepts only the opcodes of plain data and the exact global names DCP's metadata and torch.save
// use (its dataclasses, torch.Size, torch dtypes and storage types, collections.OrderedDict);
// any other name (os.system, builtins.eval, ...) is refused with InvalidArgument naming it and its
// byte offset. Every offset, length, size and stride is checked against the files.
//
// Mapping: a tensor's chunks are assembled into one whole tensor (its chunks must tile it); a
// non-tensor value becomes a bytes value of the same name holding DCP's torch.save bytes, listed
// in the metadata under "torch.distributed.checkpoint" / "byte_io" (so savepoint.torch's
// StorageReader hands them back to dcp.load unchanged), with DCP's planner_data (fqn -> key path)
// under "planner_data" when it is plain data.
//
// Thread safety: reentrant.
#ifndef SAVEPOINT_DCP_H_
#define SAVEPOINT_DCP_H_

#include <cstdint>
#include <string>

#include "savepoint/checkpoint.h"
#include "savepoint/export.h"
#include "savepoint/io_options.h"
#include "savepoint/state.h"
#include "savepoint/status.h"

namespace savepoint {

// The metadata key under which DCP's own information is kept (shared with savepoint.torch).
inline constexpr char kDcpMetadataKey[] = "torch.distributed.checkpoint";

struct SAVEPOINT_API DcpLoadOptions {
  // Largest `.metadata` accepted. Default: 256 MiB.
  uint64_t max_metadata_bytes = uint64_t{256} << 20;
  // Reports the bytes of tensor chunks read (when set).
  ProgressFn progress = nullptr;
};

// Reads the DCP directory `dir` whole into memory. Errors: NotFound (no .metadata, a data file
// missing), InvalidArgument (a refused pickle opcode or global, a dtype savepoint lacks,
// compressed or transformed chunks), Corruption (malformed pickle, zip or offsets; chunks that do
// not tile their tensor), each naming the file, tensor and byte offset.
SAVEPOINT_API Result<State> LoadDcpCheckpoint(const std::string& dir,
                                              const DcpLoadOptions& options = {},
                                              const IoOptions& io = {});

}  // namespace savepoint

#endif  // SAVEPOINT_DCP_H_
