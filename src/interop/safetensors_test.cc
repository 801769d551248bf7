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
#include "interop/safetensors_testutil.h"
#include "io/fault_fs.h"
#include "io/mem_fs.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

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
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("\"z\""), std::string::npos) << st.message();
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
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  s.metadata() = Json{{"bad", Json::array({std::string("\xc3")})}};
  st = SaveSafetensors(s, kPath, {}, Io());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
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
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound) << none.status().ToString();
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
  EXPECT_EQ(LoadSafetensors(path, bad).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(SafetensorsTest, OverwriteReplacesAndLeavesNoDebris) {
  State a, b;
  SP_ASSERT_OK(a.Put("x", Filled(DType::kU8, {3}, 1)));
  SP_ASSERT_OK(b.Put("y", Filled(DType::kI32, {3}, 2)));
  SP_ASSERT_OK(SaveSafetensors(a, kPath, {}, Io()));
  Status st = SaveSafetensors(b, kPath, {}, Io());
  EXPECT_EQ(st.code(), StatusCode::kAlreadyExists) << st.ToString();
  SP_ASSERT_OK(SaveSafetensors(b, kPath, {.overwrite = true}, Io()));
  Result<State> back = LoadSafetensors(kPath, {}, Io());
  SP_ASSERT_OK(back.status());
  EXPECT_TRUE(StatesEqual(b, *back));
  ASSERT_EQ(fs_.ListDir("/d")->size(), 1u);
  SP_ASSERT_OK(fs_.CreateDir("/d/dir.safetensors"));
  st = SaveSafetensors(b, "/d/dir.safetensors", {.overwrite = true}, Io());
  EXPECT_EQ(st.code(), StatusCode::kAlreadyExists) << st.ToString();
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

}  // namespace
}  // namespace savepoint
