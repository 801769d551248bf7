// A restricted reader of Python pickles (protocols 2-5), for files we must read but cannot trust:
// torch.distributed.checkpoint's `.metadata` and the `data.pkl` inside torch.save archives.
//
// Nothing is ever executed. The reader interprets the opcodes that build plain data (None, bools,
// ints up to 64 bits, floats, str, bytes, tuples, lists, dicts, the memo) and records, instead of
// performing them, the few object-building steps such files use:
//   GLOBAL / STACK_GLOBAL  a global name; refused unless the caller's allow-list has it
//   NEWOBJ                 an instance of an allow-listed class (kClass): an Object node
//   REDUCE                 a call of an allow-listed callable (kCallable): an Object node holding
//                          the callable's name and its arguments, never called
//   BUILD                  the state set on an Object node
//   BINPERSID              a persistent id (only when allowed): a Persistent node
// An Object node refers to its argument tuple instead of copying it, so a memoized tuple used by
// any number of NEWOBJ / REDUCE opcodes is stored once (memory stays linear in the input).
// Any other opcode, any global outside the allow-list (os.system, builtins.eval, ...), a REDUCE or
// NEWOBJ of a global in another role, malformed or truncated input: an error naming the opcode or
// global and its byte offset. Caps: input size, objects, container depth.
//
// The values live in an arena (a vector of nodes referring to each other by index), so a hostile
// pickle can build neither a cycle that leaks nor a chain whose destruction recurses.
#ifndef SAVEPOINT_INTEROP_PICKLE_H_
#define SAVEPOINT_INTEROP_PICKLE_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "savepoint/status.h"

namespace savepoint::interop {

struct PickleOptions {
  // What an allow-listed global may be used for.
  enum class Role {
    kConstant,  // stands for itself as a value (e.g. torch.float32)
    kClass,     // may be instantiated by NEWOBJ
    kCallable,  // may be "called" by REDUCE (recorded, never called)
  };
  // The map's value: a class, not the bare enum, so that the std::map instances over it are
  // hidden like the rest of src/ (GCC does not let an enum argument hide a template instance,
  // and libsavepoint would export them).
  struct Use {
    Use(Role r) : role(r) {}  // NOLINT(google-explicit-constructor): {"name", Role::kClass}
    Role role;
  };
  // "module.name" -> role. Everything else is refused.
  std::map<std::string, Use, std::less<>> globals = {};
  bool allow_persistent_id = false;
  uint64_t max_bytes = uint64_t{256} << 20;  // Default: 256 MiB
  uint32_t max_objects = 1u << 24;           // nodes created. Default: 16 M
  uint32_t max_depth = 64;                   // container nesting. Default: 64
};
using GlobalRole = PickleOptions::Role;

// Heterogeneous lookup of std::string keys by std::string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

class Pickle {
 public:
  using Id = uint32_t;
  enum class Kind {
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kBytes,
    kTuple,
    kList,
    kDict,
    kGlobal,
    kObject,
    kPersistent
  };
  struct Node {
    Kind kind = Kind::kNone;
    int64_t i = 0;  // kBool, kInt
    double f = 0;   // kFloat
    // kString, kBytes: the value; kGlobal: "module.name"; kObject: its class or callable.
    std::string s = {};
    // kTuple, kList: the items; kPersistent: the id.
    std::vector<Id> items = {};
    std::vector<std::pair<Id, Id>> dict = {};  // kDict: entries in insertion order
    Id args = 0;         // kObject: the tuple of the constructor's or callable's arguments (shared)
    Id state = 0;        // kObject: the BUILD state (0 = none: node 0 is None)
    uint32_t depth = 1;  // container nesting below and including this node
  };

  // Parses `bytes` (named `what` in errors).
  static Result<Pickle> Parse(std::string_view bytes, const PickleOptions& o,
                              std::string_view what);

  const Node& root() const { return nodes_[root_]; }
  const Node& at(Id id) const { return nodes_[id]; }
  // The arguments of an Object (the items of its argument tuple); empty for any other node.
  const std::vector<Id>& Args(const Node& object) const { return nodes_[object.args].items; }

  // Field `name` of an Object: looked up in its BUILD state when that is a dict, or a
  // (dict, slots dict) pair; nullptr when absent.
  const Node* Field(const Node& object, std::string_view name) const;
  // Value of key `name` (a string) of a dict (a node of this Pickle); nullptr when absent. The
  // first entry of that key wins. Constant time for dicts of kIndexedDictEntries entries or more
  // (so that lookups repeated through the memo cost linear time), linear below.
  const Node* Get(const Node& dict, std::string_view name) const;

  static constexpr size_t kIndexedDictEntries = 16;

 private:
  friend class PickleParser;
  // Builds index_ once the parse is complete.
  void IndexDicts();

  std::vector<Node> nodes_;  // nodes_[0] is None
  Id root_ = 0;
  // For each dict of kIndexedDictEntries entries or more: its string keys -> the first value.
  std::unordered_map<Id, std::unordered_map<std::string, Id, StringHash, std::equal_to<>>> index_;
};

}  // namespace savepoint::interop

#endif  // SAVEPOINT_INTEROP_PICKLE_H_
