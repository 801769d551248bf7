// Writing MindSpore's encrypted block framing (interop/ckpt_cipher.h): WriteEncryptedLayout.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <memory>

#include "format/endian.h"
#include "interop/ckpt_cipher.h"
#include "io/direct_file.h"
#include "savepoint/tensor.h"
#include "util/parallel.h"

namespace savepoint::interop::ckpt {
namespace {

// Where block i of the plaintext goes.
struct OutBlock {
  uint64_t plain_offset = 0;
  uint64_t plain_bytes = 0;
  uint64_t disk_offset = 0;
  uint64_t disk_bytes = 0;
};

std::vector<OutBlock> PlanBlocks(MindSporeCipher mode, uint64_t plain_bytes) {
  std::vector<OutBlock> out;
  uint64_t disk = 0;
  for (uint64_t at = 0; at < plain_bytes; at += kCipherBlockBytes) {
    const uint64_t n = std::min(kCipherBlockBytes, plain_bytes - at);
    const uint64_t d = CipherHeaderBytes(mode) + CipherTextBytes(mode, n);
    out.push_back({at, n, disk, d});
    disk += d;
  }
  return out;
}

// Gathers block `b` (`i` of `n`)'s plaintext into its place in `dst` (header + ciphertext,
// dst.size() == b.disk_bytes) and encrypts it there; returns the payload bytes it holds. The IV is
// random; an AES-GCM nonce is then the file's id and the block's sequence word (SequenceWord).
Result<uint64_t> SealBlock(const ByteLayout& layout, const EncryptSpec& spec, const OutBlock& b,
                           size_t i, size_t n, const std::array<std::byte, 8>& file_id,
                           std::span<std::byte> dst) {
  const uint64_t header = CipherHeaderBytes(spec.mode);
  std::span<std::byte> body = dst.subspan(header);
  const uint64_t payload = layout.Gather(b.plain_offset, body.first(b.plain_bytes));
  std::array<std::byte, 16> iv{};
  SP_RETURN_IF_ERROR(crypto::RandomBytes(iv));
  if (spec.mode == MindSporeCipher::kAesGcm) {
    std::memcpy(iv.data(), file_id.data(), file_id.size());
    const uint32_t w = SequenceWord(i, n);
    for (int k = 0; k < 4; ++k) iv[11 - k] = static_cast<std::byte>(w >> (8 * k));
  }
  std::string h(header, '\0');
  format::PutU32(&h, 0, CipherMagic(spec.mode));
  size_t p = 4;
  const crypto::Bytes plain = body.first(b.plain_bytes);
  if (spec.mode == MindSporeCipher::kAesGcm) {
    SP_ASSIGN_OR_RETURN(crypto::GcmTag tag,
                        crypto::GcmSeal(spec.key, crypto::Bytes(iv).first(crypto::kGcmNonceBytes),
                                        {}, plain, body));
    std::memcpy(h.data() + p, tag.data(), tag.size());
    p += tag.size();
  } else {
    const auto cipher =
        spec.mode == MindSporeCipher::kSm4Cbc ? crypto::CbcCipher::kSm4 : crypto::CbcCipher::kAes;
    SP_RETURN_IF_ERROR(
        crypto::CbcEncrypt(cipher, spec.key, iv, std::span<const crypto::Bytes>(&plain, 1), body));
  }
  const uint64_t cipher_len = b.disk_bytes - header;
  format::PutU32(&h, p, static_cast<uint32_t>(4 + 16 + 4 + cipher_len));
  format::PutU32(&h, p + 4, 16);
  std::memcpy(h.data() + p + 8, iv.data(), iv.size());
  format::PutU32(&h, p + 24, static_cast<uint32_t>(cipher_len));
  std::memcpy(dst.data(), h.data(), header);
  return payload;
}

// Writes `buf` at `offset` in parallel pieces of kLayoutPieceBytes.
Status WriteOut(io::DirectFile* f, uint64_t offset, std::span<const std::byte> buf, int threads) {
  const uint64_t pieces = (buf.size() + kLayoutPieceBytes - 1) / kLayoutPieceBytes;
  return ParallelFor(pieces, threads, [&](size_t i, int) {
    const uint64_t at = i * kLayoutPieceBytes;
    return f->WriteAt(offset + at, buf.subspan(at, std::min(kLayoutPieceBytes, buf.size() - at)));
  });
}

}  // namespace

Status WriteEncryptedLayout(const IoOptions& io, const std::string& path, const ByteLayout& layout,
                            const EncryptSpec& spec, Progress* progress, bool* direct) {
  const std::vector<OutBlock> blocks = PlanBlocks(spec.mode, layout.size());
  const uint64_t total = blocks.empty() ? 0 : blocks.back().disk_offset + blocks.back().disk_bytes;
  SP_ASSIGN_OR_RETURN(io::DirectFile f,
                      io::DirectFile::Create(FileSystemOf(io), path, io.direct_io, total));
  *direct = f.direct();
  // Waves of blocks encrypted side by side into one of two aligned buffers, after the `carry`
  // bytes the previous wave left (less than a 4 KiB block); while a wave is written from the
  // aligned file offset `at` (in the background), the next one is encrypted into the other
  // buffer. Memory: two buffers of `wave` blocks.
  const size_t wave = static_cast<size_t>(std::max(1, (io.io_threads + 1) / 2));
  const uint64_t most =
      CipherHeaderBytes(spec.mode) + CipherTextBytes(spec.mode, kCipherBlockBytes);
  std::array<Tensor, 2> staging;
  for (Tensor& t : staging) {
    SP_ASSIGN_OR_RETURN(
        t, Tensor::Empty(DType::kU8, {static_cast<int64_t>(kDirectIOAlignment + wave * most)}));
  }
  if (spec.macs != nullptr) spec.macs->assign(blocks.size(), {});
  std::array<std::byte, 8> file_id{};
  SP_RETURN_IF_ERROR(crypto::RandomBytes(file_id));
  uint64_t at = 0, carry = 0;
  std::future<Status> writing;
  auto wait = [&writing]() { return writing.valid() ? writing.get() : Status::OK(); };
  for (size_t first = 0, w = 0; first < blocks.size(); first += wave, w ^= 1) {
    std::span<std::byte> buf(staging[w].data(), staging[w].nbytes());
    const size_t last = std::min(blocks.size(), first + wave);
    const uint64_t base = blocks[first].disk_offset;
    Status sealed = ParallelFor(last - first, io.io_threads, [&](size_t k, int) -> Status {
      const OutBlock& b = blocks[first + k];
      std::span<std::byte> dst = buf.subspan(carry + (b.disk_offset - base), b.disk_bytes);
      SP_ASSIGN_OR_RETURN(uint64_t payload,
                          SealBlock(layout, spec, b, first + k, blocks.size(), file_id, dst));
      if (spec.macs != nullptr) {
        (*spec.macs)[first + k] = BlockMac(spec.mac_key, first + k, total, dst);
      }
      if (progress != nullptr) progress->Add(payload);
      return Status::OK();
    });
    Status written = wait();
    SP_RETURN_IF_ERROR(written);
    SP_RETURN_IF_ERROR(sealed);
    const uint64_t end =
        carry + (blocks[last - 1].disk_offset + blocks[last - 1].disk_bytes - base);
    const uint64_t n = last == blocks.size() ? end : end / kDirectIOAlignment * kDirectIOAlignment;
    // The unaligned rest starts the other buffer; this one is written meanwhile.
    carry = end - n;
    std::memcpy(staging[w ^ 1].data(), buf.data() + n, carry);
    writing = std::async(std::launch::async, [&, offset = at, bytes = buf.first(n)] {
      return WriteOut(&f, offset, bytes, io.io_threads);
    });
    at += n;
  }
  SP_RETURN_IF_ERROR(wait());
  return f.Finish();
}

}  // namespace savepoint::interop::ckpt
