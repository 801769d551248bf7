// IoOptions (savepoint/io_options.h), the engine-wide settings apart from per-call options: one
// validity check for every call that takes them, the file system and direct I/O reach every file
// each call opens, and the per-call fields that a call cannot use are refused, never ignored.
#include "savepoint/io_options.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "io/mem_fs.h"
#include "savepoint/async.h"
#include "savepoint/checkpoint.h"
#include "savepoint/distributed.h"
#include "savepoint/manager.h"
#include "savepoint/safetensors.h"
#include "testutil/ranks.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

// Records the direct_io flag of every data file (".spd", ".safetensors") opened through it.
class RecordingFs final : public ForwardingFileSystem {
 public:
  explicit RecordingFs(FileSystem* base) : ForwardingFileSystem(base) {}
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& p,
                                                        const FileOptions& o) override {
    Record(p, o);
    return ForwardingFileSystem::NewWritableFile(p, o);
  }
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& p,
                                                                const FileOptions& o) override {
    Record(p, o);
    return ForwardingFileSystem::NewRandomAccessFile(p, o);
  }
  // The direct_io flags seen since the last call (each value once).
  std::set<bool> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(seen_, {});
  }

 private:
  void Record(const std::string& path, const FileOptions& o) {
    if (path.find(".spd") == std::string::npos && path.find(".safetensors") == std::string::npos) {
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    seen_.insert(o.direct_io);
  }
  std::mutex mu_;
  std::set<bool> seen_;
};

// A few tensors of dtypes every format stores (safetensors included), and a value.
State SmallState() {
  State s;
  const std::vector<std::pair<DType, Shape>> specs = {
      {DType::kF32, {256, 130}}, {DType::kBF16, {1000}}, {DType::kU8, {3, 5}}, {DType::kI64, {77}}};
  for (size_t i = 0; i < specs.size(); ++i) {
    Tensor t = Tensor::Empty(specs[i].first, specs[i].second).value();
    testing::FillPattern(t.view(), i);
    EXPECT_TRUE(s.Put("layer" + std::to_string(i) + ".w", std::move(t)).ok());
  }
  EXPECT_TRUE(s.PutValue("step", int64_t{3}).ok());
  return s;
}

void ExpectBadThreads(const Status& s, const std::string& call) {
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument)) << call << ": " << s.ToString();
  EXPECT_NE(s.message().find("IoOptions.io_threads = 0: must be in [1, 64]"), std::string::npos)
      << call << ": " << s.ToString();
}

TEST(IoOptions, ValidatedByEveryCallThatTakesThem) {
  MemFileSystem mem;
  const IoOptions good{.fs = &mem, .direct_io = false};
  IoOptions bad = good;
  bad.io_threads = 0;
  State state = SmallState();
  SP_ASSERT_OK(Save(state, "/ck", {}, good));
  SP_ASSERT_OK(SaveSafetensors(state, "/st.safetensors", {}, good));
  ExpectBadThreads(Save(state, "/ck2", {}, bad), "Save");
  EXPECT_FALSE(mem.Exists("/ck2"));
  ExpectBadThreads(Load("/ck", {}, bad).status(), "Load");
  ExpectBadThreads(LoadInto("/ck", state, {}, bad), "LoadInto");
  ExpectBadThreads(CheckpointReader::Open("/ck", {}, bad).status(), "CheckpointReader::Open");
  ExpectBadThreads(VerifyCheckpoint("/ck", {}, bad), "VerifyCheckpoint");
  ExpectBadThreads(SaveSafetensors(state, "/st2.safetensors", {}, bad), "SaveSafetensors");
  ExpectBadThreads(LoadSafetensors("/st.safetensors", {}, bad).status(), "LoadSafetensors");
  ExpectBadThreads(Checkpointer::Create({}, bad).status(), "Checkpointer::Create");
  ExpectBadThreads(MergeCheckpoint("/ck", "/merged", {}, bad), "MergeCheckpoint");
  ExpectBadThreads(MergeToSafetensors("/ck", "/merged-st", {}, bad), "MergeToSafetensors");
  ExpectBadThreads(LoadDistributedAlloc("/ck", {}, {}, bad).status(), "LoadDistributedAlloc");
  ManagerOptions mo;
  mo.naming.directory = "/mgr";
  mo.io = bad;
  ExpectBadThreads(ValidateManagerOptions(mo), "ValidateManagerOptions");
  for (const Status& s : testing::OnRanks(
           2, [&](Communicator& c) { return SaveDistributed(c, state, {}, "/dist", {}, bad); })) {
    ExpectBadThreads(s, "SaveDistributed");
  }
  bad.io_threads = 65;
  EXPECT_THAT(Save(state, "/ck3", {}, bad), StatusIs(StatusCode::kInvalidArgument));
}

TEST(IoOptions, FileSystemAndDirectIoReachEveryFile) {
  MemFileSystem mem;
  RecordingFs fs(&mem);
  State state = SmallState();
  for (bool direct : {false, true}) {
    SCOPED_TRACE(direct ? "direct_io" : "buffered");
    const IoOptions io{.fs = &fs, .io_threads = 3, .direct_io = direct};
    const std::string ck = direct ? "/d/ck" : "/b/ck", st = ck + ".safetensors";
    SP_ASSERT_OK(Save(state, ck, {}, io));
    EXPECT_EQ(fs.Take(), std::set<bool>{direct}) << "Save";
    State back = Load(ck, {}, io).value();
    EXPECT_TRUE(testing::StatesEqual(state, back));
    EXPECT_EQ(fs.Take(), std::set<bool>{direct}) << "Load";
    SP_ASSERT_OK(VerifyCheckpoint(ck, {}, io));
    EXPECT_EQ(fs.Take(), std::set<bool>{direct}) << "VerifyCheckpoint";
    // A safetensors file is written with O_DIRECT when asked (a last partial block through a
    // second, buffered handle: never here, as MemFileSystem files are never direct); it is always
    // read through the page cache (its tensors are not block-aligned).
    SaveStats st_stats;
    SP_ASSERT_OK(SaveSafetensors(state, st, {.stats = &st_stats}, io));
    EXPECT_EQ(fs.Take(), std::set<bool>{direct}) << "SaveSafetensors";
    EXPECT_FALSE(st_stats.direct_io);  // MemFileSystem files never report direct()
    EXPECT_TRUE(testing::StatesEqual(state, LoadSafetensors(st, {}, io).value()));
    EXPECT_EQ(fs.Take(), std::set<bool>{false}) << "LoadSafetensors";
    auto ckpt = Checkpointer::Create({.slab_bytes = 64 << 10}, io).value();
    SP_ASSERT_OK(ckpt->SaveAsync(state, ck + "-async").value().Wait());
    EXPECT_EQ(fs.Take(), std::set<bool>{direct}) << "SaveAsync";
    EXPECT_TRUE(testing::StatesEqual(state, Load(ck + "-async", {}, io).value()));
    fs.Take();
  }
  // Nothing went to the default (POSIX) file system.
  EXPECT_FALSE(std::filesystem::exists("/b/ck"));
  EXPECT_FALSE(std::filesystem::exists("/d/ck"));
}

TEST(IoOptions, SafetensorsLoadReadsInParallelWithProgress) {
  MemFileSystem mem;
  State state;
  for (int i = 0; i < 5; ++i) {  // pieces of 8 MiB: two tensors span several
    Tensor t = Tensor::Empty(DType::kU8, {int64_t{1} << (14 + 2 * i)}).value();  // 16 KiB..4 MiB
    testing::FillPattern(t.view(), i);
    SP_ASSERT_OK(state.Put("t" + std::to_string(i), std::move(t)));
  }
  Tensor big = Tensor::Empty(DType::kF32, {5 << 20}).value();  // 20 MiB: three pieces
  testing::FillPattern(big.view(), 9);
  SP_ASSERT_OK(state.Put("big", std::move(big)));
  SP_ASSERT_OK(SaveSafetensors(state, "/m.safetensors", {}, {.fs = &mem}));
  for (int threads : {1, 2, 8}) {
    SCOPED_TRACE(threads);
    std::vector<std::pair<uint64_t, uint64_t>> calls;
    LoadStats stats;
    SafetensorsLoadOptions o{.stats = &stats, .progress = [&](uint64_t done, uint64_t total) {
                               calls.emplace_back(done, total);
                             }};
    State back = LoadSafetensors("/m.safetensors", o, {.fs = &mem, .io_threads = threads}).value();
    EXPECT_TRUE(testing::StatesEqual(state, back));
    EXPECT_EQ(stats.bytes, state.tensor_bytes());
    ASSERT_FALSE(calls.empty());
    EXPECT_EQ(calls.back(), std::make_pair(state.tensor_bytes(), state.tensor_bytes()));
    for (size_t i = 1; i < calls.size(); ++i) EXPECT_GE(calls[i].first, calls[i - 1].first);
  }
}

TEST(IoOptions, MergesAndDistributedLoadsRefuseMapping) {
  MemFileSystem mem;
  const IoOptions io{.fs = &mem, .direct_io = false};
  SP_ASSERT_OK(Save(SmallState(), "/ck", {}, io));
  MergeOptions mo;
  mo.load.mmap = true;
  Status s = MergeCheckpoint("/ck", "/merged", mo, io);
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "load.mmap"));
  MergeSafetensorsOptions ms;
  ms.load.map_mode = MapMode::kCopyOnWrite;
  EXPECT_THAT(MergeToSafetensors("/ck", "/merged-st", ms, io),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_FALSE(mem.Exists("/merged") || mem.Exists("/merged-st"));
  s = LoadDistributedAlloc("/ck", {}, {.mmap = true}, io).status();
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "mmap"));
}

TEST(IoOptions, DistributedSaveAndLoadReportStatsAndProgress) {
  MemFileSystem mem;
  const IoOptions io{.fs = &mem, .io_threads = 2, .direct_io = false};
  State state = SmallState();  // replicated on both ranks: each writes about half
  std::vector<SaveStats> saved(2);
  std::vector<uint64_t> last_done(2, 0);
  std::vector<Status> results = testing::OnRanks(2, [&](Communicator& c) {
    DistributedSaveOptions o;
    o.save.chunk_bytes = 64 << 10;
    o.save.stats = &saved[c.rank()];
    o.save.progress = [&, r = c.rank()](uint64_t done, uint64_t) { last_done[r] = done; };
    return SaveDistributed(c, state, {}, "/dist", o, io);
  });
  for (const Status& r : results) SP_ASSERT_OK(r);
  EXPECT_EQ(saved[0].bytes + saved[1].bytes, state.tensor_bytes());
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(last_done[r], saved[r].bytes) << "rank " << r;
    EXPECT_EQ(saved[r].stored_bytes, saved[r].bytes);
  }
  LoadStats stats;
  uint64_t done = 0, total = 0;
  LoadOptions lo{.stats = &stats, .progress = [&](uint64_t d, uint64_t t) { done = d, total = t; }};
  ShardLayout whole;  // every tensor whole
  for (const auto& [name, e] : state.entries()) {
    if (!e.is_tensor()) continue;
    const Shape& shape = e.tensor().shape();
    whole[name] = ShardSpec{shape, Shape(shape.size(), 0), shape, {}};
  }
  State back = LoadDistributedAlloc("/dist", whole, lo, io).value();
  EXPECT_TRUE(testing::StatesEqual(state, back));
  EXPECT_EQ(stats.bytes, state.tensor_bytes());
  EXPECT_GT(stats.chunks, 0u);
  EXPECT_GE(stats.stored_bytes, state.tensor_bytes());
  EXPECT_GT(total, 0u);
  EXPECT_EQ(done, total);
}

}  // namespace
}  // namespace savepoint
