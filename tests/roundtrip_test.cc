// Save/load round trips through the public API, on the POSIX and in-memory file systems.
#include <fmt/format.h>

#include <cstring>
#include <limits>

#include "io/mem_fs.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

using testing::RandomState;
using testing::StatesEqual;
using testing::TempDir;

TEST(RoundTrip, RandomStatePosix) {
  uint64_t seed = testing::TestSeed("RoundTrip.RandomStatePosix");
  TempDir dir;
  State s = RandomState(seed, 20, 6 << 20);
  SaveOptions so;
  so.chunk_bytes = 64 << 10;  // many chunks per tensor
  SaveStats stats;
  so.stats = &stats;
  SP_ASSERT_OK(Save(s, dir.Sub("ck"), so));
  EXPECT_EQ(stats.bytes, s.tensor_bytes());
  Result<State> back = Load(dir.Sub("ck"));
  SP_ASSERT_OK(back.status());
  EXPECT_TRUE(StatesEqual(s, *back));
  SP_EXPECT_OK(VerifyCheckpoint(dir.Sub("ck")));
}

TEST(RoundTrip, BufferedIoAndSingleThread) {
  uint64_t seed = testing::TestSeed("RoundTrip.BufferedIoAndSingleThread");
  TempDir dir;
  State s = RandomState(seed, 5, 1 << 20);
  const IoOptions io{.io_threads = 1, .direct_io = false};
  SP_ASSERT_OK(Save(s, dir.Sub("ck"), {}, io));
  Result<State> back = Load(dir.Sub("ck"), {}, io);
  SP_ASSERT_OK(back.status());
  EXPECT_TRUE(StatesEqual(s, *back));
}

TEST(RoundTrip, EveryDTypeScalarsAndEmpty) {
  MemFileSystem fs;
  State s;
  for (DType dt : AllDTypes()) {
    std::string n(DTypeName(dt));
    Tensor a = Tensor::Empty(dt, {3, 5}).value();
    testing::FillPattern(a.view(), static_cast<uint64_t>(dt));
    SP_ASSERT_OK(s.Put("t." + n, std::move(a)));
    Tensor scalar = Tensor::Empty(dt, {}).value();
    testing::FillPattern(scalar.view(), 99);
    SP_ASSERT_OK(s.Put("scalar." + n, std::move(scalar)));
    SP_ASSERT_OK(s.Put("empty." + n, Tensor::Zeros(dt, {0, 7}).value()));
  }
  const IoOptions io{.fs = &fs};
  SP_ASSERT_OK(Save(s, "/ck", {}, io));
  Result<State> back = Load("/ck", {}, io);
  SP_ASSERT_OK(back.status());
  EXPECT_TRUE(StatesEqual(s, *back));
  EXPECT_EQ(back->FindTensor("scalar.F32")->shape(), Shape{});
  EXPECT_EQ(back->FindTensor("empty.BF16")->nbytes(), 0u);
}

TEST(RoundTrip, ValuesOfEveryKind) {
  MemFileSystem fs;
  State s;
  SP_ASSERT_OK(s.PutValue("i", int64_t{-7}));
  SP_ASSERT_OK(s.PutValue("imax", std::numeric_limits<int64_t>::max()));
  SP_ASSERT_OK(s.PutValue("f", 0.1));
  SP_ASSERT_OK(s.PutValue("nan", std::numeric_limits<double>::quiet_NaN()));
  SP_ASSERT_OK(s.PutValue("inf", -std::numeric_limits<double>::infinity()));
  SP_ASSERT_OK(s.PutValue("negzero", -0.0));
  SP_ASSERT_OK(s.PutValue("b", false));
  SP_ASSERT_OK(s.PutValue("s", std::string("h\xc3\xa9llo\n\"q\"")));
  SP_ASSERT_OK(s.PutValue("bytes", Bytes{{0, 255, 10, 13, 0}}));
  SP_ASSERT_OK(s.PutValue("empty_bytes", Bytes{}));
  SP_ASSERT_OK(s.PutValue("json", Value::FromJson(Json::parse(R"({"a":[1,2,{"b":null}]})"))));
  s.metadata() = Json{{"user", "x"}, {"epoch", 3}};
  const IoOptions io{.fs = &fs};
  SP_ASSERT_OK(Save(s, "/ck", {}, io));
  Result<State> back = Load("/ck", {}, io);
  SP_ASSERT_OK(back.status());
  EXPECT_TRUE(StatesEqual(s, *back));
}

TEST(RoundTrip, ThousandsOfSmallTensorsAndNonAsciiNames) {
  MemFileSystem fs;
  State s;
  for (int i = 0; i < 3000; ++i) {
    Tensor t = Tensor::Empty(DType::kF32, {i % 17}).value();
    testing::FillPattern(t.view(), i);
    SP_ASSERT_OK(s.Put(fmt::format("层.{}.gewicht-ü/ß 🙂", i), std::move(t)));
  }
  const IoOptions io{.fs = &fs};
  SP_ASSERT_OK(Save(s, "/root/ck", {}, io));
  Result<State> back = Load("/root/ck", {}, io);
  SP_ASSERT_OK(back.status());
  EXPECT_TRUE(StatesEqual(s, *back));
}

TEST(RoundTrip, SelectByNamesAndGlobs) {
  MemFileSystem fs;
  State s = RandomState(1, 0, 0);
  for (const char* n : {"model.a.weight", "model.a.bias", "model.b.weight", "optimizer.m"}) {
    SP_ASSERT_OK(s.Put(n, Tensor::Zeros(DType::kF16, {4}).value()));
  }
  const IoOptions io{.fs = &fs};
  SP_ASSERT_OK(Save(s, "/ck", {}, io));
  LoadOptions lo;
  lo.names = {"model.*.weight", "step"};
  Result<State> part = Load("/ck", lo, io);
  SP_ASSERT_OK(part.status());
  EXPECT_EQ(part->num_tensors(), 2u);
  EXPECT_NE(part->FindTensor("model.b.weight"), nullptr);
  EXPECT_NE(part->FindValue("step"), nullptr);
  EXPECT_EQ(part->FindValue("lr"), nullptr);
  lo.names = {"model.c.*"};
  Result<State> none = Load("/ck", lo, io);
  EXPECT_THAT(none, StatusIs(StatusCode::kNotFound, "model.c.*"));
}

TEST(RoundTrip, LoadIntoCallerBuffers) {
  TempDir dir;
  State s;
  Tensor w = Tensor::Empty(DType::kBF16, {333, 77}).value();  // odd size: unaligned tail
  testing::FillPattern(w.view(), 5);
  SP_ASSERT_OK(s.PutView("w", w.view()));
  SP_ASSERT_OK(s.PutValue("step", int64_t{12}));
  SP_ASSERT_OK(Save(s, dir.Sub("ck")));

  std::vector<uint16_t> mine(333 * 77 + 1);  // caller memory, deliberately not 4 KiB aligned
  State targets;
  SP_ASSERT_OK(targets.PutView("w", TensorView(mine.data() + 1, DType::kBF16, {333, 77})));
  SP_ASSERT_OK(LoadInto(dir.Sub("ck"), targets));
  EXPECT_EQ(std::memcmp(mine.data() + 1, w.data(), w.nbytes()), 0);
  EXPECT_EQ(targets.FindValue("step")->as_int(), 12);

  State wrong;
  SP_ASSERT_OK(wrong.PutView("w", TensorView(mine.data(), DType::kF16, {333, 77})));
  Status st = LoadInto(dir.Sub("ck"), wrong);
  EXPECT_THAT(st, StatusIs(StatusCode::kInvalidArgument, "BF16"));
}

TEST(RoundTrip, ReaderListsWithoutReadingData) {
  MemFileSystem fs;
  State s = RandomState(3, 4, 1 << 16);
  const IoOptions io{.fs = &fs};
  SP_ASSERT_OK(Save(s, "/ck", {}, io));
  // Remove the data file: opening and listing must still work, reading must not.
  SP_ASSERT_OK(fs.RemoveFile("/ck/data-00000-00000.spd"));
  auto r = CheckpointReader::Open("/ck", {}, io);
  SP_ASSERT_OK(r.status());
  EXPECT_EQ((*r)->tensors().size(), 4u);
  EXPECT_EQ((*r)->values().FindValue("step")->as_int(), 3);
  Result<Tensor> t = (*r)->ReadTensor((*r)->tensors()[0].name);
  EXPECT_THAT(t, StatusIs(StatusCode::kNotFound));
}

TEST(RoundTrip, ExistingPathNeedsOverwrite) {
  MemFileSystem fs;
  const IoOptions io{.fs = &fs};
  SaveOptions so;
  SP_ASSERT_OK(Save(RandomState(1, 2, 1000), "/ck", so, io));
  Status again = Save(RandomState(2, 2, 1000), "/ck", so, io);
  EXPECT_THAT(again, StatusIs(StatusCode::kAlreadyExists));
  so.overwrite = true;
  State second = RandomState(2, 2, 1000);
  SP_ASSERT_OK(Save(second, "/ck", so, io));
  EXPECT_TRUE(StatesEqual(second, Load("/ck", {}, io).value()));
  auto entries = fs.ListDir("/").value();
  EXPECT_EQ(entries.size(), 1u) << "old checkpoint left behind";
}

TEST(RoundTrip, BadOptionsAndPaths) {
  MemFileSystem fs;
  IoOptions io{.fs = &fs};
  SaveOptions so;
  so.chunk_bytes = 1000;
  EXPECT_THAT(Save(State(), "/ck", so, io), StatusIs(StatusCode::kInvalidArgument));
  so.chunk_bytes = 4096;
  io.io_threads = 0;
  EXPECT_THAT(Save(State(), "/ck", so, io), StatusIs(StatusCode::kInvalidArgument));
  io.io_threads = 2;
  EXPECT_THAT(Save(State(), "/.hidden", so, io), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(Save(State(), "/a/..", so, io), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(Save(State(), "", so, io), StatusIs(StatusCode::kInvalidArgument));
  SP_EXPECT_OK(Save(State(), "/empty_state", so, io));
  const IoOptions load_io{.fs = &fs};
  EXPECT_THAT(Load("/nothing", {}, load_io), StatusIs(StatusCode::kNotFound));
  EXPECT_EQ(Load("/empty_state", {}, load_io).value().size(), 0u);
}

}  // namespace
}  // namespace savepoint
