// SaveSafetensors, LoadSafetensors, VerifySafetensors and InspectSafetensors: file I/O around the
// header codec of safetensors_header.cc.
//
// Save: plan the file (header + offsets; fail early on a dtype safetensors lacks), then the
// durable-commit protocol for a file through interop::CommitFile (byte_layout.h; docs/FORMAT.md
// §5): the hidden temporary file is written and synced, then renamed into place. A failure
// removes the temporary file and leaves `path` as it was. With crc_check, the writer computes
// each tensor's CRC-32 from its staging buffers and writes the header, with crc_num, last.
//
// Load and Verify read tensors in 8 MiB pieces on several threads (ReadTensors), computing each
// piece's CRC-32 as it arrives when crc_num is to be checked (safetensors_crc.h combines them).
#include "savepoint/safetensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "engine/paths.h"
#include "engine/select.h"
#include "engine/writer.h"
#include "interop/byte_layout.h"
#include "interop/safetensors_crc.h"
#include "interop/safetensors_header.h"
#include "util/parallel.h"
#include "util/progress.h"

namespace savepoint {
namespace {

using interop::Layout;

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

constexpr uint64_t kStageBytes = uint64_t{8} << 20;  // bytes per read

// Reads and validates the header of an open file.
Result<SafetensorsInfo> ReadInfo(const RandomAccessFile& file, const std::string& path) {
  const uint64_t size = file.size();
  std::string prefix(std::min<uint64_t>(size, interop::kLengthPrefixBytes), '\0');
  SP_RETURN_IF_ERROR(file.ReadAt(0, std::as_writable_bytes(std::span(prefix))));
  SP_ASSIGN_OR_RETURN(uint64_t n, interop::DecodeHeaderLength(prefix, size, path));
  std::string json(n, '\0');
  SP_RETURN_IF_ERROR(
      file.ReadAt(interop::kLengthPrefixBytes, std::as_writable_bytes(std::span(json))));
  return interop::DecodeHeader(json, size, path);
}

// The file's mapping for LoadSafetensors with mmap; null when the file system cannot map.
Result<std::shared_ptr<const MappedFile>> MapWhole(FileSystem* fs, const SafetensorsInfo& info,
                                                   MapMode mode) {
  Result<std::shared_ptr<const MappedFile>> map = fs->MapFile(info.path, mode);
  if (!map.ok()) {
    if (map.status().code() == StatusCode::kUnimplemented)
      return std::shared_ptr<const MappedFile>();
    return map.status();
  }
  if ((*map)->data().size() != info.file_bytes) {
    return CorruptionError(
        fmt::format("safetensors file {}: changed size while being opened ({} bytes, {} mapped)",
                    info.path, info.file_bytes, (*map)->data().size()));
  }
  return *map;
}

// Where ReadTensors gets the bytes: the file, or its mapping.
struct Source {
  const RandomAccessFile* file = nullptr;
  const std::byte* map = nullptr;  // the whole file, when mapped
};

// What ReadTensors reads.
struct ReadRequest {
  std::vector<std::byte*> dst;  // per tensor of info.tensors: where it goes (never with a map)
  bool all = false;             // read the tensors without a dst too (into scratch buffers)
  bool crc = false;             // compute crc_num (reads every tensor)
};

// Reads tensors of `info` in kStageBytes pieces on `threads` threads, counting them in
// `progress`; returns crc_num with `req.crc`, else 0.
Result<uint32_t> ReadTensors(const SafetensorsInfo& info, const Source& src, const ReadRequest& req,
                             int threads, Progress* progress) {
  struct Piece {
    size_t t;     // index into info.tensors
    uint64_t at;  // offset inside the tensor
  };
  std::vector<Piece> pieces;
  for (size_t t = 0; t < info.tensors.size(); ++t) {
    if (req.dst[t] == nullptr && !req.all && !req.crc) continue;
    for (uint64_t at = 0; at < info.tensors[t].nbytes(); at += kStageBytes)
      pieces.push_back({t, at});
  }
  std::vector<interop::CrcPart> parts(req.crc ? pieces.size() : 0);
  std::vector<std::unique_ptr<std::byte[]>> scratch(std::max(threads, 1));
  SP_RETURN_IF_ERROR(ParallelFor(pieces.size(), threads, [&](size_t i, int w) -> Status {
    const SafetensorsTensorInfo& t = info.tensors[pieces[i].t];
    const uint64_t at = pieces[i].at, n = std::min(kStageBytes, t.nbytes() - at);
    const uint64_t offset = info.data_offset + t.begin + at;
    std::span<const std::byte> bytes;
    if (src.map != nullptr) {
      bytes = {src.map + offset, static_cast<size_t>(n)};
    } else {
      std::byte* to = req.dst[pieces[i].t];
      if (to == nullptr && scratch[w] == nullptr) {
        scratch[w] = std::make_unique_for_overwrite<std::byte[]>(kStageBytes);
      }
      std::span<std::byte> dst(to != nullptr ? to + at : scratch[w].get(), static_cast<size_t>(n));
      Status s = src.file->ReadAt(offset, dst);
      if (!s.ok()) {
        const std::string where =
            fmt::format("safetensors file {}: tensor {:?}", info.path, t.name);
        if (s.code() == StatusCode::kOutOfRange) {  // shrank since its header was checked
          return CorruptionError(fmt::format("{}: {}", where, s.message()));
        }
        return s.WithContext(where);
      }
      bytes = dst;
    }
    if (req.crc) {
      parts[i] = interop::IndexScalarCrc(t.dtype, t.shape, bytes)
                     .value_or(interop::CrcPart{interop::Crc32Zlib(0, bytes), n});
    }
    progress->Add(n);
    return Status::OK();
  }));
  if (!req.crc) return 0;
  std::vector<interop::NamedCrc> tensors(info.tensors.size());
  for (size_t t = 0; t < info.tensors.size(); ++t) tensors[t].name = info.tensors[t].name;
  for (size_t i = 0; i < pieces.size(); ++i) {  // a tensor's pieces in order
    interop::CrcPart& part = tensors[pieces[i].t].part;
    part = interop::AppendCrc(part, parts[i]);
  }
  return interop::CrcNum(std::move(tensors));
}

// The stored crc_num of `info` when it is to be checked.
Result<std::optional<uint32_t>> CrcToCheck(const SafetensorsInfo& info, bool crc_check) {
  if (!crc_check || !info.has_crc_num) return std::optional<uint32_t>();
  SP_ASSIGN_OR_RETURN(uint32_t stored,
                      interop::ParseCrcNum(info.raw_metadata.at(interop::kCrcNumKey), info.path));
  return std::optional<uint32_t>(stored);
}

Status CheckCrc(const SafetensorsInfo& info, uint32_t stored, uint32_t computed) {
  if (stored == computed) return Status::OK();
  return CorruptionError(fmt::format(
      "safetensors file {}: CRC-32 mismatch: __metadata__ says crc_num {}, the tensors' names and "
      "bytes give {} (the file is damaged)",
      info.path, stored, computed));
}

uint64_t TensorBytes(const SafetensorsInfo& info) {
  uint64_t n = 0;
  for (const SafetensorsTensorInfo& t : info.tensors) n += t.nbytes();
  return n;
}

}  // namespace

Status SaveSafetensors(const State& state, const std::string& path,
                       const SafetensorsSaveOptions& options, const IoOptions& io) {
  const auto start = std::chrono::steady_clock::now();
  SP_ASSIGN_OR_RETURN(std::string target, engine::NormalizeCheckpointPath(path));
  SP_ASSIGN_OR_RETURN(Layout layout, interop::PlanLayout(state, target, options));
  const std::string context = fmt::format("save safetensors file {}", target);
  SP_RETURN_IF_ERROR(ValidateIoOptions(io, context));
  // The header, then the tensors back to back (PlanLayout pads the header so that the file is a
  // whole number of blocks where it can: O_DIRECT, often far faster than buffered writes + fsync).
  interop::ByteLayout bytes;
  std::string* header = bytes.AddOwned(layout.header);
  for (const Layout::Item& item : layout.items) bytes.AddBorrowed(item.view->bytes());
  interop::CommitFileOptions o{.overwrite = options.overwrite,
                               .create_parents = options.create_parents,
                               .progress = options.progress,
                               .stats = options.stats};
  if (options.crc_check) {  // the header last, with crc_num from the tensors' CRCs
    o.head_end = header->size();
    o.head = [&](const std::vector<uint32_t>& segment_crcs) {
      std::vector<interop::NamedCrc> tensors;
      for (size_t k = 0; k < layout.items.size(); ++k) {  // segment k + 1 is item k
        const TensorView& v = *layout.items[k].view;
        tensors.push_back({*layout.items[k].name,
                           interop::IndexScalarCrc(v.dtype(), v.shape(), v.bytes())
                               .value_or(interop::CrcPart{segment_crcs[k + 1], v.nbytes()})});
      }
      return interop::FillCrcNum(header, interop::CrcNum(std::move(tensors)));
    };
  }
  return interop::CommitFile(io, target, bytes, o, context, start);
}

Result<SafetensorsInfo> InspectSafetensors(const std::string& path, FileSystem* fs) {
  SP_ASSIGN_OR_RETURN(auto file, FileSystemOf({.fs = fs})->NewRandomAccessFile(path, {}));
  return ReadInfo(*file, path);
}

Result<State> LoadSafetensors(const std::string& path, const SafetensorsLoadOptions& options,
                              const IoOptions& io) {
  if (!options.mmap && options.map_mode != MapMode::kReadOnly) {
    return InvalidArgumentError(fmt::format(
        "load safetensors file {}: map_mode is copy-on-write but mmap is false (set mmap = true)",
        path));
  }
  SP_RETURN_IF_ERROR(ValidateIoOptions(io, fmt::format("load safetensors file {}", path)));
  const auto start = std::chrono::steady_clock::now();
  FileSystem* fs = FileSystemOf(io);
  SP_ASSIGN_OR_RETURN(auto file, fs->NewRandomAccessFile(path, FileOptions{}));
  SP_ASSIGN_OR_RETURN(SafetensorsInfo info, ReadInfo(*file, path));
  std::vector<std::string> names;
  for (const auto& t : info.tensors) names.push_back(t.name);
  SP_ASSIGN_OR_RETURN(std::vector<bool> keep,
                      engine::SelectTensors(options.names, names, info.values,
                                            fmt::format("safetensors file {}", path)));
  SP_ASSIGN_OR_RETURN(std::optional<uint32_t> stored, CrcToCheck(info, options.crc_check));
  std::shared_ptr<const MappedFile> map;
  if (options.mmap) {
    SP_ASSIGN_OR_RETURN(map, MapWhole(fs, info, options.map_mode));
  }
  State state;
  uint64_t bytes = 0;
  std::vector<Tensor> tensors(info.tensors.size());
  ReadRequest req{.dst = std::vector<std::byte*>(info.tensors.size(), nullptr),
                  .crc = stored.has_value()};
  for (size_t i = 0; i < info.tensors.size(); ++i) {
    if (!keep[i]) continue;
    bytes += info.tensors[i].nbytes();
    if (map != nullptr) continue;
    SP_ASSIGN_OR_RETURN(tensors[i], Tensor::Empty(info.tensors[i].dtype, info.tensors[i].shape));
    req.dst[i] = tensors[i].data();
  }
  Progress progress(options.progress, stored ? TensorBytes(info) : bytes);
  if (map == nullptr || stored) {
    const Source src =
        map != nullptr ? Source{.map = map->data().data()} : Source{.file = file.get()};
    SP_ASSIGN_OR_RETURN(uint32_t crc, ReadTensors(info, src, req, io.io_threads, &progress));
    if (stored) SP_RETURN_IF_ERROR(CheckCrc(info, *stored, crc));
  }
  progress.Finish();
  for (size_t i = 0; i < info.tensors.size(); ++i) {
    if (!keep[i]) continue;
    const SafetensorsTensorInfo& t = info.tensors[i];
    SP_RETURN_IF_ERROR(
        map != nullptr
            ? state.PutView(t.name, TensorView(map->data().data() + info.data_offset + t.begin,
                                               t.dtype, t.shape))
            : state.Put(t.name, std::move(tensors[i])));
  }
  if (map != nullptr) state.KeepAlive(std::move(map));
  for (const auto& [name, e] : info.values.entries()) {
    if (engine::Selected(options.names, name)) SP_RETURN_IF_ERROR(state.PutValue(name, e.value()));
  }
  state.metadata() = info.values.metadata();
  if (options.stats != nullptr) {
    *options.stats = LoadStats{bytes, 0, SecondsSince(start), false, bytes};
  }
  return state;
}

Status VerifySafetensors(const std::string& path, const SafetensorsVerifyOptions& options,
                         const IoOptions& io) {
  const auto start = std::chrono::steady_clock::now();
  LoadStats stats;
  Status s = [&]() -> Status {
    SP_RETURN_IF_ERROR(ValidateIoOptions(io, fmt::format("verify safetensors file {}", path)));
    SP_ASSIGN_OR_RETURN(auto file, FileSystemOf(io)->NewRandomAccessFile(path, FileOptions{}));
    SP_ASSIGN_OR_RETURN(SafetensorsInfo info, ReadInfo(*file, path));
    SP_ASSIGN_OR_RETURN(std::optional<uint32_t> stored, CrcToCheck(info, options.crc_check));
    const ReadRequest req{.dst = std::vector<std::byte*>(info.tensors.size(), nullptr),
                          .all = true,
                          .crc = stored.has_value()};
    Progress progress(options.progress, TensorBytes(info));
    SP_ASSIGN_OR_RETURN(uint32_t crc,
                        ReadTensors(info, {.file = file.get()}, req, io.io_threads, &progress));
    stats.bytes = stats.stored_bytes = TensorBytes(info);
    if (stored) {
      SP_RETURN_IF_ERROR(CheckCrc(info, *stored, crc));
      stats.chunks = 1;
    }
    progress.Finish();
    return Status::OK();
  }();
  stats.seconds = SecondsSince(start);
  if (options.stats != nullptr) *options.stats = stats;
  return s;
}

}  // namespace savepoint
