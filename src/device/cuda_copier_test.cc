// The CUDA snapshot copier over a fake driver (no GPU needed): which memory it takes, that the
// async Checkpointer pins its slabs once and unpins them when destroyed, that a state mixing
// "device" and host tensors (plain and encrypted) round-trips, that every pushed context is
// popped, and that a failed device copy fails the save with the CUDA error's name and commits
// nothing. On a machine without CUDA, CreateCudaSnapshotCopier says why it cannot run.
#include "device/cuda_copier.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "engine/encryption_testutil.h"
#include "io/mem_fs.h"
#include "savepoint/async.h"
#include "savepoint/checkpoint.h"
#include "savepoint/manager.h"
#include "testutil/testutil.h"

namespace savepoint::device {
namespace {

using ::savepoint::testing::StatusIs;

// The fake GPU: host ranges that play device memory, and counters of what the copier did.
struct FakeGpu {
  std::mutex mu;
  std::vector<std::pair<const std::byte*, size_t>> device;  // (start, bytes)
  std::set<void*> pinned;
  std::atomic<uint64_t> dtoh_bytes{0};
  std::atomic<int> pins{0}, unpins{0}, pushes{0}, pops{0}, streams{0}, destroyed{0};
  std::atomic<bool> fail_copies{false};

  bool IsDevice(CUdeviceptr p) {
    std::lock_guard<std::mutex> lock(mu);
    auto* b = reinterpret_cast<const std::byte*>(p);
    return std::any_of(device.begin(), device.end(),
                       [&](const auto& r) { return b >= r.first && b < r.first + r.second; });
  }
};
FakeGpu* gpu = nullptr;
CUstream_st* const kStream = reinterpret_cast<CUstream_st*>(0x5);
CUctx_st* const kCtx = reinterpret_cast<CUctx_st*>(0x7);
constexpr CUresult kErrorIllegalAddress = 700;

CudaDriver FakeDriver() {
  CudaDriver d{};
  d.Init = [](unsigned) { return kCudaSuccess; };
  d.DeviceGet = [](CUdevice* dev, int ordinal) {
    *dev = ordinal;
    return kCudaSuccess;
  };
  d.PrimaryCtxRetain = [](CUcontext* c, CUdevice) {
    *c = kCtx;
    return kCudaSuccess;
  };
  d.PrimaryCtxRelease = [](CUdevice) { return kCudaSuccess; };
  d.CtxPushCurrent = [](CUcontext) { return ++gpu->pushes, kCudaSuccess; };
  d.CtxPopCurrent = [](CUcontext* c) { return *c = kCtx, ++gpu->pops, kCudaSuccess; };
  d.PointerGetAttribute = [](void* data, int attribute, CUdeviceptr p) {
    if (!gpu->IsDevice(p)) return kCudaErrorInvalidValue;
    if (attribute == kPointerAttributeMemoryType) *static_cast<unsigned*>(data) = kMemoryTypeDevice;
    if (attribute == kPointerAttributeDeviceOrdinal) *static_cast<int*>(data) = 0;
    return kCudaSuccess;
  };
  d.StreamCreate = [](CUstream* s, unsigned) { return *s = kStream, ++gpu->streams, kCudaSuccess; };
  d.StreamDestroy = [](CUstream) { return ++gpu->destroyed, kCudaSuccess; };
  d.StreamSynchronize = [](CUstream) { return kCudaSuccess; };
  d.MemcpyDtoHAsync = [](void* dst, CUdeviceptr src, size_t n, CUstream) {
    if (gpu->fail_copies) return kErrorIllegalAddress;
    std::memcpy(dst, reinterpret_cast<const void*>(src), n);
    gpu->dtoh_bytes += n;
    return kCudaSuccess;
  };
  d.MemHostRegister = [](void* p, size_t, unsigned) {
    std::lock_guard<std::mutex> lock(gpu->mu);
    return gpu->pinned.insert(p).second ? (++gpu->pins, kCudaSuccess) : kCudaErrorInvalidValue;
  };
  d.MemHostUnregister = [](void* p) {
    std::lock_guard<std::mutex> lock(gpu->mu);
    return gpu->pinned.erase(p) == 1 ? (++gpu->unpins, kCudaSuccess) : kCudaErrorInvalidValue;
  };
  d.GetErrorName = [](CUresult r, const char** name) {
    *name = r == kErrorIllegalAddress ? "CUDA_ERROR_ILLEGAL_ADDRESS" : "CUDA_ERROR_OTHER";
    return kCudaSuccess;
  };
  d.GetErrorString = [](CUresult, const char** text) {
    *text = "an illegal memory access was encountered";
    return kCudaSuccess;
  };
  return d;
}

constexpr uint64_t kSlab = 64 << 10;

class CudaCopierTest : public ::testing::Test {
 protected:
  void SetUp() override { gpu = &fake_; }
  void TearDown() override { gpu = nullptr; }

  // A state of one "device" tensor of `n` floats, one host tensor and a value.
  State MixedState(int64_t n) {
    State s;
    Tensor dev = Tensor::Empty(DType::kF32, {n}).value();
    Tensor host = Tensor::Empty(DType::kI64, {1000}).value();
    for (int64_t i = 0; i < n; ++i) reinterpret_cast<float*>(dev.data())[i] = float(i) * 0.5f;
    for (int64_t i = 0; i < 1000; ++i) reinterpret_cast<int64_t*>(host.data())[i] = -i;
    {
      std::lock_guard<std::mutex> lock(fake_.mu);
      fake_.device.emplace_back(dev.data(), dev.nbytes());
    }
    EXPECT_TRUE(s.Put("weights", std::move(dev)).ok());
    EXPECT_TRUE(s.Put("host", std::move(host)).ok());
    EXPECT_TRUE(s.PutValue("step", Value(7)).ok());
    return s;
  }

  std::unique_ptr<SnapshotCopier> Copier(CudaSnapshotOptions o = {}) {
    return MakeCudaSnapshotCopier(driver_, o).value();
  }

  FakeGpu fake_;
  CudaDriver driver_ = FakeDriver();
  MemFileSystem fs_;
  IoOptions io_{.fs = &fs_, .io_threads = 2};
};

TEST_F(CudaCopierTest, TakesDeviceMemoryOnly) {
  State s = MixedState(100);
  auto copier = Copier();
  EXPECT_TRUE(copier->Copies(s.FindTensor("weights")->data()));
  EXPECT_FALSE(copier->Copies(s.FindTensor("host")->data()));
  EXPECT_GT(copier->max_copy_bytes(), uint64_t{1} << 30) << "a whole piece per call by default";
  EXPECT_EQ(Copier({.max_copy_bytes = 4096})->max_copy_bytes(), 4096u);
  EXPECT_EQ(MakeCudaSnapshotCopier(driver_, {.device = -1}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(CudaCopierTest, AsyncSaveRoundTripsWithPinnedSlabs) {
  const State state = MixedState(100000);  // 400 KB of "device" memory: several slabs
  auto copier = Copier();
  {
    CheckpointerOptions co{.staging_bytes = 4 * kSlab,
                           .slab_bytes = kSlab,
                           .snapshot_threads = 3,
                           .copier = copier.get()};
    auto ckpt = Checkpointer::Create(co, io_).value();
    for (const char* path : {"/a", "/b"}) {  // the second save reuses the pinned slabs
      Result<SaveHandle> h = ckpt->SaveAsync(state, path);
      ASSERT_TRUE(h.ok()) << h.status().ToString();
      SP_ASSERT_OK(h->Wait());
      Result<State> back = Load(path, {}, io_);
      ASSERT_TRUE(back.ok()) << back.status().ToString();
      EXPECT_TRUE(testing::StatesEqual(*back, state));
    }
    EXPECT_EQ(fake_.dtoh_bytes.load(), 2 * 400000u) << "the device tensor, by the copier alone";
    EXPECT_EQ(uint64_t(fake_.pins.load()), ckpt->staging_allocated_bytes() / kSlab);
    EXPECT_EQ(fake_.unpins.load(), 0);
  }
  EXPECT_EQ(fake_.unpins.load(), fake_.pins.load()) << "every slab unpinned with the Checkpointer";
  EXPECT_EQ(fake_.pushes.load(), fake_.pops.load());
  copier.reset();
  EXPECT_EQ(fake_.destroyed.load(), fake_.streams.load());
  EXPECT_LE(fake_.streams.load(), 3) << "one stream per concurrent snapshot thread at most";
}

TEST_F(CudaCopierTest, EncryptedAsyncSaveRoundTrips) {
  const State state = MixedState(50000);
  auto copier = Copier({.max_copy_bytes = 8192});
  CheckpointerOptions co{.staging_bytes = 4 * kSlab, .slab_bytes = kSlab, .copier = copier.get()};
  auto ckpt = Checkpointer::Create(co, io_).value();
  SaveOptions o;
  o.key = EncryptionKey::FromBytes(testing::kKeyA);
  Result<SaveHandle> h = ckpt->SaveAsync(state, "/enc", o);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  SP_ASSERT_OK(h->Wait());
  Result<State> back = Load("/enc", testing::EncLoad(testing::kKeyA), io_);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(testing::StatesEqual(*back, state));
  EXPECT_EQ(fake_.dtoh_bytes.load(), 200000u);
}

TEST_F(CudaCopierTest, FailedDeviceCopyFailsTheSaveAndCommitsNothing) {
  const State state = MixedState(100000);
  auto copier = Copier();
  CheckpointerOptions co{.staging_bytes = 4 * kSlab, .slab_bytes = kSlab, .copier = copier.get()};
  auto ckpt = Checkpointer::Create(co, io_).value();
  fake_.fail_copies = true;
  Result<SaveHandle> h = ckpt->SaveAsync(state, "/bad");
  Status st = h.ok() ? h->Wait() : h.status();
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st, StatusIs(StatusCode::kIOError, "CUDA_ERROR_ILLEGAL_ADDRESS"));
  EXPECT_NE(st.message().find("CUDA device 0"), std::string::npos) << st.ToString();
  EXPECT_FALSE(fs_.Exists("/bad")) << "nothing committed";
  fake_.fail_copies = false;
  Result<SaveHandle> again = ckpt->SaveAsync(state, "/bad");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  SP_ASSERT_OK(again->Wait());
}

TEST_F(CudaCopierTest, UnpinnedSlabsWhenAskedOrWhenPinningFails) {
  const State state = MixedState(1000);
  auto unpinned = Copier({.pin_staging = false});
  {
    CheckpointerOptions co{
        .staging_bytes = 2 * kSlab, .slab_bytes = kSlab, .copier = unpinned.get()};
    auto ckpt = Checkpointer::Create(co, io_).value();
    SP_ASSERT_OK(ckpt->SaveAsync(state, "/u").value().Wait());
  }
  EXPECT_EQ(fake_.pins.load(), 0);
  EXPECT_EQ(fake_.unpins.load(), 0);
  driver_.MemHostRegister = [](void*, size_t, unsigned) { return kErrorIllegalAddress; };
  auto failing = Copier();
  {
    CheckpointerOptions co{
        .staging_bytes = 2 * kSlab, .slab_bytes = kSlab, .copier = failing.get()};
    auto ckpt = Checkpointer::Create(co, io_).value();
    SP_ASSERT_OK(ckpt->SaveAsync(state, "/f").value().Wait());  // pageable slabs still work
    Result<State> back = Load("/f", {}, io_);
    ASSERT_TRUE(back.ok());
    EXPECT_TRUE(testing::StatesEqual(*back, state));
  }
  EXPECT_EQ(fake_.unpins.load(), 0) << "nothing to unpin";
}

// The checkpoint manager's async saves take the copier through
// ManagerOptions::async_save.checkpointer: the device tensor goes through the pinned slabs by DMA,
// the host one by the built-in copy, and the state restores; a file format refuses the copier
// rather than ignoring it.
TEST_F(CudaCopierTest, ManagerAsyncSavesCopyDeviceMemoryIntoPinnedSlabs) {
  const State state = MixedState(100000);
  auto copier = Copier();
  {
    ManagerOptions o;
    o.naming.directory = "/run";
    o.io = io_;
    o.async_save.enabled = true;
    o.async_save.checkpointer = {
        .staging_bytes = 8 * kSlab, .slab_bytes = kSlab, .copier = copier.get()};
    auto m = CheckpointManager::Open(o).value();
    SP_ASSERT_OK(m->Reserve(8 * kSlab));  // in the background: every slab allocated and pinned
    for (int i = 0; i < 500 && fake_.pins.load() < 8; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(fake_.pins.load(), 8) << "Reserve page-locks the staging before the first save";
    for (int64_t step : {1, 2}) {
      Result<bool> saved = m->Save(step, state);
      ASSERT_TRUE(saved.ok()) << saved.status().ToString();
      EXPECT_TRUE(*saved);
    }
    SP_ASSERT_OK(m->Wait());
    EXPECT_EQ(fake_.dtoh_bytes.load(), 2 * 400000u) << "the device tensor, by DMA, each save";
    EXPECT_GT(fake_.pins.load(), 0) << "slabs page-locked";
    Result<State> back = m->Restore();
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->FindTensor("weights")->nbytes(), 400000u);
    EXPECT_EQ(std::memcmp(back->FindTensor("weights")->data(), state.FindTensor("weights")->data(),
                          400000),
              0);
    SP_ASSERT_OK(m->Close());
    EXPECT_THAT(m->Reserve(1), StatusIs(StatusCode::kFailedPrecondition, "closed"));
  }
  EXPECT_EQ(fake_.unpins.load(), fake_.pins.load()) << "unpinned with the manager";
  ManagerOptions sync;
  sync.naming.directory = "/sync";
  sync.io = io_;
  sync.async_save.checkpointer.copier = copier.get();
  auto synced = CheckpointManager::Open(sync).value();
  EXPECT_THAT(synced->Reserve(1),
              StatusIs(StatusCode::kFailedPrecondition, "only async native saves stage"));
  // A synchronous save reads host memory only: refused, not a crash.
  EXPECT_THAT(synced->Save(1, state),
              StatusIs(StatusCode::kInvalidArgument, "\"weights\" is in device memory"));
  ManagerOptions file;
  file.naming.directory = "/files";
  file.io = io_;
  file.async_save.enabled = true;
  file.storage.format = Format::kSafetensors;
  file.async_save.checkpointer.copier = copier.get();
  EXPECT_THAT(CheckpointManager::Open(file).status(),
              StatusIs(StatusCode::kInvalidArgument, "async_save.checkpointer.copier"));
}

TEST(CudaSnapshotCopier, SaysWhyWithoutCuda) {
  Result<std::unique_ptr<SnapshotCopier>> c = CreateCudaSnapshotCopier();
  if (c.ok())
    GTEST_SUCCEED() << "a CUDA driver and device are present";
  else {
    EXPECT_THAT(c, StatusIs(StatusCode::kFailedPrecondition, "CUDA"));
  }
}

}  // namespace
}  // namespace savepoint::device
