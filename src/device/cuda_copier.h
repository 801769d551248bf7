// The CUDA snapshot copier over a driver table (savepoint/cuda.h has the public factory; the tests
// build one over a fake table).
//
// Thread safety: Copy and Copies may run on several threads at once.
#ifndef SAVEPOINT_DEVICE_CUDA_COPIER_H_
#define SAVEPOINT_DEVICE_CUDA_COPIER_H_

#include <memory>

#include "device/cuda_driver.h"
#include "savepoint/cuda.h"

namespace savepoint::device {

// `driver` must outlive the copier.
Result<std::unique_ptr<SnapshotCopier>> MakeCudaSnapshotCopier(const CudaDriver& driver,
                                                               const CudaSnapshotOptions& options);

}  // namespace savepoint::device

#endif  // SAVEPOINT_DEVICE_CUDA_COPIER_H_
