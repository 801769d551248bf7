// MindSpore's encrypted `.ckpt` block framing (docs/INTEROP.md, "Encrypted .ckpt files"): the
// plaintext file cut into blocks, each stored as
//   int32 magic | (AES-GCM only) 16-byte tag | int32 block_len | int32 iv_len = 16 | 16-byte IV |
//   int32 cipher_len | ciphertext
// with little-endian integers and block_len = 4 + 16 + 4 + cipher_len. AES-GCM uses the first 12
// IV bytes as its nonce and no AAD; the CBC modes pad with PKCS#7.
//
// Reading: IndexCipherBlocks reads the block headers (untrusted: every length checked);
// PlaintextView lets the `.ckpt` scanner read plaintext at any offset before the blocks are
// authenticated, and remembers a SHA-256 of every range it returned so that the load can check
// those bytes against the authenticated plaintext of each block (OpenBlock). Writing:
// WriteEncryptedLayout encrypts a ByteLayout block by block in parallel and writes it with
// O_DIRECT where possible. CBC files get an HMAC sidecar (CbcMacKey, ReadMacSidecar).
//
// Thread safety: CipherIndex is immutable after IndexCipherBlocks; PlaintextView::ReadAt and
// Verify may be called from several threads.
#ifndef SAVEPOINT_INTEROP_CKPT_CIPHER_H_
#define SAVEPOINT_INTEROP_CKPT_CIPHER_H_

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "crypto/aead.h"
#include "interop/byte_layout.h"
#include "interop/ckpt_entries.h"
#include "savepoint/filesystem.h"
#include "savepoint/mindspore.h"
#include "util/progress.h"

namespace savepoint::interop::ckpt {

// Plaintext bytes per block when writing (MindSpore's ENCRYPT_BLOCK_SIZE).
inline constexpr uint64_t kCipherBlockBytes = uint64_t{64} << 20;
// Largest ciphertext of one block a reader accepts (it is held in memory).
inline constexpr uint64_t kMaxCipherTextBytes = uint64_t{1} << 30;

uint32_t CipherMagic(MindSporeCipher mode);
// Bytes before the ciphertext: 48 (AES-GCM) or 32 (CBC).
uint64_t CipherHeaderBytes(MindSporeCipher mode);
uint64_t CipherTextBytes(MindSporeCipher mode, uint64_t plain_bytes);

// InvalidArgument unless `key_bytes` fits `mode`; names the key's source.
Status CheckCipherKey(MindSporeCipher mode, size_t key_bytes, const EncryptionKey& key);

// The mode whose magic the file starts with, or nullopt (not encrypted).
Result<std::optional<MindSporeCipher>> SniffCipher(const RandomAccessFile& file);

struct CipherBlock {
  uint64_t file_offset = 0;    // of the magic
  uint64_t disk_bytes = 0;     // header + ciphertext
  uint64_t cipher_offset = 0;  // of the ciphertext's first byte
  uint64_t cipher_bytes = 0;
  uint64_t plain_offset = 0;  // in the plaintext stream
  uint64_t plain_bytes = 0;
  std::array<std::byte, 16> iv{};
  crypto::GcmTag tag{};
};

struct CipherIndex {
  MindSporeCipher mode = MindSporeCipher::kAesGcm;
  std::vector<CipherBlock> blocks;
  uint64_t plain_bytes = 0;
  uint64_t max_disk_bytes = 0;
  bool outer_crc_trailer = false;  // MindSpore's zero CRC trailer after the blocks
  // AES-GCM files savepoint wrote: every nonce is an 8-byte file id and the block's index (with
  // the top bit set on the last block), so reordered, dropped or foreign blocks are detected.
  bool sequenced = false;
};

// Reads the block headers of `file` (named `path` in errors) encrypted with `mode` under `key`.
// For the CBC modes the last cipher block of every block is decrypted to learn its padding (a
// wrong key usually shows here). Corruption for malformed framing, naming the block;
// Unauthenticated when an AES-GCM file's nonces say savepoint wrote it (CipherIndex::sequenced)
// and its blocks are out of sequence.
Result<CipherIndex> IndexCipherBlocks(const RandomAccessFile& file, const std::string& path,
                                      MindSporeCipher mode, crypto::Bytes key);

// "MindSpore checkpoint PATH: encrypted block I of N (file offset X)".
std::string BlockContext(const std::string& path, const CipherIndex& index, size_t i);

// The plaintext of an encrypted file, decrypted on demand and not yet authenticated.
class PlaintextView : public RandomAccessFile {
 public:
  PlaintextView(const RandomAccessFile& file, const CipherIndex& index, crypto::Bytes key);
  Status ReadAt(uint64_t offset, std::span<std::byte> dst) const override;
  uint64_t size() const override { return index_.plain_bytes; }
  bool direct() const override { return false; }
  const std::string& path() const override { return file_.path(); }

  // Checks every range returned so far that lies in block `i` against the block's authenticated
  // plaintext, given as consecutive pieces. Unauthenticated when one differs (the file changed
  // while it was read).
  Status Verify(size_t i, std::span<const std::span<std::byte>> plain,
                const std::string& path) const;

 private:
  Status ReadBlockRange(size_t i, uint64_t begin, std::span<std::byte> dst) const;
  struct Seen {
    uint64_t begin = 0;  // within the block's plaintext
    uint64_t bytes = 0;
    crypto::Sha256 digest{};
  };
  const RandomAccessFile& file_;
  const CipherIndex& index_;
  crypto::Bytes key_;
  mutable std::mutex mu_;
  mutable std::vector<std::vector<Seen>> seen_;  // per block
};

// A block's plaintext after OpenBlock: consecutive pieces, in the block's buffer or in the
// buffers of the reads it holds.
struct OpenedBlock {
  std::vector<std::span<std::byte>> pieces;
  uint64_t read_bytes = 0;  // bytes of `reads` it held
};

// Decrypts block `i`: `disk` holds its on-disk bytes (header and ciphertext, as read from
// file_offset). The parts of `reads` (sorted by offset, not overlapping) that lie in the block
// receive their bytes (AES-GCM decrypts straight into them; CBC decrypts in place and copies);
// the rest of the plaintext stays in `disk`. AES-GCM authenticates, CBC checks the padding; on an
// error (naming the block) the reads' buffers may hold unauthenticated bytes.
Result<OpenedBlock> OpenBlock(const CipherIndex& index, size_t i, crypto::Bytes key,
                              std::span<std::byte> disk, std::span<const Read> reads,
                              const std::string& path);

// The key of the CBC sidecar MAC: HKDF-SHA256(key, salt "", info "savepoint .ckpt block MAC v1").
Result<crypto::Sha256> CbcMacKey(crypto::Bytes key);
// The MAC of block `i` of a file of `file_bytes` bytes: HMAC-SHA256(mac key, le64(i) ||
// le64(file_bytes) || the block's on-disk bytes).
crypto::Sha256 BlockMac(const crypto::Sha256& mac_key, uint64_t i, uint64_t file_bytes,
                        crypto::Bytes disk);
// The sidecar's name and content (JSON) for a file.
std::string MacSidecarPath(const std::string& path);
std::string EncodeMacSidecar(MindSporeCipher mode, uint64_t file_bytes,
                             const std::vector<crypto::Sha256>& macs);
// The block MACs of `path`'s sidecar, or nullopt when there is none. Corruption for a sidecar that
// does not parse or does not describe this file (mode, size, block count).
Result<std::optional<std::vector<crypto::Sha256>>> ReadMacSidecar(FileSystem* fs,
                                                                  const std::string& path,
                                                                  const CipherIndex& index,
                                                                  uint64_t file_bytes);

// How a layout is encrypted.
struct EncryptSpec {
  MindSporeCipher mode = MindSporeCipher::kAesGcm;
  crypto::Bytes key;
  // For the CBC modes: receives each block's MAC (BlockMac) under mac_key. May be null.
  std::vector<crypto::Sha256>* macs = nullptr;
  crypto::Sha256 mac_key{};
};

// The sequence word of block i of n in a savepoint AES-GCM nonce (bytes 8..11, big-endian): i,
// with the top bit set on the last block. Bytes 0..7 are a random id shared by a file's blocks.
uint32_t SequenceWord(size_t i, size_t n);

// The encrypted size of a plaintext of `plain_bytes` bytes.
uint64_t EncryptedFileBytes(MindSporeCipher mode, uint64_t plain_bytes);

// Creates `path` and writes `layout` encrypted: io.io_threads blocks at a time are gathered and
// encrypted in parallel into one aligned buffer and written (whole 4 KiB blocks with O_DIRECT
// when io.direct_io allows, the rest buffered); then synced and closed.
Status WriteEncryptedLayout(const IoOptions& io, const std::string& path, const ByteLayout& layout,
                            const EncryptSpec& spec, Progress* progress, bool* direct);

}  // namespace savepoint::interop::ckpt

#endif  // SAVEPOINT_INTEROP_CKPT_CIPHER_H_
