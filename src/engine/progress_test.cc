// Tests of the progress reports: the Progress helper (util/progress.h) and the `progress` option
// of Save, Load, CheckpointReader::Verify, SaveSafetensors, LoadSafetensors and the merges.
#include "util/progress.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "savepoint/distributed.h"
#include "savepoint/savepoint.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using savepoint::testing::FillPattern;
using savepoint::testing::TempDir;

// Records the calls of a ProgressFn and checks them.
class Recorder {
 public:
  ProgressFn Fn() {
    return [this](uint64_t done, uint64_t total) {
      if (inside_.fetch_add(1) != 0) overlapped_ = true;
      {
        std::lock_guard<std::mutex> lock(mu_);
        calls_.emplace_back(done, total);
      }
      inside_.fetch_sub(1);
    };
  }

  size_t size() const { return calls_.size(); }
  const std::vector<std::pair<uint64_t, uint64_t>>& calls() const { return calls_; }

  // Every call says `total`, done never decreases nor exceeds it, the last call has done == total,
  // no two calls overlapped; with `partial`, at least one call came before the end.
  ::testing::AssertionResult Check(uint64_t total, bool partial) const {
    if (calls_.empty()) return ::testing::AssertionFailure() << "never called";
    if (overlapped_) return ::testing::AssertionFailure() << "two calls at once";
    uint64_t last = 0;
    bool saw_partial = false;
    for (const auto& [done, t] : calls_) {
      if (t != total) return ::testing::AssertionFailure() << "total " << t << ", want " << total;
      if (done < last) return ::testing::AssertionFailure() << "done went back to " << done;
      if (done > total) return ::testing::AssertionFailure() << "done " << done << " > total";
      saw_partial = saw_partial || done < total;
      last = done;
    }
    if (last != total) return ::testing::AssertionFailure() << "ended at " << last;
    if (partial && !saw_partial) {
      return ::testing::AssertionFailure()
             << "no call before the end (" << calls_.size() << " calls)";
    }
    return ::testing::AssertionSuccess();
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<uint64_t, uint64_t>> calls_;
  std::atomic<int> inside_{0};
  std::atomic<bool> overlapped_{false};
};

// Progress objects made during a test of this fixture report from every Add (no 100 ms wait).
class ProgressOption : public ::testing::Test {
 protected:
  void SetUp() override { Progress::SetIntervalForTesting(0); }
  void TearDown() override { Progress::SetIntervalForTesting(Progress::kIntervalNs); }
};

TEST(Progress, ManyThreadsReportInOrderAndFinish) {
  Progress::SetIntervalForTesting(0);
  Recorder rec;
  ProgressFn fn = rec.Fn();
  {
    Progress p(fn, 8 * 1000 * 3);
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&p] {
        for (int i = 0; i < 1000; ++i) p.Add(3);
      });
    }
    for (auto& t : threads) t.join();
    p.Finish();
  }
  Progress::SetIntervalForTesting(Progress::kIntervalNs);
  EXPECT_TRUE(rec.Check(8 * 1000 * 3, /*partial=*/true));
}

TEST(Progress, ThrottledToTheInterval) {
  Recorder rec;
  ProgressFn fn = rec.Fn();
  const auto start = std::chrono::steady_clock::now();
  const auto run_for = std::chrono::milliseconds(350);
  Progress p(fn, UINT64_MAX);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      while (std::chrono::steady_clock::now() - start < run_for) p.Add(1);
    });
  }
  for (auto& t : threads) t.join();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  // One call per 100 ms at most (the first one 100 ms in), never before.
  EXPECT_LE(rec.size(), static_cast<size_t>(ms / 100) + 1);
  for (size_t i = 1; i < rec.calls().size(); ++i) {
    EXPECT_GE(rec.calls()[i].first, rec.calls()[i - 1].first);
  }
}

TEST(Progress, QuickOperationReportsOnlyItsEnd) {
  Recorder rec;
  ProgressFn fn = rec.Fn();
  Progress p(fn, 10);
  for (int i = 0; i < 10; ++i) p.Add(1);
  p.Finish();
  p.Finish();  // once at the end only
  ASSERT_EQ(rec.size(), 1u);
  EXPECT_EQ(rec.calls()[0], std::make_pair(uint64_t{10}, uint64_t{10}));
}

TEST(Progress, EmptyFunctionIsNeverCalled) {
  ProgressFn none;
  Progress p(none, 10);
  EXPECT_FALSE(p.enabled());
  p.Add(5);
  p.Finish();
}

TEST(Progress, DoneIsCappedAtTotal) {
  Progress::SetIntervalForTesting(0);
  Recorder rec;
  ProgressFn fn = rec.Fn();
  {
    Progress p(fn, 4);
    p.Add(3);
    p.Add(3);
    p.Finish();
  }
  Progress::SetIntervalForTesting(Progress::kIntervalNs);
  EXPECT_TRUE(rec.Check(4, /*partial=*/true));
}

// One 1 MiB tensor (16 chunks of 64 KiB) and ten small ones.
State TestState(uint64_t* bytes) {
  State s;
  Tensor big = Tensor::Empty(DType::kF32, {256, 1024}).value();
  FillPattern(big.view(), 1);
  EXPECT_TRUE(s.Put("big", std::move(big)).ok());
  for (int i = 0; i < 10; ++i) {
    Tensor t = Tensor::Empty(DType::kBF16, {100 + i}).value();
    FillPattern(t.view(), 10 + i);
    EXPECT_TRUE(s.Put("small." + std::to_string(i), std::move(t)).ok());
  }
  EXPECT_TRUE(s.PutValue("step", int64_t{3}).ok());
  *bytes = s.tensor_bytes();
  return s;
}

constexpr uint64_t kChunk = 64 << 10;

TEST_F(ProgressOption, SaveReportsTensorBytes) {
  TempDir dir;
  uint64_t bytes = 0;
  State s = TestState(&bytes);
  for (int threads : {1, 4}) {
    Recorder rec;
    SaveOptions o;
    o.chunk_bytes = kChunk;
    o.progress = rec.Fn();
    SP_ASSERT_OK(Save(s, dir.Sub("ckpt" + std::to_string(threads)), o, {.io_threads = threads}));
    EXPECT_TRUE(rec.Check(bytes, /*partial=*/threads == 1)) << threads << " threads";
  }
}

TEST_F(ProgressOption, VerifyAndLoadReportTensorBytes) {
  TempDir dir;
  uint64_t bytes = 0;
  State s = TestState(&bytes);
  SaveOptions so;
  so.chunk_bytes = kChunk;
  SP_ASSERT_OK(Save(s, dir.Sub("ckpt"), so));
  for (bool mmap : {false, true}) {
    Recorder verify, load;
    const IoOptions io{.io_threads = 1};
    LoadOptions o;
    o.mmap = mmap;
    o.progress = verify.Fn();
    auto reader = CheckpointReader::Open(dir.Sub("ckpt"), o, io);
    SP_ASSERT_OK(reader.status());
    SP_ASSERT_OK((*reader)->Verify());
    EXPECT_TRUE(verify.Check(bytes, /*partial=*/true)) << "verify";
    o.progress = load.Fn();
    Result<State> loaded = Load(dir.Sub("ckpt"), o, io);
    SP_ASSERT_OK(loaded.status());
    EXPECT_TRUE(load.Check(bytes, /*partial=*/true)) << "load, mmap " << mmap;
  }
  Recorder four;
  LoadOptions o;
  o.progress = four.Fn();
  SP_ASSERT_OK(VerifyCheckpoint(dir.Sub("ckpt"), o, {.io_threads = 4}));
  EXPECT_TRUE(four.Check(bytes, /*partial=*/false));
}

TEST_F(ProgressOption, CompressedVerifyCountsLogicalBytes) {
  TempDir dir;
  State s;
  SP_ASSERT_OK(s.Put("zeros", Tensor::Zeros(DType::kF32, {512, 1024}).value()));
  SaveOptions so;
  so.chunk_bytes = kChunk;
  so.compression.codec = Compression::Codec::kZstd;
  SP_ASSERT_OK(Save(s, dir.Sub("z"), so));
  Recorder rec;
  LoadOptions o;
  o.progress = rec.Fn();
  LoadStats stats;
  o.stats = &stats;
  SP_ASSERT_OK(VerifyCheckpoint(dir.Sub("z"), o, {.io_threads = 1}));
  EXPECT_TRUE(rec.Check(s.tensor_bytes(), /*partial=*/true));
  EXPECT_EQ(stats.bytes, s.tensor_bytes());  // logical
  EXPECT_LT(stats.stored_bytes, stats.bytes / 10);
}

TEST_F(ProgressOption, SafetensorsSaveAndLoad) {
  TempDir dir;
  State s;
  Tensor t = Tensor::Empty(DType::kU8, {int64_t{17} << 20}).value();  // three 8 MiB pieces
  FillPattern(t.view(), 5);
  SP_ASSERT_OK(s.Put("t", std::move(t)));
  Recorder save, load;
  SafetensorsSaveOptions so;
  so.progress = save.Fn();
  SP_ASSERT_OK(SaveSafetensors(s, dir.Sub("m.safetensors"), so, {.io_threads = 1}));
  EXPECT_TRUE(save.Check(s.tensor_bytes(), /*partial=*/true));
  SafetensorsLoadOptions lo;
  lo.progress = load.Fn();
  SP_ASSERT_OK(LoadSafetensors(dir.Sub("m.safetensors"), lo).status());
  EXPECT_TRUE(load.Check(s.tensor_bytes(), /*partial=*/true));
}

TEST_F(ProgressOption, MergeToSafetensorsCountsAllFilesAsOne) {
  TempDir dir;
  State s;
  for (int i = 0; i < 3; ++i) {
    Tensor t = Tensor::Empty(DType::kF32, {256, 1024}).value();
    FillPattern(t.view(), 20 + i);
    SP_ASSERT_OK(s.Put("w" + std::to_string(i), std::move(t)));
  }
  SP_ASSERT_OK(Save(s, dir.Sub("ckpt")));
  Recorder read, write;
  MergeSafetensorsOptions o;
  o.max_file_bytes = 1 << 20;  // one tensor per file
  o.load.progress = read.Fn();
  o.save.progress = write.Fn();
  SP_ASSERT_OK(MergeToSafetensors(dir.Sub("ckpt"), dir.Sub("st"), o));
  EXPECT_TRUE(read.Check(s.tensor_bytes(), /*partial=*/false));
  EXPECT_TRUE(write.Check(s.tensor_bytes(), /*partial=*/true));
  Recorder native;
  MergeOptions m;
  m.save.progress = native.Fn();
  SP_ASSERT_OK(MergeCheckpoint(dir.Sub("ckpt"), dir.Sub("merged"), m));
  EXPECT_TRUE(native.Check(s.tensor_bytes(), /*partial=*/false));
}

}  // namespace
}  // namespace savepoint
