#include "savepoint/state.h"

#include <fmt/format.h>

#include "core/utf8.h"

namespace savepoint {

Status ValidateName(std::string_view name) {
  if (name.empty()) return InvalidArgumentError("empty name");
  if (name.size() > kMaxNameBytes) {
    return InvalidArgumentError(
        fmt::format("name of {} bytes exceeds the limit of {} bytes", name.size(), kMaxNameBytes));
  }
  for (size_t i = 0; i < name.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c == 0x7f) {
      return InvalidArgumentError(fmt::format("name {:?} has control character 0x{:02x} at byte {}",
                                              name.substr(0, 64), c, i));
    }
  }
  if (!IsValidUtf8(name)) {
    return InvalidArgumentError(fmt::format("name {:?} is not valid UTF-8", name.substr(0, 64)));
  }
  return Status::OK();
}

const TensorView& State::Entry::tensor() const {
  if (const auto* t = std::get_if<Tensor>(&item)) return t->view();
  return std::get<TensorView>(item);
}

Status State::Insert(std::string name, Entry entry) {
  SP_RETURN_IF_ERROR(ValidateName(name));
  if (tables_.count(name) > 0) {
    return AlreadyExistsError(fmt::format("state entry {:?}: a sparse table has that name", name));
  }
  auto [it, inserted] = entries_.try_emplace(std::move(name));
  if (!inserted) return AlreadyExistsError(fmt::format("duplicate state entry {:?}", it->first));
  it->second = std::move(entry);
  return Status::OK();
}

Status State::Put(std::string name, Tensor tensor) {
  return Insert(std::move(name), Entry{std::move(tensor)});
}

Status State::PutView(std::string name, TensorView view) {
  Status s = view.Validate();
  if (!s.ok()) return s.WithContext(fmt::format("tensor {:?}", name));
  return Insert(std::move(name), Entry{std::move(view)});
}

Status State::PutValue(std::string name, Value value) {
  return Insert(std::move(name), Entry{std::move(value)});
}

bool State::Erase(std::string_view name) {
  auto it = entries_.find(name);
  if (it == entries_.end()) return false;
  entries_.erase(it);
  return true;
}

const State::Entry* State::Find(std::string_view name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

const TensorView* State::FindTensor(std::string_view name) const {
  const Entry* e = Find(name);
  return e != nullptr && e->is_tensor() ? &e->tensor() : nullptr;
}

const Value* State::FindValue(std::string_view name) const {
  const Entry* e = Find(name);
  return e != nullptr && !e->is_tensor() ? &e->value() : nullptr;
}

void State::KeepAlive(std::shared_ptr<const void> owner) {
  if (owner != nullptr) keep_alive_.push_back(std::move(owner));
}

size_t State::num_tensors() const {
  size_t n = 0;
  for (const auto& [name, e] : entries_) n += e.is_tensor() ? 1 : 0;
  return n;
}

uint64_t State::tensor_bytes() const {
  uint64_t n = 0;
  for (const auto& [name, e] : entries_) n += e.is_tensor() ? e.tensor().nbytes() : 0;
  return n;
}

}  // namespace savepoint
