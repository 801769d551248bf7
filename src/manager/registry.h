// Internal: the registered Stateful objects of a manager; gathering their state into one State
// and loading a checkpoint back into them under a LoadConfig.
//
// Entry names: an object registered as "model" saves its entry "w" as "model.w"; an io_state
// object "loader" of shard k as "loader.shard-<k>.w". The checkpoint's metadata lists the objects
// (kMetaKey/"objects": name -> {"category", "num_shards"}).
#ifndef SAVEPOINT_MANAGER_REGISTRY_H_
#define SAVEPOINT_MANAGER_REGISTRY_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "savepoint/checkpoint.h"
#include "savepoint/manager.h"
#include "savepoint/stateful.h"

namespace savepoint::manager {

// The shard count the checkpoint metadata `meta` records for the object `name` (Gather's
// kMetaKey/"objects"/name/"num_shards"), an integer: nullptr when the checkpoint is not a manager
// checkpoint (no kMetaKey object, as for the index) or has no count for the object; Corruption
// naming `where` and the member when the manager's record has a member of the wrong type. `meta`
// comes from a checkpoint file: untrusted (fuzz/manager_meta_fuzzer.cc).
Result<const Json*> SavedShards(const Json& meta, const std::string& name,
                                const std::string& where);

// What Registry::Load reads: an engine checkpoint (SourceOf(reader)) or a State loaded whole from
// a file format (SourceOf(state, path)). Entries are looked up by full name.
class EntrySource {
 public:
  virtual ~EntrySource() = default;
  virtual const std::string& path() const = 0;
  // Non-tensor values and the State's metadata.
  virtual const State& values() const = 0;
  // Tensors in name order (name, dtype and shape filled in).
  virtual const std::vector<TensorInfo>& tensors() const = 0;
  virtual const TensorInfo* FindTensor(const std::string& name) const = 0;
  // Reads one tensor into `dst`, which must match its dtype and shape.
  virtual Status ReadTensor(const std::string& name, const TensorView& dst) = 0;
};

std::unique_ptr<EntrySource> SourceOf(std::unique_ptr<CheckpointReader> reader);
std::unique_ptr<EntrySource> SourceOf(State state, std::string path);

// A gathered state: `state` borrows tensors from `parts`, so keep both until the save is done.
struct Gathered {
  State state;
  std::vector<State> parts;
};

class Registry {
 public:
  Registry(int shard_id, int num_shards) : shard_id_(shard_id), num_shards_(num_shards) {}

  Status Add(const std::string& name, Stateful* object, Category category);
  Status Remove(const std::string& name);
  bool empty() const { return objects_.empty(); }

  // Asks every object for its state.
  Result<Gathered> Gather() const;
  // Loads `source`'s checkpoint into the objects. Checks everything (strictness, dtypes, shapes,
  // shard count) before writing into any object.
  Status Load(EntrySource& source, const LoadConfig& config) const;

 private:
  struct Object {
    Stateful* object;
    Category category;
  };
  struct Plan;
  // "model." or "loader.shard-0.".
  std::string EntryPrefix(const std::string& name, Category category) const;
  Result<Plan> PlanObject(EntrySource& reader, const LoadConfig& config, const std::string& name,
                          const Object& o) const;

  int shard_id_;
  int num_shards_;
  std::map<std::string, Object> objects_;
};

// Which categories a LoadConfig selects. InvalidArgument naming an unknown category.
Result<std::vector<bool>> SelectedCategories(const LoadConfig& config);

}  // namespace savepoint::manager

#endif  // SAVEPOINT_MANAGER_REGISTRY_H_
