// SaveMindSporeCheckpoint, LoadMindSporeCheckpoint, InspectMindSporeCheckpoint
// (savepoint/mindspore.h) on top of the wire format of interop/ckpt_wire.h.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>

#include "engine/paths.h"
#include "engine/select.h"
#include "interop/byte_layout.h"
#include "interop/ckpt_cipher.h"
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

// The authenticated pass over an encrypted file: every block read whole, checked against its
// sidecar MAC (CBC with a sidecar), decrypted and authenticated, the ranges the scan read checked,
// then the planned reads copied out of its plaintext and, up to crc_end, its CRC taken.
struct DecryptPass {
  const RandomAccessFile* file = nullptr;
  const interop::ckpt::CipherIndex* index = nullptr;
  crypto::Bytes key;
  const std::vector<crypto::Sha256>* macs = nullptr;  // sidecar MACs, or null
  crypto::Sha256 mac_key{};
  const interop::ckpt::PlaintextView* view = nullptr;
  std::vector<interop::ckpt::Read> reads = {};  // sorted by offset, not overlapping
  uint64_t crc_end = 0;                         // 0: no CRC
  Progress* progress = nullptr;
  std::string path = {};
};

Status RunDecryptPass(const DecryptPass& p, int threads, uint32_t* crc) {
  const auto& blocks = p.index->blocks;
  std::vector<uint32_t> crcs(blocks.size(), 0);
  std::vector<std::unique_ptr<std::byte[]>> bufs(threads);
  SP_RETURN_IF_ERROR(ParallelFor(blocks.size(), threads, [&](size_t i, int w) -> Status {
    const interop::ckpt::CipherBlock& b = blocks[i];
    if (!bufs[w]) bufs[w] = std::make_unique_for_overwrite<std::byte[]>(p.index->max_disk_bytes);
    std::span<std::byte> disk(bufs[w].get(), b.disk_bytes);
    const std::string where = interop::ckpt::BlockContext(p.path, *p.index, i);
    SP_RETURN_IF_ERROR(p.file->ReadAt(b.file_offset, disk).WithContext(where));
    if (p.macs != nullptr &&
        interop::ckpt::BlockMac(p.mac_key, i, p.file->size(), disk) != (*p.macs)[i]) {
      return UnauthenticatedError(fmt::format(
          "{}: its HMAC-SHA256 does not match the one in {} (the block was changed, moved or "
          "replaced, or the key is wrong)",
          where, interop::ckpt::MacSidecarPath(p.path)));
    }
    SP_ASSIGN_OR_RETURN(interop::ckpt::OpenedBlock plain,
                        interop::ckpt::OpenBlock(*p.index, i, p.key, disk, p.reads, p.path));
    SP_RETURN_IF_ERROR(p.view->Verify(i, plain.pieces, p.path));
    if (p.progress != nullptr) p.progress->Add(plain.read_bytes);
    uint64_t at = b.plain_offset;  // the CRC of the pieces before crc_end, in order
    for (std::span<const std::byte> piece : plain.pieces) {
      if (at >= p.crc_end) break;
      const uint64_t n = std::min<uint64_t>(piece.size(), p.crc_end - at);
      crcs[i] = interop::Crc32Zlib(crcs[i], piece.first(n));
      at += n;
    }
    return Status::OK();
  }));
  if (crc == nullptr) return Status::OK();
  *crc = 0;
  for (size_t i = 0; i < blocks.size() && blocks[i].plain_offset < p.crc_end; ++i) {
    *crc = interop::Crc32ZlibCombine(
        *crc, crcs[i], std::min(blocks[i].plain_bytes, p.crc_end - blocks[i].plain_offset));
  }
  return Status::OK();
}

Status CheckCrc(const Scan& scan, uint32_t crc, const std::string& path) {
  if (crc == scan.stored_crc) return Status::OK();
  return CorruptionError(fmt::format(
      "MindSpore checkpoint {}: CRC-32 mismatch: the trailer says {}, the {} bytes before it "
      "give {} (the file was changed or damaged after it was written)",
      path, scan.stored_crc, scan.payload_end, crc));
}

// The key of an encrypted file, checked against its mode and the options.
Result<SecretBytes> DecryptionKey(MindSporeCipher mode, const MindSporeLoadOptions& options,
                                  FileSystem* fs, const std::string& path) {
  const std::string_view name = MindSporeCipherName(mode);
  if (!options.dec_key) {
    return InvalidArgumentError(fmt::format(
        "MindSpore checkpoint {} is encrypted ({}): pass its key (dec_key)", path, name));
  }
  if (options.dec_mode && *options.dec_mode != mode) {
    return InvalidArgumentError(
        fmt::format("MindSpore checkpoint {} is encrypted with {}, but dec_mode is {}", path, name,
                    MindSporeCipherName(*options.dec_mode)));
  }
  SP_ASSIGN_OR_RETURN(SecretBytes key, options.dec_key.Resolve(fs));
  SP_RETURN_IF_ERROR(interop::ckpt::CheckCipherKey(mode, key.size(), options.dec_key)
                         .WithContext(fmt::format("MindSpore checkpoint {}", path)));
  return key;
}

Result<State> LoadEncrypted(const RandomAccessFile& file, MindSporeCipher mode,
                            const std::string& path, const MindSporeLoadOptions& options,
                            const IoOptions& io, std::chrono::steady_clock::time_point start) {
  FileSystem* fs = FileSystemOf(io);
  SP_ASSIGN_OR_RETURN(SecretBytes key, DecryptionKey(mode, options, fs, path));
  SP_ASSIGN_OR_RETURN(interop::ckpt::CipherIndex index,
                      interop::ckpt::IndexCipherBlocks(file, path, mode, key.bytes()));
  interop::ckpt::PlaintextView view(file, index, key.bytes());
  DecryptPass pass{.file = &file, .index = &index, .key = key.bytes(), .view = &view, .path = path};
  std::optional<std::vector<crypto::Sha256>> macs;
  if (mode != MindSporeCipher::kAesGcm) {
    SP_ASSIGN_OR_RETURN(macs, interop::ckpt::ReadMacSidecar(fs, path, index, file.size()));
    SP_ASSIGN_OR_RETURN(pass.mac_key, interop::ckpt::CbcMacKey(key.bytes()));
    if (macs) pass.macs = &*macs;
  }
  // The structure is read before the blocks are authenticated: when it does not parse, a wrong
  // key or a modified block is the likelier cause, and the authenticated pass says which.
  // Without authentication (CBC without a sidecar) a wrong key and a changed file look alike.
  auto explain = [&](const Status& s) {
    Status auth = RunDecryptPass(pass, io.io_threads, nullptr);
    if (!auth.ok()) return auth;
    if (mode == MindSporeCipher::kAesGcm || pass.macs != nullptr) return s;
    return UnauthenticatedError(fmt::format(
        "MindSpore checkpoint {}: the decrypted file is not a valid checkpoint ({}): the key is "
        "wrong or the file was changed ({} is not authenticated, so the two look alike)",
        path, s.message(), MindSporeCipherName(mode)));
  };
  Result<Scan> scan = interop::ckpt::ScanFile(view, path);
  if (!scan.ok()) return explain(scan.status());
  Result<interop::ckpt::LoadPlan> plan = interop::ckpt::PlanLoad(*scan, view, options.names, path);
  if (!plan.ok()) return explain(plan.status());
  Status s = interop::ckpt::FinishLoad(view, path, &*plan);
  if (!s.ok()) return explain(s);
  pass.reads = plan->reads;
  std::sort(pass.reads.begin(), pass.reads.end(),
            [](const auto& a, const auto& b) { return a.offset < b.offset; });
  const bool check = scan->has_crc && options.crc_check;
  pass.crc_end = check ? scan->payload_end : 0;
  Progress progress(options.progress, plan->tensor_bytes);
  pass.progress = &progress;
  uint32_t crc = 0;
  SP_RETURN_IF_ERROR(RunDecryptPass(pass, io.io_threads, check ? &crc : nullptr));
  if (check) SP_RETURN_IF_ERROR(CheckCrc(*scan, crc, path));
  progress.Finish();
  if (options.stats != nullptr) {
    *options.stats = LoadStats{plan->tensor_bytes, 0, SecondsSince(start), false, file.size()};
  }
  return std::move(plan->state);
}

}  // namespace

Result<State> LoadMindSporeCheckpoint(const std::string& path, const MindSporeLoadOptions& options,
                                      const IoOptions& io) {
  const auto start = std::chrono::steady_clock::now();
  SP_RETURN_IF_ERROR(ValidateIoOptions(io, fmt::format("load MindSpore checkpoint {}", path)));
  SP_ASSIGN_OR_RETURN(auto file, FileSystemOf(io)->NewRandomAccessFile(path, {}));
  SP_ASSIGN_OR_RETURN(std::optional<MindSporeCipher> mode, interop::ckpt::SniffCipher(*file));
  if (mode) return LoadEncrypted(*file, *mode, path, options, io, start);
  if (options.dec_key) {
    return InvalidArgumentError(fmt::format(
        "MindSpore checkpoint {} is not encrypted, but a key was given (dec_key)", path));
  }
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
  if (check) SP_RETURN_IF_ERROR(CheckCrc(scan, crc, path));
  SP_RETURN_IF_ERROR(interop::ckpt::FinishLoad(*file, path, &plan));
  progress.Finish();
  if (options.stats != nullptr) {
    *options.stats = LoadStats{plan.tensor_bytes, 0, SecondsSince(start), false, plan.tensor_bytes};
  }
  return std::move(plan.state);
}

std::string_view MindSporeCipherName(MindSporeCipher cipher) {
  switch (cipher) {
    case MindSporeCipher::kAesGcm:
      return "AES-GCM";
    case MindSporeCipher::kAesCbc:
      return "AES-CBC";
    case MindSporeCipher::kSm4Cbc:
      return "SM4-CBC";
  }
  return "?";
}

Result<MindSporeCipher> ParseMindSporeCipher(std::string_view name) {
  std::string upper(name);
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  for (auto c : {MindSporeCipher::kAesGcm, MindSporeCipher::kAesCbc, MindSporeCipher::kSm4Cbc}) {
    if (upper == MindSporeCipherName(c)) return c;
  }
  return InvalidArgumentError(
      fmt::format("unknown MindSpore cipher {:?}: use AES-GCM, AES-CBC or SM4-CBC", name));
}

namespace {

// Removes `path` if it exists.
Status RemoveIfPresent(FileSystem* fs, const std::string& path) {
  Status s = fs->RemoveFile(path);
  return s.code() == StatusCode::kNotFound ? Status::OK() : s;
}

// Commits `layout` encrypted at `target` (options.enc_key set), with the sidecar MACs of a CBC
// file committed after it (a stale sidecar is removed first, so a crash in between leaves a file
// without one, never one that contradicts it).
Status CommitEncrypted(const IoOptions& io, const std::string& target,
                       const interop::ByteLayout& layout, interop::CommitFileOptions o,
                       const MindSporeSaveOptions& options, const std::string& context,
                       std::chrono::steady_clock::time_point start) {
  FileSystem* fs = FileSystemOf(io);
  SP_ASSIGN_OR_RETURN(SecretBytes key, options.enc_key.Resolve(fs));
  SP_RETURN_IF_ERROR(interop::ckpt::CheckCipherKey(options.enc_mode, key.size(), options.enc_key)
                         .WithContext(context));
  if (o.trailer) o.trailer(layout.Crc32(o.crc_end, io.io_threads));  // inside the plaintext
  o.crc_end = 0;
  o.trailer = nullptr;
  const bool cbc = options.enc_mode != MindSporeCipher::kAesGcm;
  std::vector<crypto::Sha256> macs;
  interop::ckpt::EncryptSpec spec{.mode = options.enc_mode, .key = key.bytes()};
  if (cbc) {
    spec.macs = &macs;
    SP_ASSIGN_OR_RETURN(spec.mac_key, interop::ckpt::CbcMacKey(key.bytes()));
  }
  o.write = [&](const IoOptions& wio, const std::string& tmp, Progress* progress, bool* direct) {
    return interop::ckpt::WriteEncryptedLayout(wio, tmp, layout, spec, progress, direct);
  };
  const std::string sidecar = interop::ckpt::MacSidecarPath(target);
  if (options.overwrite) SP_RETURN_IF_ERROR(RemoveIfPresent(fs, sidecar).WithContext(context));
  SP_RETURN_IF_ERROR(interop::CommitFile(io, target, layout, o, context, start));
  if (!cbc) return Status::OK();
  interop::ByteLayout mac;
  mac.AddOwned(interop::ckpt::EncodeMacSidecar(
      options.enc_mode, interop::ckpt::EncryptedFileBytes(options.enc_mode, layout.size()), macs));
  return interop::CommitFile(io, sidecar, mac, {.overwrite = true, .create_parents = false},
                             context + ": MAC sidecar", start);
}

}  // namespace

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
  if (options.enc_key) return CommitEncrypted(io, target, layout, o, options, context, start);
  return interop::CommitFile(io, target, layout, o, context, start);
}

namespace {

void ListEntries(const Scan& scan, const std::vector<interop::ckpt::Entry>& entries,
                 MindSporeCheckpointInfo* info) {
  info->has_crc = scan.has_crc;
  info->stored_crc = scan.stored_crc;
  for (const interop::ckpt::Entry& e : entries) {
    MindSporeEntryInfo ei;
    ei.name = e.name;
    ei.type = e.map ? "map" : e.values[0]->tensors[0].type;
    if (!e.map) ei.shape = Shape(e.values[0]->tensors[0].dims);
    ei.pieces = static_cast<uint32_t>(e.values.size());
    for (const auto* v : e.values) {
      for (const auto& t : v->tensors) ei.bytes += t.content_bytes;
    }
    info->entries.push_back(std::move(ei));
  }
}

Status ListEntries(const RandomAccessFile& file, const std::string& path,
                   MindSporeCheckpointInfo* info) {
  SP_ASSIGN_OR_RETURN(Scan scan, interop::ckpt::ScanFile(file, path));
  SP_ASSIGN_OR_RETURN(std::vector<interop::ckpt::Entry> entries,
                      interop::ckpt::GroupEntries(scan, path));
  ListEntries(scan, entries, info);
  return interop::ckpt::ReadSavepointEntry(file, entries, path, &info->values);
}

}  // namespace

Result<MindSporeCheckpointInfo> InspectMindSporeCheckpoint(const std::string& path, FileSystem* fs,
                                                           const EncryptionKey& dec_key) {
  fs = FileSystemOf({.fs = fs});
  SP_ASSIGN_OR_RETURN(auto file, fs->NewRandomAccessFile(path, {}));
  MindSporeCheckpointInfo info;
  info.path = path;
  info.file_bytes = file->size();
  SP_ASSIGN_OR_RETURN(std::optional<MindSporeCipher> mode, interop::ckpt::SniffCipher(*file));
  if (!mode) {
    SP_RETURN_IF_ERROR(ListEntries(*file, path, &info));
    return info;
  }
  info.cipher = MindSporeCipherName(*mode);
  SecretBytes key;
  if (dec_key) {
    SP_ASSIGN_OR_RETURN(key, DecryptionKey(*mode, {.dec_key = dec_key}, fs, path));
  }
  SP_ASSIGN_OR_RETURN(interop::ckpt::CipherIndex index,
                      interop::ckpt::IndexCipherBlocks(*file, path, *mode, key.bytes()));
  info.cipher_blocks = static_cast<uint32_t>(index.blocks.size());
  info.outer_crc_trailer = index.outer_crc_trailer;
  const std::string sidecar = interop::ckpt::MacSidecarPath(path);
  info.authentication =
      *mode != MindSporeCipher::kAesGcm
          ? (fs->Stat(sidecar).ok() ? "HMAC-SHA256 sidecar " + sidecar : "none")
          : (index.sequenced ? "AES-GCM tags and block sequence"
                             : "AES-GCM tags (block order not protected: MindSpore's random "
                               "nonces)");
  info.entries_listed = dec_key.has_value();
  if (!dec_key) return info;
  interop::ckpt::PlaintextView view(*file, index, key.bytes());
  SP_RETURN_IF_ERROR(ListEntries(view, path, &info));
  return info;
}

}  // namespace savepoint
