// Tests of the MindSpore `.ckpt` reader and writer (savepoint/mindspore.h): round trips of every
// dtype, scalars, strings, Int4 and hash maps; files built with the protobuf messages (pieces,
// packed dims, map slices); the CRC trailer; hostile files. Files written by the real MindSpore
// are tested in tests/mindspore/.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstring>
#include <random>
#include <string>

#include "interop/byte_layout.h"
#include "interop/ckpt_wire.h"
#include "interop/file_writer_testutil.h"
#include "interop/mindspore_ckpt.pb.h"
#include "io/mem_fs.h"
#include "savepoint/mindspore.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

using testing::FillPattern;

constexpr char kPath[] = "/d/model.ckpt";

Tensor Filled(DType dtype, Shape shape, uint64_t seed) {
  Tensor t = Tensor::Empty(dtype, std::move(shape)).value();
  FillPattern(t.view(), seed);
  return t;
}

template <typename T>
Tensor Scalar(DType dtype, T x) {
  Tensor t = Tensor::Empty(dtype, {}).value();
  std::memcpy(t.data(), &x, sizeof(T));
  return t;
}

void ExpectTensor(const State& s, const std::string& name, const TensorView& want) {
  const TensorView* got = s.FindTensor(name);
  ASSERT_NE(got, nullptr) << name;
  EXPECT_EQ(got->dtype(), want.dtype()) << name;
  EXPECT_EQ(got->shape(), want.shape()) << name;
  ASSERT_EQ(got->nbytes(), want.nbytes()) << name;
  EXPECT_EQ(0, std::memcmp(got->data(), want.data(), want.nbytes())) << name;
}

class CkptTest : public ::testing::Test {
 protected:
  void SetUp() override { SP_ASSERT_OK(fs_.CreateDir("/d")); }
  IoOptions Io(int threads = 3) { return {.fs = &fs_, .io_threads = threads, .direct_io = false}; }
  std::string FileBytes(const std::string& path) { return fs_.ReadFile(path, 1 << 30).value(); }
  void Put(const std::string& path, const std::string& bytes) {
    SP_ASSERT_OK(fs_.WriteFileSynced(path, bytes));
  }
  Status LoadStatus(const std::string& bytes) {
    Put("/d/bad.ckpt", bytes);
    return LoadMindSporeCheckpoint("/d/bad.ckpt", {}, Io()).status();
  }
  MemFileSystem fs_;
};

TEST_F(CkptTest, RoundTripEveryDTypeScalarsStringsValuesAndMetadata) {
  State s;
  int seed = 0;
  for (DType d :
       {DType::kI8, DType::kU8, DType::kI16, DType::kU16, DType::kI32, DType::kU32, DType::kI64,
        DType::kU64, DType::kF16, DType::kF32, DType::kF64, DType::kBool, DType::kBF16}) {
    Tensor t = Filled(d, {3, 5}, ++seed);
    if (d == DType::kBool) {
      for (uint64_t i = 0; i < t.nbytes(); ++i) t.data()[i] = std::byte{uint8_t(i % 2)};
    }
    SP_ASSERT_OK(s.Put(std::string("t.") + std::string(DTypeName(d)), std::move(t)));
  }
  SP_ASSERT_OK(s.Put("scalar", Scalar(DType::kF32, 3.5f)));
  SP_ASSERT_OK(s.Put("empty", Tensor::Empty(DType::kF32, {0, 4}).value()));
  SP_ASSERT_OK(s.PutValue("epoch_num", int64_t{3}));
  SP_ASSERT_OK(s.PutValue("lr", 0.125));
  SP_ASSERT_OK(s.PutValue("flag", true));
  SP_ASSERT_OK(s.PutValue("note", "h\xc3\xa9llo \xf0\x9f\x99\x82"));
  SP_ASSERT_OK(s.PutValue("blob", Value(savepoint::Bytes{{1, 2, 255}})));
  SP_ASSERT_OK(s.PutValue("config", Value::FromJson({{"layers", 4}})));
  s.metadata() = {{"run", "abc"}, {"n", 7}};
  SaveStats stats;
  SP_ASSERT_OK(SaveMindSporeCheckpoint(s, kPath, {.stats = &stats}, Io()));
  EXPECT_EQ(stats.bytes, s.tensor_bytes());
  State back = LoadMindSporeCheckpoint(kPath, {}, Io()).value();
  for (const auto& [name, e] : s.entries()) {
    if (e.is_tensor()) ExpectTensor(back, name, e.tensor());
  }
  // Values come back as MindSpore keeps them: numbers as 0-d tensors, strings as strings.
  ExpectTensor(back, "epoch_num", Scalar(DType::kI64, int64_t{3}).view());
  ExpectTensor(back, "lr", Scalar(DType::kF64, 0.125).view());
  ExpectTensor(back, "flag", Scalar(DType::kBool, uint8_t{1}).view());
  ASSERT_NE(back.FindValue("note"), nullptr);
  EXPECT_EQ(back.FindValue("note")->as_string(), "h\xc3\xa9llo \xf0\x9f\x99\x82");
  EXPECT_EQ(back.metadata(), s.metadata());
  EXPECT_EQ(back.FindValue(kMindSporeSavepointMetadataEntry), nullptr);
  ASSERT_NE(back.FindValue("blob"), nullptr);  // kept in the savepoint.metadata entry
  EXPECT_EQ(*back.FindValue("blob"), *s.FindValue("blob"));
  EXPECT_EQ(*back.FindValue("config"), *s.FindValue("config"));
  // Selection by name and glob; a pattern that matches nothing is NotFound.
  State some = LoadMindSporeCheckpoint(kPath, {.names = {"t.F*", "note"}}, Io()).value();
  EXPECT_EQ(some.size(), 4u);  // t.F16, t.F32, t.F64 and note
  EXPECT_EQ(LoadMindSporeCheckpoint(kPath, {.names = {"nope*"}}, Io()).status().code(),
            StatusCode::kNotFound);
}

TEST_F(CkptTest, Int4AndHashMapsRoundTripThroughTheMetadata) {
  State s;
  SP_ASSERT_OK(s.Put("q", Filled(DType::kI8, {4}, 1)));
  SP_ASSERT_OK(s.Put("emb.keys", Filled(DType::kI32, {3}, 2)));
  SP_ASSERT_OK(s.Put("emb.values", Filled(DType::kF32, {3, 2}, 3)));
  SP_ASSERT_OK(s.Put("emb.status", Filled(DType::kI32, {3}, 4)));
  s.metadata()[kMindSporeMetadataKey] = {{"int4", {"q"}}, {"map_tensors", {"emb"}}};
  SP_ASSERT_OK(SaveMindSporeCheckpoint(s, kPath, {}, Io()));
  MindSporeCheckpointInfo info = InspectMindSporeCheckpoint(kPath, &fs_).value();
  ASSERT_EQ(info.entries.size(), 2u);
  EXPECT_EQ(info.entries[0].name, "emb");
  EXPECT_EQ(info.entries[0].type, "map");
  EXPECT_EQ(info.entries[1].type, "Int4");
  // The map is one MapTensorProto with numpy type names, as MindSpore writes it.
  mindspore::Checkpoint proto;
  ASSERT_TRUE(proto.ParseFromString(FileBytes(kPath)));
  ASSERT_EQ(proto.value_size(), 2);
  ASSERT_TRUE(proto.value(0).has_maptensor());
  EXPECT_EQ(proto.value(0).maptensor().tensor(1).tensor_type(), "float32");
  State back = LoadMindSporeCheckpoint(kPath, {}, Io()).value();
  for (const auto& [name, e] : s.entries()) ExpectTensor(back, name, e.tensor());
  EXPECT_EQ(back.metadata(), s.metadata());
}

// Files built with the protobuf messages as MindSpore builds them: a tensor in pieces (one
// Checkpoint message each, repeating the dims), a scalar with dims [0], a map in two slices.
TEST_F(CkptTest, ReadsPiecesOldScalarsAndMapSlicesBuiltWithTheMessages) {
  Tensor w = Filled(DType::kF32, {5, 4}, 9);
  std::string file;
  for (int rows : {3, 2}) {  // np.array_split of 5 rows in 2
    mindspore::Checkpoint c;
    auto* v = c.add_value();
    v->set_tag("w");
    v->mutable_tensor()->add_dims(5);
    v->mutable_tensor()->add_dims(4);
    v->mutable_tensor()->set_tensor_type("Float32");
    const size_t at = rows == 3 ? 0 : 3 * 16;
    v->mutable_tensor()->set_tensor_content(
        std::string(reinterpret_cast<const char*>(w.data()) + at, rows * 16));
    file += c.SerializeAsString();
  }
  {
    mindspore::Checkpoint c;
    auto* v = c.add_value();
    v->set_tag("step");
    v->mutable_tensor()->add_dims(0);
    v->mutable_tensor()->set_tensor_type("Int64");
    const int64_t x = 42;
    v->mutable_tensor()->set_tensor_content(std::string(reinterpret_cast<const char*>(&x), 8));
    file += c.SerializeAsString();
  }
  for (int slice = 0; slice < 2; ++slice) {
    mindspore::Checkpoint c;
    auto* v = c.add_value();
    v->set_tag("emb");
    for (int part = 0; part < 3; ++part) {
      auto* t = v->mutable_maptensor()->add_tensor();
      t->add_dims(2);
      if (part == 1) t->add_dims(3);
      t->set_tensor_type(part == 1 ? "float32" : "int32");
      std::string content(part == 1 ? 24 : 8, '\0');
      for (size_t i = 0; i < content.size(); ++i) content[i] = char(slice * 100 + part * 10 + i);
      t->set_tensor_content(content);
    }
    file += c.SerializeAsString();
  }
  Put(kPath, file);
  State back = LoadMindSporeCheckpoint(kPath, {}, Io()).value();
  ExpectTensor(back, "w", w.view());
  ExpectTensor(back, "step", Scalar(DType::kI64, int64_t{42}).view());
  const TensorView* values = back.FindTensor("emb.values");
  ASSERT_NE(values, nullptr);
  EXPECT_EQ(values->shape(), (Shape{4, 3}));
  EXPECT_EQ(static_cast<uint8_t>(values->data()[24]), 100 + 10);  // the second slice's first byte
  EXPECT_EQ(back.FindTensor("emb.keys")->shape(), Shape{4});
  MindSporeCheckpointInfo info = InspectMindSporeCheckpoint(kPath, &fs_).value();
  EXPECT_EQ(info.entries[0].pieces, 2u);
  EXPECT_FALSE(info.has_crc);
}

TEST_F(CkptTest, PackedDimsAreAccepted) {
  // TensorProto{dims: [2, 3] packed, tensor_type "UInt8", content 6 bytes} by hand.
  std::string tensor = std::string("\x0a\x02\x02\x03", 4) + "\x12\x05UInt8" + "\x1a\x06" + "abcdef";
  std::string value = std::string("\x0a\x01", 2) + "x" + "\x12" + char(tensor.size()) + tensor;
  std::string file = "\x0a" + std::string(1, char(value.size())) + value;
  Put(kPath, file);
  State back = LoadMindSporeCheckpoint(kPath, {}, Io()).value();
  ASSERT_NE(back.FindTensor("x"), nullptr);
  EXPECT_EQ(back.FindTensor("x")->shape(), (Shape{2, 3}));
  EXPECT_EQ(0, std::memcmp(back.FindTensor("x")->data(), "abcdef", 6));
}

TEST_F(CkptTest, CrcTrailerIsWrittenVerifiedAndCanBeSkipped) {
  State s;
  SP_ASSERT_OK(s.Put("w", Filled(DType::kF32, {1000}, 1)));
  SP_ASSERT_OK(s.Put("v", Filled(DType::kF32, {4}, 2)));  // written first (name order), small
  SP_ASSERT_OK(SaveMindSporeCheckpoint(s, kPath, {.crc_check = true}, Io()));
  std::string bytes = FileBytes(kPath);
  ASSERT_GT(bytes.size(), 17u);
  EXPECT_EQ(bytes.substr(bytes.size() - 17, 7), "crc_num");
  const uint32_t want = crc32(0, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size() - 17);
  uint64_t stored = 0;
  for (size_t i = bytes.size() - 10; i < bytes.size(); ++i)
    stored = (stored << 8) | uint8_t(bytes[i]);
  EXPECT_EQ(stored, want);
  SP_ASSERT_OK(LoadMindSporeCheckpoint(kPath, {}, Io()).status());
  bytes[bytes.size() / 2] ^= 1;  // inside the tensor
  Status st = LoadStatus(bytes);
  EXPECT_THAT(st, StatusIs(StatusCode::kCorruption));
  EXPECT_NE(st.message().find(fmt::format("trailer says {}", want)), std::string::npos)
      << st.ToString();
  EXPECT_NE(st.message().find("/d/bad.ckpt"), std::string::npos) << st.ToString();
  SP_EXPECT_OK(LoadMindSporeCheckpoint("/d/bad.ckpt", {.crc_check = false}, Io()).status());
  // The CRC covers the whole file: damage in an entry that is not selected is found too, with one
  // thread or several (the file is read once, in pieces checksummed as they arrive).
  for (int threads : {1, 4}) {
    Status sel = LoadMindSporeCheckpoint("/d/bad.ckpt", {.names = {"v"}}, Io(threads)).status();
    EXPECT_THAT(sel, StatusIs(StatusCode::kCorruption));
  }
  SP_EXPECT_OK(LoadMindSporeCheckpoint(kPath, {.names = {"v"}}, Io(1)).status());
}

TEST(ByteLayout, CrcTrailerAcrossAPieceBoundary) {
  MemFileSystem fs;
  std::string a(interop::kLayoutPieceBytes - 9, 'a');  // the trailer straddles the 8 MiB boundary
  interop::ByteLayout layout;
  layout.AddBorrowed(std::as_bytes(std::span(a)));
  std::string* trailer = layout.AddOwned(interop::ckpt::EncodeCrcTrailer(0));
  interop::WriteLayoutOptions o;
  o.crc_end = a.size();
  o.trailer = [&](uint32_t crc) { trailer->replace(0, 17, interop::ckpt::EncodeCrcTrailer(crc)); };
  bool direct = false;
  SP_ASSERT_OK(interop::WriteByteLayout({.fs = &fs, .io_threads = 2}, "/f", layout, o, &direct));
  std::string bytes = fs.ReadFile("/f", 1 << 30).value();
  EXPECT_EQ(bytes.size(), a.size() + 17);
  const uint32_t crc = crc32(0, reinterpret_cast<const Bytef*>(a.data()), a.size());
  EXPECT_EQ(bytes.substr(a.size()), interop::ckpt::EncodeCrcTrailer(crc));
  std::mt19937 rng(5);
  std::string r(3 << 20, '\0');
  for (char& c : r) c = char(rng());
  const auto* p = reinterpret_cast<const std::byte*>(r.data());
  EXPECT_EQ(interop::Crc32Zlib(0, {p, r.size()}),
            crc32(0, reinterpret_cast<const Bytef*>(r.data()), r.size()));
  EXPECT_EQ(interop::Crc32ZlibCombine(interop::Crc32Zlib(0, {p, 1000}),
                                      interop::Crc32Zlib(0, {p + 1000, r.size() - 1000}),
                                      r.size() - 1000),
            interop::Crc32Zlib(0, {p, r.size()}));
}

TEST_F(CkptTest, HostileFilesFailWithClearErrors) {
  State s;
  SP_ASSERT_OK(s.Put("w", Filled(DType::kF32, {64}, 1)));
  SP_ASSERT_OK(s.PutValue("name", "abc"));
  SP_ASSERT_OK(SaveMindSporeCheckpoint(s, kPath, {}, Io()));
  const std::string good = FileBytes(kPath);
  // Every truncation fails cleanly (or, cut exactly between two messages, loads fewer entries).
  for (size_t n = 1; n < good.size(); ++n) {
    Status st = LoadStatus(good.substr(0, n));
    if (!st.ok()) {
      EXPECT_THAT(st, StatusIs(StatusCode::kCorruption)) << n << ": " << st.ToString();
    }
  }
  auto expect = [&](const std::string& bytes, std::string_view what) {
    Status st = LoadStatus(bytes);
    EXPECT_FALSE(st.ok()) << what;
    EXPECT_NE(st.message().find(what), std::string::npos) << st.ToString();
  };
  // A 4 GiB length in a tiny file.
  expect(std::string("\x0a\x80\x80\x80\x80\x10", 6) + "xyz", "runs past its message");
  // A varint of 11 bytes.
  expect(std::string("\x0a") + std::string(10, '\xff') + "\x01", "varint");
  auto one = [](const std::string& tensor) {
    std::string value = std::string("\x0a\x01", 2) + "x" + "\x12" + char(tensor.size()) + tensor;
    return "\x0a" + std::string(1, char(value.size())) + value;
  };
  // dims whose product overflows; dims that disagree with the content; an unknown type.
  expect(one(std::string("\x08\xff\xff\xff\xff\x0f\x08\xff\xff\xff\xff\x0f\x08\x05", 14) +
             "\x12\x05UInt8\x1a\x01" + "a"),
         "overflow");
  expect(one(std::string("\x08\x03", 2) + "\x12\x05UInt8\x1a\x02" + "ab"), "holds 2");
  expect(one(std::string("\x08\x01", 2) + "\x12\x04Qint\x1a\x01" + "a"), "does not know");
  expect(one(std::string("\x08\x01", 2) + "\x1a\x01" + "a"), "without tensor_type");
  // The same name twice, apart.
  std::string dup = one(std::string("\x12\x05UInt8\x1a\x01", 9) + "a");
  State other;
  SP_ASSERT_OK(other.Put("y", Filled(DType::kU8, {1}, 1)));
  SP_ASSERT_OK(SaveMindSporeCheckpoint(other, "/d/y.ckpt", {}, Io()));
  expect(dup + FileBytes("/d/y.ckpt") + dup, "appears again");
}

// Every injected failure leaves either no file or the previous file at the path, never a partial
// one (interop/file_writer_testutil.h).
TEST_F(CkptTest, FaultsNeverLeaveAPartialFile) {
  State old_state, new_state;
  SP_ASSERT_OK(old_state.Put("old", Filled(DType::kF32, {100}, 1)));
  SP_ASSERT_OK(new_state.Put("new", Filled(DType::kF64, {300}, 2)));
  SP_ASSERT_OK(new_state.PutValue("note", "nine"));
  testing::ExpectFaultsNeverLeaveAPartialFile(
      [](const State& s, const std::string& p, bool overwrite, FileSystem* fs) {
        return SaveMindSporeCheckpoint(s, p, {.overwrite = overwrite, .crc_check = true},
                                       {.fs = fs});
      },
      [](const std::string& p, FileSystem* fs) {
        return LoadMindSporeCheckpoint(p, {}, {.fs = fs});
      },
      kPath, old_state, new_state);
}

TEST_F(CkptTest, RefusesWhatMindSporeCannotHold) {
  State s;
  SP_ASSERT_OK(s.Put("f8", Filled(DType::kF8E4M3, {4}, 1)));
  Status st = SaveMindSporeCheckpoint(s, kPath, {}, Io());
  EXPECT_THAT(st, StatusIs(StatusCode::kInvalidArgument, "f8"));
  State v;
  SP_ASSERT_OK(v.PutValue(kMindSporeSavepointMetadataEntry, "reserved"));
  EXPECT_THAT(SaveMindSporeCheckpoint(v, kPath, {}, Io()), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_FALSE(fs_.Exists(kPath));
  SP_ASSERT_OK(SaveMindSporeCheckpoint(State(), kPath, {}, Io()));
  EXPECT_THAT(SaveMindSporeCheckpoint(State(), kPath, {}, Io()),
              StatusIs(StatusCode::kAlreadyExists));
  SP_EXPECT_OK(SaveMindSporeCheckpoint(State(), kPath, {.overwrite = true}, Io()));
}

}  // namespace
}  // namespace savepoint
