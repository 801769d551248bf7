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

constexpr uint64_t kReadBytes = uint64_t{8} << 20;  // bytes per parallel read

// One parallel read: into `dst`, or (dst null: bytes only the CRC covers, such as headers,
// strings and entries not selected) into the worker's scratch buffer.
struct Piece {
  std::byte* dst;
  uint64_t offset;
  uint64_t bytes;
  const std::string* entry;
};

// The reads cut into kReadBytes pieces in file order; with crc_end > 0 also the gaps between them
// up to crc_end, so that one pass reads every byte the CRC covers exactly once.
std::vector<Piece> Pieces(std::vector<interop::ckpt::Read> reads, uint64_t crc_end) {
  std::sort(reads.begin(), reads.end(), [](const auto& a, const auto& b) {
    return a.offset < b.offset;  // (a hash map's parts are planned part by part)
  });
  std::vector<Piece> out;
  auto add = [&](std::byte* dst, uint64_t offset, uint64_t n, const std::string* entry) {
    for (uint64_t k = 0; k < n; k += kReadBytes) {
      out.push_back(
          {dst != nullptr ? dst + k : nullptr, offset + k, std::min(kReadBytes, n - k), entry});
    }
  };
  uint64_t at = 0;
  for (const auto& r : reads) {
    if (crc_end > 0 && r.offset > at) add(nullptr, at, r.offset - at, nullptr);
    add(r.dst, r.offset, r.bytes, r.entry);
    at = r.offset + r.bytes;
  }
  if (crc_end > at) add(nullptr, at, crc_end - at, nullptr);
  return out;
}

// Runs the pieces on `threads` threads, counting tensor bytes in `progress`; with `crc` set,
// also the CRC-32 of every piece, combined in file order into *crc.
Status RunReads(const RandomAccessFile& file, const std::vector<Piece>& pieces, int threads,
                Progress* progress, const std::string& path, uint32_t* crc) {
  std::vector<uint32_t> crcs(crc != nullptr ? pieces.size() : 0);
  std::vector<std::vector<std::byte>> scratch(threads);
  SP_RETURN_IF_ERROR(ParallelFor(pieces.size(), threads, [&](size_t i, int w) -> Status {
    const Piece& p = pieces[i];
    if (p.dst == nullptr) scratch[w].resize(kReadBytes);
    std::span<std::byte> buf(p.dst != nullptr ? p.dst : scratch[w].data(), p.bytes);
    Status s = file.ReadAt(p.offset, buf);
    if (!s.ok()) {
      return p.entry == nullptr ? s.WithContext(fmt::format("MindSpore checkpoint {}", path))
                                : s.WithContext(fmt::format("MindSpore checkpoint {}: entry {:?}",
                                                            path, *p.entry));
    }
    if (crc != nullptr) crcs[i] = interop::Crc32Zlib(0, buf);
    if (p.dst != nullptr) progress->Add(p.bytes);
    return Status::OK();
  }));
  if (crc == nullptr) return Status::OK();
  *crc = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    *crc = interop::Crc32ZlibCombine(*crc, crcs[i], pieces[i].bytes);
  }
  return Status::OK();
}

}  // namespace

Result<State> LoadMindSporeCheckpoint(const std::string& path, const MindSporeLoadOptions& options,
                                      const IoOptions& io) {
  const auto start = std::chrono::steady_clock::now();
  SP_RETURN_IF_ERROR(ValidateIoOptions(io, fmt::format("load MindSpore checkpoint {}", path)));
  SP_ASSIGN_OR_RETURN(auto file, FileSystemOf(io)->NewRandomAccessFile(path, {}));
  SP_ASSIGN_OR_RETURN(Scan scan, interop::ckpt::ScanFile(*file, path));
  SP_ASSIGN_OR_RETURN(interop::ckpt::LoadPlan plan,
                      interop::ckpt::PlanLoad(scan, *file, options.names, path));
  // With a CRC to check, one pass reads every byte before the trailer: the tensors into their
  // buffers, the rest into scratch, each piece checksummed as it arrives.
  const bool check = scan.has_crc && options.crc_check;
  Progress progress(options.progress, plan.tensor_bytes);
  uint32_t crc = 0;
  SP_RETURN_IF_ERROR(RunReads(*file, Pieces(plan.reads, check ? scan.payload_end : 0),
                              io.io_threads, &progress, path, check ? &crc : nullptr));
  if (check && crc != scan.stored_crc) {
    return CorruptionError(fmt::format(
        "MindSpore checkpoint {}: CRC-32 mismatch: the trailer says {}, the {} bytes before it "
        "give {} (the file was changed or damaged after it was written)",
        path, scan.stored_crc, scan.payload_end, crc));
  }
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
