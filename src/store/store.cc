// OpenRead / OpenWrite: the options every store shares are checked here against what the format
// can honour, then the format's factory (formats.h) opens the container.
#include "store/store.h"

#include <fmt/format.h>

#include "engine/select.h"
#include "savepoint/sparse.h"
#include "store/formats.h"

namespace savepoint::store {
namespace {

Status Refuse(std::string_view what, std::string_view field, Format format, std::string_view why) {
  return InvalidArgumentError(fmt::format("{}: {}: {} ({})", what, field, why, FormatName(format)));
}

Status CheckRead(const std::string& path, Format f, const LoadOptions& o,
                 std::optional<Cipher> cipher) {
  const std::string what = fmt::format("read {}", path);
  SP_RETURN_IF_ERROR(engine::RefuseTopology(o.topology, what, "LoadOptions"));
  const Capabilities c = CapabilitiesOf(f);
  if (o.key && !c.encrypt) return Refuse(what, "LoadOptions.key", f, "the format is not encrypted");
  if (cipher && f != Format::kMindSporeCkpt) {
    return Refuse(what, "the source's cipher (ConvertOptions.source_cipher)", f,
                  "only .ckpt files name one");
  }
  if (o.mmap && !c.map) {
    return Refuse(what, "LoadOptions.mmap", f, "the format is read, not mapped");
  }
  if (!o.mmap && o.map_mode != MapMode::kReadOnly) {
    return InvalidArgumentError(fmt::format(
        "{}: LoadOptions.map_mode is copy-on-write but mmap is false (set mmap = true)", what));
  }
  return Status::OK();
}

Status CheckWrite(const engine::WriteRequest& r, Format f, const FileOptions& file) {
  const std::string what = fmt::format("write {}", r.path);
  SP_RETURN_IF_ERROR(engine::RefuseTopology(r.options.topology, what, "SaveOptions"));
  const Capabilities c = CapabilitiesOf(f);
  if (!c.write) {
    return Refuse(what, "SaveOptions.format", f,
                  "read only: DCP and RecIS directories are sources (write DCP checkpoints "
                  "through savepoint.torch.StorageWriter)");
  }
  if (r.topology.comm != nullptr && !c.shard) {
    return Refuse(what, "the topology", f, "ranks write native checkpoints only");
  }
  if (r.options.key && !c.encrypt) {
    return Refuse(what, "SaveOptions.key", f, "the format is not encrypted");
  }
  if (file.file_checksum && !c.file_checksum) {
    return Refuse(what, "file_checksum", f,
                  "native checkpoints always carry a CRC32C per chunk; the whole-file checksum is "
                  "MindSpore's");
  }
  if (file.mindspore_flavour && f != Format::kSafetensors) {
    return Refuse(what, "mindspore_flavour", f, "a flavour of safetensors files");
  }
  if (file.cipher != Cipher::kAesGcm && (f != Format::kMindSporeCkpt || !r.options.key)) {
    return Refuse(what, "the cipher (ConvertOptions.cipher, ManagerStorage.cipher)", f,
                  "only an encrypted .ckpt file chooses one");
  }
  if (f == Format::kNative) return Status::OK();
  const SaveOptions d;
  const char* field = r.options.chunk_bytes != d.chunk_bytes ? "SaveOptions.chunk_bytes"
                      : r.options.compression.codec != d.compression.codec ||
                              r.options.compression.shuffle != d.compression.shuffle ||
                              r.options.compression.zstd_level != d.compression.zstd_level
                          ? "SaveOptions.compression"
                      : r.options.format_version != d.format_version ? "SaveOptions.format_version"
                                                                     : nullptr;
  if (field != nullptr) return Refuse(what, field, f, "applies to native checkpoints only");
  return Status::OK();
}

}  // namespace

Capabilities CapabilitiesOf(Format format) {
  switch (format) {
    case Format::kNative:
      return {.write = true, .map = true, .encrypt = true, .shard = true, .tables = true};
    case Format::kSafetensors:
      return {.write = true, .ranges = true, .map = true, .file_checksum = true};
    case Format::kMindSporeCkpt:
      return {.write = true, .ranges = true, .encrypt = true, .file_checksum = true};
    case Format::kRecis:
      return {.tables = true};
    case Format::kDcp:
    case Format::kAuto:
      break;
  }
  return {};
}

Status Reader::ReadRange(std::string_view name, uint64_t, std::span<std::byte>) const {
  return UnimplementedError(fmt::format("{}: tensor {:?}: {} stores do not read byte ranges",
                                        path(), name, FormatName(format())));
}

Result<std::unique_ptr<Reader>> OpenRead(const std::string& path, Format format,
                                         const LoadOptions& options, const IoOptions& io,
                                         std::optional<Cipher> cipher) {
  SP_RETURN_IF_ERROR(ValidateIoOptions(io, fmt::format("read {}", path)));
  if (format == Format::kAuto) {
    Result<Format> found = DetectFormat(path, FileSystemOf(io));
    // Nothing there, or a file system that cannot tell: the native reader says what is missing
    // ("not a committed checkpoint (no MANIFEST)"), as Load always has.
    const StatusCode code = found.status().code();
    if (!found.ok() && code != StatusCode::kNotFound && code != StatusCode::kUnimplemented) {
      return found.status();
    }
    format = found.ok() ? *found : Format::kNative;
  }
  SP_RETURN_IF_ERROR(CheckRead(path, format, options, cipher));
  LoadOptions o = options;
  o.format = Format::kAuto;
  switch (format) {
    case Format::kNative:
      return OpenNative(path, o, io);
    case Format::kSafetensors:
      return OpenSafetensors(path, o, io);
    case Format::kMindSporeCkpt:
      return OpenCkpt(path, o, io, cipher);
    case Format::kDcp:
      return OpenDcp(path, o, io);
    case Format::kRecis:
      return OpenRecis(path, o, io);
    case Format::kAuto:
      break;
  }
  return InvalidArgumentError(
      fmt::format("read {}: format {}: not a format", path, static_cast<int>(format)));
}

Result<std::unique_ptr<Writer>> OpenWrite(const engine::WriteRequest& request, Format format,
                                          const FileOptions& file) {
  if (format == Format::kAuto) format = TargetFormat(request.path);
  if (!IsWritableFormat(format) && format != Format::kDcp && format != Format::kRecis) {
    return InvalidArgumentError(
        fmt::format("write {}: format {}: not a format", request.path, static_cast<int>(format)));
  }
  SP_RETURN_IF_ERROR(CheckWrite(request, format, file));
  engine::WriteRequest r = request;
  r.options.format = Format::kNative;  // what the engine checks; the store is chosen here
  r.state = nullptr;
  if (!r.options.overwrite && r.topology.comm == nullptr && FileSystemOf(r.io)->Exists(r.path)) {
    return AlreadyExistsError(
        fmt::format("write {}: something is already there (pass overwrite to replace a "
                    "checkpoint)",
                    r.path));
  }
  if (format == Format::kNative) return NativeWriter(r);
  return FileWriter(r, format, file);
}

std::vector<Entry> EntriesOf(const State& state) {
  std::vector<Entry> out;
  for (const auto& [name, e] : state.entries()) {
    Entry x{.name = name, .tensor = e.is_tensor()};
    if (x.tensor) x.dtype = e.tensor().dtype(), x.shape = e.tensor().shape();
    out.push_back(std::move(x));
  }
  return out;
}

namespace {

// A table of views into `t`'s memory (the caller keeps `t` alive).
Result<SparseTable> ViewOf(const SparseTable& t) {
  std::vector<SparseTable::Slot> slots = t.slots();
  const std::span<const int64_t> d = t.deleted();
  const TensorView deleted =
      d.empty() ? TensorView{}
                : TensorView(d.data(), DType::kI64, {static_cast<int64_t>(d.size())});
  return SparseTable::FromViews(t.ids_view(), std::move(slots), deleted);
}

}  // namespace

Result<State> Select(std::shared_ptr<const State> state, const std::vector<std::string>& names,
                     const std::string& where) {
  std::vector<std::string> tensors;  // the dense tensors, then the tables (selected alike)
  for (const auto& [name, e] : state->entries()) {
    if (e.is_tensor()) tensors.push_back(name);
  }
  const size_t dense = tensors.size();
  for (const auto& [name, t] : state->tables()) tensors.push_back(name);
  SP_ASSIGN_OR_RETURN(std::vector<bool> keep, engine::SelectTensors(names, tensors, *state, where));
  State out;
  for (size_t i = 0; i < dense; ++i) {
    if (keep[i]) SP_RETURN_IF_ERROR(out.PutView(tensors[i], *state->FindTensor(tensors[i])));
  }
  SP_RETURN_IF_ERROR(engine::CopyValues(*state, &out, names));
  for (const auto& [name, t] : state->tables()) {
    if (!engine::Selected(names, name)) continue;
    SP_ASSIGN_OR_RETURN(SparseTable view, ViewOf(*t));
    SP_RETURN_IF_ERROR(out.PutTable(name, std::move(view)));
  }
  out.KeepAlive(std::move(state));
  return out;
}

}  // namespace savepoint::store
