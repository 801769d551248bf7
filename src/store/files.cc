// The file stores: one safetensors file (savepoint/safetensors.h) or one MindSpore `.ckpt` file
// (savepoint/mindspore.h). Both list their entries from the header (no tensor bytes read) and
// read byte ranges of a tensor straight from the file (a plain `.ckpt`; an encrypted one is read
// whole only); whole reads, verification and writes are the interop code's.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "interop/ckpt_cipher.h"
#include "interop/ckpt_entries.h"
#include "savepoint/mindspore.h"
#include "savepoint/safetensors.h"
#include "store/formats.h"

namespace savepoint::store {
namespace {

// OutOfRange unless [offset, offset + n) lies in a tensor of `bytes` bytes.
Status CheckRange(const std::string& path, std::string_view name, uint64_t offset, uint64_t n,
                  uint64_t bytes) {
  if (offset <= bytes && n <= bytes - offset) return Status::OK();
  return OutOfRangeError(fmt::format("{}: tensor {:?}: bytes [{}, +{}) past its {} bytes", path,
                                     name, offset, n, bytes));
}

Status NoTensor(const std::string& path, std::string_view name) {
  return NotFoundError(fmt::format("{}: no tensor {:?}", path, name));
}

class SafetensorsReader final : public Reader {
 public:
  SafetensorsReader(SafetensorsInfo info, std::unique_ptr<RandomAccessFile> file,
                    const LoadOptions& options, const IoOptions& io)
      : info_(std::move(info)), file_(std::move(file)), options_(options), io_(io) {
    std::vector<const SafetensorsTensorInfo*> order;
    for (const SafetensorsTensorInfo& t : info_.tensors) order.push_back(&t);
    std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
    for (const SafetensorsTensorInfo* t : order) {
      entries_.push_back({.name = t->name, .tensor = true, .dtype = t->dtype, .shape = t->shape});
    }
    for (const auto& [name, e] : info_.values.entries()) entries_.push_back({.name = name});
  }

  Format format() const override { return Format::kSafetensors; }
  const std::string& path() const override { return info_.path; }
  Result<std::vector<Entry>> Entries() override { return entries_; }

  Result<State> Read(const std::vector<std::string>& names) override {
    return LoadSafetensors(info_.path,
                           {.names = names,
                            .mmap = options_.mmap,
                            .map_mode = options_.map_mode,
                            .stats = options_.stats,
                            .progress = options_.progress,
                            .crc_check = options_.verify_checksums},
                           io_);
  }

  Status ReadRange(std::string_view name, uint64_t offset,
                   std::span<std::byte> dst) const override {
    auto it = std::lower_bound(
        info_.tensors.begin(), info_.tensors.end(), name,
        [](const SafetensorsTensorInfo& t, std::string_view n) { return t.name < n; });
    if (it == info_.tensors.end() || it->name != name) return NoTensor(info_.path, name);
    SP_RETURN_IF_ERROR(CheckRange(info_.path, name, offset, dst.size(), it->nbytes()));
    return file_->ReadAt(info_.data_offset + it->begin + offset, dst);
  }

  Status Verify(LoadStats* stats) override {
    return VerifySafetensors(
        info_.path,
        {.crc_check = options_.verify_checksums, .stats = stats, .progress = options_.progress},
        io_);
  }

 private:
  const SafetensorsInfo info_;  // tensors in name order
  const std::unique_ptr<RandomAccessFile> file_;
  const LoadOptions options_;
  const IoOptions io_;
  std::vector<Entry> entries_;
};

// A plain `.ckpt` file's structure, for ReadRange.
struct CkptScan {
  interop::ckpt::Scan scan;
  std::vector<interop::ckpt::Entry> entries;
  std::map<std::string, size_t, std::less<>> index;  // name -> entries
};

// The entries of a plain `.ckpt` file's scan (hash maps and strings as non-tensors).
Result<std::vector<Entry>> CkptEntries(const CkptScan& s, const std::string& path) {
  std::vector<Entry> out;
  for (const interop::ckpt::Entry& e : s.entries) {
    Entry x{.name = e.name};
    const std::string& type = e.values[0]->tensors[0].type;
    if (!e.map && type != "str") {
      SP_ASSIGN_OR_RETURN(auto ds, interop::ckpt::TensorEntryInfo(e, path));
      x.tensor = true, x.dtype = ds.first, x.shape = ds.second, x.int4 = type == "Int4";
    }
    out.push_back(std::move(x));
  }
  return out;
}

// The entries of an encrypted `.ckpt` file, listed through the decrypting view (OpenCkpt made
// sure there is a key).
Result<std::vector<Entry>> EncryptedEntries(const std::string& path, const LoadOptions& o,
                                            const IoOptions& io) {
  SP_ASSIGN_OR_RETURN(MindSporeCheckpointInfo info,
                      InspectMindSporeCheckpoint(path, FileSystemOf(io), o.key));
  std::vector<Entry> out;
  for (const MindSporeEntryInfo& e : info.entries) out.push_back({.name = e.name});
  return out;
}

// The structure is scanned on first need (Entries, ReadRange): a whole Read scans the file itself.
class CkptReader final : public Reader {
 public:
  CkptReader(std::string path, std::unique_ptr<RandomAccessFile> file, bool encrypted,
             const LoadOptions& options, const IoOptions& io, std::optional<Cipher> cipher)
      : path_(std::move(path)),
        file_(std::move(file)),
        encrypted_(encrypted),
        options_(options),
        io_(io),
        cipher_(cipher) {}

  Format format() const override { return Format::kMindSporeCkpt; }
  const std::string& path() const override { return path_; }
  Result<std::vector<Entry>> Entries() override {
    SP_RETURN_IF_ERROR(List());
    return entries_;
  }

  Result<State> Read(const std::vector<std::string>& names) override {
    return LoadMindSporeCheckpoint(path_,
                                   {.names = names,
                                    .crc_check = options_.verify_checksums,
                                    .dec_key = options_.key,
                                    .dec_mode = cipher_,
                                    .stats = options_.stats,
                                    .progress = options_.progress},
                                   io_);
  }

  // The entry's content is its pieces' contents back to back.
  Status ReadRange(std::string_view name, uint64_t offset,
                   std::span<std::byte> dst) const override {
    if (encrypted_) {
      return UnimplementedError(
          fmt::format("{}: tensor {:?}: an encrypted .ckpt file is read whole", path_, name));
    }
    SP_RETURN_IF_ERROR(List());
    auto it = scan_->index.find(name);
    if (it == scan_->index.end()) return NoTensor(path_, name);
    const interop::ckpt::Entry& e = scan_->entries[it->second];
    uint64_t bytes = 0;
    for (const interop::ckpt::ValueRecord* v : e.values) bytes += v->tensors[0].content_bytes;
    SP_RETURN_IF_ERROR(CheckRange(path_, name, offset, dst.size(), bytes));
    for (const interop::ckpt::ValueRecord* v : e.values) {
      const interop::ckpt::TensorRecord& t = v->tensors[0];
      if (dst.empty()) break;
      if (offset >= t.content_bytes) {
        offset -= t.content_bytes;
        continue;
      }
      const uint64_t n = std::min<uint64_t>(dst.size(), t.content_bytes - offset);
      SP_RETURN_IF_ERROR(file_->ReadAt(t.content_offset + offset, dst.first(n)));
      dst = dst.subspan(n);
      offset = 0;
    }
    return Status::OK();
  }

  // A `.ckpt` file's one checksum covers the whole file: it is read (and decoded) whole.
  Status Verify(LoadStats* stats) override {
    LoadOptions o = options_;
    o.stats = stats;
    CkptReader whole(path_, nullptr, encrypted_, o, io_, cipher_);
    return whole.Read({}).status();
  }

 private:
  // Scans the file (once; the outcome is kept). After a successful scan a call costs one atomic
  // load: ReadRange calls it for every byte run.
  Status List() const {
    if (scanned_.load(std::memory_order_acquire)) return Status::OK();
    std::lock_guard<std::mutex> lock(mu_);
    if (!listed_) listed_ = Scan();
    if (listed_->ok()) scanned_.store(true, std::memory_order_release);
    return listed_->status();
  }
  Result<bool> Scan() const {
    if (encrypted_) {
      SP_ASSIGN_OR_RETURN(entries_, EncryptedEntries(path_, options_, io_));
      return true;
    }
    scan_ = std::make_unique<CkptScan>();
    SP_ASSIGN_OR_RETURN(scan_->scan, interop::ckpt::ScanFile(*file_, path_));
    SP_ASSIGN_OR_RETURN(scan_->entries, interop::ckpt::GroupEntries(scan_->scan, path_));
    for (size_t i = 0; i < scan_->entries.size(); ++i)
      scan_->index.emplace(scan_->entries[i].name, i);
    SP_ASSIGN_OR_RETURN(entries_, CkptEntries(*scan_, path_));
    return true;
  }

  const std::string path_;
  const std::unique_ptr<RandomAccessFile> file_;  // null in Verify's whole reader
  const bool encrypted_;
  const LoadOptions options_;
  const IoOptions io_;
  const std::optional<Cipher> cipher_;
  mutable std::mutex mu_;
  mutable std::optional<Result<bool>> listed_;  // guarded by mu_
  mutable std::atomic<bool> scanned_{false};    // the scan succeeded: scan_, entries_ are final
  mutable std::unique_ptr<CkptScan> scan_;
  mutable std::vector<Entry> entries_;
};

class FileWriterImpl final : public Writer {
 public:
  FileWriterImpl(const engine::WriteRequest& request, Format format, const FileOptions& file)
      : r_(request), format_(format), file_(file) {}
  Format format() const override { return format_; }

  Status Commit(const State& state) override {
    if (!state.tables().empty()) {
      return InvalidArgumentError(fmt::format(
          "write {}: the state has {} sparse tables, which only native checkpoints hold", r_.path,
          state.tables().size()));
    }
    const SaveOptions& o = r_.options;
    if (format_ == Format::kSafetensors) {
      return SaveSafetensors(state, r_.path,
                             {.overwrite = o.overwrite,
                              .create_parents = o.create_parents,
                              .stats = o.stats,
                              .progress = o.progress,
                              .mindspore_format = file_.mindspore_flavour || file_.file_checksum,
                              .crc_check = file_.file_checksum},
                             r_.io);
    }
    return SaveMindSporeCheckpoint(state, r_.path,
                                   {.overwrite = o.overwrite,
                                    .create_parents = o.create_parents,
                                    .crc_check = file_.file_checksum,
                                    .enc_key = o.key,
                                    .enc_mode = file_.cipher,
                                    .stats = o.stats,
                                    .progress = o.progress},
                                   r_.io);
  }

 private:
  const engine::WriteRequest r_;
  const Format format_;
  const FileOptions file_;
};

}  // namespace

Result<std::unique_ptr<Reader>> OpenSafetensors(const std::string& path, const LoadOptions& options,
                                                const IoOptions& io) {
  FileSystem* fs = FileSystemOf(io);
  SP_ASSIGN_OR_RETURN(SafetensorsInfo info, InspectSafetensors(path, fs));
  SP_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file,
                      fs->NewRandomAccessFile(path, {.random_access = true}));
  return std::unique_ptr<Reader>(
      std::make_unique<SafetensorsReader>(std::move(info), std::move(file), options, io));
}

Result<std::unique_ptr<Reader>> OpenCkpt(const std::string& path, const LoadOptions& options,
                                         const IoOptions& io, std::optional<Cipher> cipher) {
  // Only the byte runs a caller asks for are read: no read-ahead past them.
  SP_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file,
                      FileSystemOf(io)->NewRandomAccessFile(path, {.random_access = true}));
  SP_ASSIGN_OR_RETURN(std::optional<Cipher> mode, interop::ckpt::SniffCipher(*file));
  if (mode && !options.key) {
    return InvalidArgumentError(
        fmt::format("MindSpore checkpoint {} is encrypted: pass its key", path));
  }
  return std::unique_ptr<Reader>(
      std::make_unique<CkptReader>(path, std::move(file), mode.has_value(), options, io, cipher));
}

std::unique_ptr<Writer> FileWriter(const engine::WriteRequest& request, Format format,
                                   const FileOptions& file) {
  return std::make_unique<FileWriterImpl>(request, format, file);
}

}  // namespace savepoint::store
