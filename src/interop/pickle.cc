// The restricted pickle reader (see pickle.h): a stack machine over the allow-listed opcodes that
// builds nodes in an arena and never runs anything.
#include "interop/pickle.h"

#include <fmt/format.h>

#include <bit>
#include <cstring>
#include <unordered_map>

namespace savepoint::interop {

class PickleParser {
 public:
  PickleParser(std::string_view in, const PickleOptions& o, std::string_view what)
      : in_(in), o_(o), what_(what) {
    out_.nodes_.emplace_back();  // node 0: None
  }

  Result<Pickle> Run() {
    if (in_.size() > o_.max_bytes) {
      return InvalidArgumentError(
          fmt::format("{}: {} bytes, above the cap of {}", what_, in_.size(), o_.max_bytes));
    }
    while (true) {
      if (pos_ >= in_.size()) return Bad("ends without STOP");
      op_pos_ = pos_;
      const uint8_t op = static_cast<uint8_t>(in_[pos_++]);
      if (op == '.') break;
      SP_RETURN_IF_ERROR(Step(op));
    }
    if (stack_.size() != 1 || !marks_.empty())
      return Bad("STOP with a stack of other than one value");
    out_.root_ = stack_.back();
    out_.IndexDicts();
    return std::move(out_);
  }

 private:
  using Id = Pickle::Id;
  using Kind = Pickle::Kind;

  Status Bad(std::string_view why) const {
    return CorruptionError(fmt::format("{}: malformed pickle at byte {}: {}", what_, op_pos_, why));
  }

  Status Step(uint8_t op) {
    switch (op) {
      case 0x80:
        return Skip(1);  // PROTO
      case 0x95:
        return Skip(8);  // FRAME
      case '(':
        marks_.push_back(stack_.size());
        return Status::OK();  // MARK
      case 'N':
        return Push(0);  // NONE
      case 0x88:
        return PushInt(Kind::kBool, 1);  // NEWTRUE
      case 0x89:
        return PushInt(Kind::kBool, 0);  // NEWFALSE
      case 'K':
        return PushUnsigned(1);  // BININT1
      case 'M':
        return PushUnsigned(2);  // BININT2
      case 'J':
        return PushBinInt();  // BININT
      case 0x8a:
        return PushLong1();  // LONG1
      case 'G':
        return PushFloat();  // BINFLOAT
      case 0x8c:
        return PushString(Kind::kString, 1);  // SHORT_BINUNICODE
      case 'X':
        return PushString(Kind::kString, 4);  // BINUNICODE
      case 0x8d:
        return PushString(Kind::kString, 8);  // BINUNICODE8
      case 'C':
        return PushString(Kind::kBytes, 1);  // SHORT_BINBYTES
      case 'B':
        return PushString(Kind::kBytes, 4);  // BINBYTES
      case 0x8e:
        return PushString(Kind::kBytes, 8);  // BINBYTES8
      case ')':
        return PushContainer(Kind::kTuple, {});  // EMPTY_TUPLE
      case ']':
        return PushContainer(Kind::kList, {});  // EMPTY_LIST
      case '}':
        return PushContainer(Kind::kDict, {});  // EMPTY_DICT
      case 0x85:
        return TupleN(1);  // TUPLE1
      case 0x86:
        return TupleN(2);  // TUPLE2
      case 0x87:
        return TupleN(3);  // TUPLE3
      case 't':
        return FromMark(Kind::kTuple);  // TUPLE
      case 'l':
        return FromMark(Kind::kList);  // LIST
      case 'd':
        return DictFromMark();  // DICT
      case 'a':
        return Append();  // APPEND
      case 'e':
        return AppendMark();  // APPENDS
      case 's':
        return SetItem();  // SETITEM
      case 'u':
        return SetItemsMark();  // SETITEMS
      case 0x94:
        return Memoize(memo_.size());  // MEMOIZE
      case 'q':
        return PutFromBytes(1);  // BINPUT
      case 'r':
        return PutFromBytes(4);  // LONG_BINPUT
      case 'h':
        return GetFromBytes(1);  // BINGET
      case 'j':
        return GetFromBytes(4);  // LONG_BINGET
      case 'c':
        return TextGlobal();  // GLOBAL
      case 0x93:
        return StackGlobal();  // STACK_GLOBAL
      case 0x81:
        return NewObj();  // NEWOBJ
      case 'R':
        return Reduce();  // REDUCE
      case 'b':
        return Build();  // BUILD
      case 'Q':
        return PersistentId();  // BINPERSID
      default:
        return InvalidArgumentError(fmt::format(
            "{}: pickle opcode 0x{:02x} at byte {} is not allowed (the file is read as untrusted: "
            "only plain data and allow-listed names)",
            what_, op, op_pos_));
    }
  }

  // --- Reading the operands. ---
  Result<std::string_view> Take(uint64_t n) {
    if (n > in_.size() - pos_) return Bad("truncated operand");
    std::string_view s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  Result<uint64_t> Unsigned(int bytes) {
    SP_ASSIGN_OR_RETURN(std::string_view b, Take(bytes));
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<uint8_t>(b[i])} << (8 * i);
    return v;
  }
  Status Skip(uint64_t n) { return Take(n).status(); }

  // --- The stack. ---
  Result<Id> New(Pickle::Node n) {
    if (out_.nodes_.size() >= o_.max_objects) {
      return InvalidArgumentError(
          fmt::format("{}: more than {} objects at byte {}", what_, o_.max_objects, op_pos_));
    }
    out_.nodes_.push_back(std::move(n));
    return static_cast<Id>(out_.nodes_.size() - 1);
  }
  Status Push(Id id) {
    if (stack_.size() >= o_.max_objects) return Bad("stack too deep");
    stack_.push_back(id);
    return Status::OK();
  }
  Status PushNew(Pickle::Node n) {
    SP_ASSIGN_OR_RETURN(Id id, New(std::move(n)));
    return Push(id);
  }
  Result<Id> Pop() {
    if (stack_.size() <= (marks_.empty() ? 0 : marks_.back())) return Bad("stack underflow");
    Id id = stack_.back();
    stack_.pop_back();
    return id;
  }
  // The items above the topmost mark, removing them and the mark.
  Result<std::vector<Id>> PopMark() {
    if (marks_.empty()) return Bad("no MARK");
    const size_t m = marks_.back();
    marks_.pop_back();
    std::vector<Id> items(stack_.begin() + m, stack_.end());
    stack_.resize(m);
    return items;
  }
  Pickle::Node& N(Id id) { return out_.nodes_[id]; }

  // --- Scalars. ---
  Status PushInt(Kind k, int64_t v) { return PushNew({.kind = k, .i = v}); }
  Status PushUnsigned(int bytes) {
    SP_ASSIGN_OR_RETURN(uint64_t v, Unsigned(bytes));
    return PushInt(Kind::kInt, static_cast<int64_t>(v));
  }
  Status PushBinInt() {
    SP_ASSIGN_OR_RETURN(uint64_t v, Unsigned(4));
    return PushInt(Kind::kInt, static_cast<int32_t>(static_cast<uint32_t>(v)));
  }
  Status PushLong1() {
    SP_ASSIGN_OR_RETURN(uint64_t n, Unsigned(1));
    if (n > 8)
      return InvalidArgumentError(
          fmt::format("{}: integer of {} bytes at byte {} (at most 8)", what_, n, op_pos_));
    SP_ASSIGN_OR_RETURN(uint64_t v, Unsigned(static_cast<int>(n)));
    if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);  // sign
    return PushInt(Kind::kInt, static_cast<int64_t>(v));
  }
  Status PushFloat() {
    SP_ASSIGN_OR_RETURN(std::string_view b, Take(8));
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(b[i]);  // big-endian
    return PushNew({.kind = Kind::kFloat, .f = std::bit_cast<double>(v)});
  }
  Status PushString(Kind k, int len_bytes) {
    SP_ASSIGN_OR_RETURN(uint64_t n, Unsigned(len_bytes));
    SP_ASSIGN_OR_RETURN(std::string_view s, Take(n));
    return PushNew({.kind = k, .s = std::string(s)});
  }

  // --- Containers. ---
  Result<uint32_t> DepthOf(const std::vector<Id>& items) {
    uint32_t d = 1;
    for (Id i : items) d = std::max(d, N(i).depth + 1);
    if (d > o_.max_depth) {
      return InvalidArgumentError(fmt::format("{}: containers nested deeper than {} at byte {}",
                                              what_, o_.max_depth, op_pos_));
    }
    return d;
  }
  Status PushContainer(Kind k, std::vector<Id> items) {
    SP_ASSIGN_OR_RETURN(uint32_t d, DepthOf(items));
    return PushNew({.kind = k, .items = std::move(items), .depth = d});
  }
  Status TupleN(int n) {
    std::vector<Id> items(n);
    for (int i = n - 1; i >= 0; --i) {
      SP_ASSIGN_OR_RETURN(items[i], Pop());
    }
    return PushContainer(Kind::kTuple, std::move(items));
  }
  Status FromMark(Kind k) {
    SP_ASSIGN_OR_RETURN(std::vector<Id> items, PopMark());
    return PushContainer(k, std::move(items));
  }
  // Adds `items` to the container `target` (a list, or a dict taking them as key, value pairs).
  Status Extend(Id target, const std::vector<Id>& items, Kind want) {
    if (N(target).kind != want)
      return Bad(want == Kind::kList ? "APPEND to a non-list" : "SETITEM on a non-dict");
    SP_ASSIGN_OR_RETURN(uint32_t d, DepthOf(items));
    N(target).depth = std::max(N(target).depth, d);
    if (want == Kind::kList) {
      N(target).items.insert(N(target).items.end(), items.begin(), items.end());
      return Status::OK();
    }
    if (items.size() % 2 != 0) return Bad("SETITEMS with an odd number of items");
    for (size_t i = 0; i < items.size(); i += 2)
      N(target).dict.emplace_back(items[i], items[i + 1]);
    return Status::OK();
  }
  Status DictFromMark() {
    SP_ASSIGN_OR_RETURN(std::vector<Id> items, PopMark());
    SP_ASSIGN_OR_RETURN(Id d, New({.kind = Kind::kDict}));
    SP_RETURN_IF_ERROR(Extend(d, items, Kind::kDict));
    return Push(d);
  }
  // The container on top of the stack, above the topmost mark (Python keeps marked items apart).
  Result<Id> Top(std::string_view op) {
    if (stack_.size() <= (marks_.empty() ? 0 : marks_.back())) {
      return Bad(fmt::format("{} without a container", op));
    }
    return stack_.back();
  }
  Status Append() {
    SP_ASSIGN_OR_RETURN(Id v, Pop());
    SP_ASSIGN_OR_RETURN(Id list, Top("APPEND"));
    return Extend(list, {v}, Kind::kList);
  }
  Status AppendMark() {
    SP_ASSIGN_OR_RETURN(std::vector<Id> items, PopMark());
    SP_ASSIGN_OR_RETURN(Id list, Top("APPENDS"));
    return Extend(list, items, Kind::kList);
  }
  Status SetItem() {
    SP_ASSIGN_OR_RETURN(Id v, Pop());
    SP_ASSIGN_OR_RETURN(Id k, Pop());
    SP_ASSIGN_OR_RETURN(Id dict, Top("SETITEM"));
    return Extend(dict, {k, v}, Kind::kDict);
  }
  Status SetItemsMark() {
    SP_ASSIGN_OR_RETURN(std::vector<Id> items, PopMark());
    SP_ASSIGN_OR_RETURN(Id dict, Top("SETITEMS"));
    return Extend(dict, items, Kind::kDict);
  }

  // --- The memo. ---
  Status Memoize(uint64_t index) {
    SP_ASSIGN_OR_RETURN(Id top, Top("MEMOIZE"));
    if (memo_.size() >= o_.max_objects) return Bad("memo too large");
    memo_[index] = top;
    return Status::OK();
  }
  Status PutFromBytes(int bytes) {
    SP_ASSIGN_OR_RETURN(uint64_t index, Unsigned(bytes));
    return Memoize(index);
  }
  Status GetFromBytes(int bytes) {
    SP_ASSIGN_OR_RETURN(uint64_t index, Unsigned(bytes));
    auto it = memo_.find(index);
    if (it == memo_.end()) return Bad(fmt::format("memo key {} was never stored", index));
    return Push(it->second);
  }

  // --- Globals and objects: recorded, never run. ---
  Status PushGlobal(std::string module, std::string_view name) {
    std::string full = module + "." + std::string(name);
    if (o_.globals.find(full) == o_.globals.end()) {
      return InvalidArgumentError(fmt::format(
          "{}: refusing global {:?} at byte {}: not one of the names this file type uses (the "
          "pickle is read as untrusted; nothing was executed)",
          what_, full, op_pos_));
    }
    return PushNew({.kind = Kind::kGlobal, .s = std::move(full)});
  }
  Result<std::string_view> Line() {
    size_t end = in_.find('\n', pos_);
    if (end == std::string_view::npos || end - pos_ > 512) return Bad("GLOBAL without a newline");
    std::string_view s = in_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }
  Status TextGlobal() {
    SP_ASSIGN_OR_RETURN(std::string_view module, Line());
    SP_ASSIGN_OR_RETURN(std::string_view name, Line());
    return PushGlobal(std::string(module), name);
  }
  Status StackGlobal() {
    SP_ASSIGN_OR_RETURN(Id name, Pop());
    SP_ASSIGN_OR_RETURN(Id module, Pop());
    if (N(module).kind != Kind::kString || N(name).kind != Kind::kString) {
      return Bad("STACK_GLOBAL of non-strings");
    }
    return PushGlobal(N(module).s, N(name).s);
  }
  // The global node `id` when it has role `role`; else the error naming it.
  Result<std::string> GlobalAs(Id id, GlobalRole role, std::string_view op) {
    if (N(id).kind != Kind::kGlobal) return Bad(fmt::format("{} of something not a global", op));
    if (o_.globals.find(N(id).s)->second.role != role) {
      return InvalidArgumentError(
          fmt::format("{}: refusing {} of {:?} at byte {} (allowed only "
                      "as another role; nothing was executed)",
                      what_, op, N(id).s, op_pos_));
    }
    return N(id).s;
  }
  Status MakeObject(GlobalRole role, std::string_view op) {
    SP_ASSIGN_OR_RETURN(Id args, Pop());
    SP_ASSIGN_OR_RETURN(Id callee, Pop());
    SP_ASSIGN_OR_RETURN(std::string name, GlobalAs(callee, role, op));
    if (N(args).kind != Kind::kTuple) return Bad(fmt::format("{} arguments are not a tuple", op));
    if (name == "collections.OrderedDict" && N(args).items.empty()) {
      return PushNew({.kind = Kind::kDict});  // an empty mapping, filled by SETITEMS
    }
    // The tuple is shared, not copied: a memoized one may be the arguments of every later NEWOBJ
    // or REDUCE. Its depth was checked when it was built.
    return PushNew({.kind = Kind::kObject, .s = name, .args = args, .depth = N(args).depth});
  }
  Status NewObj() { return MakeObject(GlobalRole::kClass, "NEWOBJ"); }
  Status Reduce() { return MakeObject(GlobalRole::kCallable, "REDUCE"); }
  Status Build() {
    SP_ASSIGN_OR_RETURN(Id state, Pop());
    SP_ASSIGN_OR_RETURN(Id target, Top("BUILD"));
    if (N(target).kind != Kind::kObject) return Bad("BUILD of a non-object");
    SP_ASSIGN_OR_RETURN(uint32_t depth, DepthOf({state}));
    N(target).depth = std::max(N(target).depth, depth);
    N(target).state = state;
    return Status::OK();
  }
  Status PersistentId() {
    if (!o_.allow_persistent_id) {
      return InvalidArgumentError(
          fmt::format("{}: persistent id at byte {} is not allowed here", what_, op_pos_));
    }
    SP_ASSIGN_OR_RETURN(Id pid, Pop());
    SP_ASSIGN_OR_RETURN(uint32_t d, DepthOf({pid}));
    return PushNew({.kind = Kind::kPersistent, .items = {pid}, .depth = d});
  }

  std::string_view in_;
  const PickleOptions& o_;
  std::string_view what_;
  size_t pos_ = 0, op_pos_ = 0;
  std::vector<Id> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, Id> memo_;
  Pickle out_;
};

Result<Pickle> Pickle::Parse(std::string_view bytes, const PickleOptions& o,
                             std::string_view what) {
  return PickleParser(bytes, o, what).Run();
}

void Pickle::IndexDicts() {
  for (Id id = 0; id < nodes_.size(); ++id) {
    const Node& d = nodes_[id];
    if (d.kind != Kind::kDict || d.dict.size() < kIndexedDictEntries) continue;
    auto& index = index_[id];
    for (const auto& [k, v] : d.dict) {
      if (nodes_[k].kind == Kind::kString) index.try_emplace(nodes_[k].s, v);  // the first wins
    }
  }
}

const Pickle::Node* Pickle::Get(const Node& dict, std::string_view name) const {
  if (dict.kind != Kind::kDict) return nullptr;
  if (auto index = index_.find(static_cast<Id>(&dict - nodes_.data())); index != index_.end()) {
    auto it = index->second.find(name);
    return it == index->second.end() ? nullptr : &nodes_[it->second];
  }
  for (const auto& [k, v] : dict.dict) {
    if (nodes_[k].kind == Kind::kString && nodes_[k].s == name) return &nodes_[v];
  }
  return nullptr;
}

const Pickle::Node* Pickle::Field(const Node& object, std::string_view name) const {
  if (object.kind != Kind::kObject || object.state == 0) return nullptr;
  const Node& state = nodes_[object.state];
  if (state.kind == Kind::kDict) return Get(state, name);
  if (state.kind == Kind::kTuple && state.items.size() == 2) {  // (dict or None, slots dict)
    for (Id part : state.items) {
      if (const Node* n = Get(nodes_[part], name)) return n;
    }
  }
  return nullptr;
}

}  // namespace savepoint::interop
