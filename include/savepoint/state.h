// State: everything a checkpoint holds, under hierarchical names.
//
// Names look like "model.layer1.weight" or "optimizer.state.0.exp_avg". A name is any non-empty
// UTF-8 string of at most kMaxNameBytes bytes without NUL or other control characters; it is a key,
// never used as a file path. Tensors and values share one namespace. Iteration is in byte-wise
// name order.
//
// A State entry is one of:
//  - an owned Tensor (State frees it),
//  - a borrowed TensorView (the caller keeps the memory alive while the State is used; this is how
//    Save avoids copying the caller's buffers and how Load fills caller-provided buffers),
//  - a Value (int, float, bool, string, bytes, JSON).
// Beside the entries, a State holds named sparse embedding tables (SparseTable, savepoint/sparse.h:
// int64 ids plus named slots of one row per id); a table name must not also name an entry.
// Plus one JSON object of free-form user metadata, and a list of opaque keep-alive owners (see
// KeepAlive) that let borrowed views point into memory the State itself keeps alive, e.g. the
// read-only file mappings behind Load(..., {.mmap = true}).
//
// Thread safety: const methods may be called concurrently; mutation needs external locking.
#ifndef SAVEPOINT_STATE_H_
#define SAVEPOINT_STATE_H_

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "savepoint/export.h"
#include "savepoint/status.h"
#include "savepoint/tensor.h"
#include "savepoint/value.h"

namespace savepoint {

class SparseTable;  // savepoint/sparse.h

inline constexpr size_t kMaxNameBytes = 4096;

// OK when `name` is a valid entry name (see above); otherwise says why.
SAVEPOINT_API Status ValidateName(std::string_view name);

class SAVEPOINT_API State {
 public:
  // One entry: exactly one of tensor (owned), view (borrowed) or value.
  struct Entry {
    std::variant<Tensor, TensorView, Value> item;
    bool is_tensor() const { return item.index() != 2; }
    // The tensor's view (owned or borrowed). Precondition: is_tensor().
    const TensorView& tensor() const;
    const Value& value() const { return std::get<Value>(item); }
  };

  State() = default;
  State(State&&) noexcept = default;
  State& operator=(State&&) noexcept = default;

  // Adds an owned tensor. Fails on a bad or duplicate name.
  Status Put(std::string name, Tensor tensor);
  // Adds a borrowed view. Fails on a bad or duplicate name or an invalid view.
  Status PutView(std::string name, TensorView view);
  // Adds a non-tensor value. Fails on a bad or duplicate name.
  Status PutValue(std::string name, Value value);
  // Removes an entry; returns whether it existed.
  bool Erase(std::string_view name);

  bool Contains(std::string_view name) const { return entries_.count(name) > 0; }
  // nullptr when absent.
  const Entry* Find(std::string_view name) const;
  // nullptr when absent or not a tensor.
  const TensorView* FindTensor(std::string_view name) const;
  // nullptr when absent or not a value.
  const Value* FindValue(std::string_view name) const;

  size_t size() const { return entries_.size(); }
  size_t num_tensors() const;
  // Total tensor bytes.
  uint64_t tensor_bytes() const;
  const std::map<std::string, Entry, std::less<>>& entries() const { return entries_; }

  // Free-form user metadata (a JSON object; null until set).
  Json& metadata() { return metadata_; }
  const Json& metadata() const { return metadata_; }

  // Keeps `owner` alive for as long as this State lives (moves with it; released when the State
  // is destroyed or assigned over). Views in this State may point into memory owned by these
  // objects, so they stay valid without the caller holding the owner. Null is ignored. Erasing an
  // entry does not release owners.
  void KeepAlive(std::shared_ptr<const void> owner);
  size_t num_keep_alive() const { return keep_alive_.size(); }

  // --- Sparse embedding tables (savepoint/sparse.h; defined in src/sparse/table.cc). ---
  // Adds a table (validated: SparseTable::Validate). Fails on a bad name, or one already used by
  // a table or an entry. A table made of views borrows the caller's memory, as PutView does.
  Status PutTable(std::string name, SparseTable table);
  // nullptr when absent.
  const SparseTable* FindTable(std::string_view name) const;
  // Removes a table; returns whether it existed.
  bool EraseTable(std::string_view name);
  // Every table, by name (shared so that copies of a State's table list are cheap).
  const std::map<std::string, std::shared_ptr<const SparseTable>, std::less<>>& tables() const {
    return tables_;
  }

 private:
  Status Insert(std::string name, Entry entry);
  std::map<std::string, Entry, std::less<>> entries_;
  std::map<std::string, std::shared_ptr<const SparseTable>, std::less<>> tables_;
  Json metadata_;
  std::vector<std::shared_ptr<const void>> keep_alive_;
};

}  // namespace savepoint

#endif  // SAVEPOINT_STATE_H_
