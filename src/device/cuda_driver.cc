// Loading the CUDA driver at run time. See cuda_driver.h.
#include "device/cuda_driver.h"

#include <dlfcn.h>
#include <fmt/format.h>

namespace savepoint::device {
namespace {

template <typename F>
bool Find(void* lib, const char* name, F* fn) {
  *fn = reinterpret_cast<F>(::dlsym(lib, name));
  return *fn != nullptr;
}

Result<const CudaDriver*> Load() {
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = ::dlerror();
    return FailedPreconditionError(fmt::format("CUDA driver libcuda.so.1 not found ({})",
                                               why != nullptr ? why : "no reason given"));
  }
  static CudaDriver d;  // filled once, under the static initialiser of LoadCudaDriver
  const char* missing = nullptr;
  auto need = [&](const char* name, auto* fn) {
    if (missing == nullptr && !Find(lib, name, fn)) missing = name;
  };
  need("cuInit", &d.Init);
  need("cuDeviceGet", &d.DeviceGet);
  need("cuDevicePrimaryCtxRetain", &d.PrimaryCtxRetain);
  need("cuDevicePrimaryCtxRelease_v2", &d.PrimaryCtxRelease);
  need("cuCtxPushCurrent_v2", &d.CtxPushCurrent);
  need("cuCtxPopCurrent_v2", &d.CtxPopCurrent);
  need("cuPointerGetAttribute", &d.PointerGetAttribute);
  need("cuStreamCreate", &d.StreamCreate);
  need("cuStreamDestroy_v2", &d.StreamDestroy);
  need("cuStreamSynchronize", &d.StreamSynchronize);
  need("cuMemcpyDtoHAsync_v2", &d.MemcpyDtoHAsync);
  need("cuMemHostRegister_v2", &d.MemHostRegister);
  need("cuMemHostUnregister", &d.MemHostUnregister);
  need("cuGetErrorName", &d.GetErrorName);
  need("cuGetErrorString", &d.GetErrorString);
  if (missing != nullptr) {
    return FailedPreconditionError(
        fmt::format("CUDA driver libcuda.so.1 lacks {} (driver too old)", missing));
  }
  CUresult r = d.Init(0);
  if (r != kCudaSuccess) {
    return FailedPreconditionError(CudaError(d, r, "CUDA driver: cuInit").message());
  }
  return &d;
}

}  // namespace

Result<const CudaDriver*> LoadCudaDriver() {
  static const Result<const CudaDriver*> loaded = Load();
  return loaded;
}

Status CudaError(const CudaDriver& d, CUresult r, const std::string& what) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (d.GetErrorName == nullptr || d.GetErrorName(r, &name) != kCudaSuccess) name = nullptr;
  if (d.GetErrorString == nullptr || d.GetErrorString(r, &text) != kCudaSuccess) text = nullptr;
  return IOError(fmt::format("{}: {} ({})", what,
                             name != nullptr ? name : fmt::format("CUresult {}", r),
                             text != nullptr ? text : "no description"));
}

}  // namespace savepoint::device
