// Tests of the store seam: every writable format written through OpenWrite and read back through
// OpenRead (entries, whole reads, selections, byte ranges, verification) on an in-memory file
// system; the options each format refuses, refused before anything is written; detection; and
// the public verbs on top (Save by format, Load and Verify of every format, Convert).
#include "store/store.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "io/mem_fs.h"
#include "savepoint/dcp.h"
#include "savepoint/safetensors.h"
#include "testutil/sparse_tables.h"
#include "testutil/testutil.h"

namespace savepoint::store {
namespace {

using ::savepoint::testing::StatesEqual;
using ::savepoint::testing::StatusIs;

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override { SP_ASSERT_OK(fs_.CreateDir("/d")); }
  IoOptions Io() { return {.fs = &fs_, .direct_io = false}; }
  engine::WriteRequest Request(const std::string& path, SaveOptions o = {}) {
    engine::WriteRequest r;
    r.path = path;
    r.options = o;
    r.io = Io();
    return r;
  }
  // A state every writable format holds alike: tensors of the dtypes they share, a string value
  // and metadata (a .ckpt file gives numeric values back as 0-d tensors, as MindSpore keeps them).
  static State Portable(uint64_t seed) {
    State all = testing::CkptCrashState(seed), s;
    for (const auto& [name, e] : all.entries()) {
      if (e.is_tensor()) {
        EXPECT_TRUE(s.Put(name, Tensor::CopyOf(e.tensor()).value()).ok());
      }
    }
    EXPECT_TRUE(s.PutValue("note", "hello").ok());
    s.metadata() = {{"run", "x"}};
    return s;
  }
  // Tensors only, one of them "marker": 4096 bytes of 0x5a, to be found in a file.
  static State Marked(uint64_t seed) {
    State all = Portable(seed), s;
    for (const auto& [name, e] : all.entries()) {
      if (e.is_tensor()) {
        EXPECT_TRUE(s.Put(name, Tensor::CopyOf(e.tensor()).value()).ok());
      }
    }
    Tensor m = Tensor::Empty(DType::kU8, {4096}).value();
    std::memset(m.data(), 0x5a, 4096);
    EXPECT_TRUE(s.Put("marker", std::move(m)).ok());
    return s;
  }
  Status Write(const State& s, const std::string& path, Format f, SaveOptions o = {},
               FileOptions file = {}) {
    SP_ASSIGN_OR_RETURN(std::unique_ptr<Writer> w, OpenWrite(Request(path, o), f, file));
    return w->Commit(s);
  }

  MemFileSystem fs_;
};

TEST_F(StoreTest, EveryWritableFormatRoundTripsThroughTheSeam) {
  const State s = Portable(7);
  for (const char* path : {"/d/native", "/d/m.safetensors", "/d/m.ckpt"}) {
    SCOPED_TRACE(path);
    SP_ASSERT_OK(Write(s, path, Format::kAuto));
    SP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Reader> r, OpenRead(path, Format::kAuto, {}, Io()));
    EXPECT_EQ(r->format(), TargetFormat(path));
    EXPECT_TRUE(r->caps().write);
    size_t tensors = 0;
    SP_ASSERT_OK_AND_ASSIGN(std::vector<Entry> entries, r->Entries());
    for (const Entry& e : entries) {
      if (!e.tensor) continue;
      ++tensors;
      const TensorView* t = s.FindTensor(e.name);
      ASSERT_NE(t, nullptr) << e.name;
      EXPECT_EQ(e.dtype, t->dtype()) << e.name;
      EXPECT_EQ(e.shape, t->shape()) << e.name;
    }
    EXPECT_EQ(tensors, s.num_tensors());
    SP_ASSERT_OK_AND_ASSIGN(State back, r->Read({}));
    EXPECT_TRUE(StatesEqual(s, back));
    SP_EXPECT_OK(r->Verify(nullptr));
  }
}

TEST_F(StoreTest, ByteRangesOfFileStoresAreTheTensorsBytes) {
  const State s = Portable(11);
  for (const char* path : {"/d/m.safetensors", "/d/m.ckpt"}) {
    SCOPED_TRACE(path);
    SP_ASSERT_OK(Write(s, path, Format::kAuto));
    SP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Reader> r, OpenRead(path, Format::kAuto, {}, Io()));
    ASSERT_TRUE(r->caps().ranges);
    for (const auto& [name, e] : s.entries()) {
      if (!e.is_tensor() || e.tensor().nbytes() < 3) continue;
      const TensorView& t = e.tensor();
      const uint64_t off = t.nbytes() / 3, n = t.nbytes() - off - 1;
      std::string got(n, '\0');
      SP_ASSERT_OK(r->ReadRange(name, off, std::as_writable_bytes(std::span(got))));
      EXPECT_EQ(0, std::memcmp(got.data(), reinterpret_cast<const char*>(t.data()) + off, n))
          << name;
      std::byte one[2];
      EXPECT_THAT(r->ReadRange(name, t.nbytes() - 1, one),
                  StatusIs(StatusCode::kOutOfRange, "past its"));
    }
    std::byte b[1];
    EXPECT_THAT(r->ReadRange("no.such", 0, b), StatusIs(StatusCode::kNotFound, "no.such"));
  }
  SP_ASSERT_OK(Write(s, "/d/native", Format::kNative));
  SP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Reader> native,
                          OpenRead("/d/native", Format::kAuto, {}, Io()));
  std::byte b[1];
  EXPECT_THAT(native->ReadRange(s.entries().begin()->first, 0, b),
              StatusIs(StatusCode::kUnimplemented, "do not read byte ranges"));
}

TEST_F(StoreTest, SelectionsFollowTheOneNameRule) {
  const State s = Portable(3);
  const std::string first = s.entries().begin()->first;
  for (const char* path : {"/d/native", "/d/m.safetensors", "/d/m.ckpt"}) {
    SCOPED_TRACE(path);
    SP_ASSERT_OK(Write(s, path, Format::kAuto));
    SP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Reader> r, OpenRead(path, Format::kAuto, {}, Io()));
    SP_ASSERT_OK_AND_ASSIGN(State one, r->Read({first}));
    EXPECT_NE(one.Find(first), nullptr);
    EXPECT_EQ(one.num_tensors(), s.Find(first)->is_tensor() ? 1u : 0u);
    EXPECT_THAT(r->Read({"nothing*matches"}).status(), StatusIs(StatusCode::kNotFound));
  }
}

TEST_F(StoreTest, WritesRefuseWhatTheFormatCannotHonourBeforeWriting) {
  const State s = Portable(5);
  const EncryptionKey key = EncryptionKey::FromBytes(std::string(32, 'k'));
  struct Case {
    std::string path;
    Format format;
    SaveOptions options;
    FileOptions file;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"/d/x", Format::kDcp, {}, {}, "read only"},
      {"/d/x", Format::kRecis, {}, {}, "read only"},
      {"/d/x.safetensors", Format::kAuto, {.key = key}, {}, "SaveOptions.key"},
      {"/d/x", Format::kNative, {}, {.file_checksum = true}, "file_checksum"},
      {"/d/x.ckpt", Format::kAuto, {}, {.mindspore_flavour = true}, "mindspore_flavour"},
      {"/d/x.ckpt", Format::kAuto, {}, {.cipher = Cipher::kSm4Cbc}, "cipher"},
      {"/d/x.safetensors", Format::kAuto, {.chunk_bytes = 1 << 20}, {}, "chunk_bytes"},
      {"/d/x.ckpt",
       Format::kAuto,
       {.compression = {.codec = Compression::Codec::kZstd}},
       {},
       "compression"},
      {"/d/x.ckpt", Format::kAuto, {.format_version = 1}, {}, "format_version"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    EXPECT_THAT(Write(s, c.path, c.format, c.options, c.file),
                StatusIs(StatusCode::kInvalidArgument, c.message));
    EXPECT_FALSE(fs_.Exists(c.path));
  }
  SP_ASSERT_OK(Write(s, "/d/x.ckpt", Format::kAuto));
  EXPECT_THAT(OpenWrite(Request("/d/x.ckpt"), Format::kAuto).status(),
              StatusIs(StatusCode::kAlreadyExists, "overwrite"));
  SP_EXPECT_OK(OpenWrite(Request("/d/x.ckpt", {.overwrite = true}), Format::kAuto).status());
}

TEST_F(StoreTest, TablesGoToNativeCheckpointsOnly) {
  State s = Portable(9);
  const std::vector<int64_t> ids = {4, 8, 15};
  const auto fill = [](int64_t id, std::span<std::byte> row) {
    for (std::byte& b : row) b = std::byte(id);
  };
  SP_ASSERT_OK(s.PutTable("emb", testing::MakeTable(ids, {{"w", DType::kF32, 4, fill}})));
  EXPECT_THAT(Write(s, "/d/t.safetensors", Format::kAuto),
              StatusIs(StatusCode::kInvalidArgument, "sparse tables"));
  SP_ASSERT_OK(Write(s, "/d/t", Format::kAuto));
  SP_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Reader> r, OpenRead("/d/t", Format::kAuto, {}, Io()));
  SP_ASSERT_OK_AND_ASSIGN(State back, r->Read({}));
  ASSERT_NE(back.FindTable("emb"), nullptr);
  EXPECT_EQ(back.FindTable("emb")->num_rows(), 3);
}

TEST_F(StoreTest, ReadsRefuseMappingFormatsThatAreReadNotMapped) {
  SP_ASSERT_OK(Write(Portable(1), "/d/m.ckpt", Format::kAuto));
  EXPECT_THAT(OpenRead("/d/m.ckpt", Format::kAuto, {.mmap = true}, Io()).status(),
              StatusIs(StatusCode::kInvalidArgument, "LoadOptions.mmap"));
  EXPECT_THAT(Write(Portable(1), "/d/s.ckpt", Format::kAuto,
                    {.compression = {.shuffle = Compression::Shuffle::kOff}}),
              StatusIs(StatusCode::kInvalidArgument, "SaveOptions.compression"));
}

TEST_F(StoreTest, LoadOfAMissingPathSaysWhatLoadAlwaysSaid) {
  EXPECT_THAT(Load("/d/none", {}, Io()).status(),
              StatusIs(StatusCode::kNotFound, "not a committed checkpoint (no MANIFEST)"));
  EXPECT_THAT(Load("/d/none", {}, {.fs = &fs_, .io_threads = 0}).status(),
              StatusIs(StatusCode::kInvalidArgument, "io_threads"));
  SP_ASSERT_OK(fs_.CreateDir("/d/empty"));
  EXPECT_THAT(Load("/d/empty", {}, Io()).status(),
              StatusIs(StatusCode::kNotFound, "not a committed checkpoint"));
}

TEST_F(StoreTest, ReadsRefuseKeysOfUnencryptedFormats) {
  SP_ASSERT_OK(Write(Portable(1), "/d/m.safetensors", Format::kAuto));
  const EncryptionKey key = EncryptionKey::FromBytes(std::string(32, 'k'));
  EXPECT_THAT(OpenRead("/d/m.safetensors", Format::kAuto, {.key = key}, Io()).status(),
              StatusIs(StatusCode::kInvalidArgument, "LoadOptions.key"));
  EXPECT_THAT(OpenRead("/d/m.safetensors", Format::kAuto, {}, Io(), Cipher::kAesGcm).status(),
              StatusIs(StatusCode::kInvalidArgument, "cipher"));
}

TEST_F(StoreTest, DetectionFollowsNamesAndDirectoryContents) {
  SP_ASSERT_OK(Write(Portable(1), "/d/native", Format::kNative));
  SP_ASSERT_OK(Write(Portable(1), "/d/m.ckpt", Format::kAuto));
  SP_ASSERT_OK(Write(Portable(1), "/d/m.bin", Format::kSafetensors));
  SP_ASSERT_OK(fs_.CreateDir("/d/dcp"));
  SP_ASSERT_OK(fs_.WriteFileSynced("/d/dcp/.metadata", "x"));
  EXPECT_EQ(*DetectFormat("/d/native", &fs_), Format::kNative);
  EXPECT_EQ(*DetectFormat("/d/m.ckpt", &fs_), Format::kMindSporeCkpt);
  EXPECT_EQ(*DetectFormat("/d/m.bin", &fs_), Format::kSafetensors);
  EXPECT_EQ(*DetectFormat("/d/dcp", &fs_), Format::kDcp);
  EXPECT_THAT(DetectFormat("/d/none", &fs_).status(), StatusIs(StatusCode::kNotFound, "/d/none"));
  EXPECT_EQ(TargetFormat("a/b.safetensors"), Format::kSafetensors);
  EXPECT_EQ(TargetFormat("a/b.ckpt"), Format::kMindSporeCkpt);
  EXPECT_EQ(TargetFormat("a/b"), Format::kNative);
  for (Format f : {Format::kAuto, Format::kNative, Format::kSafetensors, Format::kMindSporeCkpt,
                   Format::kDcp, Format::kRecis}) {
    EXPECT_EQ(*ParseFormat(FormatName(f)), f);
  }
  EXPECT_THAT(ParseFormat("onnx").status(), StatusIs(StatusCode::kInvalidArgument, "\"ckpt\""));
}

// --- The public verbs over the seam. ---

TEST_F(StoreTest, SaveWritesTheFormatItIsGivenAndLoadReadsAnyFormat) {
  const State s = Portable(21);
  SP_ASSERT_OK(Save(s, "/d/a.safetensors", {.format = Format::kAuto}, Io()));
  SP_ASSERT_OK(Save(s, "/d/b.ckpt", {.format = Format::kAuto}, Io()));
  SP_ASSERT_OK(Save(s, "/d/c.ckpt", {}, Io()));  // kNative by default: a directory
  EXPECT_EQ(*DetectFormat("/d/a.safetensors", &fs_), Format::kSafetensors);
  EXPECT_EQ(*DetectFormat("/d/b.ckpt", &fs_), Format::kMindSporeCkpt);
  EXPECT_EQ(*DetectFormat("/d/c.ckpt", &fs_), Format::kNative);  // a directory wins over a name
  for (const char* path : {"/d/a.safetensors", "/d/b.ckpt", "/d/c.ckpt"}) {
    SCOPED_TRACE(path);
    LoadStats stats;
    SP_ASSERT_OK_AND_ASSIGN(State back, Load(path, {.stats = &stats}, Io()));
    EXPECT_TRUE(StatesEqual(s, back));
    EXPECT_EQ(stats.bytes, s.tensor_bytes());
    SP_EXPECT_OK(Verify(path, {}, Io()));
  }
  EXPECT_FALSE(Load("/d/a.safetensors", {.format = Format::kMindSporeCkpt}, Io()).ok());
  EXPECT_THAT(CheckpointReader::Open("/d/c.ckpt", {.format = Format::kSafetensors}, Io()).status(),
              StatusIs(StatusCode::kInvalidArgument, "reads native checkpoints"));
  EXPECT_THAT(Verify("/d/c.ckpt", {.mmap = true}, Io()),
              StatusIs(StatusCode::kInvalidArgument, "do not apply"));
}

TEST_F(StoreTest, VerifyFindsADamagedByteInEveryFormatWithAChecksum) {
  const State s = Marked(23);
  SP_ASSERT_OK(Save(s, "/d/n", {}, Io()));
  SP_ASSERT_OK(Convert("/d/n", "/d/m.ckpt", {.file_checksum = true}, Io()).status());
  SP_ASSERT_OK(Convert("/d/n", "/d/m.safetensors", {.file_checksum = true}, Io()).status());
  for (const char* path : {"/d/m.ckpt", "/d/m.safetensors"}) {
    SCOPED_TRACE(path);
    SP_ASSERT_OK(Verify(path, {}, Io()));
    std::string bytes = *fs_.ReadFile(path, uint64_t{1} << 30);
    const size_t at = bytes.find(std::string(4096, '\x5a'));
    ASSERT_NE(at, std::string::npos);
    bytes[at + 2048] ^= 0x40;  // a byte of tensor "marker"
    SP_ASSERT_OK(fs_.WriteFileSynced(path, bytes));
    EXPECT_THAT(Verify(path, {}, Io()), StatusIs(StatusCode::kCorruption));
    SP_EXPECT_OK(Verify(path, {.verify_checksums = false}, Io()));
  }
}

TEST_F(StoreTest, ConvertGoesAnyWayAndChecksTheTargetFirst) {
  const State s = Portable(31);
  SP_ASSERT_OK(Save(s, "/d/n", {}, Io()));
  SP_ASSERT_OK_AND_ASSIGN(ConvertReport r1, Convert("/d/n", "/d/m.ckpt", {}, Io()));
  EXPECT_EQ(r1.from, Format::kNative);
  EXPECT_EQ(r1.to, Format::kMindSporeCkpt);
  EXPECT_EQ(r1.tensors, s.num_tensors());
  EXPECT_EQ(r1.tensor_bytes, s.tensor_bytes());
  SP_ASSERT_OK(Convert("/d/m.ckpt", "/d/m.safetensors", {}, Io()).status());
  SP_ASSERT_OK(Convert("/d/m.safetensors", "/d/back", {}, Io()).status());
  SP_ASSERT_OK_AND_ASSIGN(State back, Load("/d/back", {}, Io()));
  EXPECT_TRUE(StatesEqual(s, back));
  // An existing target fails before the source is even opened (here: there is none).
  EXPECT_THAT(Convert("/d/missing", "/d/back", {}, Io()).status(),
              StatusIs(StatusCode::kAlreadyExists));
  EXPECT_THAT(Convert("/d/missing", "/d/new", {}, Io()).status(), StatusIs(StatusCode::kNotFound));
  EXPECT_FALSE(fs_.Exists("/d/new"));
  EXPECT_THAT(Convert("/d/n", "/d/x", {.to = Format::kDcp}, Io()).status(),
              StatusIs(StatusCode::kInvalidArgument, "read only"));
  // An encrypted .ckpt target, read back with its key and cipher.
  const EncryptionKey key = EncryptionKey::FromBytes(std::string(16, 'k'));
  SP_ASSERT_OK(
      Convert("/d/n", "/d/e.ckpt", {.key = key, .cipher = Cipher::kAesCbc}, Io()).status());
  SP_ASSERT_OK(
      Convert("/d/e.ckpt", "/d/e2", {.source_key = key, .source_cipher = Cipher::kAesCbc}, Io())
          .status());
  SP_ASSERT_OK_AND_ASSIGN(State e2, Load("/d/e2", {}, Io()));
  EXPECT_TRUE(StatesEqual(s, e2));
  EXPECT_THAT(Convert("/d/e.ckpt", "/d/e3", {}, Io()).status(),
              StatusIs(StatusCode::kInvalidArgument, "encrypted"));
}

}  // namespace
}  // namespace savepoint::store
