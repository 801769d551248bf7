// Tampering with encrypted checkpoints (docs/FORMAT.md §10), with and without compression: a
// flipped bit in a chunk's ciphertext, tag or nonce (its stored offset), swapped and reordered
// chunks, a chunk copied from another checkpoint saved with the same key, edited manifest fields
// and MAC, stripped encryption and a truncated data file. Each is detected: Corruption where the
// CRC32C of the stored bytes catches it first, Unauthenticated otherwise, naming the tensor, the
// chunk, its file and offset (or the MANIFEST for the manifest's own authentication). Changes that
// keep the manifest's MAC valid are made with the key, so that what they test is the per-chunk
// AES-GCM binding (nonce and AAD), not the MAC.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>

#include "engine/encryption_testutil.h"
#include "format/endian.h"
#include "io/mem_fs.h"
#include "testutil/testutil.h"
#include "util/crc32c.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

using Codec = Compression::Codec;
using testing::EncLoad;
using testing::EncSave;
using testing::Has;
using testing::kEncDataFile;
using testing::kKeyA;
using testing::ShardOf;

constexpr StatusCode kCorrupt = StatusCode::kCorruption;
constexpr StatusCode kUnauth = StatusCode::kUnauthenticated;

class Tamper : public ::testing::TestWithParam<Codec> {
 protected:
  void SetUp() override {
    SP_ASSERT_OK(Save(state_, "/ck", Options(), io_));
    data_ = Data("/ck");
    manifest_ = fs_.ReadFile("/ck/MANIFEST", 1 << 24).value();
    m_ = Fresh();
  }
  // A copy of the manifest as saved (a Manifest cannot be copied: it holds a State).
  format::Manifest Fresh() { return format::DecodeManifest(manifest_, "/ck/MANIFEST").value(); }
  SaveOptions Options() const {
    SaveOptions o = EncSave(kKeyA);
    o.compression.codec = GetParam();
    return o;
  }
  std::string Data(const std::string& dir) {
    return fs_.ReadFile(dir + "/" + kEncDataFile, uint64_t{1} << 30).value();
  }
  void WriteData(const std::string& d) {
    SP_ASSERT_OK(fs_.WriteFileSynced(std::string("/ck/") + kEncDataFile, d));
  }
  // Writes `m` as /ck's manifest with a valid MAC (`key`) or none ("").
  void WriteManifest(const format::Manifest& m, const std::string& key = kKeyA) {
    testing::WriteManifest(&fs_, "/ck", m, key);
  }
  Status LoadCk(bool verify) {
    LoadOptions lo = EncLoad(kKeyA);
    lo.verify_checksums = verify;
    return Load("/ck", lo, io_).status();
  }
  uint64_t Offset(format::Manifest& m, std::string_view name, uint64_t chunk) {
    return format::ChunkOffset(ShardOf(m, name), chunk, m.chunk_bytes);
  }
  uint64_t Len(format::Manifest& m, std::string_view name, uint64_t chunk) {
    return format::ChunkStoredLen(ShardOf(m, name), chunk, m.chunk_bytes);
  }
  // Expects `code` with a message naming the chunk (as the manifest `m` places it) and `what`.
  void ExpectChunk(const Status& s, StatusCode code, std::string_view name, uint64_t chunk,
                   std::string_view what, format::Manifest* m = nullptr) {
    if (m == nullptr) m = &m_;
    EXPECT_EQ(s.code(), code) << s.ToString();
    for (const std::string& needle :
         {std::string("checkpoint /ck"), fmt::format("tensor \"{}\" chunk {}", name, chunk),
          fmt::format("file {} offset {}", kEncDataFile, Offset(*m, name, chunk)),
          std::string(what)}) {
      EXPECT_TRUE(Has(s, needle)) << "lacks \"" << needle << "\": " << s.ToString();
    }
  }
  void ExpectManifestRejected(const Status& s) {
    EXPECT_EQ(s.code(), kUnauth) << s.ToString();
    EXPECT_TRUE(Has(s, "/ck/MANIFEST") && Has(s, "fails authentication")) << s.ToString();
  }
  // Moves the bytes of chunks `from[i]` of rand.f32 to where chunk i is, and (when `manifest`)
  // their CRCs and tags with them, keeping the MAC valid.
  void Permute(const std::vector<uint64_t>& from, bool manifest) {
    std::string d = data_;
    format::Manifest m = Fresh();
    format::ShardRecord& s = ShardOf(m, "rand.f32");
    const format::ShardRecord& orig = ShardOf(m_, "rand.f32");
    for (uint64_t i = 0; i < from.size(); ++i) {
      ASSERT_EQ(Len(m_, "rand.f32", i), Len(m_, "rand.f32", from[i]));
      d.replace(Offset(m_, "rand.f32", i), Len(m_, "rand.f32", i),
                data_.substr(Offset(m_, "rand.f32", from[i]), Len(m_, "rand.f32", i)));
      s.crc32c[i] = orig.crc32c[from[i]];
      s.tags[i] = orig.tags[from[i]];
    }
    WriteData(d);
    if (manifest) WriteManifest(m);
  }

  MemFileSystem fs_;
  const IoOptions io_{.fs = &fs_, .io_threads = 2};
  const State state_ = testing::EncState(21);
  std::string data_;
  std::string manifest_;
  format::Manifest m_;
};

TEST_P(Tamper, FlippedCiphertextBit) {
  std::string d = data_;
  d[Offset(m_, "rand.f32", 1) + 100] ^= 0x10;
  WriteData(d);
  ExpectChunk(LoadCk(true), kCorrupt, "rand.f32", 1, "CRC32C mismatch");
  ExpectChunk(LoadCk(false), kUnauth, "rand.f32", 1, "AES-GCM authentication failed");
  ExpectChunk(VerifyCheckpoint("/ck", EncLoad(kKeyA), io_), kCorrupt, "rand.f32", 1, "CRC32C");
  LoadOptions lo = EncLoad(kKeyA);
  lo.verify_checksums = false;
  auto reader = CheckpointReader::Open("/ck", lo, io_).value();
  ExpectChunk(reader->ReadTensor("rand.f32").status(), kUnauth, "rand.f32", 1, "AES-GCM");
  SP_EXPECT_OK(reader->ReadTensor("mid.u8").status());  // other tensors still read
}

TEST_P(Tamper, FlippedBitInPackedSmallTensor) {
  std::string d = data_;
  d[Offset(m_, "opt.bias", 0) + 3] ^= 0x01;
  WriteData(d);
  ExpectChunk(LoadCk(true), kCorrupt, "opt.bias", 0, "CRC32C mismatch");
  ExpectChunk(LoadCk(false), kUnauth, "opt.bias", 0, "AES-GCM authentication failed");
}

// Compressed saves only (instantiated with zstd below).
class TamperCompressed : public Tamper {};

TEST_P(TamperCompressed, FlippedBitInCompressedChunk) {
  const format::ShardRecord& s = ShardOf(m_, "zeros.f64");
  ASSERT_TRUE(s.compressed() && s.stored[0].compressed);
  std::string d = data_;
  d[s.stored[0].offset + s.stored[0].bytes / 2] ^= 0x20;
  WriteData(d);
  ExpectChunk(LoadCk(true), kCorrupt, "zeros.f64", 0, "zstd-compressed");
  // Authenticated before the decompressor sees it.
  ExpectChunk(LoadCk(false), kUnauth, "zeros.f64", 0, "AES-GCM authentication failed");
}

TEST_P(Tamper, FlippedTagBit) {
  format::Manifest m = Fresh();
  ShardOf(m, "rand.f32").tags[2][7] ^= std::byte{0x80};
  WriteManifest(m, "");  // without the key: the manifest no longer authenticates
  ExpectManifestRejected(LoadCk(true));
  ExpectManifestRejected(CheckpointReader::Open("/ck", EncLoad(kKeyA), io_).status());
  WriteManifest(m);  // with it: the chunk's tag no longer matches
  ExpectChunk(LoadCk(true), kUnauth, "rand.f32", 2, "AES-GCM authentication failed");
  ExpectChunk(VerifyCheckpoint("/ck", EncLoad(kKeyA), io_), kUnauth, "rand.f32", 2, "AES-GCM");
}

// The nonce is (file, stored offset): a chunk moved to another offset (its bytes, CRC and tag
// intact) no longer decrypts.
TEST_P(Tamper, ChangedNonce) {
  format::Manifest m = Fresh();
  format::ShardRecord& s = ShardOf(m, "rand.f32");
  const uint64_t from = Offset(m_, "rand.f32", 0), len = Len(m_, "rand.f32", 0);
  std::string d = data_;
  if (s.compressed()) {  // chunks stored on their own: move chunk 0 to the end of the file
    s.stored[0].offset = d.size();
    d += data_.substr(from, len) + std::string(format::AlignUp(len) - len, '\0');
    m.files[0].bytes = d.size();
  } else {  // one extent: move it by 64 bytes (into its padding)
    ASSERT_GE(format::AlignUp(s.offset + s.bytes) - (s.offset + s.bytes), 64u);
    s.offset += 64;
    d.replace(s.offset, s.bytes, data_.substr(from, s.bytes));
  }
  WriteData(d);
  WriteManifest(m);
  ExpectChunk(LoadCk(true), kUnauth, "rand.f32", 0, "AES-GCM authentication failed", &m);
}

TEST_P(Tamper, TwoChunksSwapped) {
  Permute({1, 0, 2}, /*manifest=*/false);
  ExpectChunk(LoadCk(true), kCorrupt, "rand.f32", 0, "CRC32C mismatch");
  ExpectChunk(LoadCk(false), kUnauth, "rand.f32", 0, "AES-GCM authentication failed");
  Permute({1, 0, 2}, /*manifest=*/true);  // CRCs and tags swapped too: only AES-GCM can tell
  ExpectChunk(LoadCk(true), kUnauth, "rand.f32", 0, "AES-GCM authentication failed");
}

TEST_P(Tamper, ChunksReordered) {
  Permute({1, 2, 0}, /*manifest=*/true);
  ExpectChunk(LoadCk(true), kUnauth, "rand.f32", 0, "AES-GCM authentication failed");
  ExpectChunk(VerifyCheckpoint("/ck", EncLoad(kKeyA), io_), kUnauth, "rand.f32", 0, "AES-GCM");
}

// Another checkpoint of the same state under the same key has another salt, so other keys.
TEST_P(Tamper, ChunkCopiedFromAnotherCheckpoint) {
  SP_ASSERT_OK(Save(state_, "/other", Options(), io_));
  const std::string other = Data("/other");
  format::Manifest om = testing::ReadManifest(&fs_, "/other");
  ASSERT_EQ(Len(om, "rand.f32", 1), Len(m_, "rand.f32", 1));
  std::string d = data_;
  d.replace(Offset(m_, "rand.f32", 1), Len(m_, "rand.f32", 1),
            other.substr(Offset(om, "rand.f32", 1), Len(om, "rand.f32", 1)));
  WriteData(d);
  ExpectChunk(LoadCk(false), kUnauth, "rand.f32", 1, "AES-GCM authentication failed");
  format::Manifest m = Fresh();  // its CRC and tag too
  ShardOf(m, "rand.f32").crc32c[1] = ShardOf(om, "rand.f32").crc32c[1];
  ShardOf(m, "rand.f32").tags[1] = ShardOf(om, "rand.f32").tags[1];
  WriteManifest(m);
  ExpectChunk(LoadCk(true), kUnauth, "rand.f32", 1, "AES-GCM authentication failed");
  // The other checkpoint's whole manifest with this one's data: the MAC is the other's, but the
  // data files belong to another checkpoint id.
  SP_ASSERT_OK(
      fs_.WriteFileSynced("/ck/MANIFEST", fs_.ReadFile("/other/MANIFEST", 1 << 24).value()));
  WriteData(data_);
  Status s = LoadCk(true);
  EXPECT_EQ(s.code(), kCorrupt) << s.ToString();
  EXPECT_TRUE(Has(s, "belongs to another checkpoint")) << s.ToString();
}

// An edit of the body as someone without the key would make it: both CRCs fixed, the MAC not.
TEST_P(Tamper, EditedManifestField) {
  std::string bytes = manifest_;
  const size_t at = bytes.find("\"name\":\"step\",\"value\":12");
  const size_t at2 = bytes.find("\"kind\":\"int\",\"name\":\"step\",\"value\":12");
  ASSERT_TRUE(at != std::string::npos || at2 != std::string::npos) << bytes.substr(64, 400);
  const size_t pos = bytes.find(":12", at != std::string::npos ? at : at2);
  bytes[pos + 2] = '3';  // step 12 -> 13
  format::PutU32(&bytes, 32, Crc32c(std::string_view(bytes).substr(64)));
  format::PutU32(&bytes, 60, Crc32c(std::string_view(bytes).substr(0, 60)));
  SP_ASSERT_OK(fs_.WriteFileSynced("/ck/MANIFEST", bytes));
  ExpectManifestRejected(LoadCk(true));
  ExpectManifestRejected(VerifyCheckpoint("/ck", EncLoad(kKeyA), io_));
  // A field of a tensor, through the decoder and encoder.
  format::Manifest m = Fresh();
  for (auto& t : m.tensors) {
    if (t.name == "opt.bias") t.dtype = DType::kI32;  // same size
  }
  WriteManifest(m, "");
  ExpectManifestRejected(LoadCk(true));
}

TEST_P(Tamper, FlippedMacBit) {
  std::string bytes = manifest_;
  bytes[45] ^= 0x04;  // in the MAC, bytes [40, 60)
  SP_ASSERT_OK(fs_.WriteFileSynced("/ck/MANIFEST", bytes));
  Status s = LoadCk(true);
  EXPECT_EQ(s.code(), kCorrupt) << s.ToString();  // the header's CRC covers the MAC
  EXPECT_TRUE(Has(s, "header checksum mismatch")) << s.ToString();
  format::PutU32(&bytes, 60, Crc32c(std::string_view(bytes).substr(0, 60)));
  SP_ASSERT_OK(fs_.WriteFileSynced("/ck/MANIFEST", bytes));
  ExpectManifestRejected(LoadCk(true));
}

TEST_P(Tamper, EditedKeyCheckReadsAsAWrongKey) {
  format::Manifest m = Fresh();
  m.encryption.key_check[0] ^= std::byte{1};
  WriteManifest(m);
  Status s = LoadCk(true);
  EXPECT_EQ(s.code(), kUnauth) << s.ToString();
  EXPECT_TRUE(Has(s, "wrong key")) << s.ToString();
}

// A manifest rewritten as unencrypted is refused when a key is given (a downgrade would otherwise
// hand ciphertext back as tensor bytes).
TEST_P(Tamper, StrippedEncryptionIsRefusedWithAKey) {
  format::Manifest m = Fresh();
  m.encryption = {};
  for (auto& t : m.tensors) {
    for (auto& s : t.shards) s.tags.clear();
  }
  WriteManifest(m, "");
  Status s = LoadCk(true);
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_TRUE(Has(s, "is not encrypted")) << s.ToString();
}

TEST_P(Tamper, TruncatedDataFile) {
  WriteData(data_.substr(0, data_.size() / 2));
  for (bool verify : {true, false}) {
    Status s = LoadCk(verify);
    EXPECT_EQ(s.code(), kCorrupt) << s.ToString();
    EXPECT_TRUE(Has(s, "tensor \"") && Has(s, "chunk")) << s.ToString();
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, Tamper, ::testing::Values(Codec::kNone, Codec::kZstd),
                         [](const auto& info) {
                           return info.param == Codec::kNone ? std::string("raw")
                                                             : std::string("zstd");
                         });
INSTANTIATE_TEST_SUITE_P(Zstd, TamperCompressed, ::testing::Values(Codec::kZstd));

}  // namespace
}  // namespace savepoint
