// Zero-copy tensor access through read-only mappings of the data files (CheckpointReader::MapTensor
// and the building blocks of Load with LoadOptions::mmap).
//
// A data file is mapped once per Reader, lazily, on the first tensor that needs it, and only after
// Reader::File has checked its header (magic, version, checkpoint id, file index) and its size
// against the manifest; the mapping's own size is checked again, since the file may have changed
// in between. A view is handed out only for a tensor stored as a single shard (one contiguous,
// C-order extent equal to the whole tensor, uncompressed); nothing of it is read until it is
// verified or touched.
//
// Thread safety: see reader.h. maps_ is guarded by map_mu_, which is never held while File takes
// mu_; two threads mapping the same file at once map it once.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/reader.h"
#include "util/parallel.h"
#include "util/progress.h"

namespace savepoint::engine {

Result<std::shared_ptr<const MappedFile>> Reader::Mapping(uint32_t index) {
  {
    std::lock_guard<std::mutex> lock(map_mu_);
    if (maps_[index]) return maps_[index];
  }
  // Header and size checks (opens the file for reading once; no tensor data is read).
  SP_RETURN_IF_ERROR(File(index).status());
  std::lock_guard<std::mutex> lock(map_mu_);
  if (maps_[index]) return maps_[index];
  const format::FileRecord& rec = m_.files[index];
  const std::string fpath = JoinPath(path_, rec.name);
  Result<std::shared_ptr<const MappedFile>> map = fs_->MapFile(fpath, options_.map_mode);
  if (!map.ok()) return map.status().WithContext(fmt::format("checkpoint {}", path_));
  if ((*map)->data().size() < rec.bytes) return Truncated(index, (*map)->data().size(), " mapped");
  spdlog::debug("savepoint: mapped {} ({} bytes)", fpath, (*map)->data().size());
  maps_[index] = *map;
  return maps_[index];
}

Result<TensorView> Reader::MapIndex(size_t index, std::shared_ptr<const MappedFile>* mapping) {
  const format::TensorRecord& t = m_.tensors[index];
  if (mapping != nullptr) mapping->reset();
  if (m_.encryption.enabled) {
    return InvalidArgumentError(fmt::format(
        "checkpoint {}: tensor {:?} cannot be mapped: the checkpoint is encrypted, its bytes on "
        "disk are ciphertext (read it with ReadTensor, or Load without mmap)",
        path_, t.name));
  }
  if (t.shards.empty()) {  // an empty tensor: nothing stored
    return TensorView(static_cast<const void*>(nullptr), t.dtype, t.shape);
  }
  const format::ShardRecord& s = t.shards[0];
  if (t.shards.size() > 1 || s.sizes != t.shape) {
    return FailedPreconditionError(fmt::format(
        "checkpoint {}: tensor {:?} is stored as {} shards, so it cannot be mapped as one "
        "contiguous view (read it with ReadTensor)",
        path_, t.name, t.shards.size()));
  }
  if (s.compressed()) {
    return FailedPreconditionError(fmt::format(
        "checkpoint {}: tensor {:?} is stored compressed ({}), so it cannot be mapped as a view "
        "(read it with ReadTensor)",
        path_, t.name, codec::CodecName(s.codec)));
  }
  SP_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> map, Mapping(s.file));
  const std::span<const std::byte> bytes = map->data();
  if (s.offset > bytes.size() || s.bytes > bytes.size() - s.offset) {
    return CorruptionError(fmt::format(
        "checkpoint {}: tensor {:?}: extent at offset {} ({} bytes) is past the end of mapped "
        "data file {} ({} bytes)",
        path_, t.name, s.offset, s.bytes, m_.files[s.file].name, bytes.size()));
  }
  TensorView view(bytes.data() + s.offset, t.dtype, t.shape);  // const_cast inside: read-only
  if (mapping != nullptr) *mapping = std::move(map);
  return view;
}

Status Reader::VerifyMapped(const std::vector<size_t>& tensors, uint64_t* chunks,
                            Progress* progress) {
  struct Chunk {
    const format::TensorRecord* tensor;
    uint64_t chunk;
    const std::byte* data;  // the chunk's first byte in the mapping
  };
  std::vector<Chunk> work;
  for (size_t ti : tensors) {
    const format::TensorRecord& t = m_.tensors[ti];
    if (t.shards.empty()) continue;
    SP_ASSIGN_OR_RETURN(TensorView view, MapIndex(ti, nullptr));
    for (uint64_t c = 0; c < t.shards[0].crc32c.size(); ++c) {
      work.push_back({&t, c, view.data() + c * m_.chunk_bytes});
    }
  }
  if (chunks != nullptr) *chunks = work.size();
  return ParallelFor(work.size(), io_.io_threads, [&](size_t i, int) -> Status {
    const Chunk& w = work[i];
    const format::ShardRecord& s = w.tensor->shards[0];
    const uint64_t len = std::min(m_.chunk_bytes, s.bytes - w.chunk * m_.chunk_bytes);
    SP_RETURN_IF_ERROR(CheckChunk(*w.tensor, s, w.chunk, {w.data, len}));
    if (progress != nullptr) progress->Add(len);
    return Status::OK();
  });
}

Result<TensorView> Reader::MapTensor(const std::string& name, bool verify) {
  int64_t i = IndexOf(name);
  if (i < 0) return NotFoundError(fmt::format("checkpoint {}: no tensor {:?}", path_, name));
  SP_ASSIGN_OR_RETURN(TensorView view, MapIndex(static_cast<size_t>(i), nullptr));
  if (verify) SP_RETURN_IF_ERROR(VerifyMapped({static_cast<size_t>(i)}, nullptr));
  return view;
}

}  // namespace savepoint::engine
