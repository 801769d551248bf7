// The CUDA snapshot copier. See savepoint/cuda.h and cuda_copier.h.
//
// Each copy runs in the primary context of the device holding the source (pushed on the calling
// thread for the call and popped after, so the caller's own context is left as it was), on a
// non-blocking stream taken from a per-device free list (one per concurrent copier thread), and
// waits for its stream before returning: the snapshot checksums the staged bytes right after.
#include "device/cuda_copier.h"

#include <fmt/format.h>

#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace savepoint::device {
namespace {

class CudaSnapshotCopier final : public SnapshotCopier {
 public:
  CudaSnapshotCopier(const CudaDriver& d, const CudaSnapshotOptions& o) : d_(d), options_(o) {}

  ~CudaSnapshotCopier() override {
    for (auto& [ordinal, dev] : devices_) {
      if (d_.CtxPushCurrent(dev.ctx) == kCudaSuccess) {
        for (CUstream s : dev.free_streams) d_.StreamDestroy(s);
        CUcontext popped;
        d_.CtxPopCurrent(&popped);
      }
      d_.PrimaryCtxRelease(dev.device);
    }
  }

  bool Copies(const std::byte* src) const override {
    unsigned type = 0;
    CUresult r = d_.PointerGetAttribute(&type, kPointerAttributeMemoryType, Address(src));
    if (r == kCudaErrorInvalidValue) return false;  // not memory CUDA knows: plain host memory
    // Any other failure goes to Copy, which reports it, rather than to a memcpy that would fault.
    return r != kCudaSuccess || type == kMemoryTypeDevice || type == kMemoryTypeUnified;
  }

  Status Copy(const std::byte* src, std::byte* dst, uint64_t n) override {
    int ordinal = -1;
    CUresult r = d_.PointerGetAttribute(&ordinal, kPointerAttributeDeviceOrdinal, Address(src));
    if (r != kCudaSuccess) {
      return CudaError(d_, r,
                       fmt::format("savepoint: snapshot of {} bytes at {}: which device", n,
                                   static_cast<const void*>(src)));
    }
    SP_ASSIGN_OR_RETURN(CUcontext ctx, Context(ordinal));
    SP_RETURN_IF_ERROR(Check(d_.CtxPushCurrent(ctx), ordinal, "cuCtxPushCurrent"));
    Status st = CopyOnStream(ordinal, src, dst, n);
    CUcontext popped;
    d_.CtxPopCurrent(&popped);
    return st;
  }

  uint64_t max_copy_bytes() const override {
    return options_.max_copy_bytes != 0 ? options_.max_copy_bytes : kWholePiece;
  }

  Status PrepareStaging(std::byte* slab, uint64_t n) override {
    if (!options_.pin_staging) return Status::OK();
    SP_ASSIGN_OR_RETURN(CUcontext ctx, Context(options_.device));
    SP_RETURN_IF_ERROR(Check(d_.CtxPushCurrent(ctx), options_.device, "cuCtxPushCurrent"));
    CUresult r = d_.MemHostRegister(slab, n, kMemHostRegisterPortable);
    CUcontext popped;
    d_.CtxPopCurrent(&popped);
    return Check(r, options_.device, fmt::format("page-locking a {}-byte staging slab", n));
  }

  void ReleaseStaging(std::byte* slab, uint64_t n) override {
    (void)n;
    if (!options_.pin_staging) return;
    Result<CUcontext> ctx = Context(options_.device);
    if (!ctx.ok() || d_.CtxPushCurrent(*ctx) != kCudaSuccess) return;
    d_.MemHostUnregister(slab);
    CUcontext popped;
    d_.CtxPopCurrent(&popped);
  }

 private:
  // Larger than any chunk piece: one copy call per piece (the snapshot caps pieces at a slab).
  static constexpr uint64_t kWholePiece = uint64_t{1} << 62;

  struct Device {
    CUdevice device = 0;
    CUcontext ctx = nullptr;
    std::vector<CUstream> free_streams;
  };

  static CUdeviceptr Address(const std::byte* p) { return reinterpret_cast<CUdeviceptr>(p); }

  Status Check(CUresult r, int ordinal, const std::string& what) const {
    if (r == kCudaSuccess) return Status::OK();
    return CudaError(d_, r, fmt::format("savepoint: CUDA device {}: {}", ordinal, what));
  }

  // The primary context of device `ordinal`, retained on first use (released by the destructor).
  Result<CUcontext> Context(int ordinal) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = devices_.find(ordinal);
    if (it != devices_.end()) return it->second.ctx;
    Device dev;
    SP_RETURN_IF_ERROR(Check(d_.DeviceGet(&dev.device, ordinal), ordinal, "cuDeviceGet"));
    SP_RETURN_IF_ERROR(
        Check(d_.PrimaryCtxRetain(&dev.ctx, dev.device), ordinal, "cuDevicePrimaryCtxRetain"));
    return devices_.emplace(ordinal, std::move(dev)).first->second.ctx;
  }

  // With device `ordinal`'s context current: copies on a stream of the free list and waits.
  Status CopyOnStream(int ordinal, const std::byte* src, std::byte* dst, uint64_t n) {
    CUstream s = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::vector<CUstream>& free = devices_[ordinal].free_streams;
      if (!free.empty()) {
        s = free.back();
        free.pop_back();
      }
    }
    if (s == nullptr) {
      SP_RETURN_IF_ERROR(Check(d_.StreamCreate(&s, kStreamNonBlocking), ordinal, "cuStreamCreate"));
    }
    CUresult r = d_.MemcpyDtoHAsync(dst, Address(src), n, s);
    if (r == kCudaSuccess) r = d_.StreamSynchronize(s);
    {
      std::lock_guard<std::mutex> lock(mu_);
      devices_[ordinal].free_streams.push_back(s);
    }
    return Check(r, ordinal,
                 fmt::format("copying {} bytes from device memory at {} to the host", n,
                             static_cast<const void*>(src)));
  }

  const CudaDriver& d_;
  const CudaSnapshotOptions options_;
  std::mutex mu_;
  std::map<int, Device> devices_;  // by ordinal; guarded by mu_
};

}  // namespace

Result<std::unique_ptr<SnapshotCopier>> MakeCudaSnapshotCopier(const CudaDriver& driver,
                                                               const CudaSnapshotOptions& options) {
  if (options.device < 0) {
    return InvalidArgumentError(
        fmt::format("CudaSnapshotOptions.device = {}: a device ordinal is >= 0", options.device));
  }
  return std::unique_ptr<SnapshotCopier>(new CudaSnapshotCopier(driver, options));
}

}  // namespace savepoint::device

namespace savepoint {

Result<std::unique_ptr<SnapshotCopier>> CreateCudaSnapshotCopier(const CudaSnapshotOptions& o) {
  SP_ASSIGN_OR_RETURN(const device::CudaDriver* driver, device::LoadCudaDriver());
  return device::MakeCudaSnapshotCopier(*driver, o);
}

}  // namespace savepoint
