// Stateful: an object that can hand its state to a CheckpointManager and take it back.
//
// A training program registers its model, optimizer, data loader, RNG, counters ... with a
// CheckpointManager under a name and a category (manager.h). On every save the manager asks each
// object for its state; on restore it gives each object back the entries it saved, which lets a
// resumed run continue bit for bit (same weights, same optimizer moments, same next batch, same
// random numbers).
//
// Thread safety: the manager calls an object's methods from the thread that calls the manager
// (never concurrently for one manager). An object registered with several managers must be
// safe for that itself.
#ifndef SAVEPOINT_STATEFUL_H_
#define SAVEPOINT_STATEFUL_H_

#include <optional>
#include <random>
#include <string>
#include <string_view>

#include "savepoint/export.h"
#include "savepoint/state.h"
#include "savepoint/status.h"

namespace savepoint {

// What a registered object holds. Loading can include or exclude categories (LoadConfig).
// Stable names (written into checkpoints; never rename): "dense", "sparse", "extra", "optimizer",
// "io_state".
enum class Category {
  kDense,      // dense model parameters
  kSparse,     // sparse parameters (embedding tables)
  kExtra,      // anything else: counters, RNG state, schedules
  kOptimizer,  // optimizer state (moments, step counts)
  kIoState,    // data-loader position, one per shard
};

SAVEPOINT_API std::string_view CategoryName(Category category);
// Parses a CategoryName. InvalidArgument naming the text otherwise.
SAVEPOINT_API Result<Category> ParseCategory(std::string_view name);

class SAVEPOINT_API Stateful {
 public:
  virtual ~Stateful() = default;

  // Adds this object's state to `out` under names relative to the object ("weight", "m.0", ...;
  // the manager prefixes them with "<registered name>."). Tensors may be borrowed views of the
  // object's own memory: the manager copies or writes them out before the call that asked for them
  // returns, and the object must not change that memory until then.
  virtual Status SaveState(State& out) = 0;

  // Takes back a state in the layout SaveState produces. For restoring, the manager first calls
  // SaveState to learn the layout, then reads every tensor straight into the memory SaveState
  // gave: tensors exposed as borrowed views are therefore already filled in place when this is
  // called; tensors handed over as owned Tensors were read into those Tensors, and `in` holds
  // views of them (valid during this call only: copy what you keep). `in` also holds every value.
  // With lenient matching (LoadConfig), entries the checkpoint lacks are absent from `in`.
  virtual Status LoadState(const State& in) = 0;
};

// A Stateful for a std::mt19937_64 (not owned; must outlive the registration). Its state is one
// string value "engine" holding the engine's textual state (operator<<), so a restored engine
// produces exactly the numbers the saved one would have produced next.
class SAVEPOINT_API Mt19937Stateful final : public Stateful {
 public:
  explicit Mt19937Stateful(std::mt19937_64* engine) : engine_(engine) {}
  Status SaveState(State& out) override;
  Status LoadState(const State& in) override;

 private:
  std::mt19937_64* engine_;
};

}  // namespace savepoint

#endif  // SAVEPOINT_STATEFUL_H_
