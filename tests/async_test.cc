// Asynchronous two-phase saves (Checkpointer): round trips, bounded staging memory, snapshot
// isolation from later mutation, background faults, one save in flight, custom copiers.
#include "savepoint/async.h"

#include <fmt/format.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include "io/fault_fs.h"
#include "io/mem_fs.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

using testing::RandomState;
using testing::StatesEqual;

// A Checkpointer whose saves write through `fs` (nullptr = DefaultFileSystem()).
std::unique_ptr<Checkpointer> Make(uint64_t staging, FileSystem* fs = nullptr,
                                   uint64_t slab = 64 << 10, int threads = 2) {
  CheckpointerOptions o;
  o.staging_bytes = staging;
  o.slab_bytes = slab;
  return Checkpointer::Create(o, {.fs = fs, .io_threads = threads}).value();
}

State LoadFrom(FileSystem* fs, const std::string& path) {
  Result<State> s = Load(path, {}, {.fs = fs});
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(s).value() : State();
}

TEST(Async, RoundTripOnDisk) {
  uint64_t seed = testing::TestSeed("Async.RoundTripOnDisk");
  testing::TempDir dir;
  State s = RandomState(seed, 12, 3 << 20);
  auto ckpt = Make(uint64_t{64} << 20, nullptr, 1 << 20);
  Result<SaveHandle> h = ckpt->SaveAsync(s, dir.Sub("a"));
  SP_ASSERT_OK(h.status());
  SP_ASSERT_OK(h->Wait());
  EXPECT_TRUE(h->Poll());
  SaveStats st = h->stats();
  EXPECT_EQ(st.bytes, s.tensor_bytes());
  EXPECT_GT(st.seconds, 0);
  EXPECT_GE(st.seconds, st.blocked_seconds);
  EXPECT_GT(st.chunks, 0u);
  EXPECT_EQ(st.stored_bytes, st.bytes);  // uncompressed
  EXPECT_TRUE(StatesEqual(s, LoadFrom(DefaultFileSystem(), dir.Sub("a"))));
  SP_EXPECT_OK(VerifyCheckpoint(dir.Sub("a")));
}

TEST(Async, StateLargerThanStagingStaysWithinCap) {
  uint64_t seed = testing::TestSeed("Async.StateLargerThanStagingStaysWithinCap");
  MemFileSystem fs;
  State s = RandomState(seed, 20, 8 << 20);  // 8 MiB through a 256 KiB pool
  auto ckpt = Make(256 << 10, &fs);
  Result<SaveHandle> h = ckpt->SaveAsync(s, "/a");
  SP_ASSERT_OK(h.status());
  SP_ASSERT_OK(h->Wait());
  EXPECT_LE(ckpt->staging_allocated_bytes(), ckpt->staging_cap_bytes());
  EXPECT_EQ(ckpt->staging_cap_bytes(), 256u << 10);
  EXPECT_EQ(ckpt->staging_in_use_bytes(), 0u);
  EXPECT_TRUE(StatesEqual(s, LoadFrom(&fs, "/a")));
}

// Polls `done` for up to 60 s (a loaded CI machine); true once it holds.
bool Eventually(const std::function<bool()>& done) {
  for (int i = 0; i < 6000 && !done(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return done();
}

// CheckpointerOptions::prefault_bytes and Reserve allocate staging slabs in the background, up to
// the target and never past the cap, and a save uses them.
TEST(Async, ReserveAllocatesStagingInTheBackground) {
  CheckpointerOptions o;
  o.staging_bytes = 16 << 20;
  o.slab_bytes = 1 << 20;
  o.prefault_bytes = (5 << 20) - 1;  // rounds up to 5 slabs
  MemFileSystem fs;
  auto ckpt = Checkpointer::Create(o, {.fs = &fs, .io_threads = 2}).value();
  ASSERT_TRUE(Eventually([&] { return ckpt->staging_allocated_bytes() == (5u << 20); }));
  EXPECT_EQ(ckpt->staging_in_use_bytes(), 0u);
  ckpt->Reserve(uint64_t{1} << 40);  // far over the cap: stops at it
  ASSERT_TRUE(Eventually([&] { return ckpt->staging_allocated_bytes() == (16u << 20); }));
  ckpt->Reserve(1 << 20);  // below what is allocated: nothing to do
  State s =
      RandomState(testing::TestSeed("Async.ReserveAllocatesStagingInTheBackground"), 4, 3 << 20);
  Result<SaveHandle> h = ckpt->SaveAsync(s, "/a");
  SP_ASSERT_OK(h.status());
  SP_ASSERT_OK(h->Wait());
  EXPECT_EQ(ckpt->staging_allocated_bytes(), 16u << 20);  // no slab allocated past the cap
  EXPECT_TRUE(StatesEqual(s, LoadFrom(&fs, "/a")));
}

TEST(Async, MutatingAfterSnapshotDoesNotChangeWhatIsSaved) {
  MemFileSystem fs;
  Tensor w = Tensor::Empty(DType::kF32, {1000, 333}).value();
  testing::FillPattern(w.view(), 7);
  Tensor copy = Tensor::CopyOf(w.view()).value();
  State s;
  SP_ASSERT_OK(s.PutView("w", w.view()));
  auto ckpt = Make(64 << 20, &fs);
  Result<SaveHandle> h = ckpt->SaveAsync(s, "/a");
  SP_ASSERT_OK(h.status());
  std::memset(w.data(), 0xEE, w.nbytes());  // the "optimizer step" after the snapshot
  SP_ASSERT_OK(h->Wait());
  State back = LoadFrom(&fs, "/a");
  ASSERT_NE(back.FindTensor("w"), nullptr);
  EXPECT_EQ(std::memcmp(back.FindTensor("w")->data(), copy.data(), copy.nbytes()), 0);
}

TEST(Async, ManySmallTensorsAndEmptyState) {
  MemFileSystem fs;
  State s;
  for (int i = 0; i < 2000; ++i) {
    Tensor t = Tensor::Empty(DType::kBF16, {i % 50}).value();
    testing::FillPattern(t.view(), i);
    SP_ASSERT_OK(s.Put(fmt::format("p.{}", i), std::move(t)));
  }
  auto ckpt = Make(1 << 20, &fs);
  SP_ASSERT_OK(ckpt->SaveAsync(s, "/small").value().Wait());
  EXPECT_TRUE(StatesEqual(s, LoadFrom(&fs, "/small")));
  SP_ASSERT_OK(ckpt->SaveAsync(State(), "/empty").value().Wait());
  EXPECT_EQ(LoadFrom(&fs, "/empty").size(), 0u);
}

TEST(Async, OneSaveInFlightByDefault) {
  MemFileSystem fs;
  auto ckpt = Make(128 << 10, &fs);
  std::vector<SaveHandle> handles;
  std::vector<State> states;
  for (int i = 0; i < 5; ++i) states.push_back(RandomState(100 + i, 4, 1 << 20));
  for (int i = 0; i < 5; ++i) {
    Result<SaveHandle> h = ckpt->SaveAsync(states[i], fmt::format("/s{}", i));
    SP_ASSERT_OK(h.status());
    if (i > 0) {
      EXPECT_TRUE(handles.back().Poll()) << "previous save still running when the next started";
    }
    handles.push_back(*h);
  }
  SP_ASSERT_OK(ckpt->WaitAll());
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(StatesEqual(states[i], LoadFrom(&fs, fmt::format("/s{}", i))));
  }
}

TEST(Async, ConcurrentSavesWhenAllowed) {
  MemFileSystem fs;
  CheckpointerOptions o;
  o.staging_bytes = 512 << 10;
  o.slab_bytes = 64 << 10;
  o.allow_concurrent_saves = true;
  auto ckpt = Checkpointer::Create(o, {.fs = &fs, .io_threads = 2}).value();
  State a = RandomState(1, 4, 1 << 20), b = RandomState(2, 4, 1 << 20);
  SaveHandle ha = ckpt->SaveAsync(a, "/a").value();
  SaveHandle hb = ckpt->SaveAsync(b, "/b").value();
  SP_ASSERT_OK(ha.Wait());
  SP_ASSERT_OK(hb.Wait());
  EXPECT_TRUE(StatesEqual(a, LoadFrom(&fs, "/a")));
  EXPECT_TRUE(StatesEqual(b, LoadFrom(&fs, "/b")));
}

// Background failures: the handle reports them, nothing commits, the pool drains, the next save
// works.
TEST(Async, BackgroundFaultsAreReportedAndRecovered) {
  using Op = FaultInjectionFileSystem::Op;
  State s = RandomState(5, 8, 2 << 20);
  struct Case {
    Op op;
    uint64_t n;
    int err;
  };
  for (Case c : {Case{Op::kWrite, 1, EIO}, Case{Op::kWrite, 9, ENOSPC}, Case{Op::kWrite, 30, EIO},
                 Case{Op::kSync, 1, EIO}, Case{Op::kRename, 1, EIO}, Case{Op::kSyncDir, 1, EIO},
                 Case{Op::kCreate, 2, ENOSPC}}) {
    SCOPED_TRACE(
        fmt::format("{} #{} errno {}", FaultInjectionFileSystem::OpName(c.op), c.n, c.err));
    MemFileSystem mem;
    FaultInjectionFileSystem fault(&mem);
    auto ckpt = Make(256 << 10, &fault);
    fault.FailNth(c.op, c.n, c.err);
    Result<SaveHandle> h = ckpt->SaveAsync(s, "/root/a");
    Status st = h.ok() ? h->Wait() : h.status();
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), c.err == ENOSPC ? StatusCode::kNoSpace : StatusCode::kIOError);
    EXPECT_NE(st.message().find("/root/a"), std::string::npos) << st.ToString();
    EXPECT_EQ(ckpt->staging_in_use_bytes(), 0u);
    Result<State> back = Load("/root/a", {}, {.fs = &mem});
    if (c.op != Op::kSyncDir) {
      EXPECT_THAT(back, StatusIs(StatusCode::kNotFound));
      fault.Reset();
      SP_ASSERT_OK(ckpt->SaveAsync(s, "/root/a").value().Wait());
      EXPECT_TRUE(StatesEqual(s, LoadFrom(&mem, "/root/a")));
    }
  }
}

TEST(Async, PowerLossDuringPersistNeverCommitsATornCheckpoint) {
  State a = RandomState(1, 6, 512 << 10), b = RandomState(2, 6, 512 << 10);
  auto run = [&](MemFileSystem& mem, FileSystem* fs) {
    auto ckpt = Make(128 << 10, fs);
    Result<SaveHandle> h = ckpt->SaveAsync(b, "/root/b");
    return h.ok() ? h->Wait() : h.status();
    (void)mem;
  };
  uint64_t total;
  {
    MemFileSystem mem;
    FaultInjectionFileSystem fault(&mem);
    SP_ASSERT_OK(Save(a, "/root/a", {}, {.fs = &mem}));
    SP_ASSERT_OK(run(mem, &fault));
    total = fault.mutation_count();
  }
  for (uint64_t k = 0; k <= total; ++k) {
    SCOPED_TRACE(fmt::format("crash after {} of {}", k, total));
    MemFileSystem mem;
    FaultInjectionFileSystem fault(&mem);
    SP_ASSERT_OK(Save(a, "/root/a", {}, {.fs = &mem}));
    fault.CrashAfter(k);
    Status st = run(mem, &fault);
    EXPECT_EQ(st.ok(), k >= total);
    mem.SimulatePowerLoss();
    EXPECT_TRUE(StatesEqual(a, LoadFrom(&mem, "/root/a")));
    Result<State> got = Load("/root/b", {}, {.fs = &mem});
    if (got.ok()) {
      EXPECT_TRUE(StatesEqual(b, *got));
    } else {
      EXPECT_THAT(got, StatusIs(StatusCode::kNotFound));
      EXPECT_LT(k, total);
    }
  }
}

// Called from several snapshot threads at once: counts atomically.
class CountingCopier : public SnapshotCopier {
 public:
  Status Copy(const std::byte* src, std::byte* dst, uint64_t n) override {
    calls++;
    bytes += n;
    std::memcpy(dst, src, n);
    return Status::OK();
  }
  std::atomic<int> calls{0};
  std::atomic<uint64_t> bytes{0};
};

// Fails every copy from the `fail_after`-th on.
class FailingCopier : public SnapshotCopier {
 public:
  explicit FailingCopier(int fail_after = 0) : left_(fail_after) {}
  Status Copy(const std::byte* src, std::byte* dst, uint64_t n) override {
    if (left_.fetch_sub(1) <= 0) return IOError("device-to-host copy failed");
    std::memcpy(dst, src, n);
    return Status::OK();
  }

 private:
  std::atomic<int> left_;
};

// The bytes of rank 0's data file of the checkpoint at `path` after its header (which holds the
// random checkpoint id).
std::string DataFileBytes(MemFileSystem* fs, const std::string& path) {
  auto f = fs->NewRandomAccessFile(path + "/data-00000-00000.spd", {}).value();
  std::string bytes(f->size() - 4096, '\0');
  SP_EXPECT_OK(f->ReadAt(4096, std::as_writable_bytes(std::span<char>(bytes))));
  return bytes;
}

// Any number of snapshot threads, with a pool smaller than the state (the walker blocks on
// slabs while copies are in flight, and writers held back during the snapshot must be started):
// the data file is byte-for-byte the single-threaded one, and
// compressed saves round-trip too.
TEST(Async, SnapshotThreadsGiveTheSameDataFile) {
  uint64_t seed = testing::TestSeed("Async.SnapshotThreadsGiveTheSameDataFile");
  MemFileSystem fs;
  State s = RandomState(seed, 24, 3 << 20);
  std::string reference;
  for (int threads : {1, 2, 3, 8}) {
    SCOPED_TRACE(fmt::format("snapshot_threads={}", threads));
    CheckpointerOptions o;
    o.staging_bytes = 512 << 10;
    o.slab_bytes = 64 << 10;
    o.snapshot_threads = threads;
    o.persist_during_snapshot = threads % 2 == 0;  // both ways of starting the writers
    auto ckpt = Checkpointer::Create(o, {.fs = &fs, .io_threads = 2}).value();
    SaveOptions so;
    const std::string raw = fmt::format("/raw{}", threads),
                      packed = fmt::format("/zstd{}", threads);
    SP_ASSERT_OK(ckpt->SaveAsync(s, raw, so).value().Wait());
    so.compression.codec = Compression::Codec::kZstd;
    SP_ASSERT_OK(ckpt->SaveAsync(s, packed, so).value().Wait());
    EXPECT_LE(ckpt->staging_allocated_bytes(), ckpt->staging_cap_bytes());
    EXPECT_EQ(ckpt->staging_in_use_bytes(), 0u);
    const std::string bytes = DataFileBytes(&fs, raw);
    if (threads == 1) reference = bytes;
    EXPECT_TRUE(bytes == reference) << "data file differs from the single-threaded snapshot's";
    for (const std::string& path : {raw, packed}) {
      EXPECT_TRUE(StatesEqual(s, LoadFrom(&fs, path))) << path;
      SP_EXPECT_OK(VerifyCheckpoint(path, {}, {.fs = &fs}));
    }
  }
}

// A copy failing part-way on one of several snapshot threads fails the save, commits nothing and
// returns every slab to the pool.
TEST(Async, CopierFailureWithSeveralSnapshotThreads) {
  MemFileSystem fs;
  State s = RandomState(21, 16, 2 << 20);
  for (int fail_after : {0, 3, 40}) {
    SCOPED_TRACE(fmt::format("fail_after={}", fail_after));
    FailingCopier bad(fail_after);
    CheckpointerOptions o;
    o.copier = &bad;
    o.staging_bytes = 512 << 10;
    o.slab_bytes = 64 << 10;
    o.snapshot_threads = 4;
    auto ckpt = Checkpointer::Create(o, {.fs = &fs, .io_threads = 2}).value();
    const std::string path = fmt::format("/f{}", fail_after);
    Result<SaveHandle> h = ckpt->SaveAsync(s, path);
    Status st = h.ok() ? h->Wait() : h.status();
    EXPECT_NE(st.message().find("device-to-host"), std::string::npos) << st.ToString();
    EXPECT_FALSE(fs.Exists(path));
    EXPECT_EQ(ckpt->staging_in_use_bytes(), 0u);
  }
}

TEST(Async, PluggableCopier) {
  MemFileSystem fs;
  State s = RandomState(9, 5, 1 << 20);
  CountingCopier copier;
  CheckpointerOptions o;
  o.copier = &copier;
  o.staging_bytes = 1 << 20;
  o.slab_bytes = 128 << 10;
  auto ckpt = Checkpointer::Create(o, {.fs = &fs, .io_threads = 2}).value();
  SP_ASSERT_OK(ckpt->SaveAsync(s, "/a").value().Wait());
  EXPECT_EQ(copier.bytes, s.tensor_bytes());
  EXPECT_GT(copier.calls, 0);
  EXPECT_TRUE(StatesEqual(s, LoadFrom(&fs, "/a")));

  FailingCopier bad;
  o.copier = &bad;
  auto ckpt2 = Checkpointer::Create(o, {.fs = &fs, .io_threads = 2}).value();
  Result<SaveHandle> h = ckpt2->SaveAsync(s, "/b");
  Status st = h.ok() ? h->Wait() : h.status();
  EXPECT_NE(st.message().find("device-to-host"), std::string::npos) << st.ToString();
  EXPECT_FALSE(fs.Exists("/b"));
}

TEST(Async, HandleApiAndBadOptions) {
  MemFileSystem fs;
  auto ckpt = Make(1 << 20, &fs);
  SaveOptions so;
  State s = RandomState(3, 3, 256 << 10);
  SaveHandle h = ckpt->SaveAsync(s, "/a", so).value();
  EXPECT_TRUE(h.WaitFor(std::chrono::seconds(30)));
  SP_EXPECT_OK(h.status());
  EXPECT_EQ(h.path(), "/a");
  EXPECT_THAT(ckpt->SaveAsync(s, "/a", so), StatusIs(StatusCode::kAlreadyExists));
  CheckpointerOptions bad;
  bad.slab_bytes = 1000;
  EXPECT_THAT(Checkpointer::Create(bad), StatusIs(StatusCode::kInvalidArgument));
  bad.slab_bytes = 1 << 20;
  EXPECT_EQ(Checkpointer::Create(bad, {.io_threads = 0}).status().code(),
            StatusCode::kInvalidArgument);
  for (int threads : {-1, 65}) {
    bad.snapshot_threads = threads;
    Status st = Checkpointer::Create(bad, {.io_threads = 2}).status();
    EXPECT_THAT(st, StatusIs(StatusCode::kInvalidArgument, "snapshot_threads"));
  }
  // SaveOptions fields an async save does not use are refused, not silently ignored.
  SaveStats io;
  for (int field = 0; field < 3; ++field) {
    SaveOptions odd = so;
    if (field == 0) odd.chunk_bytes = 1 << 20;  // the slabs are 64 KiB
    if (field == 1) odd.progress = [](uint64_t, uint64_t) {};
    if (field == 2) odd.stats = &io;
    Status st = ckpt->SaveAsync(s, "/b", odd).status();
    EXPECT_THAT(st, StatusIs(StatusCode::kInvalidArgument));
    const char* name[] = {"chunk_bytes", "SaveOptions.progress", "stats"};
    EXPECT_NE(st.message().find(name[field]), std::string::npos) << st.ToString();
  }
  EXPECT_FALSE(fs.Exists("/b"));
  SP_EXPECT_OK(ckpt->SaveAsync(s, "/b", so).value().Wait());
}

}  // namespace
}  // namespace savepoint
