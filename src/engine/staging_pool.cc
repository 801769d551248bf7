#include "engine/staging_pool.h"

#include <cstring>

namespace savepoint::engine {

StagingPool::StagingPool(uint64_t slab_bytes, size_t max_slabs)
    : slab_bytes_(slab_bytes), max_slabs_(max_slabs < 2 ? 2 : max_slabs) {}

Result<std::byte*> StagingPool::Acquire(const std::function<bool()>& cancelled) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !free_.empty() || slabs_.size() < max_slabs_ || cancelled(); });
  if (!free_.empty()) {
    std::byte* slab = free_.back();
    free_.pop_back();
    return slab;
  }
  if (slabs_.size() < max_slabs_) {
    SP_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(DType::kU8, {int64_t(slab_bytes_)}));
    slabs_.push_back(std::move(t));
    return slabs_.back().data();
  }
  return static_cast<std::byte*>(nullptr);
}

void StagingPool::Release(std::byte* slab) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(slab);
  }
  cv_.notify_all();
}

void StagingPool::Wake() {
  { std::lock_guard<std::mutex> lock(mu_); }
  cv_.notify_all();
}

Result<bool> StagingPool::GrowOne(uint64_t target_bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (slabs_.size() >= max_slabs_ || slabs_.size() * slab_bytes_ >= target_bytes) return false;
  }
  SP_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(DType::kU8, {int64_t(slab_bytes_)}));
  std::memset(t.data(), 0, slab_bytes_);  // the page faults happen here, not in a snapshot
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (slabs_.size() >= max_slabs_) return false;  // Acquire took the last place meanwhile
    slabs_.push_back(std::move(t));
    free_.push_back(slabs_.back().data());
  }
  cv_.notify_all();
  return true;
}

bool StagingPool::exhausted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return free_.empty() && slabs_.size() >= max_slabs_;
}

uint64_t StagingPool::allocated_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return slabs_.size() * slab_bytes_;
}

uint64_t StagingPool::in_use_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return (slabs_.size() - free_.size()) * slab_bytes_;
}

}  // namespace savepoint::engine
