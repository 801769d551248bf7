// Fuzz target for the MindSpore strategy-file parser (src/mindspore_strategy/), protobuf and JSON:
// strategy files come with checkpoints from anywhere. Any input must give OK or a clean error: no
// crash, no sanitizer report, no huge allocation or loop. A file that parses is resolved (layout
// checks), every resolved layout is cut for its first and last rank on a made-up shape, and the
// file is written back in both forms, which must parse again to the same strategy and encode to
// the same bytes (CheckRoundTrip).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>

#include "savepoint/mindspore_strategy.h"

namespace {

using namespace savepoint;

// Exact round trips: in each format that can hold the strategy (CheckMindSporeStrategyEncodable;
// WriteMindSporeStrategy refuses the others), its bytes parse back to the same strategy (the same
// protobuf bytes) and encode to the same bytes again.
// MindSpore's JSON keys layouts and node strategies by name (a later one replaces an earlier
// one), so a strategy that names one twice (merged pipeline files repeat node names) has only its
// protobuf form exactly.
bool NamesRepeat(const MindSporeStrategy& s) {
  std::set<std::string> nodes, params;
  for (const MindSporeNodeStrategy& n : s.nodes) {
    if (!nodes.insert(n.node_name).second) return true;
  }
  for (const auto& [name, l] : s.layouts) {
    if (!params.insert(name).second) return true;
  }
  return false;
}

void CheckRoundTrip(const MindSporeStrategy& s) {
  const std::string pb = EncodeMindSporeStrategy(s, MindSporeStrategyFormat::kProtobuf);
  for (auto f : {MindSporeStrategyFormat::kProtobuf, MindSporeStrategyFormat::kJson}) {
    if (!CheckMindSporeStrategyEncodable(s, f).ok()) continue;
    if (f == MindSporeStrategyFormat::kJson && NamesRepeat(s)) continue;
    const std::string once = EncodeMindSporeStrategy(s, f);
    Result<MindSporeStrategy> back = ParseMindSporeStrategy(once, "back");
    if (!back.ok()) {
      if (s.layouts.empty()) continue;  // (a file of strategies only: nothing to compare)
      std::abort();
    }
    if (EncodeMindSporeStrategy(*back, f) != once) std::abort();
    if (CheckMindSporeStrategyEncodable(*back, MindSporeStrategyFormat::kProtobuf).ok() &&
        EncodeMindSporeStrategy(*back, MindSporeStrategyFormat::kProtobuf) != pb) {
      std::abort();
    }
  }
}

void CutLayouts(const MindSporeLayoutMap& m) {
  for (const auto& [name, p] : m.params) {
    Shape slice(p.layout.tensor_map.size(), 2);
    Result<Shape> global = MindSporeGlobalShape(p.layout, slice);
    if (!global.ok()) continue;
    for (int64_t r : {int64_t{0}, m.stage_devices - 1}) {
      MindSporeShard(p.layout, *global, r, name).status().IgnoreError();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  Result<MindSporeStrategy> s = ParseMindSporeStrategy(input, "in");
  if (!s.ok()) return 0;
  CheckRoundTrip(*s);
  Result<MindSporeLayoutMap> m = ResolveMindSporeStrategy(*s, "in");
  if (m.ok() && m->stage_devices <= 4096) CutLayouts(*m);
  return 0;
}
