// The few CUDA driver API entry points the CUDA snapshot copier uses, found at run time with
// dlopen("libcuda.so.1"), so that savepoint builds and runs without CUDA. The types and constants
// are the driver API's (cuda.h), whose ABI is stable across CUDA versions; the tests fill a table
// with fakes to exercise the copier on machines without a GPU.
//
// Thread safety: the table is immutable once loaded.
#ifndef SAVEPOINT_DEVICE_CUDA_DRIVER_H_
#define SAVEPOINT_DEVICE_CUDA_DRIVER_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "savepoint/status.h"

namespace savepoint::device {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;  // NOLINT(runtime/int): the driver's type
using CUcontext = struct CUctx_st*;
using CUstream = struct CUstream_st*;

inline constexpr CUresult kCudaSuccess = 0;
inline constexpr CUresult kCudaErrorInvalidValue = 1;
inline constexpr int kPointerAttributeMemoryType = 2;     // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
inline constexpr int kPointerAttributeDeviceOrdinal = 9;  // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
inline constexpr unsigned kMemoryTypeHost = 1;            // CU_MEMORYTYPE_HOST
inline constexpr unsigned kMemoryTypeDevice = 2;          // CU_MEMORYTYPE_DEVICE
inline constexpr unsigned kMemoryTypeUnified = 4;         // CU_MEMORYTYPE_UNIFIED
inline constexpr unsigned kMemHostRegisterPortable = 1;   // CU_MEMHOSTREGISTER_PORTABLE
inline constexpr unsigned kStreamNonBlocking = 1;         // CU_STREAM_NON_BLOCKING

struct CudaDriver {
  CUresult (*Init)(unsigned flags);
  CUresult (*DeviceGet)(CUdevice* device, int ordinal);
  CUresult (*PrimaryCtxRetain)(CUcontext* ctx, CUdevice device);
  CUresult (*PrimaryCtxRelease)(CUdevice device);
  CUresult (*CtxPushCurrent)(CUcontext ctx);
  CUresult (*CtxPopCurrent)(CUcontext* ctx);
  CUresult (*PointerGetAttribute)(void* data, int attribute, CUdeviceptr ptr);
  CUresult (*StreamCreate)(CUstream* stream, unsigned flags);
  CUresult (*StreamDestroy)(CUstream stream);
  CUresult (*StreamSynchronize)(CUstream stream);
  CUresult (*MemcpyDtoHAsync)(void* dst, CUdeviceptr src, size_t n, CUstream stream);
  CUresult (*MemHostRegister)(void* p, size_t n, unsigned flags);
  CUresult (*MemHostUnregister)(void* p);
  CUresult (*GetErrorName)(CUresult r, const char** name);
  CUresult (*GetErrorString)(CUresult r, const char** text);
};

// The process's CUDA driver, loaded and initialised (cuInit) on first use; FailedPrecondition,
// with the reason, when libcuda.so.1 is missing or cuInit fails (no device, driver too old).
Result<const CudaDriver*> LoadCudaDriver();

// "what: CUDA_ERROR_NAME (its description)" as an IOError (the device failed), for a failed call.
Status CudaError(const CudaDriver& d, CUresult r, const std::string& what);

}  // namespace savepoint::device

#endif  // SAVEPOINT_DEVICE_CUDA_DRIVER_H_
