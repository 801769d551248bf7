// Fuzz target for what the checkpoint manager reads from a checkpoint's user metadata
// (src/manager/): its record under "savepoint.manager" (index.h, ApplyRecordMeta: step, epoch, step
// in epoch, metrics, flags), from which a record missing from the index is rebuilt, and the objects
// it lists (registry.h, SavedShards: each object's shard count), which a load reads. Checkpoints
// are written by whoever can write the directory or bucket. The input is the whole metadata JSON.
// Any input must give OK or a clean error: no crash, no sanitizer report. A record that applies is
// written again (RecordMeta) and applies to the same record, written the same; a shard count that
// reads is an integer.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "manager/index.h"
#include "manager/options.h"
#include "manager/registry.h"

namespace {

using namespace savepoint;

void CheckRecord(const Json& meta) {
  CheckpointRecord record;
  if (!manager::ApplyRecordMeta(meta, &record).ok()) return;
  const Json written = manager::RecordMeta(record);
  CheckpointRecord back;
  if (!manager::ApplyRecordMeta(written, &back).ok()) std::abort();
  if (manager::RecordMeta(back) != written) std::abort();
}

void CheckShards(const Json& meta) {
  std::vector<std::string> names = {"model", ""};
  const Json* objects = nullptr;
  if (meta.is_object() && meta.contains(manager::kMetaKey) && meta[manager::kMetaKey].is_object() &&
      meta[manager::kMetaKey].contains("objects")) {
    objects = &meta[manager::kMetaKey]["objects"];
  }
  if (objects != nullptr && objects->is_object()) {
    for (const auto& [name, unused] : objects->items()) names.push_back(name);
  }
  for (const std::string& name : names) {
    Result<const Json*> n = manager::SavedShards(meta, name, "fuzz");
    if (n.ok() && *n != nullptr && !(*n)->is_number_integer()) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1 << 20)) return 0;
  const Json meta = Json::parse(std::string_view(reinterpret_cast<const char*>(data), size),
                                nullptr, /*allow_exceptions=*/false);
  if (meta.is_discarded()) return 0;
  if (meta.is_object() && meta.contains(manager::kMetaKey)) CheckRecord(meta[manager::kMetaKey]);
  CheckRecord(meta);
  CheckShards(meta);
  return 0;
}
