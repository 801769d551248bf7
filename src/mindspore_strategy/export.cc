// ExportMindSporeDistributed (savepoint/mindspore_strategy.h): a native (typically distributed)
// checkpoint written as a MindSpore job's rank files. Every destination rank's layout is planned
// from the manifest and the destination strategy before any file is written (a strategy that does
// not fit writes nothing); then rank by rank, the rank's boxes are read with LoadDistributed (only
// the chunks they overlap, in parallel) and committed as one .ckpt file.
#include <fmt/format.h>

#include <algorithm>

#include "mindspore_strategy/transform.h"
#include "savepoint/mindspore.h"

namespace savepoint {
namespace {

// The boxes of destination rank `rank`, as transform_checkpoints cuts a whole source: a tensor
// with a layout is cut to the rank's box (dropped when its stage is another one), every other
// tensor is whole.
Result<ShardLayout> RankLayout(const transform::Side& dst, const std::vector<TensorInfo>& tensors,
                               int64_t rank) {
  ShardLayout out;
  const uint32_t stage = static_cast<uint32_t>(rank / dst.devices());
  for (const TensorInfo& t : tensors) {
    const MindSporeParamPlacement* p = dst.Find(t.name);
    if (p == nullptr) {
      out[t.name] = ShardSpec{t.shape, Shape(t.shape.size(), 0), t.shape, {}};
      continue;
    }
    if (std::find(p->stages.begin(), p->stages.end(), stage) == p->stages.end()) continue;
    Result<ShardSpec> box = MindSporeShard(p->layout, t.shape, rank % dst.devices(), t.name);
    if (!box.ok()) return box.status().WithContext(fmt::format("strategy file {}", dst.map->file));
    out[t.name] = std::move(*box);
  }
  return out;
}

// The metadata of a native checkpoint describes it (a Python tree, a trainer's notes): only what
// the .ckpt writer needs (int4 tensors, hash maps) travels into the rank files.
void KeepMindSporeMetadata(State* state) {
  Json& meta = state->metadata();
  if (!meta.is_object() || !meta.contains(kMindSporeMetadataKey)) {
    meta = nullptr;
    return;
  }
  meta = Json{{kMindSporeMetadataKey, meta[kMindSporeMetadataKey]}};
}

Result<std::vector<int64_t>> Ranks(const transform::Side& dst, const std::vector<int64_t>& asked) {
  const int64_t n = dst.devices() * dst.stages();
  std::vector<int64_t> out = asked;
  if (out.empty()) {
    for (int64_t r = 0; r < n; ++r) out.push_back(r);
  }
  for (int64_t r : out) {
    if (r < 0 || r >= n) {
      return InvalidArgumentError(
          fmt::format("destination rank {}: the destination has {} ranks", r, n));
    }
  }
  return out;
}

Status Export(const std::string& src, const std::string& dst_dir, const std::string& prefix,
              const MindSporeExportOptions& o, const IoOptions& io) {
  if (prefix.find('/') != std::string::npos) {
    return InvalidArgumentError(fmt::format("prefix {:?} holds a '/'", prefix));
  }
  if (!o.load.names.empty()) {
    return InvalidArgumentError("MindSporeExportOptions.load.names: every tensor is exported");
  }
  SP_ASSIGN_OR_RETURN(transform::Side dst,
                      transform::ReadSide(o.dst_strategy_file, FileSystemOf(io)));
  SP_ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(src, o.load, io));
  SP_ASSIGN_OR_RETURN(std::vector<int64_t> ranks, Ranks(dst, o.ranks));
  std::vector<ShardLayout> layouts;
  for (int64_t r : ranks) {
    SP_ASSIGN_OR_RETURN(ShardLayout l, RankLayout(dst, reader->tensors(), r));
    layouts.push_back(std::move(l));
  }
  for (size_t i = 0; i < ranks.size(); ++i) {
    const std::string context = fmt::format("destination rank {}", ranks[i]);
    Result<State> state = LoadDistributedAlloc(src, layouts[i], o.load, io);
    if (!state.ok()) return state.status().WithContext(context);
    KeepMindSporeMetadata(&*state);
    const std::string path =
        fmt::format("{}/rank_{}/{}{}.ckpt", dst_dir, ranks[i], prefix, ranks[i]);
    SP_RETURN_IF_ERROR(
        SaveMindSporeCheckpoint(*state, path, {.overwrite = o.overwrite}, io).WithContext(context));
  }
  return Status::OK();
}

}  // namespace

Status ExportMindSporeDistributed(const std::string& src, const std::string& dst_dir,
                                  const std::string& prefix, const MindSporeExportOptions& options,
                                  const IoOptions& io) {
  return Export(src, dst_dir, prefix, options, io)
      .WithContext(fmt::format("export of {} as MindSpore rank files in {}", src, dst_dir));
}

}  // namespace savepoint
