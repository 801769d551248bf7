// SaveMindSporeCheckpoint, LoadMindSporeCheckpoint, InspectMindSporeCheckpoint
// (savepoint/mindspore.h) on top of the wire format of interop/ckpt_wire.h.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <optional>

#include "engine/paths.h"
#include "engine/select.h"
#include "interop/byte_layout.h"
#include "interop/ckpt_entries.h"
#include "interop/ckpt_wire.h"
#include "savepoint/mindspore.h"
#include "util/parallel.h"
#include "util/progress.h"

namespace savepoint {
namespace {

using interop::ckpt::Scan;

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

constexpr uint64_t kReadBytes = uint64_t{8} << 20;  // bytes per parallel read or CRC block

// The CRC-32 of the file's bytes before its trailer, read in parallel blocks.
Result<uint32_t> PayloadCrc(const RandomAccessFile& file, uint64_t end, int threads) {
  const uint64_t blocks = (end + kReadBytes - 1) / kReadBytes;
  std::vector<uint32_t> crcs(blocks);
  std::vector<std::vector<std::byte>> bufs(threads);
  SP_RETURN_IF_ERROR(ParallelFor(blocks, threads, [&](size_t i, int w) -> Status {
    const uint64_t at = i * kReadBytes, n = std::min(kReadBytes, end - at);
    bufs[w].resize(kReadBytes);
    std::span<std::byte> b(bufs[w].data(), n);
    SP_RETURN_IF_ERROR(file.ReadAt(at, b));
    crcs[i] = interop::Crc32Zlib(0, b);
    return Status::OK();
  }));
  uint32_t crc = 0;
  for (uint64_t i = 0; i < blocks; ++i) {
    crc = interop::Crc32ZlibCombine(crc, crcs[i], std::min(kReadBytes, end - i * kReadBytes));
  }
  return crc;
}

Status CheckCrc(const RandomAccessFile& file, const Scan& scan, const std::string& path,
                int threads) {
  SP_ASSIGN_OR_RETURN(uint32_t crc, PayloadCrc(file, scan.payload_end, threads));
  if (crc == scan.stored_crc) return Status::OK();
  return CorruptionError(fmt::format(
      "MindSpore checkpoint {}: CRC-32 mismatch: the trailer says {}, the {} bytes before it give "
      "{} (the file was changed or damaged after it was written)",
      path, scan.stored_crc, scan.payload_end, crc));
}

// Runs the planned reads on `threads` threads, counting them in `progress`.
Status RunReads(const RandomAccessFile& file, const std::vector<interop::ckpt::Read>& reads,
                int threads, Progress* progress, const std::string& path) {
  std::vector<interop::ckpt::Read> pieces;
  for (const auto& r : reads) {
    for (uint64_t at = 0; at < r.bytes; at += kReadBytes) {
      pieces.push_back({r.dst + at, r.offset + at, std::min(kReadBytes, r.bytes - at), r.entry});
    }
  }
  return ParallelFor(pieces.size(), threads, [&](size_t i, int) -> Status {
    const auto& p = pieces[i];
    Status s = file.ReadAt(p.offset, {p.dst, static_cast<size_t>(p.bytes)});
    if (!s.ok()) {
      return s.WithContext(fmt::format("MindSpore checkpoint {}: entry {:?}", path, *p.entry));
    }
    progress->Add(p.bytes);
    return Status::OK();
  });
}

}  // namespace

Result<State> LoadMindSporeCheckpoint(const std::string& path, const MindSporeLoadOptions& options,
                                      const IoOptions& io) {
  const auto start = std::chrono::steady_clock::now();
  SP_RETURN_IF_ERROR(ValidateIoOptions(io, fmt::format("load MindSpore checkpoint {}", path)));
  SP_ASSIGN_OR_RETURN(auto file, FileSystemOf(io)->NewRandomAccessFile(path, {}));
  SP_ASSIGN_OR_RETURN(Scan scan, interop::ckpt::ScanFile(*file, path));
  if (scan.has_crc && options.crc_check)
    SP_RETURN_IF_ERROR(CheckCrc(*file, scan, path, io.io_threads));
  SP_ASSIGN_OR_RETURN(interop::ckpt::LoadPlan plan,
                      interop::ckpt::PlanLoad(scan, *file, options.names, path));
  Progress progress(options.progress, plan.tensor_bytes);
  SP_RETURN_IF_ERROR(RunReads(*file, plan.reads, io.io_threads, &progress, path));
  SP_RETURN_IF_ERROR(interop::ckpt::FinishLoad(*file, path, &plan));
  progress.Finish();
  if (options.stats != nullptr) {
    *options.stats = LoadStats{plan.tensor_bytes, 0, SecondsSince(start), false, plan.tensor_bytes};
  }
  return std::move(plan.state);
}

Status SaveMindSporeCheckpoint(const State& state, const std::string& path,
                               const MindSporeSaveOptions& options, const IoOptions& io) {
  const auto start = std::chrono::steady_clock::now();
  SP_ASSIGN_OR_RETURN(std::string target, engine::NormalizeCheckpointPath(path));
  const std::string context = fmt::format("save MindSpore checkpoint {}", target);
  SP_RETURN_IF_ERROR(ValidateIoOptions(io, context));
  interop::ByteLayout layout;
  SP_RETURN_IF_ERROR(interop::ckpt::PlanSave(state, &layout).WithContext(context));
  interop::CommitFileOptions o{.overwrite = options.overwrite,
                               .create_parents = options.create_parents,
                               .progress = options.progress,
                               .stats = options.stats};
  if (options.crc_check) {
    o.crc_end = layout.size();
    std::string* trailer = layout.AddOwned(interop::ckpt::EncodeCrcTrailer(0));
    o.trailer = [trailer](uint32_t crc) {  // in place: the layout points at these bytes
      const std::string t = interop::ckpt::EncodeCrcTrailer(crc);
      trailer->replace(0, t.size(), t);
    };
  }
  return interop::CommitFile(io, target, layout, o, context, start);
}

Result<MindSporeCheckpointInfo> InspectMindSporeCheckpoint(const std::string& path,
                                                           FileSystem* fs) {
  SP_ASSIGN_OR_RETURN(auto file, FileSystemOf({.fs = fs})->NewRandomAccessFile(path, {}));
  SP_ASSIGN_OR_RETURN(Scan scan, interop::ckpt::ScanFile(*file, path));
  MindSporeCheckpointInfo info;
  info.path = path;
  info.file_bytes = scan.file_bytes;
  info.has_crc = scan.has_crc;
  info.stored_crc = scan.stored_crc;
  SP_ASSIGN_OR_RETURN(std::vector<interop::ckpt::Entry> entries,
                      interop::ckpt::GroupEntries(scan, path));
  for (const interop::ckpt::Entry& e : entries) {
    MindSporeEntryInfo ei;
    ei.name = e.name;
    ei.type = e.map ? "map" : e.values[0]->tensors[0].type;
    if (!e.map) ei.shape = Shape(e.values[0]->tensors[0].dims);
    ei.pieces = static_cast<uint32_t>(e.values.size());
    for (const auto* v : e.values) {
      for (const auto& t : v->tensors) ei.bytes += t.content_bytes;
    }
    info.entries.push_back(std::move(ei));
  }
  return info;
}

}  // namespace savepoint
