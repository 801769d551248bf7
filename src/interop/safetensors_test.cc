// Tests of SaveSafetensors / LoadSafetensors / InspectSafetensors: every dtype, values and
// metadata, empty tensors and scalars, name selection, mmap, overwrite, and the durability of the
// writer under injected faults and power loss. Hostile files: safetensors_hostile_test.cc.
#include "savepoint/safetensors.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "format/endian.h"
#include "interop/file_writer_testutil.h"
#include "interop/safetensors_crc.h"
#include "interop/safetensors_testutil.h"
#include "io/fault_fs.h"
#include "io/mem_fs.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

using testing::FillPattern;
using testing::StatesEqual;

constexpr char kPath[] = "/d/model.safetensors";

using testing::LoadWith;

Tensor Filled(DType dtype, Shape shape, uint64_t seed) {
  Tensor t = Tensor::Empty(dtype, std::move(shape)).value();
  FillPattern(t.view(), seed);
  return t;
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SP_ASSERT_OK(fs_.CreateDir("/d"));
    SP_ASSERT_OK(fs_.SyncDir("/"));
  }

  IoOptions Io() { return IoOptions{.fs = &fs_}; }

  // Saves `s` and loads it back, expecting equality.
  void RoundTrip(const State& s) {
    SP_ASSERT_OK(SaveSafetensors(s, kPath, {.overwrite = true}, Io()));
    Result<State> back = LoadSafetensors(kPath, {}, Io());
    SP_ASSERT_OK(back.status());
    EXPECT_TRUE(StatesEqual(s, *back));
  }

  std::string Contents(const std::string& path) {
    Result<std::string> c = fs_.ReadFile(path, uint64_t{1} << 30);
    return c.ok() ? *c : "<" + c.status().ToString() + ">";
  }

  MemFileSystem fs_;
};

TEST_F(SafetensorsTest, EveryDTypeRoundTrips) {
  State s;
  uint64_t seed = 1;
  for (DType d : AllDTypes()) {
    if (!IsSafetensorsDType(d)) continue;
    SP_ASSERT_OK(s.Put(fmt::format("t.{}", DTypeName(d)), Filled(d, {3, 5}, seed++)));
  }
  SP_ASSERT_OK(s.Put("odd", Filled(DType::kU8, {3}, seed++)));  // would misalign what follows
  EXPECT_EQ(s.num_tensors(), AllDTypes().size());
  RoundTrip(s);
  Result<SafetensorsInfo> info = InspectSafetensors(kPath, &fs_);
  SP_ASSERT_OK(info.status());
  for (const SafetensorsTensorInfo& t : info->tensors) {
    EXPECT_EQ((info->data_offset + t.begin) % DTypeSize(t.dtype), 0u) << t.name;
  }
  // Deterministic: the same State gives the same bytes.
  std::string first = Contents(kPath);
  SP_ASSERT_OK(SaveSafetensors(s, kPath, {.overwrite = true}, Io()));
  EXPECT_EQ(Contents(kPath), first);
}

TEST_F(SafetensorsTest, LayoutFollowsTheSpec) {
  State s;
  SP_ASSERT_OK(s.Put("b", Filled(DType::kF32, {2, 3}, 1)));
  SP_ASSERT_OK(s.Put("a", Filled(DType::kBF16, {5}, 2)));
  SP_ASSERT_OK(SaveSafetensors(s, kPath, {}, Io()));
  std::string file = Contents(kPath);
  uint64_t n = format::GetU64(file, 0);
  EXPECT_EQ(n % 8, 0u);
  std::string header = file.substr(8, n);
  EXPECT_EQ(header.find_last_not_of(' ') + 1, header.find_last_of('}') + 1);
  Json j = Json::parse(header);
  // Larger elements first, back to back from 0.
  EXPECT_EQ(j["b"]["data_offsets"], Json::array({0, 24}));
  EXPECT_EQ(j["a"]["data_offsets"], Json::array({24, 34}));
  EXPECT_EQ(j["b"]["dtype"], "F32");
  EXPECT_EQ(j["b"]["shape"], Json::array({2, 3}));
  EXPECT_FALSE(j.contains("__metadata__"));
  ASSERT_EQ(file.size(), 8 + n + 34);
  EXPECT_EQ(std::memcmp(file.data() + 8 + n, s.FindTensor("b")->data(), 24), 0);
  EXPECT_EQ(std::memcmp(file.data() + 8 + n + 24, s.FindTensor("a")->data(), 10), 0);
}

// Files larger than one 8 MiB write piece, with tensors straddling pieces; on POSIX, once with a
// block-multiple size (written with O_DIRECT) and once without.
TEST_F(SafetensorsTest, LargeFilesSpanSeveralPieces) {
  testing::TempDir dir;
  for (bool odd : {false, true}) {
    SCOPED_TRACE(odd ? "odd size" : "block-multiple size");
    State s;
    SP_ASSERT_OK(s.Put("big", Filled(DType::kF32, {3 << 20}, 1)));
    SP_ASSERT_OK(s.Put("mid", Filled(DType::kBF16, {(2 << 20) + (odd ? 1 : 4)}, 2)));
    SP_ASSERT_OK(s.Put("small", Filled(DType::kF64, {1000}, 3)));
    for (FileSystem* fs : {static_cast<FileSystem*>(&fs_), DefaultFileSystem()}) {
      const std::string path = fs == &fs_ ? std::string(kPath) : dir.Sub("big.safetensors");
      SP_ASSERT_OK(SaveSafetensors(s, path, {.overwrite = true}, {.fs = fs, .io_threads = 3}));
      Result<FileInfo> st = fs->Stat(path);
      SP_ASSERT_OK(st.status());
      EXPECT_EQ(st->size % kDirectIOAlignment == 0, !odd) << st->size;
      Result<State> back = LoadSafetensors(path, {}, {.fs = fs});
      SP_ASSERT_OK(back.status());
      EXPECT_TRUE(StatesEqual(s, *back));
    }
  }
}

TEST_F(SafetensorsTest, C128IsRejectedOnSave) {
  State s;
  SP_ASSERT_OK(s.Put("z", Filled(DType::kC128, {2}, 1)));
  Status st = SaveSafetensors(s, kPath, {}, Io());
  EXPECT_THAT(st, StatusIs(StatusCode::kInvalidArgument, "\"z\""));
  EXPECT_NE(st.message().find("C128"), std::string::npos) << st.message();
  EXPECT_EQ(fs_.ListDir("/d")->size(), 0u);
}

TEST_F(SafetensorsTest, ValuesAndMetadataRoundTrip) {
  State s;
  SP_ASSERT_OK(s.Put("w", Filled(DType::kF16, {4}, 3)));
  SP_ASSERT_OK(s.PutValue("step", int64_t{-7}));
  SP_ASSERT_OK(s.PutValue("lr", -0.0));
  SP_ASSERT_OK(s.PutValue("inf", std::numeric_limits<double>::infinity()));
  SP_ASSERT_OK(s.PutValue("flag", true));
  SP_ASSERT_OK(s.PutValue("note", "h\xc3\xa9llo"));
  SP_ASSERT_OK(s.PutValue("rng", Bytes{{0, 1, 255}}));
  SP_ASSERT_OK(s.PutValue("cfg", Value::FromJson(Json{{"layers", Json::array({1, 2})}})));
  s.metadata() = Json{{"format", "pt"},
                      {"epochs", 3},
                      {"nested", {{"a", nullptr}}},
                      {kSafetensorsValuesKey, "a user string under a reserved key"}};
  RoundTrip(s);
  Result<SafetensorsInfo> info = InspectSafetensors(kPath, &fs_);
  SP_ASSERT_OK(info.status());
  // Strings 1:1 for other tools; the rest under the reserved keys.
  EXPECT_EQ(info->raw_metadata.at("format"), "pt");
  EXPECT_EQ(Json::parse(info->raw_metadata.at(kSafetensorsMetadataKey)),
            (Json{{"epochs", 3},
                  {"nested", {{"a", nullptr}}},
                  {kSafetensorsValuesKey, "a user string under a reserved key"}}));
  EXPECT_EQ(Json::parse(info->raw_metadata.at(kSafetensorsValuesKey)).size(), 7u);
  EXPECT_TRUE(StatesEqual(info->values, [&] {
    State v;
    for (const auto& [name, e] : s.entries()) {
      if (!e.is_tensor()) v.PutValue(name, e.value()).IgnoreError();
    }
    v.metadata() = s.metadata();
    return v;
  }()));
}

TEST_F(SafetensorsTest, MetadataShapesRoundTrip) {
  for (Json md : {Json(), Json::object(), Json::array({1, "x"}), Json("text"), Json(42),
                  Json{{"only", "strings"}}}) {
    State s;
    s.metadata() = md;
    RoundTrip(s);
  }
}

TEST_F(SafetensorsTest, MetadataThatIsNotUtf8IsInvalidArgument) {
  State s;
  s.metadata() = Json{{"bad", std::string("\xff\xfe")}};
  Status st = SaveSafetensors(s, kPath, {}, Io());
  EXPECT_THAT(st, StatusIs(StatusCode::kInvalidArgument));
  s.metadata() = Json{{"bad", Json::array({std::string("\xc3")})}};
  st = SaveSafetensors(s, kPath, {}, Io());
  EXPECT_THAT(st, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_FALSE(fs_.Exists(kPath));
}

TEST_F(SafetensorsTest, EmptyTensorsAndScalars) {
  State s;
  SP_ASSERT_OK(s.Put("empty", Filled(DType::kF32, {0}, 1)));
  SP_ASSERT_OK(s.Put("empty2d", Filled(DType::kI64, {3, 0}, 2)));
  SP_ASSERT_OK(s.Put("scalar", Filled(DType::kF64, {}, 3)));
  SP_ASSERT_OK(s.Put("z_last_empty", Filled(DType::kU8, {0, 4}, 4)));
  RoundTrip(s);
  Result<SafetensorsInfo> info = InspectSafetensors(kPath, &fs_);
  SP_ASSERT_OK(info.status());
  ASSERT_EQ(info->tensors.size(), 4u);
  EXPECT_EQ(info->tensors[2].name, "scalar");
  EXPECT_EQ(info->tensors[2].shape, Shape{});
  EXPECT_EQ(info->tensors[2].nbytes(), 8u);
  Result<State> mapped = LoadSafetensors(kPath, LoadWith(true), Io());
  SP_ASSERT_OK(mapped.status());
  EXPECT_TRUE(StatesEqual(s, *mapped));
}

TEST_F(SafetensorsTest, NamesSelectTensorsAndValues) {
  State s;
  SP_ASSERT_OK(s.Put("model.a", Filled(DType::kF32, {2}, 1)));
  SP_ASSERT_OK(s.Put("model.b", Filled(DType::kF32, {2}, 2)));
  SP_ASSERT_OK(s.Put("opt.m", Filled(DType::kF32, {2}, 3)));
  SP_ASSERT_OK(s.PutValue("step", 3));
  SP_ASSERT_OK(SaveSafetensors(s, kPath, {}, Io()));
  Result<State> part = LoadSafetensors(kPath, LoadWith(false, {"model.*", "step"}), Io());
  SP_ASSERT_OK(part.status());
  EXPECT_EQ(part->size(), 3u);
  EXPECT_TRUE(part->Contains("model.b"));
  EXPECT_FALSE(part->Contains("opt.m"));
  EXPECT_EQ(part->FindValue("step")->as_int(), 3);
  Result<State> none = LoadSafetensors(kPath, LoadWith(false, {"nope*"}), Io());
  EXPECT_THAT(none, StatusIs(StatusCode::kNotFound));
}

TEST_F(SafetensorsTest, MmapGivesViewsKeptAliveByTheState) {
  testing::TempDir dir;
  const std::string path = dir.Sub("m.safetensors");
  State s = testing::RandomState(testing::TestSeed("MmapGivesViews"), 6, 64 << 10);
  State st;  // s without C128 tensors, which safetensors lacks
  for (auto& [name, e] : s.entries()) {
    if (e.is_tensor() && !IsSafetensorsDType(e.tensor().dtype())) continue;
    if (e.is_tensor()) SP_ASSERT_OK(st.PutView(name, e.tensor()));
    if (!e.is_tensor()) SP_ASSERT_OK(st.PutValue(name, e.value()));
  }
  st.metadata() = s.metadata();
  SP_ASSERT_OK(SaveSafetensors(st, path));
  Result<State> mapped = LoadSafetensors(path, LoadWith(true));
  SP_ASSERT_OK(mapped.status());
  EXPECT_EQ(mapped->num_keep_alive(), 1u);
  EXPECT_TRUE(StatesEqual(st, *mapped));
  for (const auto& [name, e] : mapped->entries()) {
    if (e.is_tensor()) {
      EXPECT_TRUE(std::holds_alternative<TensorView>(e.item)) << name;
    }
  }
  Result<State> read = LoadSafetensors(path);
  SP_ASSERT_OK(read.status());
  EXPECT_EQ(read->num_keep_alive(), 0u);
  EXPECT_TRUE(StatesEqual(st, *read));

  // Copy-on-write views are writable and private: the file keeps its bytes.
  SafetensorsLoadOptions cow;
  cow.mmap = true;
  cow.map_mode = MapMode::kCopyOnWrite;
  Result<State> writable = LoadSafetensors(path, cow);
  SP_ASSERT_OK(writable.status());
  for (const auto& [name, e] : writable->entries()) {
    if (e.is_tensor()) std::memset(e.tensor().data(), 0x5a, e.tensor().nbytes());
  }
  Result<State> again = LoadSafetensors(path);
  SP_ASSERT_OK(again.status());
  EXPECT_TRUE(StatesEqual(st, *again));
  // Copy-on-write without mmap is refused, not ignored.
  SafetensorsLoadOptions bad;
  bad.map_mode = MapMode::kCopyOnWrite;
  EXPECT_THAT(LoadSafetensors(path, bad), StatusIs(StatusCode::kInvalidArgument));
}

TEST_F(SafetensorsTest, OverwriteReplacesAndLeavesNoDebris) {
  State a, b;
  SP_ASSERT_OK(a.Put("x", Filled(DType::kU8, {3}, 1)));
  SP_ASSERT_OK(b.Put("y", Filled(DType::kI32, {3}, 2)));
  SP_ASSERT_OK(SaveSafetensors(a, kPath, {}, Io()));
  Status st = SaveSafetensors(b, kPath, {}, Io());
  EXPECT_THAT(st, StatusIs(StatusCode::kAlreadyExists));
  SP_ASSERT_OK(SaveSafetensors(b, kPath, {.overwrite = true}, Io()));
  Result<State> back = LoadSafetensors(kPath, {}, Io());
  SP_ASSERT_OK(back.status());
  EXPECT_TRUE(StatesEqual(b, *back));
  ASSERT_EQ(fs_.ListDir("/d")->size(), 1u);
  SP_ASSERT_OK(fs_.CreateDir("/d/dir.safetensors"));
  st = SaveSafetensors(b, "/d/dir.safetensors", {.overwrite = true}, Io());
  EXPECT_THAT(st, StatusIs(StatusCode::kAlreadyExists));
}

TEST_F(SafetensorsTest, CreatesParentsAndSurvivesPowerLoss) {
  State s;
  SP_ASSERT_OK(s.Put("x", Filled(DType::kF32, {64}, 1)));
  SP_ASSERT_OK(SaveSafetensors(s, "/d/deep/er/m.safetensors", {}, Io()));
  fs_.SimulatePowerLoss();
  Result<State> back = LoadSafetensors("/d/deep/er/m.safetensors", {}, Io());
  SP_ASSERT_OK(back.status());
  EXPECT_TRUE(StatesEqual(s, *back));
}

// Every injected failure leaves either no file or the previous file at the path, never a partial
// one (interop/file_writer_testutil.h).
TEST_F(SafetensorsTest, FaultsNeverLeaveAPartialFile) {
  State old_state, new_state;
  SP_ASSERT_OK(old_state.Put("old", Filled(DType::kF32, {100}, 1)));
  SP_ASSERT_OK(new_state.Put("new", Filled(DType::kF64, {300}, 2)));
  SP_ASSERT_OK(new_state.PutValue("step", 9));
  testing::ExpectFaultsNeverLeaveAPartialFile(
      [](const State& s, const std::string& p, bool overwrite, FileSystem* fs) {
        return SaveSafetensors(s, p, {.overwrite = overwrite}, {.fs = fs});
      },
      [](const std::string& p, FileSystem* fs) { return LoadSafetensors(p, {}, {.fs = fs}); },
      kPath, old_state, new_state);
}

// MindSpore's flavour: "format": "ms" and crc_num (docs/INTEROP.md).

template <typename T>
Tensor Of(DType dtype, Shape shape, std::vector<T> values) {
  Tensor t = Tensor::Empty(dtype, std::move(shape)).value();
  std::memcpy(t.data(), values.data(), t.nbytes());
  return t;
}

// Python, with the quirk of 0-d integer arrays spelled out (bytes(np.array(3)) is 3 zero bytes):
//   binascii.crc32(b"a" + b"\0" * 3 + b"b" + struct.pack("<2f", 1, 2) + b"c" + bytes([1, 2, 3])
//                  + b"d" + struct.pack("<f", 0.5) + b"e" + struct.pack("<i", -1))  # 2917978312
// ("e" = -1 is no count: MindSpore itself fails on it; savepoint hashes its bytes.)
State CrcState() {
  State s;
  SP_EXPECT_OK(s.Put("b", Of<float>(DType::kF32, {2}, {1, 2})));
  SP_EXPECT_OK(s.Put("a", Of<int64_t>(DType::kI64, {}, {3})));
  SP_EXPECT_OK(s.Put("c", Of<uint8_t>(DType::kU8, {3}, {1, 2, 3})));
  SP_EXPECT_OK(s.Put("d", Of<float>(DType::kF32, {}, {0.5})));
  SP_EXPECT_OK(s.Put("e", Of<int32_t>(DType::kI32, {}, {-1})));
  return s;
}
constexpr char kCrcOfCrcState[] = "2917978312";

TEST_F(SafetensorsTest, MindSporeCrcNumIsMindSporesAlgorithm) {
  State s = CrcState();
  SP_ASSERT_OK(s.PutValue("step", 7));  // values are not tensors: not in the CRC
  s.metadata() = Json{{"format", "pt"}, {"crc_num", "12"}};  // replaced, and dropped
  SP_ASSERT_OK(SaveSafetensors(s, kPath, {.mindspore_format = true, .crc_check = true}, Io()));
  Result<SafetensorsInfo> info = InspectSafetensors(kPath, &fs_);
  SP_ASSERT_OK(info.status());
  EXPECT_EQ(info->raw_metadata.at("crc_num"), kCrcOfCrcState);
  EXPECT_EQ(info->raw_metadata.at("format"), "ms");
  EXPECT_TRUE(info->mindspore_format);
  EXPECT_TRUE(info->has_crc_num);
  EXPECT_EQ(info->crc_num, 2917978312u);
  // The header stays valid JSON padded with spaces after the crc_num went in.
  std::string file = Contents(kPath);
  EXPECT_EQ(format::GetU64(file, 0) % 8, 0u);
  // `__metadata__` first, then the tensors in offset order, which MindSpore's reader requires.
  auto header = nlohmann::ordered_json::parse(file.substr(8, format::GetU64(file, 0)));
  EXPECT_EQ(header.begin().key(), "__metadata__");
  uint64_t at = 0;
  for (auto it = std::next(header.begin()); it != header.end(); ++it) {
    EXPECT_EQ((*it)["data_offsets"][0].get<uint64_t>(), at) << it.key();
    at = (*it)["data_offsets"][1].get<uint64_t>();
  }
  Result<State> back = LoadSafetensors(kPath, {}, Io());
  SP_ASSERT_OK(back.status());
  EXPECT_EQ(back->FindValue("step")->as_int(), 7);
  EXPECT_EQ(back->num_tensors(), 5u);
  SP_EXPECT_OK(VerifySafetensors(kPath, {}, Io()));
  // Without the options: neither key (a stale crc_num is never copied).
  SP_ASSERT_OK(SaveSafetensors(*back, kPath, {.overwrite = true}, Io()));
  info = InspectSafetensors(kPath, &fs_);
  SP_ASSERT_OK(info.status());
  EXPECT_FALSE(info->has_crc_num);
  EXPECT_EQ(info->raw_metadata.at("format"), "ms");  // the loaded metadata's own member

  // A 0-d integer scalar counts as that many zero bytes, however many (binascii.crc32(b"\0" *
  // 100000) == 3557922173, past the 4 KiB block of the doubling).
  int64_t v = 100000;
  std::optional<interop::CrcPart> zeros =
      interop::IndexScalarCrc(DType::kI64, {}, std::as_bytes(std::span(&v, 1)));
  ASSERT_TRUE(zeros.has_value());
  EXPECT_EQ(zeros->crc, 3557922173u);
  EXPECT_EQ(zeros->len, 100000u);
  EXPECT_FALSE(interop::IndexScalarCrc(DType::kI64, {1}, std::as_bytes(std::span(&v, 1))));
  EXPECT_FALSE(interop::IndexScalarCrc(DType::kF64, {}, std::as_bytes(std::span(&v, 1))));
}

TEST_F(SafetensorsTest, MindSporeCrcMismatchIsCorruption) {
  testing::TempDir dir;
  const std::string path = dir.Sub("ms.safetensors");
  State s = CrcState();
  SP_ASSERT_OK(s.Put("big", Filled(DType::kF32, {(3 << 20) + 5}, 9)));  // several pieces
  SP_ASSERT_OK(SaveSafetensors(s, path, {.crc_check = true}, {.io_threads = 3}));
  SP_ASSERT_OK(LoadSafetensors(path, LoadWith(true), {.io_threads = 3}).status());
  SP_ASSERT_OK(VerifySafetensors(path, {}, {.io_threads = 3}));
  // One flipped bit deep inside "big", which a load of "a" alone does not read but the CRC needs.
  std::string bytes = DefaultFileSystem()->ReadFile(path, uint64_t{1} << 30).value();
  bytes[bytes.size() - (5 << 20)] ^= 0x10;
  SP_ASSERT_OK(DefaultFileSystem()->WriteFileSynced(path, bytes));
  for (bool mmap : {false, true}) {
    for (std::vector<std::string> names : {std::vector<std::string>{}, {"a"}}) {
      SCOPED_TRACE(fmt::format("mmap {} names {}", mmap, names.size()));
      Result<State> r = LoadSafetensors(path, LoadWith(mmap, names), {.io_threads = 3});
      EXPECT_THAT(r, StatusIs(StatusCode::kCorruption));
      const std::string m = r.status().message();
      EXPECT_NE(m.find(path), std::string::npos) << m;
      EXPECT_NE(m.find("CRC-32 mismatch"), std::string::npos) << m;
      SafetensorsLoadOptions unchecked = LoadWith(mmap, names);
      unchecked.crc_check = false;
      SP_EXPECT_OK(LoadSafetensors(path, unchecked).status());
    }
  }
  LoadStats stats;
  Status v = VerifySafetensors(path, {.stats = &stats}, {.io_threads = 2});
  EXPECT_THAT(v, StatusIs(StatusCode::kCorruption));
  EXPECT_EQ(stats.chunks, 0u);
  SP_EXPECT_OK(VerifySafetensors(path, {.crc_check = false}, {.io_threads = 2}));
  // Both values are named: the stored one, and what the bytes give.
  Result<SafetensorsInfo> info = InspectSafetensors(path);
  SP_ASSERT_OK(info.status());
  EXPECT_NE(v.message().find(fmt::format("crc_num {},", info->crc_num)), std::string::npos)
      << v.message();

  // A crc_num that is no CRC-32 is Corruption too, unless unchecked.
  for (const char* stored : {"-5", "4294967296", "12x", ""}) {
    const std::string json =
        fmt::format(R"({{"__metadata__":{{"crc_num":"{}"}},"x":{{"dtype":"U8","shape":[2],)"
                    R"("data_offsets":[0,2]}}}})",
                    stored);
    std::string f(8, '\0');
    format::PutU64(&f, 0, json.size());
    SP_ASSERT_OK(fs_.WriteFileSynced(kPath, f + json + "ab"));
    Result<State> bad = LoadSafetensors(kPath, {}, Io());
    EXPECT_THAT(bad, StatusIs(StatusCode::kCorruption));
    SafetensorsLoadOptions unchecked;
    unchecked.crc_check = false;
    SP_EXPECT_OK(LoadSafetensors(kPath, unchecked, Io()).status());
  }
}

TEST_F(SafetensorsTest, MindSporeFormatRefusesWhatMindSporeCannotLoad) {
  for (DType d : {DType::kF8E4M3, DType::kF8E5M2, DType::kC64}) {
    State s;
    SP_ASSERT_OK(s.Put("w", Filled(d, {2}, 1)));
    SP_EXPECT_OK(SaveSafetensors(s, kPath, {.overwrite = true}, Io()));
    Status st = SaveSafetensors(s, kPath, {.overwrite = true, .mindspore_format = true}, Io());
    EXPECT_THAT(st, StatusIs(StatusCode::kInvalidArgument));
  }
  State s;
  SP_ASSERT_OK(s.Put("w", Filled(DType::kI8, {2}, 1)));
  s.metadata() = Json{{"w", "Int4"}};  // MindSpore's qint4x2 marker: fine
  SP_EXPECT_OK(SaveSafetensors(s, kPath, {.overwrite = true, .mindspore_format = true}, Io()));
  s.metadata() = Json{{"w", "x"}};
  Status st = SaveSafetensors(s, kPath, {.overwrite = true, .mindspore_format = true}, Io());
  EXPECT_THAT(st, StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace savepoint
