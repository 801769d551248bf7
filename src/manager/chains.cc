// Sparse delta chains in a manager's directory (see chains.h).
#include "manager/chains.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

namespace savepoint::manager {

const std::string& Bases::Of(const CheckpointRecord& r) {
  auto it = bases_.find(r.name);
  if (it != bases_.end()) return it->second;
  std::string name;
  Result<std::optional<std::string>> base = store_->BaseOf(r.path);
  if (!base.ok()) {
    spdlog::warn("savepoint: retention: cannot read the base of {}: {}", r.path,
                 base.status().ToString());
  } else if (base->has_value()) {
    const size_t slash = (*base)->rfind('/');
    name = slash == std::string::npos ? **base : (*base)->substr(slash + 1);
  }
  return bases_[r.name] = std::move(name);
}

std::set<std::string> NeededByKept(const std::vector<CheckpointRecord>& records,
                                   const std::vector<std::string>& doomed, Bases& bases) {
  std::map<std::string, const CheckpointRecord*> by_name;
  for (const CheckpointRecord& r : records) by_name[r.name] = &r;
  std::set<std::string> needed;
  for (const CheckpointRecord& r : records) {
    if (std::find(doomed.begin(), doomed.end(), r.name) != doomed.end()) continue;
    // Walk down the chain; a chain is at most a few thousand links and names repeat only in a
    // corrupt directory, which the `needed` check stops.
    for (std::string base = bases.Of(r); !base.empty() && needed.insert(base).second;) {
      auto it = by_name.find(base);
      if (it == by_name.end()) break;  // not indexed: nothing retention could delete
      base = bases.Of(*it->second);
    }
  }
  return needed;
}

namespace {
Result<uint64_t> BytesOf(Store& store, const std::string& path,
                         const std::vector<CheckpointRecord>& records) {
  for (const CheckpointRecord& r : records) {
    if (r.path == path) return r.bytes;
  }
  SP_ASSIGN_OR_RETURN(StoredFacts f, store.Describe(path, /*metadata=*/false));
  return f.bytes;
}
}  // namespace

Result<bool> ChainNeedsCompaction(Store& store, const std::string& head,
                                  const std::vector<CheckpointRecord>& records,
                                  const CompactionPolicy& policy) {
  SP_ASSIGN_OR_RETURN(std::vector<SparseChainLink> chain, store.Chain(head));
  uint64_t delta_bytes = 0;
  for (size_t i = 0; i + 1 < chain.size(); ++i) {
    SP_ASSIGN_OR_RETURN(uint64_t b, BytesOf(store, chain[i].path, records));
    delta_bytes += b;
  }
  SP_ASSIGN_OR_RETURN(uint64_t base_bytes, BytesOf(store, chain.back().path, records));
  return ShouldCompact(static_cast<int64_t>(chain.size()) - 1, delta_bytes, base_bytes, policy);
}

Compaction::Compaction(Store* store, CheckpointRecord record) : record_(std::move(record)) {
  thread_ = std::thread([this, store] {
    const auto t0 = std::chrono::steady_clock::now();
    result_ = store->Compact(record_.path);
    seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    done_.store(true, std::memory_order_release);
  });
}

Compaction::~Compaction() {
  if (thread_.joinable()) thread_.join();
}

bool Compaction::Done() const { return done_.load(std::memory_order_acquire); }

Status Compaction::Wait() {
  if (thread_.joinable()) thread_.join();
  return result_;
}

}  // namespace savepoint::manager
