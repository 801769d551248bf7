// Reading MindSpore's encrypted block framing, and the CBC MAC sidecar (interop/ckpt_cipher.h).
#include "interop/ckpt_cipher.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "format/endian.h"
#include "format/file_magic.h"
#include "interop/ckpt_wire.h"

namespace savepoint::interop::ckpt {
namespace {

using crypto::Bytes;

constexpr uint32_t kMagicGcm = format::kMindSporeMagicGcm;
constexpr uint32_t kMagicCbc = format::kMindSporeMagicCbc;
constexpr uint32_t kMagicSm4 = format::kMindSporeMagicSm4;
constexpr uint64_t kIvBytes = 16;
constexpr char kMacInfo[] = "savepoint .ckpt block MAC v1";
constexpr uint64_t kMaxSidecarBytes = uint64_t{16} << 20;
constexpr char kSidecarFormat[] = "savepoint.ckpt.mac";
constexpr uint32_t kLastBlockBit = uint32_t{1} << 31;

std::optional<MindSporeCipher> ModeOfMagic(uint32_t magic) {
  switch (magic) {
    case kMagicGcm:
      return MindSporeCipher::kAesGcm;
    case kMagicCbc:
      return MindSporeCipher::kAesCbc;
    case kMagicSm4:
      return MindSporeCipher::kSm4Cbc;
  }
  return std::nullopt;
}

crypto::CbcCipher CbcOf(MindSporeCipher mode) {
  return mode == MindSporeCipher::kSm4Cbc ? crypto::CbcCipher::kSm4 : crypto::CbcCipher::kAes;
}

Bytes Nonce(const CipherBlock& b) { return Bytes(b.iv).first(crypto::kGcmNonceBytes); }

Result<std::string> ReadString(const RandomAccessFile& file, uint64_t offset, uint64_t n) {
  std::string s(n, '\0');
  SP_RETURN_IF_ERROR(file.ReadAt(offset, std::as_writable_bytes(std::span(s))));
  return s;
}

// The header of the block at `at`; Corruption naming it.
Status ReadHeader(const RandomAccessFile& file, const std::string& path, MindSporeCipher mode,
                  size_t i, uint64_t at, CipherBlock* b) {
  auto bad = [&](const std::string& why) {
    return CorruptionError(
        fmt::format("MindSpore checkpoint {}: encrypted block {} (file offset "
                    "{}): {}",
                    path, i, at, why));
  };
  const uint64_t header = CipherHeaderBytes(mode);
  if (file.size() - at < header) return bad("the file ends inside the block header");
  SP_ASSIGN_OR_RETURN(std::string h, ReadString(file, at, header));
  const uint32_t magic = format::GetU32(h, 0);
  if (magic != CipherMagic(mode)) {
    const std::optional<MindSporeCipher> other = ModeOfMagic(magic);
    return bad(other ? fmt::format("the block is {}, the file's first block {}",
                                   MindSporeCipherName(*other), MindSporeCipherName(mode))
                     : fmt::format("bad magic {:#010x}", magic));
  }
  size_t p = 4;
  if (mode == MindSporeCipher::kAesGcm) {
    std::memcpy(b->tag.data(), h.data() + p, crypto::kGcmTagBytes);
    p += crypto::kGcmTagBytes;
  }
  const uint32_t block_len = format::GetU32(h, p), iv_len = format::GetU32(h, p + 4);
  std::memcpy(b->iv.data(), h.data() + p + 8, kIvBytes);
  const uint32_t cipher_len = format::GetU32(h, p + 8 + kIvBytes);
  if (iv_len != kIvBytes) return bad(fmt::format("IV length {}, expected 16", iv_len));
  if (uint64_t{block_len} != 4 + kIvBytes + 4 + cipher_len) {
    return bad(fmt::format("block length {} does not match the ciphertext length {} (+24)",
                           block_len, cipher_len));
  }
  if (cipher_len == 0 || cipher_len > kMaxCipherTextBytes) {
    return bad(
        fmt::format("ciphertext length {} outside [1, {}]", cipher_len, kMaxCipherTextBytes));
  }
  if (mode != MindSporeCipher::kAesGcm && cipher_len % crypto::kCbcBlockBytes != 0) {
    return bad(fmt::format("CBC ciphertext length {} is not a multiple of 16", cipher_len));
  }
  if (file.size() - at - header < cipher_len) {
    return bad(fmt::format("the block is cut short: {} ciphertext bytes declared, {} left",
                           cipher_len, file.size() - at - header));
  }
  b->file_offset = at;
  b->cipher_offset = at + header;
  b->cipher_bytes = cipher_len;
  b->disk_bytes = header + cipher_len;
  return Status::OK();
}

// The plaintext size of a CBC block: its last cipher block decrypted, the padding checked.
Result<uint64_t> CbcPlainBytes(const RandomAccessFile& file, const CipherBlock& b,
                               MindSporeCipher mode, Bytes key) {
  const uint64_t n = b.cipher_bytes;
  std::array<std::byte, 32> two{};
  std::array<std::byte, 16> last{};
  if (n == 16) {
    std::memcpy(two.data(), b.iv.data(), 16);
    SP_RETURN_IF_ERROR(file.ReadAt(b.cipher_offset, std::span(two).subspan(16)));
  } else {
    SP_RETURN_IF_ERROR(file.ReadAt(b.cipher_offset + n - 32, std::span(two)));
  }
  SP_RETURN_IF_ERROR(crypto::CbcDecryptRaw(CbcOf(mode), key, Bytes(two).first(16),
                                           Bytes(two).subspan(16), std::span(last)));
  const auto pad = static_cast<uint8_t>(last[15]);
  bool ok = pad >= 1 && pad <= 16;
  for (int k = 16 - pad; ok && k < 16; ++k) ok = static_cast<uint8_t>(last[k]) == pad;
  if (!ok) {
    return UnauthenticatedError(
        fmt::format("{} padding is invalid after decryption (wrong key, or the data changed)",
                    MindSporeCipherName(mode)));
  }
  return n - pad;
}

// The index word of an AES-GCM nonce (bytes 8..11, big-endian).
uint32_t NonceWord(const CipherBlock& b) {
  uint32_t v = 0;
  for (int k = 8; k < 12; ++k) v = (v << 8) | static_cast<uint8_t>(b.iv[k]);
  return v;
}

bool SameFileId(const CipherBlock& a, const CipherBlock& b) {
  return std::memcmp(a.iv.data(), b.iv.data(), 8) == 0;
}

// Whether the AES-GCM blocks carry savepoint's sequenced nonces: a block whose index word is its
// position (a random nonce does so with probability 2^-31), or two blocks sharing a file id
// (2^-64). Then every block must be in sequence.
Status CheckSequence(CipherIndex* index, const std::string& path) {
  const auto& blocks = index->blocks;
  const size_t n = blocks.size();
  bool ours = false;
  for (size_t i = 0; i < n && !ours; ++i) {
    ours =
        (NonceWord(blocks[i]) & ~kLastBlockBit) == i || (i > 0 && SameFileId(blocks[i], blocks[0]));
  }
  if (!ours) return Status::OK();
  index->sequenced = true;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t w = NonceWord(blocks[i]);
    const bool same_file = SameFileId(blocks[i], blocks[0]);
    if (same_file && w == SequenceWord(i, n)) continue;
    const std::string says = !same_file
                                 ? "comes from another file"
                                 : fmt::format("is block {}{} of its file", w & ~kLastBlockBit,
                                               (w & kLastBlockBit) != 0 ? " (the last)" : "");
    return UnauthenticatedError(fmt::format(
        "{}: out of sequence: it {} (blocks were reordered, dropped or mixed in from another "
        "file)",
        BlockContext(path, *index, i), says));
  }
  return Status::OK();
}

}  // namespace

uint32_t SequenceWord(size_t i, size_t n) {
  return static_cast<uint32_t>(i) | (i + 1 == n ? kLastBlockBit : 0);
}

uint32_t CipherMagic(MindSporeCipher mode) {
  switch (mode) {
    case MindSporeCipher::kAesGcm:
      return kMagicGcm;
    case MindSporeCipher::kAesCbc:
      return kMagicCbc;
    case MindSporeCipher::kSm4Cbc:
      return kMagicSm4;
  }
  return 0;
}

uint64_t CipherHeaderBytes(MindSporeCipher mode) {
  return mode == MindSporeCipher::kAesGcm ? 48 : 32;
}

uint64_t CipherTextBytes(MindSporeCipher mode, uint64_t plain_bytes) {
  return mode == MindSporeCipher::kAesGcm ? plain_bytes : crypto::CbcPaddedSize(plain_bytes);
}

uint64_t EncryptedFileBytes(MindSporeCipher mode, uint64_t plain_bytes) {
  const uint64_t blocks = (plain_bytes + kCipherBlockBytes - 1) / kCipherBlockBytes;
  uint64_t total = 0;
  for (uint64_t i = 0; i < blocks; ++i) {
    const uint64_t n = std::min(kCipherBlockBytes, plain_bytes - i * kCipherBlockBytes);
    total += CipherHeaderBytes(mode) + CipherTextBytes(mode, n);
  }
  return total;
}

Status CheckCipherKey(MindSporeCipher mode, size_t key_bytes, const EncryptionKey& key) {
  const bool sm4 = mode == MindSporeCipher::kSm4Cbc;
  const bool ok = sm4 ? key_bytes == 16 : (key_bytes == 16 || key_bytes == 24 || key_bytes == 32);
  if (ok) return Status::OK();
  return InvalidArgumentError(fmt::format("{}: {} needs a key of {} bytes, the key has {}",
                                          key.Describe(), MindSporeCipherName(mode),
                                          sm4 ? "16" : "16, 24 or 32", key_bytes));
}

Result<std::optional<MindSporeCipher>> SniffCipher(const RandomAccessFile& file) {
  if (file.size() < 4) return std::optional<MindSporeCipher>();
  SP_ASSIGN_OR_RETURN(std::string m, ReadString(file, 0, 4));
  return ModeOfMagic(format::GetU32(m, 0));
}

std::string BlockContext(const std::string& path, const CipherIndex& index, size_t i) {
  return fmt::format("MindSpore checkpoint {}: encrypted block {} of {} (file offset {})", path, i,
                     index.blocks.size(), index.blocks[i].file_offset);
}

Result<CipherIndex> IndexCipherBlocks(const RandomAccessFile& file, const std::string& path,
                                      MindSporeCipher mode, Bytes key) {
  CipherIndex index;
  index.mode = mode;
  const uint64_t size = file.size();
  uint64_t at = 0;
  while (at < size) {
    if (size - at == kCrcTrailerBytes && !index.blocks.empty()) {
      SP_ASSIGN_OR_RETURN(std::string t, ReadString(file, at, kCrcMagicBytes));
      if (t == kCrcMagic) {
        index.outer_crc_trailer = true;
        break;
      }
    }
    if (index.blocks.size() >= kMaxValues) {
      return CorruptionError(
          fmt::format("MindSpore checkpoint {}: more than {} encrypted blocks", path, kMaxValues));
    }
    CipherBlock b;
    SP_RETURN_IF_ERROR(ReadHeader(file, path, mode, index.blocks.size(), at, &b));
    b.plain_offset = index.plain_bytes;
    b.plain_bytes = b.cipher_bytes;
    index.blocks.push_back(b);
    if (mode != MindSporeCipher::kAesGcm && !key.empty()) {  // (without a key: sizes only)
      Result<uint64_t> n = CbcPlainBytes(file, b, mode, key);
      if (!n.ok())
        return n.status().WithContext(BlockContext(path, index, index.blocks.size() - 1));
      index.blocks.back().plain_bytes = *n;
    }
    index.plain_bytes += index.blocks.back().plain_bytes;
    index.max_disk_bytes = std::max(index.max_disk_bytes, b.disk_bytes);
    at += b.disk_bytes;
  }
  if (index.blocks.empty()) {
    return CorruptionError(fmt::format("MindSpore checkpoint {}: no encrypted blocks", path));
  }
  if (mode == MindSporeCipher::kAesGcm) SP_RETURN_IF_ERROR(CheckSequence(&index, path));
  return index;
}

PlaintextView::PlaintextView(const RandomAccessFile& file, const CipherIndex& index, Bytes key)
    : file_(file), index_(index), key_(key), seen_(index.blocks.size()) {}

Status PlaintextView::ReadBlockRange(size_t i, uint64_t begin, std::span<std::byte> dst) const {
  const CipherBlock& b = index_.blocks[i];
  if (index_.mode == MindSporeCipher::kAesGcm) {
    SP_RETURN_IF_ERROR(file_.ReadAt(b.cipher_offset + begin, dst));
    return crypto::GcmDecryptRange(key_, Nonce(b), begin, dst, dst);
  }
  // CBC: whole cipher blocks from the one holding `begin`, chained from the one before it.
  const uint64_t lo = begin / 16 * 16;
  const uint64_t hi = (begin + dst.size() + 15) / 16 * 16;
  std::vector<std::byte> buf(hi - lo + 16);
  if (lo == 0) {
    std::memcpy(buf.data(), b.iv.data(), 16);
    SP_RETURN_IF_ERROR(file_.ReadAt(b.cipher_offset, std::span(buf).subspan(16)));
  } else {
    SP_RETURN_IF_ERROR(file_.ReadAt(b.cipher_offset + lo - 16, std::span(buf)));
  }
  std::vector<std::byte> plain(hi - lo);
  SP_RETURN_IF_ERROR(crypto::CbcDecryptRaw(CbcOf(index_.mode), key_, Bytes(buf).first(16),
                                           Bytes(buf).subspan(16), std::span(plain)));
  std::memcpy(dst.data(), plain.data() + (begin - lo), dst.size());
  return Status::OK();
}

Status PlaintextView::ReadAt(uint64_t offset, std::span<std::byte> dst) const {
  if (offset > size() || dst.size() > size() - offset) {
    return OutOfRangeError(
        fmt::format("{}: read of {} bytes at plaintext offset {} past its {} "
                    "bytes",
                    path(), dst.size(), offset, size()));
  }
  // The first block ending after `offset`.
  auto it = std::upper_bound(
      index_.blocks.begin(), index_.blocks.end(), offset,
      [](uint64_t o, const CipherBlock& b) { return o < b.plain_offset + b.plain_bytes; });
  uint64_t done = 0;
  for (; done < dst.size(); ++it) {
    const size_t i = static_cast<size_t>(it - index_.blocks.begin());
    const uint64_t begin = offset + done - it->plain_offset;
    const uint64_t n = std::min<uint64_t>(dst.size() - done, it->plain_bytes - begin);
    std::span<std::byte> part = dst.subspan(done, n);
    SP_RETURN_IF_ERROR(ReadBlockRange(i, begin, part));
    const Seen seen{begin, n, crypto::Sha256Of(part)};
    std::lock_guard<std::mutex> lock(mu_);
    seen_[i].push_back(seen);
    done += n;
  }
  return Status::OK();
}

Status PlaintextView::Verify(size_t i, std::span<const std::span<std::byte>> plain,
                             const std::string& path) const {
  std::vector<Seen> seen;
  {
    std::lock_guard<std::mutex> lock(mu_);
    seen = seen_[i];
  }
  for (const Seen& s : seen) {
    // The parts of the pieces that hold [s.begin, s.begin + s.bytes).
    std::vector<Bytes> parts;
    uint64_t at = 0, got = 0;
    for (std::span<std::byte> p : plain) {
      const uint64_t lo = std::max(at, s.begin), hi = std::min(at + p.size(), s.begin + s.bytes);
      if (lo < hi) {
        parts.push_back(Bytes(p).subspan(lo - at, hi - lo));
        got += hi - lo;
      }
      at += p.size();
    }
    if (got != s.bytes || crypto::Sha256Of(parts) != s.digest) {
      return UnauthenticatedError(fmt::format(
          "{}: the structure read before authentication differs from the authenticated block "
          "(the file changed while it was read)",
          BlockContext(path, index_, i)));
    }
  }
  return Status::OK();
}

namespace {

// The block's plaintext [begin, begin + place.size()) as pieces: the parts of `reads` in their
// buffers, the rest in `place`.
OpenedBlock Scatter(std::span<const Read> reads, uint64_t begin, std::span<std::byte> place) {
  OpenedBlock out;
  const uint64_t end = begin + place.size();
  auto it = std::partition_point(reads.begin(), reads.end(),
                                 [&](const Read& r) { return r.offset + r.bytes <= begin; });
  uint64_t at = begin;
  for (; it != reads.end() && it->offset < end; ++it) {
    const uint64_t lo = std::max(begin, it->offset), hi = std::min(end, it->offset + it->bytes);
    if (lo > at) out.pieces.push_back(place.subspan(at - begin, lo - at));
    out.pieces.push_back(std::span<std::byte>(it->dst + (lo - it->offset), hi - lo));
    out.read_bytes += hi - lo;
    at = hi;
  }
  if (at < end) out.pieces.push_back(place.subspan(at - begin, end - at));
  return out;
}

}  // namespace

Result<OpenedBlock> OpenBlock(const CipherIndex& index, size_t i, Bytes key,
                              std::span<std::byte> disk, std::span<const Read> reads,
                              const std::string& path) {
  const CipherBlock& b = index.blocks[i];
  std::span<std::byte> cipher = disk.subspan(b.cipher_offset - b.file_offset, b.cipher_bytes);
  if (index.mode == MindSporeCipher::kAesGcm) {
    OpenedBlock out = Scatter(reads, b.plain_offset, cipher);
    const std::vector<crypto::MutableBytes> outs(out.pieces.begin(), out.pieces.end());
    Status s = crypto::GcmOpen(key, Nonce(b), {}, cipher, b.tag, outs);
    if (!s.ok()) return s.WithContext(BlockContext(path, index, i));
    return out;
  }
  Result<uint64_t> n = crypto::CbcDecrypt(CbcOf(index.mode), key, b.iv, cipher, cipher);
  if (!n.ok()) return n.status().WithContext(BlockContext(path, index, i));
  if (*n != b.plain_bytes) {
    return UnauthenticatedError(fmt::format("{}: the padding changed while the file was read",
                                            BlockContext(path, index, i)));
  }
  std::span<std::byte> plain = cipher.first(*n);
  OpenedBlock out = Scatter(reads, b.plain_offset, plain);
  uint64_t at = 0;  // the pieces are consecutive: copy the reads' parts out of the block
  for (std::span<std::byte> p : out.pieces) {
    if (p.data() != plain.data() + at) std::memcpy(p.data(), plain.data() + at, p.size());
    at += p.size();
  }
  return out;
}

Result<crypto::Sha256> CbcMacKey(Bytes key) {
  crypto::Sha256 out{};
  SP_RETURN_IF_ERROR(
      crypto::HkdfSha256(key, {}, std::as_bytes(std::span(kMacInfo, sizeof(kMacInfo) - 1)), out));
  return out;
}

crypto::Sha256 BlockMac(const crypto::Sha256& mac_key, uint64_t i, uint64_t file_bytes,
                        Bytes disk) {
  std::string prefix(16, '\0');
  format::PutU64(&prefix, 0, i);
  format::PutU64(&prefix, 8, file_bytes);
  const Bytes parts[] = {crypto::AsBytes(prefix), disk};
  return crypto::HmacSha256(mac_key, parts);
}

std::string MacSidecarPath(const std::string& path) { return path + ".mac"; }

namespace {

Status SidecarError(const std::string& side, std::string_view why) {
  return CorruptionError(fmt::format("MAC sidecar {}: {}", side, why));
}

// A member a sidecar must have, and the type it must be of.
struct SidecarField {
  const char* name;
  bool (nlohmann::json::*is_type)() const noexcept;
  const char* type;
};
constexpr SidecarField kSidecarFields[] = {
    {"format", &nlohmann::json::is_string, "a string"},
    {"version", &nlohmann::json::is_number_integer, "an integer"},
    {"cipher", &nlohmann::json::is_string, "a string"},
    {"file_bytes", &nlohmann::json::is_number_unsigned, "a non-negative integer"},
    {"blocks", &nlohmann::json::is_array, "an array"},
};

// OK if the parsed sidecar `j` is a savepoint MAC sidecar of version 1 whose members are of
// their types; Corruption naming the sidecar `side` and the first member that is not.
Status CheckSidecarFields(const nlohmann::json& j, const std::string& side) {
  const auto bad = [&](std::string_view why) { return SidecarError(side, why); };
  if (!j.is_object()) return bad("not a JSON object");
  for (const SidecarField& f : kSidecarFields) {
    auto it = j.find(f.name);
    if (it == j.end() || !((*it).*f.is_type)()) {
      return bad(fmt::format("field {:?} is missing or not {}", f.name, f.type));
    }
  }
  if (j["format"] != kSidecarFormat || j["version"] != 1) {
    return bad(fmt::format("not a {} sidecar of version 1", kSidecarFormat));
  }
  return Status::OK();
}

}  // namespace

std::string EncodeMacSidecar(MindSporeCipher mode, uint64_t file_bytes,
                             const std::vector<crypto::Sha256>& macs) {
  nlohmann::json j;
  j["format"] = kSidecarFormat;
  j["version"] = 1;
  j["cipher"] = std::string(MindSporeCipherName(mode));
  j["mac"] = "HMAC-SHA256";
  j["file_bytes"] = file_bytes;
  nlohmann::json blocks = nlohmann::json::array();
  for (const crypto::Sha256& m : macs) blocks.push_back(crypto::Hex(m));
  j["blocks"] = std::move(blocks);
  return j.dump(1) + "\n";
}

Result<std::optional<std::vector<crypto::Sha256>>> ReadMacSidecar(FileSystem* fs,
                                                                  const std::string& path,
                                                                  const CipherIndex& index,
                                                                  uint64_t file_bytes) {
  using Out = std::optional<std::vector<crypto::Sha256>>;
  const std::string side = MacSidecarPath(path);
  Result<FileInfo> st = fs->Stat(side);
  if (!st.ok() && st.status().code() == StatusCode::kNotFound) return Out();
  SP_RETURN_IF_ERROR(st.status());
  const auto bad = [&](std::string_view why) { return SidecarError(side, why); };
  SP_ASSIGN_OR_RETURN(auto f, fs->NewRandomAccessFile(side, {}));
  if (f->size() > kMaxSidecarBytes) return bad("larger than 16 MiB");
  SP_ASSIGN_OR_RETURN(std::string text, ReadString(*f, 0, f->size()));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  SP_RETURN_IF_ERROR(CheckSidecarFields(j, side));
  if (j["cipher"].get_ref<const std::string&>() != MindSporeCipherName(index.mode) ||
      j["file_bytes"].get<uint64_t>() != file_bytes || j["blocks"].size() != index.blocks.size()) {
    return UnauthenticatedError(fmt::format(
        "MAC sidecar {} describes another file (cipher, size or block count differ from {}: "
        "{} bytes, {} blocks)",
        side, path, file_bytes, index.blocks.size()));
  }
  std::vector<crypto::Sha256> macs;
  for (const nlohmann::json& b : j["blocks"]) {
    Result<std::string> raw =
        b.is_string() ? crypto::Unhex(b.get<std::string>()) : Result<std::string>(bad("bad MAC"));
    if (!raw.ok() || raw->size() != crypto::kSha256Bytes)
      return bad("a block MAC is not 32 hex bytes");
    crypto::Sha256 m{};
    std::memcpy(m.data(), raw->data(), m.size());
    macs.push_back(m);
  }
  return Out(std::move(macs));
}

}  // namespace savepoint::interop::ckpt
