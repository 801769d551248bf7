// CUDA device memory in asynchronous saves: a SnapshotCopier (savepoint/async.h) that copies the
// tensors living in GPU memory straight into the Checkpointer's staging slabs, page-locked, with
// asynchronous device-to-host copies on side streams of its own.
//
//   // FailedPrecondition without CUDA; the copier must outlive the Checkpointer:
//   auto copier = savepoint::CreateCudaSnapshotCopier({}).value();
//   savepoint::CheckpointerOptions o; o.copier = copier.get(); auto ckpt = ...Create(o).value();
//   // tensors of the State may now point at device memory (cudaMalloc'd, UVA)
//
// savepoint has no build-time CUDA dependency: the copier opens the CUDA driver (libcuda.so.1)
// when it is created. A tensor whose bytes are plain host memory is copied by the built-in copy;
// one in device (or managed) memory is copied by DMA into the slab, a chunk per call, and then
// checksummed on the host. The caller must make the device bytes final first (synchronize the
// stream that wrote them): the copier's streams do not wait on the caller's work. Staging memory
// stays bounded by CheckpointerOptions::staging_bytes; with the slabs page-locked, the copy runs
// at the speed of the host link rather than through the driver's bounce buffers.
//
// Thread safety: the copier may be called from several snapshot threads at once.
#ifndef SAVEPOINT_CUDA_H_
#define SAVEPOINT_CUDA_H_

#include <cstdint>
#include <memory>

#include "savepoint/async.h"
#include "savepoint/export.h"
#include "savepoint/status.h"

namespace savepoint {

struct SAVEPOINT_API CudaSnapshotOptions {
  // Page-lock each staging slab once, when the Checkpointer allocates it (cuMemHostRegister,
  // portable to every device), and unlock it when the Checkpointer frees it. Page-locked memory
  // cannot be swapped out. Default: true. false copies into pageable slabs (about half the speed).
  bool pin_staging = true;
  // The device whose primary context registers the slabs (any device can then reach them).
  // Default: 0.
  int device = 0;
  // The most bytes of one device-to-host copy. Default: 0 = a whole chunk piece at once (up to a
  // slab). Smaller values checksum bytes still in cache at the price of more copy calls.
  uint64_t max_copy_bytes = 0;
};

// A CUDA snapshot copier. FailedPrecondition, saying why, when the CUDA driver cannot be loaded
// or initialised (no driver, no GPU); InvalidArgument for a bad option. A copy that fails later
// is an IOError naming the CUDA error.
SAVEPOINT_API Result<std::unique_ptr<SnapshotCopier>> CreateCudaSnapshotCopier(
    const CudaSnapshotOptions& options = {});

}  // namespace savepoint

#endif  // SAVEPOINT_CUDA_H_
