// Internal: the registered Stateful objects of a manager; gathering their state into one State
// and loading a checkpoint back into them under a LoadConfig.
//
// Entry names: an object registered as "model" saves its entry "w" as "model.w"; an io_state
// object "loader" of shard k as "loader.shard-<k>.w". The checkpoint's metadata lists the objects
// (kMetaKey/"objects": name -> {"category", "num_shards"}).
#ifndef SAVEPOINT_MANAGER_REGISTRY_H_
#define SAVEPOINT_MANAGER_REGISTRY_H_

#include <map>
#include <string>
#include <vector>

#include "savepoint/checkpoint.h"
#include "savepoint/manager.h"
#include "savepoint/stateful.h"

namespace savepoint::manager {

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
  // Loads `reader`'s checkpoint into the objects. Checks everything (strictness, dtypes, shapes,
  // shard count) before writing into any object.
  Status Load(CheckpointReader& reader, const LoadConfig& config) const;

 private:
  struct Object {
    Stateful* object;
    Category category;
  };
  struct Plan;
  // "model." or "loader.shard-0.".
  std::string EntryPrefix(const std::string& name, Category category) const;
  Result<Plan> PlanObject(CheckpointReader& reader, const LoadConfig& config,
                          const std::string& name, const Object& o) const;

  int shard_id_;
  int num_shards_;
  std::map<std::string, Object> objects_;
};

// Which categories a LoadConfig selects. InvalidArgument naming an unknown category.
Result<std::vector<bool>> SelectedCategories(const LoadConfig& config);

}  // namespace savepoint::manager

#endif  // SAVEPOINT_MANAGER_REGISTRY_H_
