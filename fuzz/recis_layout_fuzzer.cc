// Fuzz target for the RecIS checkpoint layout parser (src/interop/recis_layout.h, the layout in
// savepoint/recis.h): the untrusted `index` JSON, `tensorkey.json`, the block names and their
// `begin@end@size` slice strings, sorted into a plan (no I/O). The input is the index text, then
// optionally a NUL byte and the tensorkey.json text (no NUL: the directory has no tensorkey.json).
// Any input must give OK or a clean error: no crash, no sanitizer report, no huge allocation. A
// plan that is returned must keep the header's promises (abort otherwise): its files are plain
// names, sorted and unique, and hold every block; every block of the index is in it once; each
// table has shard_num shards, each with its id block and shard 0's slots; shard counts and slices
// are in range; counts within the caps. It is parsed again under tight caps, which may only refuse
// it or give the same plan.
#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>

#include "format/manifest.h"
#include "interop/recis_layout.h"
#include "savepoint/recis.h"

namespace {

using namespace savepoint;
using interop::RecisBlock;
using interop::RecisPlan;
using interop::RecisSlice;

void Check(bool ok) {
  if (!ok) std::abort();
}

void CheckSlice(const RecisSlice& s) { Check(0 <= s.begin && s.begin < s.end && s.end <= s.size); }

// A block of the plan: a name, and a file the plan lists.
void CheckBlock(const RecisPlan& plan, const RecisBlock& b) {
  Check(!b.name.empty());
  Check(interop::IsPlainFileName(b.file));
  Check(std::binary_search(plan.files.begin(), plan.files.end(), b.file));
}

// `name` ends with "/part_<shard>_<shards>" (the numbers maybe zero-padded).
void CheckPartName(const std::string& name, int64_t shard, int64_t shards) {
  const size_t sep = name.rfind("/part_");
  Check(sep != std::string::npos);
  const std::string_view part = std::string_view(name).substr(sep + 6);
  const size_t us = part.find('_');
  Check(us != std::string_view::npos);
  int64_t i = -1, n = -1;
  auto [e1, c1] = std::from_chars(part.data(), part.data() + us, i);
  auto [e2, c2] = std::from_chars(part.data() + us + 1, part.data() + part.size(), n);
  Check(c1 == std::errc() && e1 == part.data() + us && i == shard);
  Check(c2 == std::errc() && e2 == part.data() + part.size() && n == shards);
}

// The invariants of an accepted plan, under the caps `o`; returns its number of blocks.
uint64_t CheckPlan(const RecisPlan& plan, const RecisLoadOptions& o) {
  Check(plan.files.size() <= o.max_files);
  for (size_t i = 0; i < plan.files.size(); ++i) {
    const std::string& f = plan.files[i];
    Check(interop::IsPlainFileName(f));
    Check(!f.empty() && f != "." && f != ".." && f.find('/') == std::string::npos &&
          f.find('\\') == std::string::npos && f.find('\0') == std::string::npos);
    if (i > 0) Check(plan.files[i - 1] < f);
  }
  uint64_t blocks = 0;
  for (const auto& [name, b] : plan.dense) {
    CheckBlock(plan, b);
    Check(!name.empty() && b.name == name + "^ ");
    ++blocks;
  }
  Check(plan.tables.empty() == (plan.shard_num == 0));
  Check(plan.shard_num >= 0 && plan.shard_num <= 65536);
  for (const auto& [name, t] : plan.tables) {
    Check(!name.empty());
    Check(t.shards.size() == static_cast<size_t>(plan.shard_num));
    for (size_t i = 0; i < t.shards.size(); ++i) {
      const interop::RecisShardBlocks& s = t.shards[i];
      Check(s.has_ids && !s.slots.empty() && s.slots.size() == t.shards[0].slots.size());
      if (s.has_slice) CheckSlice(s.slice);
      CheckBlock(plan, s.ids);
      CheckPartName(s.ids.name, static_cast<int64_t>(i), plan.shard_num);
      ++blocks;
      for (const auto& [slot, b] : s.slots) {
        Check(!slot.empty() && slot != interop::kRecisIdSlot && t.shards[0].slots.count(slot));
        CheckBlock(plan, b);
        CheckPartName(b.name, static_cast<int64_t>(i), plan.shard_num);
        ++blocks;
      }
    }
  }
  Check(blocks <= o.max_blocks);
  return blocks;
}

// Same files, tables (shards, block names and files, slices) and dense blocks.
bool SamePlan(const RecisPlan& a, const RecisPlan& b) {
  const auto same_block = [](const RecisBlock& x, const RecisBlock& y) {
    return x.name == y.name && x.file == y.file;
  };
  if (a.files != b.files || a.shard_num != b.shard_num || a.tables.size() != b.tables.size() ||
      a.dense.size() != b.dense.size()) {
    return false;
  }
  for (const auto& [name, x] : a.dense) {
    auto y = b.dense.find(name);
    if (y == b.dense.end() || !same_block(x, y->second)) return false;
  }
  for (const auto& [name, x] : a.tables) {
    auto y = b.tables.find(name);
    if (y == b.tables.end() || x.shards.size() != y->second.shards.size()) return false;
    for (size_t i = 0; i < x.shards.size(); ++i) {
      const interop::RecisShardBlocks& s = x.shards[i];
      const interop::RecisShardBlocks& t = y->second.shards[i];
      if (!same_block(s.ids, t.ids) || s.slots.size() != t.slots.size() ||
          s.has_slice != t.has_slice || s.slice.begin != t.slice.begin ||
          s.slice.end != t.slice.end || s.slice.size != t.slice.size) {
        return false;
      }
      for (const auto& [slot, b] : s.slots) {
        auto c = t.slots.find(slot);
        if (c == t.slots.end() || !same_block(b, c->second)) return false;
      }
    }
  }
  return true;
}

// The number of entries of the index's block_index (which the plan holds, each once).
size_t IndexBlocks(std::string_view index) {
  Json j = Json::parse(index, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("block_index")) std::abort();
  return j["block_index"].size();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1 << 20)) return 0;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string_view index = input.substr(0, nul);
  const RecisLoadOptions o;
  std::map<std::string, std::string> keys;
  if (nul != std::string_view::npos) {
    Result<std::map<std::string, std::string>> parsed =
        interop::ParseRecisTensorKeys(input.substr(nul + 1), "tensorkey.json", o);
    if (!parsed.ok()) return 0;
    keys = std::move(*parsed);
    Check(keys.size() <= o.max_blocks);
    // Every value's slice, as PlanRecis would take it.
    for (const auto& [part, key] : keys) {
      const size_t caret = key.find('^');
      if (caret == std::string::npos) continue;
      Result<RecisSlice> s = interop::ParseRecisSlice(std::string_view(key).substr(caret + 1), "k");
      if (s.ok()) CheckSlice(*s);
    }
  }
  Result<RecisPlan> plan = interop::PlanRecis(index, "index", keys, o);
  if (!plan.ok()) return 0;
  Check(CheckPlan(*plan, o) == IndexBlocks(index));
  RecisLoadOptions tight;
  tight.max_files = 2;
  tight.max_blocks = 6;
  Result<RecisPlan> small = interop::PlanRecis(index, "index", keys, tight);
  if (small.ok()) {
    CheckPlan(*small, tight);
    Check(SamePlan(*plan, *small));
  }
  return 0;
}
