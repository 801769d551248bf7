// StagingPool: a capped set of reusable, 4 KiB-aligned slabs for asynchronous saves.
//
// Slabs are allocated on first demand up to `max_slabs` and then recycled, so steady-state saves
// neither allocate nor page-fault. Acquire blocks while every slab is in use.
//
// Thread safety: all methods are thread-safe.
#ifndef SAVEPOINT_ENGINE_STAGING_POOL_H_
#define SAVEPOINT_ENGINE_STAGING_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "savepoint/async.h"
#include "savepoint/status.h"
#include "savepoint/tensor.h"

namespace savepoint::engine {

class StagingPool {
 public:
  // `copier` (not owned, may be null) prepares each new slab (SnapshotCopier::PrepareStaging)
  // and releases it in the destructor.
  StagingPool(uint64_t slab_bytes, size_t max_slabs, SnapshotCopier* copier = nullptr);
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // A free slab, blocking until one is released. Returns nullptr if `cancelled()` becomes true
  // while waiting (re-checked whenever Wake() or Release() is called), or an error if memory
  // cannot be allocated.
  Result<std::byte*> Acquire(const std::function<bool()>& cancelled);
  // Returns a slab obtained from Acquire.
  void Release(std::byte* slab);
  // Wakes waiters so they re-check their cancellation condition.
  void Wake();
  // Allocates one more slab, touches every page of it (so no later copy into it page-faults) and
  // adds it to the free slabs, if fewer than `target_bytes` (and fewer than the cap) are
  // allocated. Returns whether it added one. The allocation and the touching run outside the
  // pool's lock, so Acquire and Release go on meanwhile.
  Result<bool> GrowOne(uint64_t target_bytes);

  // True when Acquire would block now: no free slab and the cap reached.
  bool exhausted() const;

  uint64_t slab_bytes() const { return slab_bytes_; }
  uint64_t cap_bytes() const { return slab_bytes_ * max_slabs_; }
  uint64_t allocated_bytes() const;
  uint64_t in_use_bytes() const;

 private:
  // A new slab (every page touched if `touch`), prepared by the copier if there is one; sets
  // *prepared to whether that succeeded (a failure is logged; the slab is used unprepared).
  Result<Tensor> NewSlab(bool touch, bool* prepared);

  const uint64_t slab_bytes_;
  const size_t max_slabs_;
  SnapshotCopier* const copier_;
  std::atomic<bool> warned_{false};  // a failed PrepareStaging was logged
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Tensor> slabs_;         // every slab ever allocated
  std::vector<std::byte*> free_;      // slabs ready for reuse
  std::vector<std::byte*> prepared_;  // slabs the copier prepared (released in the destructor)
};

}  // namespace savepoint::engine

#endif  // SAVEPOINT_ENGINE_STAGING_POOL_H_
