// Reading checkpoints: open (manifest only), parallel verified chunk reads, Verify.
#include "engine/reader.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "engine/box.h"
#include "engine/request.h"
#include "format/endian.h"
#include "util/crc32c.h"
#include "util/parallel.h"
#include "util/progress.h"

namespace savepoint::engine {

using format::AlignUp;
using format::kAlignment;

struct Reader::Task {
  const format::TensorRecord* tensor;
  const format::ShardRecord* shard;
  uint64_t chunk;
  Destination dst;  // where this chunk's first byte goes
};

// Small chunks close together in one file, read with one read (see kRegionBytes).
struct Reader::Region {
  uint32_t file = 0;
  uint64_t begin = 0;       // file offset of the first chunk
  uint64_t end = 0;         // end of the last chunk
  std::vector<Task> tasks;  // in file order
};

namespace {

TensorInfo Describe(const format::TensorRecord& t) {
  TensorInfo info;
  info.name = t.name;
  info.dtype = t.dtype;
  info.shape = t.shape;
  info.nbytes = NumBytes(t.dtype, t.shape).value();
  info.num_shards = t.shards.size();
  for (const auto& s : t.shards) {
    info.num_chunks += s.crc32c.size();
    info.stored_bytes += format::StoredBytes(s);
    if (s.compressed()) {
      info.codec = codec::CodecName(s.codec);
      info.filter = codec::FilterName(s.filter);
    }
  }
  return info;
}

std::span<std::byte> Writable(std::string& s) {
  return std::as_writable_bytes(std::span<char>(s.data(), s.size()));
}

// The most MANIFEST bytes read whole: what versions 1 and 2 allow (header and a 256 MiB body),
// unless its header says version 3 or later, which may be larger (kMaxManifestFileBytes). The
// header is checked by the decoder.
uint64_t WholeCap(std::string_view header) {
  const bool indexed = header.size() >= format::kManifestHeaderBytes &&
                       format::GetU32(header, 8) >= format::kIndexedFormatVersion;
  return indexed ? format::kMaxManifestFileBytes
                 : format::kManifestHeaderBytes + format::kMaxManifestBodyBytes;
}

// MANIFEST through one open (format/manifest_index.h): the header, then for an unencrypted version
// 3 file the head and the sections of the tensors `only` names, in one batch (the manifest
// returned); for any other the whole file (*whole; nullopt returned). nullopt and *whole empty
// when it cannot be opened here (the whole read reports why).
Result<std::optional<format::Manifest>> ReadManifestParts(FileSystem* fs, const std::string& mpath,
                                                          const ShardFilter& only,
                                                          uint64_t* file_bytes,
                                                          std::string* whole) {
  Result<std::unique_ptr<RandomAccessFile>> f =
      fs->NewRandomAccessFile(mpath, {.random_access = true});
  if (!f.ok() || (*f)->size() < format::kManifestHeaderBytes)
    return std::optional<format::Manifest>();
  const RandomAccessFile& file = **f;
  std::string head(format::kManifestHeaderBytes, '\0');
  SP_RETURN_IF_ERROR(file.ReadAt(0, Writable(head)));
  SP_ASSIGN_OR_RETURN(uint64_t head_bytes, format::IndexedHeadBytes(head, mpath));
  if (head_bytes == 0 || head_bytes > file.size()) {
    if (file.size() > WholeCap(head)) {
      return ResourceExhaustedError(
          fmt::format("read {}: file is {} bytes, larger than the limit of {} bytes", mpath,
                      file.size(), WholeCap(head)));
    }
    whole->assign(file.size(), '\0');
    SP_RETURN_IF_ERROR(file.ReadAt(0, Writable(*whole)));
    return std::optional<format::Manifest>();
  }
  head.resize(head_bytes);  // the head after the header
  SP_RETURN_IF_ERROR(file.ReadAt(format::kManifestHeaderBytes,
                                 Writable(head).subspan(format::kManifestHeaderBytes)));
  SP_ASSIGN_OR_RETURN(format::ManifestHead h, format::DecodeManifestHead(head, file.size(), mpath));
  std::vector<std::pair<size_t, const std::vector<format::Box>*>> wanted;
  std::vector<std::string> sections;
  std::vector<ReadOp> ops;
  const auto& tensors = h.manifest.tensors;
  for (const auto& [name, boxes] : only) {
    auto it = std::lower_bound(
        tensors.begin(), tensors.end(), name,
        [](const format::TensorRecord& t, const std::string& n) { return t.name < n; });
    if (it == tensors.end() || it->name != name) continue;  // the caller names what is missing
    const size_t i = static_cast<size_t>(it - tensors.begin());
    wanted.emplace_back(i, boxes.empty() ? nullptr : &boxes);
    sections.emplace_back(h.sections[i].bytes, '\0');
  }
  for (size_t k = 0; k < wanted.size(); ++k) {
    ops.push_back({h.sections[wanted[k].first].offset, Writable(sections[k])});
  }
  SP_RETURN_IF_ERROR(file.ReadAtMany(ops));
  for (size_t k = 0; k < wanted.size(); ++k) {
    SP_RETURN_IF_ERROR(
        format::DecodeTensorSection(sections[k], &h, wanted[k].first, wanted[k].second, mpath));
  }
  *file_bytes = file.size();
  return std::optional<format::Manifest>(std::move(h.manifest));
}

// MANIFEST whole, at most WholeCap bytes (a larger file's header is read to find its version).
Result<std::string> ReadManifestWhole(FileSystem* fs, const std::string& mpath) {
  Result<std::string> bytes = fs->ReadFile(mpath, WholeCap({}));
  if (bytes.ok() || bytes.status().code() != StatusCode::kResourceExhausted) return bytes;
  SP_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> f, fs->NewRandomAccessFile(mpath, {}));
  std::string header(format::kManifestHeaderBytes, '\0');
  SP_RETURN_IF_ERROR(f->ReadAt(0, Writable(header)));
  if (WholeCap(header) == WholeCap({})) return bytes;
  return fs->ReadFile(mpath, WholeCap(header));
}

}  // namespace

Result<std::unique_ptr<Reader>> Reader::OpenImpl(const std::string& path, const LoadOptions& o,
                                                 const IoOptions& io, const ShardFilter* only) {
  SP_RETURN_IF_ERROR(ValidateIoOptions(io, fmt::format("open checkpoint {}", path)));
  SP_RETURN_IF_ERROR(RefuseTopology(o.topology, "open checkpoint " + path, "LoadOptions"));
  if (o.format != Format::kAuto && o.format != Format::kNative) {
    return InvalidArgumentError(fmt::format(
        "open checkpoint {}: LoadOptions.format = {}: this call reads native checkpoints (Load and "
        "Verify read the other formats)",
        path, FormatName(o.format)));
  }
  std::unique_ptr<Reader> r(new Reader());
  r->fs_ = FileSystemOf(io);
  r->options_ = o;
  r->io_ = io;
  r->path_ = path;
  std::string mpath = JoinPath(path, format::kManifestFileName);
  std::string whole;
  if (only != nullptr) {
    uint64_t file_bytes = 0;
    SP_ASSIGN_OR_RETURN(std::optional<format::Manifest> m,
                        ReadManifestParts(r->fs_, mpath, *only, &file_bytes, &whole));
    if (m.has_value()) {
      r->m_ = std::move(*m);
      SP_RETURN_IF_ERROR(r->Unlock({}, mpath));  // (not encrypted: refuses a key)
      r->Index(file_bytes);
      return r;
    }
  }
  Result<std::string> bytes =
      whole.empty() ? ReadManifestWhole(r->fs_, mpath) : Result<std::string>(std::move(whole));
  if (!bytes.ok()) {
    if (bytes.status().code() == StatusCode::kNotFound) {
      return NotFoundError(
          fmt::format("{}: not a committed checkpoint (no {})", path, format::kManifestFileName));
    }
    return bytes.status().WithContext(fmt::format("checkpoint {}", path));
  }
  SP_ASSIGN_OR_RETURN(r->m_, format::DecodeManifest(*bytes, mpath));
  SP_RETURN_IF_ERROR(r->Unlock(*bytes, mpath));
  r->Index(bytes->size());
  return r;
}

void Reader::Index(uint64_t manifest_bytes) {
  total_bytes_ = manifest_bytes;
  for (const auto& f : m_.files) total_bytes_ += f.bytes;
  for (const auto& t : m_.tensors) infos_.push_back(Describe(t));
  files_.resize(m_.files.size());
  maps_.resize(m_.files.size());
}

Status Reader::Unlock(std::string_view bytes, const std::string& mpath) {
  const EncryptionKey& key = options_.key;
  if (!m_.encryption.enabled) {
    if (!key) return Status::OK();
    return InvalidArgumentError(fmt::format(
        "checkpoint {} is not encrypted, but LoadOptions.key is set ({}): refused, so that an "
        "unencrypted checkpoint cannot stand in for an encrypted one (load it without a key)",
        path_, key.Describe()));
  }
  if (!key) return Status::OK();  // the manifest can be listed; CheckReadable refuses reads
  Result<SecretBytes> user = format::ResolveUserKey(key, fs_, "LoadOptions.key");
  if (!user.ok()) return user.status().WithContext(fmt::format("checkpoint {}", path_));
  SP_ASSIGN_OR_RETURN(format::CheckpointKeys k,
                      format::CheckpointKeys::Derive(*user, m_.encryption.salt));
  if (!k.MatchesKeyCheck(m_.encryption.key_check)) {
    return UnauthenticatedError(fmt::format(
        "checkpoint {}: wrong key: LoadOptions.key ({}) is not the key it was encrypted with (the "
        "manifest's key check differs)",
        path_, key.Describe()));
  }
  SP_RETURN_IF_ERROR(format::AuthenticateManifest(bytes, m_, k, mpath));
  keys_ = std::move(k);
  return Status::OK();
}

Status Reader::CheckReadable() const {
  if (!m_.encryption.enabled || keys_.has_value()) return Status::OK();
  return InvalidArgumentError(
      fmt::format("checkpoint {} is encrypted: pass LoadOptions::key", path_));
}

Status Reader::Unseal(const format::TensorRecord& t, const format::ShardRecord& s, uint64_t chunk,
                      std::byte* in, std::byte* out) const {
  const uint64_t cb = m_.chunk_bytes;
  const uint64_t stored = format::ChunkStoredLen(s, chunk, cb);
  if (!keys_.has_value()) {
    if (out != nullptr && out != in) std::memcpy(out, in, stored);
    return Status::OK();
  }
  format::ChunkIdentity id;
  id.checkpoint_id = m_.checkpoint_id;
  id.file = s.file;
  id.offset = format::ChunkOffset(s, chunk, cb);
  id.tensor = t.name;
  id.box = s.offsets;
  id.chunk = chunk;
  id.raw_bytes = format::ChunkLen(s.bytes, chunk, cb);
  id.stored_bytes = stored;
  id.compressed = s.compressed() && s.stored[chunk].compressed;
  Status st = keys_->Open(id, {in, stored}, s.tags[chunk], {out != nullptr ? out : in, stored});
  if (st.ok()) return st;
  return UnauthenticatedError(fmt::format(
      "{}: AES-GCM authentication failed: the chunk was modified, moved, or copied from another "
      "checkpoint",
      ChunkWhere(t, s, chunk)));
}

int64_t Reader::IndexOf(std::string_view name) const {
  auto it = std::lower_bound(m_.tensors.begin(), m_.tensors.end(), name,
                             [](const auto& t, std::string_view n) { return t.name < n; });
  return it != m_.tensors.end() && it->name == name ? it - m_.tensors.begin() : -1;
}

const TensorInfo* Reader::FindTensor(const std::string& name) const {
  int64_t i = IndexOf(name);
  return i < 0 ? nullptr : &infos_[i];
}

// Opens data file `index` once, checking its header and size against the manifest.
Result<RandomAccessFile*> Reader::File(uint32_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  if (files_[index]) return files_[index].get();
  const format::FileRecord& rec = m_.files[index];
  std::string fpath = JoinPath(path_, rec.name);
  SP_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> f,
                      fs_->NewRandomAccessFile(fpath, FileOptions{.direct_io = io_.direct_io}));
  if (f->size() < rec.bytes) return Truncated(index, f->size(), "");
  SP_ASSIGN_OR_RETURN(Tensor header,
                      Tensor::Empty(DType::kU8, {int64_t(format::kDataHeaderBytes)}));
  SP_RETURN_IF_ERROR(f->ReadAt(0, {header.data(), format::kDataHeaderBytes}));
  SP_RETURN_IF_ERROR(format::CheckDataHeader(
      std::string_view(reinterpret_cast<const char*>(header.data()), format::kDataHeaderBytes),
      m_.checkpoint_id, index, m_.version, fpath));
  spdlog::debug("savepoint: reading {} ({})", fpath, f->direct() ? "O_DIRECT" : "buffered");
  files_[index] = std::move(f);
  return files_[index].get();
}

Status Reader::OpenFilesOf(const std::vector<bool>& keep) {
  std::vector<bool> opened(m_.files.size(), false);
  for (size_t i = 0; i < keep.size() && i < m_.tensors.size(); ++i) {
    if (!keep[i]) continue;
    for (const format::ShardRecord& s : m_.tensors[i].shards) {
      if (opened[s.file]) continue;
      SP_RETURN_IF_ERROR(OpenFile(s.file));
      opened[s.file] = true;
    }
  }
  return Status::OK();
}

std::string Reader::ChunkWhere(const format::TensorRecord& t, const format::ShardRecord& s,
                               uint64_t chunk) const {
  return fmt::format("checkpoint {}: {}", path_, ChunkDesc(t, s, chunk));
}

std::string Reader::ChunkDesc(const format::TensorRecord& t, const format::ShardRecord& s,
                              uint64_t chunk) const {
  bool compressed = s.compressed() && s.stored[chunk].compressed;
  return fmt::format("tensor {:?} chunk {} (file {} offset {}, {} bytes{})", t.name, chunk,
                     m_.files[s.file].name, format::ChunkOffset(s, chunk, m_.chunk_bytes),
                     format::ChunkStoredLen(s, chunk, m_.chunk_bytes),
                     compressed ? fmt::format(", {}-compressed", codec::CodecName(s.codec)) : "");
}

Status Reader::Truncated(uint32_t index, uint64_t size, std::string_view how) const {
  std::string lost;
  uint64_t lost_offset = UINT64_MAX;
  for (const auto& t : m_.tensors) {
    for (const auto& s : t.shards) {
      if (s.file != index) continue;
      for (uint64_t c = 0; c < s.crc32c.size(); ++c) {  // chunks of a shard ascend in the file
        uint64_t off = format::ChunkOffset(s, c, m_.chunk_bytes);
        if (off + format::ChunkStoredLen(s, c, m_.chunk_bytes) <= size) continue;
        if (off < lost_offset) {
          lost_offset = off;
          lost = ChunkDesc(t, s, c);
        }
        break;
      }
    }
  }
  return CorruptionError(
      fmt::format("checkpoint {}: data file {} is truncated: {} bytes{}, manifest says {}{}", path_,
                  m_.files[index].name, size, how, m_.files[index].bytes,
                  lost.empty() ? std::string() : "; first chunk lost: " + lost));
}

Status Reader::CheckChunk(const format::TensorRecord& t, const format::ShardRecord& s,
                          uint64_t chunk, std::span<const std::byte> bytes) const {
  uint32_t crc = Crc32c(bytes);
  if (crc == s.crc32c[chunk]) return Status::OK();
  return CorruptionError(fmt::format("{}: CRC32C mismatch (stored {:08x}, computed {:08x})",
                                     ChunkWhere(t, s, chunk), s.crc32c[chunk], crc));
}

// Allocates `*t` with at least `bytes` bytes (4 KiB-aligned) unless it has them.
static Status Ensure(Tensor* t, uint64_t bytes) {
  if (t->data() != nullptr && t->capacity() >= bytes) return Status::OK();
  SP_ASSIGN_OR_RETURN(*t, Tensor::Empty(DType::kU8, {static_cast<int64_t>(bytes)}));
  return Status::OK();
}

// Staging holds one chunk and, for a direct read of a chunk that does not start at a 4 KiB
// boundary (version 2 packs small extents at 64 bytes), the rest of the blocks around it.
static uint64_t StagingBytes(uint64_t chunk_bytes) { return chunk_bytes + kAlignment; }

Status Reader::ReadCompressedChunk(const Task& t, Buffers* b, bool verify) {
  const format::ShardRecord& s = *t.shard;
  const format::StoredChunk& sc = s.stored[t.chunk];
  SP_ASSIGN_OR_RETURN(RandomAccessFile * f, File(s.file));
  SP_RETURN_IF_ERROR(Ensure(&b->staging, StagingBytes(m_.chunk_bytes)));
  // sc.bytes <= the chunk's raw size <= chunk_bytes (checked by the decoder), so this fits.
  Status st = f->ReadAt(sc.offset, {b->staging.data(), f->direct() ? AlignUp(sc.bytes) : sc.bytes});
  if (!st.ok()) return st.WithContext(ChunkWhere(*t.tensor, s, t.chunk));
  std::span<const std::byte> stored(b->staging.data(), sc.bytes);
  if (verify) SP_RETURN_IF_ERROR(CheckChunk(*t.tensor, s, t.chunk, stored));
  // Compressed, then encrypted: decrypt in place (authenticating also when only verifying).
  SP_RETURN_IF_ERROR(Unseal(*t.tensor, s, t.chunk, b->staging.data(), b->staging.data()));
  if (t.dst.data == nullptr) return Status::OK();
  const uint64_t len = format::ChunkLen(s.bytes, t.chunk, m_.chunk_bytes);
  const size_t elem = DTypeSize(t.tensor->dtype);
  const bool shuffle = s.filter == codec::Filter::kShuffle && elem > 1;
  if (shuffle) SP_RETURN_IF_ERROR(Ensure(&b->scratch, m_.chunk_bytes));
  Status d = codec::DecompressChunk({s.codec, s.filter, 1}, elem, stored, {t.dst.data, len},
                                    {b->scratch.data(), shuffle ? len : 0});
  if (!d.ok()) return d.WithContext(ChunkWhere(*t.tensor, s, t.chunk));
  return Status::OK();
}

Status Reader::ReadChunk(const Task& t, Buffers* b, bool verify) {
  const format::ShardRecord& s = *t.shard;
  if (s.compressed() && s.stored[t.chunk].compressed) return ReadCompressedChunk(t, b, verify);
  uint64_t len = format::ChunkLen(s.bytes, t.chunk, m_.chunk_bytes);
  uint64_t off = format::ChunkOffset(s, t.chunk, m_.chunk_bytes);
  SP_ASSIGN_OR_RETURN(RandomAccessFile * f, File(s.file));
  std::byte* out = t.dst.data;
  Status st;
  if (out != nullptr && DirectRead(t, f)) {
    st = f->ReadAt(off, {out, f->direct() ? AlignUp(len) : len});
    if (!st.ok()) return st.WithContext(ChunkWhere(*t.tensor, s, t.chunk));
    if (verify) SP_RETURN_IF_ERROR(CheckChunk(*t.tensor, s, t.chunk, {out, len}));
    return Unseal(*t.tensor, s, t.chunk, out, out);
  }
  // Through staging: a direct read covers the 4 KiB blocks holding the chunk (at most
  // StagingBytes, as the chunk is at most chunk_bytes long).
  SP_RETURN_IF_ERROR(Ensure(&b->staging, StagingBytes(m_.chunk_bytes)));
  const uint64_t from = f->direct() ? format::AlignDown(off) : off;
  const uint64_t to = f->direct() ? AlignUp(off + len) : off + len;
  st = f->ReadAt(from, {b->staging.data(), to - from});
  if (!st.ok()) return st.WithContext(ChunkWhere(*t.tensor, s, t.chunk));
  std::byte* bytes = b->staging.data() + (off - from);
  if (verify) SP_RETURN_IF_ERROR(CheckChunk(*t.tensor, s, t.chunk, {bytes, len}));
  return Unseal(*t.tensor, s, t.chunk, bytes, out);
}

// A chunk that can be read straight into its destination, with the whole read in one op: in
// direct mode, the chunk must start at a 4 KiB boundary and the destination be aligned and hold
// the read rounded up to whole blocks.
bool Reader::DirectRead(const Task& t, const RandomAccessFile* f) const {
  const format::ShardRecord& s = *t.shard;
  if (t.dst.data == nullptr || (s.compressed() && s.stored[t.chunk].compressed)) return false;
  uint64_t len = format::ChunkLen(s.bytes, t.chunk, m_.chunk_bytes);
  uint64_t off = format::ChunkOffset(s, t.chunk, m_.chunk_bytes);
  bool aligned = reinterpret_cast<uintptr_t>(t.dst.data) % kAlignment == 0;
  return !f->direct() || (aligned && off % kAlignment == 0 && AlignUp(len) <= t.dst.capacity);
}

bool Reader::InRegion(const Task& t) {
  const format::ShardRecord& s = *t.shard;
  return !s.compressed() && s.bytes > 0 && s.bytes < format::kPackBelowBytes;
}

void Reader::TakeRegions(std::vector<Task>* tasks, std::vector<Region>* regions) const {
  std::vector<Task> small, rest;
  for (const Task& t : *tasks) (InRegion(t) ? small : rest).push_back(t);
  if (small.empty()) return;
  const uint64_t cb = m_.chunk_bytes;
  auto offset = [&](const Task& t) { return format::ChunkOffset(*t.shard, t.chunk, cb); };
  std::sort(small.begin(), small.end(), [&](const Task& a, const Task& b) {
    return std::make_pair(a.shard->file, offset(a)) < std::make_pair(b.shard->file, offset(b));
  });
  for (const Task& t : small) {
    const uint64_t off = offset(t), end = off + format::ChunkLen(t.shard->bytes, t.chunk, cb);
    Region* r = regions->empty() ? nullptr : &regions->back();
    // Extents never overlap (the decoder checks), so off >= r->end within one file.
    bool joins = r != nullptr && r->file == t.shard->file && off >= r->end &&
                 off - r->end <= kRegionGapBytes &&
                 AlignUp(end) - format::AlignDown(r->begin) <= kRegionBytes;
    if (!joins) r = &regions->emplace_back(Region{t.shard->file, off, end, {}});
    r->end = end;
    r->tasks.push_back(t);
  }
  *tasks = std::move(rest);
}

Status Reader::ReadRegion(const Region& r, Buffers* b, bool verify) {
  SP_ASSIGN_OR_RETURN(RandomAccessFile * f, File(r.file));
  // A region of one chunk spans less than kPackBelowBytes + 8 KiB; of several, kRegionBytes.
  SP_RETURN_IF_ERROR(Ensure(&b->region, kRegionBytes));
  const uint64_t from = f->direct() ? format::AlignDown(r.begin) : r.begin;
  const uint64_t to = f->direct() ? AlignUp(r.end) : r.end;
  if (!f->ReadAt(from, {b->region.data(), to - from}).ok()) {
    // Name the failing chunk exactly: read the region's chunks again one at a time.
    for (const Task& t : r.tasks) SP_RETURN_IF_ERROR(ReadChunk(t, b, verify));
    return Status::OK();
  }
  for (const Task& t : r.tasks) {
    const format::ShardRecord& s = *t.shard;
    const uint64_t len = format::ChunkLen(s.bytes, t.chunk, m_.chunk_bytes);
    std::byte* bytes = b->region.data() + (format::ChunkOffset(s, t.chunk, m_.chunk_bytes) - from);
    if (verify) SP_RETURN_IF_ERROR(CheckChunk(*t.tensor, s, t.chunk, {bytes, len}));
    SP_RETURN_IF_ERROR(Unseal(*t.tensor, s, t.chunk, bytes, t.dst.data));
  }
  return Status::OK();
}

// Reads a run of direct-read chunks of one file with one batched submission (io_uring where
// available), then checks their CRC32Cs. If the batch fails, the chunks are read again one by one
// so that the error names the failing chunk.
Status Reader::ReadDirectBatch(std::span<const Task> run, RandomAccessFile* f, Buffers* b,
                               bool verify) {
  std::vector<ReadOp> ops;
  ops.reserve(run.size());
  for (const Task& t : run) {
    uint64_t len = format::ChunkLen(t.shard->bytes, t.chunk, m_.chunk_bytes);
    ops.push_back({format::ChunkOffset(*t.shard, t.chunk, m_.chunk_bytes),
                   {t.dst.data, f->direct() ? AlignUp(len) : len}});
  }
  if (!f->ReadAtMany(ops).ok()) {
    // Name the failing chunk exactly: read the run again one chunk at a time.
    for (const Task& t : run) SP_RETURN_IF_ERROR(ReadChunk(t, b, verify));
    return Status::OK();
  }
  for (const Task& t : run) {
    uint64_t len = format::ChunkLen(t.shard->bytes, t.chunk, m_.chunk_bytes);
    if (verify) SP_RETURN_IF_ERROR(CheckChunk(*t.tensor, *t.shard, t.chunk, {t.dst.data, len}));
    SP_RETURN_IF_ERROR(Unseal(*t.tensor, *t.shard, t.chunk, t.dst.data, t.dst.data));
  }
  return Status::OK();
}

// Groups tasks into runs: up to ReadBatchChunks() consecutive direct-read chunks of one data file,
// or one other chunk. Opens (and checks) the data files it needs.
Result<std::vector<std::pair<size_t, size_t>>> Reader::ReadRuns(const std::vector<Task>& tasks) {
  const size_t batch = ReadBatchChunks(m_.chunk_bytes);
  std::vector<std::pair<size_t, size_t>> runs;
  for (size_t i = 0; i < tasks.size();) {
    SP_ASSIGN_OR_RETURN(RandomAccessFile * f, File(tasks[i].shard->file));
    size_t end = i + 1;
    if (DirectRead(tasks[i], f)) {
      while (end < tasks.size() && end - i < batch &&
             tasks[end].shard->file == tasks[i].shard->file && DirectRead(tasks[end], f)) {
        ++end;
      }
    }
    runs.emplace_back(i, end);
    i = end;
  }
  return runs;
}

Status Reader::ReadShardChunk(size_t tensor, size_t shard, uint64_t chunk, Destination dst,
                              Buffers* b, bool verify) {
  SP_RETURN_IF_ERROR(CheckReadable());
  const format::TensorRecord& t = m_.tensors[tensor];
  return ReadChunk(Task{&t, &t.shards[shard], chunk, dst}, b, verify);
}

Status Reader::ReadShardChunks(size_t tensor, size_t shard, uint64_t first, uint64_t count,
                               Destination dst, Buffers* b, bool verify) {
  SP_RETURN_IF_ERROR(CheckReadable());
  const format::TensorRecord& t = m_.tensors[tensor];
  std::vector<Task> run;
  run.reserve(count);
  for (uint64_t c = first; c < first + count; ++c) {
    uint64_t pos = (c - first) * m_.chunk_bytes;
    run.push_back({&t, &t.shards[shard], c, {dst.data + pos, dst.capacity - pos}});
  }
  SP_ASSIGN_OR_RETURN(RandomAccessFile * f, File(t.shards[shard].file));
  if (std::all_of(run.begin(), run.end(), [&](const Task& k) { return DirectRead(k, f); })) {
    return ReadDirectBatch(run, f, b, verify);
  }
  for (const Task& k : run) SP_RETURN_IF_ERROR(ReadChunk(k, b, verify));
  return Status::OK();
}

Status Reader::AddTasks(size_t ti, Destination dst, std::vector<Task>* tasks,
                        std::vector<Scatter>* scatter) {
  const format::TensorRecord& t = m_.tensors[ti];
  for (const auto& s : t.shards) {
    Destination base = dst;
    if (dst.data != nullptr && s.sizes != t.shape) {  // a box of the tensor: read, then scatter
      SP_ASSIGN_OR_RETURN(Tensor buf, Tensor::Empty(t.dtype, s.sizes));
      base = Destination{buf.data(), buf.capacity()};
      scatter->push_back({std::move(buf), &t, &s, dst});
    }
    for (uint64_t c = 0; c < s.crc32c.size(); ++c) {
      uint64_t pos = c * m_.chunk_bytes;
      Destination d =
          base.data == nullptr ? base : Destination{base.data + pos, base.capacity - pos};
      tasks->push_back({&t, &s, c, d});
    }
  }
  return Status::OK();
}

Status Reader::ReadMany(const std::vector<std::pair<size_t, Destination>>& jobs, LoadStats* stats,
                        bool verify, Progress* progress) {
  SP_RETURN_IF_ERROR(CheckReadable());
  auto start = std::chrono::steady_clock::now();
  std::vector<Task> tasks;
  std::vector<Scatter> scatter;
  for (const auto& [ti, dst] : jobs) SP_RETURN_IF_ERROR(AddTasks(ti, dst, &tasks, &scatter));
  const uint64_t chunks = tasks.size();
  auto raw_bytes = [&](std::span<const Task> ts) {
    uint64_t n = 0;
    for (const Task& t : ts) n += format::ChunkLen(t.shard->bytes, t.chunk, m_.chunk_bytes);
    return n;
  };
  Progress own(options_.progress, options_.progress ? raw_bytes(tasks) : 0);
  Progress* p = progress != nullptr ? progress : &own;
  std::vector<Region> regions;
  TakeRegions(&tasks, &regions);
  std::vector<Buffers> buffers(io_.io_threads);
  SP_ASSIGN_OR_RETURN(auto runs, ReadRuns(tasks));
  const size_t work = regions.size() + runs.size();
  auto read = [&](size_t r, int w) -> Status {
    if (r < regions.size()) return ReadRegion(regions[r], &buffers[w], verify);
    const auto [begin, end] = runs[r - regions.size()];
    SP_ASSIGN_OR_RETURN(RandomAccessFile * f, File(tasks[begin].shard->file));
    if (!DirectRead(tasks[begin], f)) return ReadChunk(tasks[begin], &buffers[w], verify);
    return ReadDirectBatch({tasks.data() + begin, end - begin}, f, &buffers[w], verify);
  };
  SP_RETURN_IF_ERROR(ParallelFor(work, io_.io_threads, [&](size_t r, int w) -> Status {
    SP_RETURN_IF_ERROR(read(r, w));
    if (!p->enabled()) return Status::OK();
    if (r < regions.size()) {
      p->Add(raw_bytes(regions[r].tasks));
    } else {
      const auto [begin, end] = runs[r - regions.size()];
      p->Add(raw_bytes({tasks.data() + begin, end - begin}));
    }
    return Status::OK();
  }));
  if (p == &own) own.Finish();
  for (const Scatter& sc : scatter) {
    const Shape origin(sc.shard->sizes.size(), 0);
    CopyRegion({sc.buffer.data(), sc.shard->sizes, origin, 0},
               {sc.dst.data, sc.tensor->shape, sc.shard->offsets, 0}, sc.shard->sizes,
               DTypeSize(sc.tensor->dtype));
  }
  if (stats != nullptr) {
    *stats = LoadStats{0, chunks, 0, false, 0};
    stats->direct_io = AnyFileDirect();
    for (const auto& [ti, dst] : jobs) {
      stats->bytes += infos_[ti].nbytes;
      stats->stored_bytes += infos_[ti].stored_bytes;
    }
    stats->seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return Status::OK();
}

Status Reader::ReadTensor(const std::string& name, const TensorView& dst) {
  int64_t i = IndexOf(name);
  if (i < 0) return NotFoundError(fmt::format("checkpoint {}: no tensor {:?}", path_, name));
  const TensorInfo& info = infos_[i];
  if (info.dtype != dst.dtype() || info.shape != dst.shape()) {
    return InvalidArgumentError(
        fmt::format("checkpoint {}: tensor {:?} is {} {}, destination is {} {}", path_, name,
                    DTypeName(info.dtype), ShapeToString(info.shape), DTypeName(dst.dtype()),
                    ShapeToString(dst.shape())));
  }
  SP_RETURN_IF_ERROR(dst.Validate());
  return ReadMany({{static_cast<size_t>(i), Destination{dst.data(), dst.nbytes()}}}, nullptr,
                  options_.verify_checksums);
}

Result<Tensor> Reader::ReadTensor(const std::string& name) {
  const TensorInfo* info = FindTensor(name);
  if (info == nullptr)
    return NotFoundError(fmt::format("checkpoint {}: no tensor {:?}", path_, name));
  SP_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(info->dtype, info->shape));
  SP_RETURN_IF_ERROR(
      ReadMany({{static_cast<size_t>(info - infos_.data()), Destination{t.data(), t.capacity()}}},
               nullptr, options_.verify_checksums));
  return t;
}

bool Reader::AnyFileDirect() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& f : files_) {
    if (f != nullptr && f->direct()) return true;
  }
  return false;
}

Status Reader::Verify(LoadStats* stats) {
  for (uint32_t f = 0; f < m_.files.size(); ++f) SP_RETURN_IF_ERROR(File(f).status());
  std::vector<std::pair<size_t, Destination>> jobs;
  for (size_t i = 0; i < m_.tensors.size(); ++i) jobs.emplace_back(i, Destination{});
  return ReadMany(jobs, stats, /*verify=*/true);
}

}  // namespace savepoint::engine
