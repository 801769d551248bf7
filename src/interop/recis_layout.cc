// ParseRecisSlice, ParseRecisTensorKeys, PlanRecis: the names of a RecIS checkpoint directory
// (savepoint/recis.h) sorted into tables and dense tensors. Block names, as RecIS's SaveBundle
// writes them: a table's blocks `T.S/part_i_n` (RecIS's `T@S` with its first '@' replaced by '.',
// plus the shard), mapped back to `T@S^begin@end@size` by tensorkey.json; a dense tensor `X^ `.
#include "interop/recis_layout.h"

#include <fmt/format.h>

#include <charconv>
#include <set>
#include <utility>
#include <vector>

#include "format/manifest.h"
#include "savepoint/value.h"

namespace savepoint::interop {
namespace {

constexpr std::string_view kPartSep = "/part_";
constexpr std::string_view kDenseSuffix = "^ ";  // RecIS's '^' + its empty slice " "
constexpr int64_t kMaxShards = 65536;

// A non-negative decimal integer filling `s` exactly (no sign, no spaces), below 10^18; -1 when
// `s` is not one.
int64_t ParseCount(std::string_view s) {
  int64_t v = 0;
  if (s.empty() || s.size() > 18) return -1;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < 0) return -1;
  return v;
}

Result<Json> ParseJson(std::string_view text, std::string_view what) {
  SP_RETURN_IF_ERROR(format::CheckJsonDepth(text, format::kMaxJsonDepth, what));
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return CorruptionError(fmt::format("{}: not valid JSON", what));
  if (!j.is_object()) return CorruptionError(fmt::format("{}: not a JSON object", what));
  return j;
}

// A table block's place: table, slot, shard i of n, and the slice when tensorkey.json has it.
struct PartName {
  std::string table, slot;
  int64_t shard = 0, shards = 0;
  bool has_slice = false;
  RecisSlice slice;
};

// `T@S^begin@end@size` (tensorkey.json's value for `block`) into table, slot and slice; it must
// name the same table and slot as the block name's `prefix` (`T.S`).
Status FromTensorKey(std::string_view key, std::string_view prefix, std::string_view block,
                     std::string_view what, PartName* p) {
  const size_t caret = key.find('^');
  const size_t at = key.find('@');
  if (caret == std::string_view::npos || at == std::string_view::npos || at == 0 ||
      at + 1 >= caret) {
    return CorruptionError(
        fmt::format("{}: block {:?} maps to {:?}, not <table>@<slot>^<slice>", what, block, key));
  }
  p->table = std::string(key.substr(0, at));
  p->slot = std::string(key.substr(at + 1, caret - at - 1));
  if (p->table + "." + p->slot != prefix) {
    return CorruptionError(
        fmt::format("{}: block {:?} maps to {:?}, which names another block", what, block, key));
  }
  SP_ASSIGN_OR_RETURN(
      p->slice, ParseRecisSlice(key.substr(caret + 1), fmt::format("{}: block {:?}", what, block)));
  p->has_slice = true;
  return Status::OK();
}

// A table block and its place.
struct TablePart {
  PartName place;
  RecisBlock block;
};

// Parses a table block name `T.S/part_i_n` (already known to contain "/part_").
Result<PartName> ParsePartName(const std::string& block, std::string_view what,
                               const std::map<std::string, std::string>& tensor_keys) {
  const size_t sep = block.rfind(kPartSep);
  const std::string_view prefix = std::string_view(block).substr(0, sep);
  const std::string_view part = std::string_view(block).substr(sep + kPartSep.size());
  const size_t us = part.find('_');
  PartName p;
  const int64_t i = ParseCount(part.substr(0, us));
  const int64_t n = us == std::string_view::npos ? -1 : ParseCount(part.substr(us + 1));
  if (i < 0 || n < 1 || n > kMaxShards || i >= n) {
    return CorruptionError(
        fmt::format("{}: block {:?}: bad shard part {:?} (expected part_<i>_<n>, i < n <= {})",
                    what, block, part, kMaxShards));
  }
  p.shard = i;
  p.shards = n;
  auto key = tensor_keys.find(block);
  if (key != tensor_keys.end()) {
    SP_RETURN_IF_ERROR(FromTensorKey(key->second, prefix, block, what, &p));
    return p;
  }
  const size_t dot = prefix.rfind('.');
  if (dot == std::string_view::npos || dot == 0 || dot + 1 == prefix.size()) {
    return CorruptionError(
        fmt::format("{}: block {:?}: expected <table>.<slot>/part_<i>_<n>", what, block));
  }
  p.table = std::string(prefix.substr(0, dot));
  p.slot = std::string(prefix.substr(dot + 1));
  return p;
}

// file_index: {plain file name: number}, numbers unique. Returns number -> name.
Result<std::map<int64_t, std::string>> ParseFiles(const Json& j, std::string_view what,
                                                  const RecisLoadOptions& o) {
  if (!j.is_object()) return CorruptionError(fmt::format("{}: file_index is not an object", what));
  if (j.size() > o.max_files) {
    return CorruptionError(
        fmt::format("{}: {} files, more than the limit of {}", what, j.size(), o.max_files));
  }
  std::map<int64_t, std::string> files;
  for (const auto& [name, number] : j.items()) {
    if (!IsPlainFileName(name)) {
      return CorruptionError(fmt::format(
          "{}: file_index names {:?}, not a file name in the checkpoint directory", what, name));
    }
    if (!number.is_number_integer() || number.get<int64_t>() < 0) {
      return CorruptionError(fmt::format("{}: file_index[{:?}] is not a file number", what, name));
    }
    if (!files.emplace(number.get<int64_t>(), name).second) {
      return CorruptionError(fmt::format("{}: file number {} is given to {:?} and {:?}", what,
                                         number.get<int64_t>(), files[number.get<int64_t>()],
                                         name));
    }
  }
  return files;
}

Status MissingBlock(std::string_view what, std::string_view table, size_t shard, size_t shards,
                    std::string_view block) {
  return CorruptionError(fmt::format("{}: table {:?}: shard {} of {} has no {} block", what, table,
                                     shard, shards, block));
}

// Every table block is of the same shard count, and every shard of every table has an id block:
// checked before a table's shard records are made, so that those made are no more than the id
// blocks the index names (a few bytes of index could otherwise ask for 65536 records per table).
Status CheckShardCounts(const std::vector<TablePart>& parts, std::string_view what) {
  const int64_t shards = parts.empty() ? 0 : parts[0].place.shards;
  std::map<std::string_view, std::set<int64_t>> ids;  // table -> its shards with an id block
  for (const TablePart& t : parts) {
    if (t.place.shards != shards) {
      return CorruptionError(fmt::format(
          "{}: block {:?} is of {} shards, other table blocks of {} (a directory mixing saves?)",
          what, t.block.name, t.place.shards, shards));
    }
    std::set<int64_t>& have = ids[t.place.table];
    if (t.place.slot == kRecisIdSlot) have.insert(t.place.shard);
  }
  for (const auto& [table, have] : ids) {
    int64_t first_missing = 0;  // `have` is sorted, unique and within [0, shards)
    for (auto it = have.begin(); it != have.end() && *it == first_missing; ++it) ++first_missing;
    if (first_missing < shards) {
      return MissingBlock(what, table, static_cast<size_t>(first_missing),
                          static_cast<size_t>(shards), "id");
    }
  }
  return Status::OK();
}

// Adds a table block (its shard count checked by CheckShardCounts) to the plan.
Status AddPart(RecisPlan* plan, TablePart part, std::string_view what) {
  const PartName& p = part.place;
  RecisBlock& block = part.block;
  plan->shard_num = static_cast<int>(p.shards);
  RecisTablePlan& t = plan->tables[p.table];
  t.shards.resize(static_cast<size_t>(p.shards));
  RecisShardBlocks& s = t.shards[static_cast<size_t>(p.shard)];
  if (p.has_slice) {
    if (s.has_slice && (s.slice.begin != p.slice.begin || s.slice.end != p.slice.end ||
                        s.slice.size != p.slice.size)) {
      return CorruptionError(fmt::format(
          "{}: block {:?}: slice range differs from the other blocks of table {:?} shard {}", what,
          block.name, p.table, p.shard));
    }
    s.has_slice = true;
    s.slice = p.slice;
  }
  const std::string dup = fmt::format("{}: table {:?} shard {} has two {} blocks ({:?})", what,
                                      p.table, p.shard, p.slot, block.name);
  if (p.slot == kRecisIdSlot) {
    if (s.has_ids) return CorruptionError(dup);
    s.has_ids = true;
    s.ids = std::move(block);
    return Status::OK();
  }
  if (!s.slots.emplace(p.slot, std::move(block)).second) return CorruptionError(dup);
  return Status::OK();
}

// Every table has every shard, each with its id block and the same slots as shard 0.
Status CheckTables(const RecisPlan& plan, std::string_view what) {
  for (const auto& [name, t] : plan.tables) {
    const auto missing = [&](size_t i, std::string_view block) {
      return MissingBlock(what, name, i, t.shards.size(), block);
    };
    for (size_t i = 0; i < t.shards.size(); ++i) {
      const RecisShardBlocks& s = t.shards[i];
      if (!s.has_ids) return missing(i, "id");
      if (s.slots.empty()) return missing(i, "slot");
      for (const auto& [slot, b] : t.shards[0].slots) {
        if (s.slots.count(slot) == 0) return missing(i, fmt::format("{:?}", slot));
      }
      for (const auto& [slot, b] : s.slots) {
        if (t.shards[0].slots.count(slot) == 0) return missing(0, fmt::format("{:?}", slot));
      }
    }
  }
  return Status::OK();
}

// A dense block into `plan`, a table block (parsed) into `parts`.
Status SortBlock(RecisBlock block, std::string_view what,
                 const std::map<std::string, std::string>& tensor_keys, RecisPlan* plan,
                 std::vector<TablePart>* parts) {
  const std::string& name = block.name;
  if (name.size() > kDenseSuffix.size() && name.ends_with(kDenseSuffix)) {
    std::string tensor = name.substr(0, name.size() - kDenseSuffix.size());
    plan->dense.emplace(std::move(tensor), std::move(block));
    return Status::OK();
  }
  if (name.find(kPartSep) == std::string::npos) {
    return CorruptionError(fmt::format(
        "{}: block {:?}: not a RecIS block name (<table>.<slot>/part_<i>_<n> or <tensor>^ )", what,
        name));
  }
  SP_ASSIGN_OR_RETURN(PartName p, ParsePartName(name, what, tensor_keys));
  parts->push_back({std::move(p), std::move(block)});
  return Status::OK();
}

}  // namespace

bool IsPlainFileName(std::string_view name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find_first_of(std::string_view("/\\\0", 3)) == std::string_view::npos;
}

Result<RecisSlice> ParseRecisSlice(std::string_view text, std::string_view what) {
  const size_t a = text.find('@');
  const size_t b = a == std::string_view::npos ? a : text.find('@', a + 1);
  int64_t begin = -1, end = -1, size = -1;
  if (b != std::string_view::npos) {
    begin = ParseCount(text.substr(0, a));
    end = ParseCount(text.substr(a + 1, b - a - 1));
    size = ParseCount(text.substr(b + 1));
  }
  if (begin < 0 || end < 0 || size < 0 || begin >= end || end > size) {
    return CorruptionError(fmt::format(
        "{}: bad slice {:?} (expected begin@end@size, begin < end <= size)", what, text));
  }
  return RecisSlice{begin, end, size};
}

Result<std::map<std::string, std::string>> ParseRecisTensorKeys(std::string_view json,
                                                                std::string_view what,
                                                                const RecisLoadOptions& o) {
  SP_ASSIGN_OR_RETURN(Json j, ParseJson(json, what));
  if (j.size() > o.max_blocks) {
    return CorruptionError(fmt::format("{}: more than {} entries", what, o.max_blocks));
  }
  std::map<std::string, std::string> keys;
  for (const auto& [part, key] : j.items()) {
    if (!key.is_string()) {
      return CorruptionError(fmt::format("{}: the value of {:?} is not a string", what, part));
    }
    keys.emplace(part, key.get<std::string>());
  }
  return keys;
}

Result<RecisPlan> PlanRecis(std::string_view index_json, std::string_view what,
                            const std::map<std::string, std::string>& tensor_keys,
                            const RecisLoadOptions& o) {
  SP_ASSIGN_OR_RETURN(Json j, ParseJson(index_json, what));
  if (!j.contains("file_index") || !j.contains("block_index") || !j["block_index"].is_object()) {
    return CorruptionError(
        fmt::format("{}: not a RecIS index (no file_index and block_index objects)", what));
  }
  SP_ASSIGN_OR_RETURN(auto files, ParseFiles(j["file_index"], what, o));
  const Json& blocks = j["block_index"];
  if (blocks.size() > o.max_blocks) {
    return CorruptionError(
        fmt::format("{}: {} blocks, more than the limit of {}", what, blocks.size(), o.max_blocks));
  }
  RecisPlan plan;
  std::set<std::string> used;
  std::vector<TablePart> parts;  // added to `plan` once their shard counts are checked
  for (const auto& [name, number] : blocks.items()) {
    auto file = number.is_number_integer() ? files.find(number.get<int64_t>()) : files.end();
    if (file == files.end()) {
      return CorruptionError(fmt::format("{}: block {:?}: file number {} is not in file_index",
                                         what, name, number.dump()));
    }
    used.insert(file->second);
    SP_RETURN_IF_ERROR(SortBlock({name, file->second}, what, tensor_keys, &plan, &parts));
  }
  SP_RETURN_IF_ERROR(CheckShardCounts(parts, what));
  for (TablePart& part : parts) SP_RETURN_IF_ERROR(AddPart(&plan, std::move(part), what));
  SP_RETURN_IF_ERROR(CheckTables(plan, what));
  plan.files.assign(used.begin(), used.end());
  return plan;
}

}  // namespace savepoint::interop
