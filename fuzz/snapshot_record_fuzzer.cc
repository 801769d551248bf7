// Fuzz target for shared-memory snapshots' own records (src/failover/rpc/snapshot.h), which the
// failover controller reads from a memory-backed directory other processes of the host write:
// the name of a snapshot directory (first line of the input) and the "failover.snapshot" record
// kept in its metadata (the rest: JSON).
// Properties (std::abort on violation): no crash or sanitizer report; a name that parses is the
// name SnapshotWriter gives that step ("step_{n}_{epoch}_{step_in_epoch}"); a record that
// decodes re-encodes, decodes to the same record and re-encodes to the same bytes.
#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "failover/rpc/snapshot.h"
#include "format/manifest.h"

namespace {

using namespace savepoint;

bool Same(const failover::SnapshotRecord& a, const failover::SnapshotRecord& b) {
  if (a.rank != b.rank || a.world != b.world || a.layout.size() != b.layout.size()) return false;
  for (const auto& [name, s] : a.layout) {
    auto it = b.layout.find(name);
    if (it == b.layout.end()) return false;
    const ShardSpec& t = it->second;
    if (s.global_shape != t.global_shape || s.offsets != t.offsets || s.sizes != t.sizes ||
        s.replicas != t.replicas || s.tensor != t.tensor) {
      return false;
    }
  }
  return true;
}

void CheckName(std::string_view name) {
  failover::StepInfo at;
  if (!failover::ParseSnapshotName(name, &at)) return;
  if (fmt::format("step_{}_{}_{}", at.step, at.epoch, at.step_in_epoch) != name) std::abort();
}

void CheckRecord(std::string_view text) {
  if (!format::CheckJsonDepth(text, 64, "record").ok()) return;
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return;
  Result<failover::SnapshotRecord> record = failover::ParseSnapshotRecord(j, "fuzz");
  if (!record.ok()) return;
  const std::string once = failover::SnapshotRecordToJson(*record).dump();
  Result<failover::SnapshotRecord> back =
      failover::ParseSnapshotRecord(Json::parse(once), "fuzz (written back)");
  if (!back.ok() || !Same(*record, *back)) std::abort();
  if (failover::SnapshotRecordToJson(*back).dump() != once) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nl = input.find('\n');
  CheckName(input.substr(0, nl));
  if (nl != std::string_view::npos) CheckRecord(input.substr(nl + 1));
  return 0;
}
