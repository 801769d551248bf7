// Tests of ParallelFor (util/parallel.h) and Base64 (util/base64.h).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "testutil/testutil.h"
#include "util/base64.h"
#include "util/parallel.h"
#include "util/varint.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

TEST(ParallelFor, RunsEveryIndexOnce) {
  for (int threads = 1; threads <= 8; ++threads) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{2}, size_t{7}, size_t{1000}}) {
      std::vector<std::atomic<int>> runs(n);
      std::atomic<int> bad_worker{0};
      Status s = ParallelFor(n, threads, [&](size_t i, int worker) -> Status {
        if (worker < 0 || worker >= threads) bad_worker.fetch_add(1);
        runs[i].fetch_add(1);
        return Status::OK();
      });
      SP_EXPECT_OK(s);
      EXPECT_EQ(bad_worker.load(), 0) << "threads " << threads;
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(runs[i].load(), 1) << "index " << i << " threads " << threads << " n " << n;
      }
    }
  }
}

TEST(ParallelFor, ZeroOrNegativeThreadsRunInline) {
  for (int threads : {0, -3, 1}) {
    std::thread::id caller = std::this_thread::get_id();
    std::vector<size_t> order;
    SP_EXPECT_OK(ParallelFor(5, threads, [&](size_t i, int worker) -> Status {
      EXPECT_EQ(std::this_thread::get_id(), caller);
      EXPECT_EQ(worker, 0);
      order.push_back(i);
      return Status::OK();
    }));
    EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2, 3, 4}));
  }
}

TEST(ParallelFor, UsesSeveralWorkers) {
  // With tasks that wait until a second worker has shown up, more than one worker must take part.
  std::atomic<int> seen_mask{0};
  SP_EXPECT_OK(ParallelFor(64, 4, [&](size_t, int worker) -> Status {
    seen_mask.fetch_or(1 << worker);
    for (int spin = 0; spin < 2000 && __builtin_popcount(seen_mask.load()) < 2; ++spin) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return Status::OK();
  }));
  EXPECT_GE(__builtin_popcount(seen_mask.load()), 2);
}

TEST(ParallelFor, SingleThreadStopsAtFirstError) {
  std::vector<size_t> ran;
  Status s = ParallelFor(100, 1, [&](size_t i, int) -> Status {
    ran.push_back(i);
    if (i == 5 || i == 7) return IOError(fmt::format("task {}", i));
    return Status::OK();
  });
  EXPECT_THAT(s, StatusIs(StatusCode::kIOError));
  EXPECT_EQ(s.message(), "task 5");
  EXPECT_EQ(ran, (std::vector<size_t>{0, 1, 2, 3, 4, 5}));
}

TEST(ParallelFor, ReturnsLowestIndexErrorAmongThoseRun) {
  uint64_t seed = testing::TestSeed("ParallelFor.ReturnsLowestIndexErrorAmongThoseRun");
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 100; ++round) {
    int threads = 1 + static_cast<int>(rng() % 8);
    size_t n = 1 + rng() % 300;
    std::vector<bool> fails(n);
    for (size_t i = 0; i < n; ++i) fails[i] = rng() % 10 == 0;
    std::vector<std::atomic<bool>> ran(n);
    Status s = ParallelFor(n, threads, [&](size_t i, int) -> Status {
      ran[i].store(true);
      if (i % 3 == 0) std::this_thread::yield();
      if (fails[i]) {
        return Status(static_cast<StatusCode>(1 + i % 12), fmt::format("task {}", i));
      }
      return Status::OK();
    });
    size_t lowest = n;
    for (size_t i = 0; i < n; ++i) {
      if (ran[i].load() && fails[i]) {
        lowest = i;
        break;
      }
    }
    size_t first_fail = n;
    for (size_t i = 0; i < n; ++i) {
      if (fails[i]) {
        first_fail = i;
        break;
      }
    }
    SCOPED_TRACE(fmt::format("round {} threads {} n {}", round, threads, n));
    if (first_fail == n) {
      SP_EXPECT_OK(s);
      continue;
    }
    // Tasks are claimed in index order, so every task up to the first failing one ran.
    for (size_t i = 0; i <= first_fail; ++i) ASSERT_TRUE(ran[i].load()) << "index " << i;
    ASSERT_EQ(lowest, first_fail);
    EXPECT_EQ(s.message(), fmt::format("task {}", lowest));
    EXPECT_EQ(s.code(), static_cast<StatusCode>(1 + lowest % 12));
  }
}

TEST(ParallelFor, NoNewTaskStartsAfterAFailure) {
  for (int threads = 1; threads <= 8; ++threads) {
    std::atomic<int> ran{0};
    Status s = ParallelFor(1000, threads, [&](size_t i, int) -> Status {
      ran.fetch_add(1);
      if (i == 0) {
        // Fail only once every worker is busy with a task (or after 2 s).
        for (int spin = 0; spin < 20000 && ran.load() < threads; ++spin) {
          std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
        return Status(StatusCode::kNoSpace, "full");
      }
      // Slow tasks: by the time one ends, task 0's failure is known.
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      return Status::OK();
    });
    EXPECT_THAT(s, StatusIs(StatusCode::kNoSpace));
    EXPECT_EQ(s.message(), "full");
    // Task 0 plus the one task each other worker had already claimed.
    EXPECT_LE(ran.load(), threads) << "threads " << threads;
  }
}

TEST(ParallelFor, ErrorFromLaterTaskThatFinishesFirst) {
  // Task 0 fails slowly, task 1 fails at once on another worker: task 0's error is returned.
  Status s = ParallelFor(2, 2, [&](size_t i, int) -> Status {
    if (i == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return InternalError(fmt::format("task {}", i));
  });
  EXPECT_EQ(s.message(), "task 0");
}

std::vector<uint8_t> RandomBytes(std::mt19937_64& rng, size_t n) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST(Base64, KnownVectors) {  // RFC 4648, section 10
  const std::vector<std::pair<std::string, std::string>> cases = {{"", ""},
                                                                  {"f", "Zg=="},
                                                                  {"fo", "Zm8="},
                                                                  {"foo", "Zm9v"},
                                                                  {"foob", "Zm9vYg=="},
                                                                  {"fooba", "Zm9vYmE="},
                                                                  {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, coded] : cases) {
    std::vector<uint8_t> data(plain.begin(), plain.end());
    EXPECT_EQ(Base64Encode(data), coded);
    Result<std::vector<uint8_t>> back = Base64Decode(coded);
    SP_ASSERT_OK(back.status());
    EXPECT_EQ(*back, data) << coded;
  }
  EXPECT_EQ(Base64Encode({0, 0xff, 0xfe}), "AP/+");
}

TEST(Base64, RoundTripLengths0To100) {
  uint64_t seed = testing::TestSeed("Base64.RoundTripLengths0To100");
  std::mt19937_64 rng(seed);
  for (size_t n = 0; n <= 100; ++n) {
    std::vector<uint8_t> data = RandomBytes(rng, n);
    std::string text = Base64Encode(data);
    EXPECT_EQ(text.size(), 4 * ((n + 2) / 3)) << n;
    EXPECT_EQ(
        text.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="),
        std::string::npos);
    Result<std::vector<uint8_t>> back = Base64Decode(text);
    SP_ASSERT_OK(back.status());
    EXPECT_EQ(*back, data) << "length " << n;
  }
}

TEST(Base64, RoundTripAcrossInternalBlocks) {
  // Larger than the 3 MiB encode block and the 4 MiB decode block.
  std::mt19937_64 rng(42);
  for (size_t n : {size_t{3} << 20, (size_t{3} << 20) + 1, (size_t{3} << 20) + 2}) {
    std::vector<uint8_t> data = RandomBytes(rng, n);
    std::string text = Base64Encode(data);
    Result<std::vector<uint8_t>> back = Base64Decode(text);
    SP_ASSERT_OK(back.status());
    EXPECT_TRUE(*back == data) << "length " << n;
  }
}

TEST(Base64, RejectsBadLengthAndAlphabet) {
  for (std::string_view bad : std::initializer_list<std::string_view>{
           "A", "AA", "AAA", "AAAAA", "Zg=", "Zm9vY", "@@@@", "Zm9v!A==", "Zm-_", "Zm9\x80",
           std::string_view("Zm\0v", 4)}) {
    Result<std::vector<uint8_t>> r = Base64Decode(bad);
    EXPECT_FALSE(r.ok()) << ::testing::PrintToString(bad);
    if (!r.ok()) {
      EXPECT_THAT(r, StatusIs(StatusCode::kCorruption));
    }
  }
}

// Padding may only end the text, and whitespace is outside the alphabet ("Fails with Corruption
// on characters outside the alphabet").
TEST(Base64, RejectsMisplacedPaddingAndWhitespace) {
  for (std::string_view bad : {"====", "A===", "=AAA", "A=AA", "Zg==Zg==", "Zm9v    ", "    Zm9v",
                               "Zm9v\n\n\n\n", "Zg\n="}) {
    Result<std::vector<uint8_t>> r = Base64Decode(bad);
    EXPECT_FALSE(r.ok()) << ::testing::PrintToString(bad) << " decoded to "
                         << (r.ok() ? r->size() : 0) << " bytes";
  }
}

// Varints round-trip at every length's boundary; truncated ones, 11-byte ones and values past
// 64 bits are refused.
TEST(Varint, RoundTripsAndRefusesMalformedBytes) {
  for (uint64_t v : {uint64_t{0}, uint64_t{127}, uint64_t{128}, uint64_t{16383}, uint64_t{16384},
                     uint64_t{1} << 63, UINT64_MAX}) {
    char b[kMaxVarintBytes];
    const std::string_view in(b, static_cast<size_t>(PutVarint(v, b) - b));
    size_t at = 0;
    uint64_t got = 0;
    ASSERT_TRUE(GetVarint(in, &at, &got)) << v;
    EXPECT_EQ(got, v);
    EXPECT_EQ(at, in.size());
    size_t short_at = 0;
    if (in.size() > 1) {
      EXPECT_FALSE(GetVarint(in.substr(0, in.size() - 1), &short_at, &got)) << v;
    }
  }
  size_t at = 0;
  uint64_t v = 0;
  EXPECT_FALSE(GetVarint(std::string(10, '\x80') + '\x01', &at, &v));  // 11 bytes
  at = 0;
  EXPECT_FALSE(GetVarint(std::string(9, '\xff') + '\x02', &at, &v));  // past 64 bits
  at = 0;
  EXPECT_FALSE(GetVarint("", &at, &v));
}

}  // namespace
}  // namespace savepoint
