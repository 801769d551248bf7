// Registered objects: gathering their state, and loading a checkpoint into them under a
// LoadConfig (categories, strict/lenient matching, renames, only-filters).
//
// Loading is two passes: first every selected object is planned (its current state is asked for
// as a template, every entry is matched against the checkpoint by name, dtype and shape, and
// strictness is enforced), then, only if every plan succeeded, the tensors are read straight into
// the template's memory and each object's LoadState is called.
#include "manager/registry.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <set>

#include "engine/select.h"
#include "manager/options.h"

namespace savepoint::manager {
namespace {

constexpr size_t kNumCategories = 5;

Status ApplyCategories(const std::vector<std::string>& names, bool value, const char* field,
                       std::vector<bool>& selected) {
  for (const std::string& n : names) {
    if (n == "*") {
      selected.assign(kNumCategories, value);
      continue;
    }
    Result<Category> c = ParseCategory(n);
    if (!c.ok()) return c.status().WithContext(fmt::format("LoadConfig.{}", field));
    selected[static_cast<size_t>(*c)] = value;
  }
  return Status::OK();
}

}  // namespace

Result<const Json*> SavedShards(const Json& meta, const std::string& name,
                                const std::string& where) {
  auto manager = meta.find(kMetaKey);  // (end() when `meta` is no object)
  if (manager == meta.end() || !manager->is_object()) return nullptr;
  const auto bad = [&](const std::string& member, std::string_view type) {
    return CorruptionError(
        fmt::format("{}: metadata {}.{} is not {}", where, kMetaKey, member, type));
  };
  auto objects = manager->find("objects");
  if (objects == manager->end()) return nullptr;
  if (!objects->is_object()) return bad("objects", "an object");
  auto record = objects->find(name);
  if (record == objects->end()) return nullptr;
  if (!record->is_object()) return bad(fmt::format("objects.{}", name), "an object");
  auto shards = record->find("num_shards");
  if (shards == record->end()) return nullptr;
  if (!shards->is_number_integer()) {
    return bad(fmt::format("objects.{}.num_shards", name), "an integer");
  }
  return &*shards;
}

Result<std::vector<bool>> SelectedCategories(const LoadConfig& config) {
  std::vector<bool> selected(kNumCategories, false);
  SP_RETURN_IF_ERROR(ApplyCategories(config.include, true, "include", selected));
  SP_RETURN_IF_ERROR(ApplyCategories(config.exclude, false, "exclude", selected));
  return selected;
}

struct Registry::Plan {
  std::string name;
  Stateful* object = nullptr;
  State templ;
  struct Item {
    std::string key;  // name in templ
    std::string src;  // name in the checkpoint
    bool tensor = false;
  };
  std::vector<Item> items;
};

std::string Registry::EntryPrefix(const std::string& name, Category category) const {
  if (category == Category::kIoState) return fmt::format("{}.shard-{}.", name, shard_id_);
  return name + ".";
}

Status Registry::Add(const std::string& name, Stateful* object, Category category) {
  SP_RETURN_IF_ERROR(ValidateName(name).WithContext("register"));
  if (name.find('.') != std::string::npos || object == nullptr) {
    return InvalidArgumentError(fmt::format(
        "register {:?}: the name must not contain '.' and the object not be null", name));
  }
  if (!objects_.emplace(name, Object{object, category}).second) {
    return AlreadyExistsError(fmt::format("register {:?}: the name is already registered", name));
  }
  return Status::OK();
}

Status Registry::Remove(const std::string& name) {
  if (objects_.erase(name) == 0) {
    return NotFoundError(fmt::format("unregister {:?}: not registered", name));
  }
  return Status::OK();
}

Result<Gathered> Registry::Gather() const {
  Gathered g;
  Json objects = Json::object();
  g.parts.reserve(objects_.size());
  for (const auto& [name, o] : objects_) {
    State& part = g.parts.emplace_back();
    SP_RETURN_IF_ERROR(o.object->SaveState(part).WithContext(fmt::format("save {:?}", name)));
    const std::string prefix = EntryPrefix(name, o.category);
    for (const auto& [key, entry] : part.entries()) {
      Status s = entry.is_tensor() ? g.state.PutView(prefix + key, entry.tensor())
                                   : g.state.PutValue(prefix + key, entry.value());
      SP_RETURN_IF_ERROR(s.WithContext(fmt::format("save {:?}", name)));
    }
    objects[name] = {{"category", CategoryName(o.category)}, {"num_shards", num_shards_}};
  }
  g.state.metadata()[kMetaKey]["objects"] = std::move(objects);
  return g;
}

Result<Registry::Plan> Registry::PlanObject(EntrySource& reader, const LoadConfig& config,
                                            const std::string& name, const Object& o) const {
  Plan plan{name, o.object, State(), {}};
  SP_RETURN_IF_ERROR(o.object->SaveState(plan.templ).WithContext(fmt::format("load {:?}", name)));
  const std::string where =
      fmt::format("load {:?} ({}) from {}", name, CategoryName(o.category), reader.path());
  if (o.category == Category::kIoState) {
    SP_ASSIGN_OR_RETURN(const Json* saved, SavedShards(reader.values().metadata(), name, where));
    if (saved != nullptr && *saved != num_shards_) {
      return InvalidArgumentError(fmt::format("{}: saved with {} shards, this run has {}", where,
                                              saved->dump(), num_shards_));
    }
  }
  std::map<std::string, std::string> source_of;  // target -> checkpoint name
  for (const auto& [from, to] : config.renames) source_of[to] = from;
  const std::string prefix = EntryPrefix(name, o.category);
  std::set<std::string> consumed;
  for (const auto& [key, entry] : plan.templ.entries()) {
    const std::string target = prefix + key;
    if (!engine::Selected(config.only, target)) continue;
    auto renamed = source_of.find(target);
    const std::string src = renamed != source_of.end() ? renamed->second : target;
    Status problem;
    if (entry.is_tensor()) {
      const TensorInfo* info = reader.FindTensor(src);
      const TensorView& want = entry.tensor();
      if (info == nullptr) {
        problem = NotFoundError(fmt::format("{}: no tensor {:?}", where, src));
      } else if (info->dtype != want.dtype() || info->shape != want.shape()) {
        problem = InvalidArgumentError(
            fmt::format("{}: tensor {:?} is {} {} in the checkpoint, {:?} is {} {} here", where,
                        src, DTypeName(info->dtype), ShapeToString(info->shape), target,
                        DTypeName(want.dtype()), ShapeToString(want.shape())));
      }
    } else if (reader.values().FindValue(src) == nullptr) {
      problem = NotFoundError(fmt::format("{}: no value {:?}", where, src));
    }
    if (!problem.ok()) {
      if (config.strict) return problem;
      spdlog::info("savepoint: skipped: {}", problem.message());
      continue;
    }
    consumed.insert(src);
    plan.items.push_back({key, src, entry.is_tensor()});
  }
  if (config.strict && config.only.empty()) {
    auto check = [&](const std::string& n) -> Status {
      if (n.starts_with(prefix) && consumed.count(n) == 0 && config.renames.count(n) == 0) {
        return InvalidArgumentError(
            fmt::format("{}: the checkpoint has {:?}, which the object does not have", where, n));
      }
      return Status::OK();
    };
    for (const TensorInfo& t : reader.tensors()) SP_RETURN_IF_ERROR(check(t.name));
    for (const auto& [n, e] : reader.values().entries()) SP_RETURN_IF_ERROR(check(n));
  }
  return plan;
}

Status Registry::Load(EntrySource& reader, const LoadConfig& config) const {
  SP_ASSIGN_OR_RETURN(std::vector<bool> selected, SelectedCategories(config));
  std::vector<Plan> plans;
  for (const auto& [name, o] : objects_) {
    if (!selected[static_cast<size_t>(o.category)]) continue;
    SP_ASSIGN_OR_RETURN(Plan plan, PlanObject(reader, config, name, o));
    if (!plan.items.empty()) plans.push_back(std::move(plan));
  }
  for (Plan& plan : plans) {
    State in;
    for (const Plan::Item& item : plan.items) {
      const State::Entry* entry = plan.templ.Find(item.key);
      if (item.tensor) {
        SP_RETURN_IF_ERROR(reader.ReadTensor(item.src, entry->tensor()));
        SP_RETURN_IF_ERROR(in.PutView(item.key, entry->tensor()));
      } else {
        SP_RETURN_IF_ERROR(in.PutValue(item.key, *reader.values().FindValue(item.src)));
      }
    }
    SP_RETURN_IF_ERROR(plan.object->LoadState(in).WithContext(fmt::format("load {:?}", plan.name)));
  }
  return Status::OK();
}

namespace {

class ReaderSource final : public EntrySource {
 public:
  explicit ReaderSource(std::unique_ptr<CheckpointReader> r) : r_(std::move(r)) {}
  const std::string& path() const override { return r_->path(); }
  const State& values() const override { return r_->values(); }
  const std::vector<TensorInfo>& tensors() const override { return r_->tensors(); }
  const TensorInfo* FindTensor(const std::string& name) const override {
    return r_->FindTensor(name);
  }
  Status ReadTensor(const std::string& name, const TensorView& dst) override {
    return r_->ReadTensor(name, dst);
  }

 private:
  std::unique_ptr<CheckpointReader> r_;
};

// A .ckpt file stores int, float and bool values as 0-d Int64, Float64 and Bool tensors (as
// MindSpore does): such a tensor also serves as the value.
std::optional<Value> ScalarValue(const TensorView& t) {
  if (!t.shape().empty() || t.data() == nullptr) return std::nullopt;
  switch (t.dtype()) {
    case DType::kI64: {
      int64_t x;
      std::memcpy(&x, t.data(), sizeof x);
      return Value(x);
    }
    case DType::kF64: {
      double x;
      std::memcpy(&x, t.data(), sizeof x);
      return Value(x);
    }
    case DType::kBool:
      return Value(t.data()[0] != std::byte{0});
    default:
      return std::nullopt;
  }
}

// A State loaded whole (a file format).
class StateSource final : public EntrySource {
 public:
  StateSource(State state, std::string path) : state_(std::move(state)), path_(std::move(path)) {
    values_.metadata() = state_.metadata();
    for (const auto& [name, e] : state_.entries()) {
      if (!e.is_tensor()) {
        values_.PutValue(name, e.value()).IgnoreError();  // names are valid: they are in a State
        continue;
      }
      const TensorView& t = e.tensor();
      if (std::optional<Value> v = ScalarValue(t)) values_.PutValue(name, *v).IgnoreError();
      infos_.push_back({.name = name,
                        .dtype = t.dtype(),
                        .shape = t.shape(),
                        .nbytes = t.nbytes(),
                        .num_shards = 1,
                        .num_chunks = 1,
                        .stored_bytes = t.nbytes()});
    }
  }
  const std::string& path() const override { return path_; }
  const State& values() const override { return values_; }
  const std::vector<TensorInfo>& tensors() const override { return infos_; }
  const TensorInfo* FindTensor(const std::string& name) const override {
    auto it =
        std::lower_bound(infos_.begin(), infos_.end(), name,
                         [](const TensorInfo& t, const std::string& n) { return t.name < n; });
    return it != infos_.end() && it->name == name ? &*it : nullptr;
  }
  Status ReadTensor(const std::string& name, const TensorView& dst) override {
    const TensorView* src = state_.FindTensor(name);
    if (src == nullptr) return NotFoundError(fmt::format("{}: no tensor {:?}", path_, name));
    if (src->dtype() != dst.dtype() || src->shape() != dst.shape()) {
      return InvalidArgumentError(fmt::format(
          "{}: tensor {:?} is {} {}, the target {} {}", path_, name, DTypeName(src->dtype()),
          ShapeToString(src->shape()), DTypeName(dst.dtype()), ShapeToString(dst.shape())));
    }
    if (src->nbytes() > 0) std::memcpy(dst.data(), src->data(), src->nbytes());
    return Status::OK();
  }

 private:
  State state_;
  State values_;  // state_'s values and metadata
  std::string path_;
  std::vector<TensorInfo> infos_;  // name order (State entries are sorted)
};

}  // namespace

std::unique_ptr<EntrySource> SourceOf(std::unique_ptr<CheckpointReader> reader) {
  return std::make_unique<ReaderSource>(std::move(reader));
}

std::unique_ptr<EntrySource> SourceOf(State state, std::string path) {
  return std::make_unique<StateSource>(std::move(state), std::move(path));
}

}  // namespace savepoint::manager
