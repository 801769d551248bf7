#include "engine/staging_pool.h"

#include <spdlog/spdlog.h>

#include <cstring>

namespace savepoint::engine {
StagingPool::StagingPool(uint64_t slab_bytes, size_t max_slabs, SnapshotCopier* copier)
    : slab_bytes_(slab_bytes), max_slabs_(max_slabs < 2 ? 2 : max_slabs), copier_(copier) {}

StagingPool::~StagingPool() {
  for (std::byte* slab : prepared_) copier_->ReleaseStaging(slab, slab_bytes_);
}

Result<Tensor> StagingPool::NewSlab(bool touch, bool* prepared) {
  SP_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(DType::kU8, {int64_t(slab_bytes_)}));
  if (touch) std::memset(t.data(), 0, slab_bytes_);  // the page faults happen here
  *prepared = false;
  if (copier_ == nullptr) return t;
  Status st = copier_->PrepareStaging(t.data(), slab_bytes_);
  if (st.ok()) {
    *prepared = true;
  } else if (!warned_.exchange(true)) {
    spdlog::warn(
        "savepoint: preparing a staging slab for the snapshot copier: {} (the slabs "
        "that fail are used as they are)",
        st.ToString());
  }
  return t;
}

Result<std::byte*> StagingPool::Acquire(const std::function<bool()>& cancelled) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !free_.empty() || slabs_.size() < max_slabs_ || cancelled(); });
  if (!free_.empty()) {
    std::byte* slab = free_.back();
    free_.pop_back();
    return slab;
  }
  if (slabs_.size() < max_slabs_) {
    bool prepared;
    SP_ASSIGN_OR_RETURN(Tensor t, NewSlab(/*touch=*/false, &prepared));
    if (prepared) prepared_.push_back(t.data());
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
  bool prepared;
  SP_ASSIGN_OR_RETURN(Tensor t, NewSlab(/*touch=*/true, &prepared));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (slabs_.size() >= max_slabs_) {  // Acquire took the last place meanwhile
      if (prepared) copier_->ReleaseStaging(t.data(), slab_bytes_);
      return false;
    }
    if (prepared) prepared_.push_back(t.data());
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
