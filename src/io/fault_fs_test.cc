// Tests of FaultInjectionFileSystem over MemFileSystem: FailNth for every operation kind,
// ShortWriteNth (torn writes), CrashAfter, counters and Reset.
#include "io/fault_fs.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "io/mem_fs.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

using Op = FaultInjectionFileSystem::Op;

std::span<const std::byte> AsBytes(std::string_view s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

class FaultInjectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(base_.CreateDir("/d").ok());
    ASSERT_TRUE(base_.WriteFileSynced("/d/existing", "0123456789").ok());
  }

  std::string BaseContents(const std::string& path) {
    Result<std::string> contents = base_.ReadFile(path, 1 << 20);
    return contents.ok() ? *contents : "<" + contents.status().ToString() + ">";
  }

  MemFileSystem base_;
  FaultInjectionFileSystem fs_{&base_};
};

// One call of each kind, against fresh state; `call` performs the n-th call of its op.
struct OpCase {
  Op op;
  std::string path;  // must appear in the error message
  std::function<Status(FaultInjectionFileSystem&)> call;
  std::function<bool(MemFileSystem&)> base_unchanged;
};

std::vector<OpCase> OpCases() {
  auto open_and = [](const std::function<Status(WritableFile&)>& fn) {
    return [fn](FaultInjectionFileSystem& fs) -> Status {
      auto file = fs.NewWritableFile("/d/w", FileOptions{});
      if (!file.ok()) return file.status();
      return fn(**file);
    };
  };
  return {
      {Op::kCreate, "/d/new",
       [](FaultInjectionFileSystem& fs) {
         return fs.NewWritableFile("/d/new", FileOptions{}).status();
       },
       [](MemFileSystem& base) { return !base.Exists("/d/new"); }},
      {Op::kWrite, "/d/w", open_and([](WritableFile& f) { return f.WriteAt(0, AsBytes("x")); }),
       [](MemFileSystem& base) { return base.Stat("/d/w")->size == 0; }},
      {Op::kSync, "/d/w", open_and([](WritableFile& f) { return f.Sync(); }),
       [](MemFileSystem&) { return true; }},
      {Op::kClose, "/d/w", open_and([](WritableFile& f) { return f.Close(); }),
       [](MemFileSystem&) { return true; }},
      {Op::kCreateDir, "/d/sub",
       [](FaultInjectionFileSystem& fs) { return fs.CreateDir("/d/sub"); },
       [](MemFileSystem& base) { return !base.Exists("/d/sub"); }},
      {Op::kRemoveFile, "/d/existing",
       [](FaultInjectionFileSystem& fs) { return fs.RemoveFile("/d/existing"); },
       [](MemFileSystem& base) { return base.Exists("/d/existing"); }},
      {Op::kRemoveDir, "/d/empty",
       [](FaultInjectionFileSystem& fs) { return fs.RemoveDir("/d/empty"); },
       [](MemFileSystem& base) { return base.Exists("/d/empty"); }},
      {Op::kRename, "/d/renamed",
       [](FaultInjectionFileSystem& fs) { return fs.Rename("/d/existing", "/d/renamed"); },
       [](MemFileSystem& base) { return base.Exists("/d/existing"); }},
      {Op::kSyncDir, "/d", [](FaultInjectionFileSystem& fs) { return fs.SyncDir("/d"); },
       [](MemFileSystem&) { return true; }},
      {Op::kRead, "/d/existing",
       [](FaultInjectionFileSystem& fs) { return fs.ReadFile("/d/existing", 100).status(); },
       [](MemFileSystem&) { return true; }},
  };
}

TEST(FaultInjectionOpTest, FailNthEveryOpKind) {
  for (int err : {EIO, ENOSPC}) {
    const StatusCode expected = err == EIO ? StatusCode::kIOError : StatusCode::kNoSpace;
    for (const OpCase& c : OpCases()) {
      SCOPED_TRACE(FaultInjectionFileSystem::OpName(c.op));
      MemFileSystem base;
      ASSERT_TRUE(base.CreateDirs("/d/empty").ok());
      ASSERT_TRUE(base.WriteFileSynced("/d/existing", "0123456789").ok());
      FaultInjectionFileSystem fs(&base);
      fs.FailNth(c.op, 1, err);
      Status s = c.call(fs);
      EXPECT_EQ(s.code(), expected) << s.ToString();
      EXPECT_NE(s.message().find(c.path), std::string::npos) << s.message();
      EXPECT_TRUE(c.base_unchanged(base));
      EXPECT_EQ(fs.count(c.op), 1u);
      const bool opened_first = c.op == Op::kWrite || c.op == Op::kSync || c.op == Op::kClose;
      EXPECT_EQ(fs.mutation_count(), opened_first ? 1u : 0u);  // only the create got through
      Status again = c.call(fs);
      EXPECT_TRUE(again.ok()) << "only the 1st call fails: " << again.ToString();
    }
  }
}

TEST_F(FaultInjectionTest, FailedCreateLeavesNoFile) {
  fs_.FailNth(Op::kCreate, 1, ENOSPC);
  auto file = fs_.NewWritableFile("/d/f", FileOptions{});
  EXPECT_THAT(file, StatusIs(StatusCode::kNoSpace));
  EXPECT_EQ(file.status().message(), "open /d/f for writing: No space left on device");
  EXPECT_FALSE(base_.Exists("/d/f"));
  EXPECT_EQ(fs_.mutation_count(), 0u);
}

TEST_F(FaultInjectionTest, ShortWriteLeavesHalfTheBytes) {
  auto file = fs_.NewWritableFile("/d/f", FileOptions{});
  ASSERT_TRUE(file.ok());
  fs_.ShortWriteNth(2, ENOSPC);
  ASSERT_TRUE((*file)->WriteAt(0, AsBytes("abcd")).ok());
  Status s = (*file)->WriteAt(4, AsBytes("0123456789"));
  EXPECT_THAT(s, StatusIs(StatusCode::kNoSpace, "/d/f at offset 4"));
  EXPECT_EQ(BaseContents("/d/f"), "abcd01234");
  ASSERT_TRUE((*file)->WriteAt(13, AsBytes("x")).ok());  // later writes are normal
  EXPECT_EQ(fs_.count(Op::kWrite), 3u);
}

TEST_F(FaultInjectionTest, ShortWriteOfOneByteWritesNothing) {
  auto file = fs_.NewWritableFile("/d/f", FileOptions{});
  ASSERT_TRUE(file.ok());
  fs_.ShortWriteNth(1, EIO);
  EXPECT_THAT((*file)->WriteAt(0, AsBytes("a")), StatusIs(StatusCode::kIOError));
  EXPECT_EQ(base_.Stat("/d/f")->size, 0u);
}

TEST_F(FaultInjectionTest, CrashAfterLetsExactlyNMutationsThrough) {
  fs_.CrashAfter(3);
  auto file = fs_.NewWritableFile("/d/f", FileOptions{});  // 1
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->WriteAt(0, AsBytes("abc")).ok());  // 2
  ASSERT_TRUE(fs_.CreateDir("/d/sub").ok());              // 3
  EXPECT_EQ(fs_.mutation_count(), 3u);

  Status s = (*file)->Sync();
  EXPECT_THAT(s, StatusIs(StatusCode::kIOError, "injected crash"));
  EXPECT_NE(s.message().find("/d/f"), std::string::npos) << s.message();
  EXPECT_FALSE((*file)->WriteAt(3, AsBytes("d")).ok());
  EXPECT_FALSE(fs_.Rename("/d/f", "/d/g").ok());
  EXPECT_FALSE(fs_.RemoveFile("/d/existing").ok());
  EXPECT_FALSE(fs_.SyncDir("/d").ok());
  EXPECT_FALSE(fs_.NewWritableFile("/d/h", FileOptions{}).ok());
  EXPECT_EQ(fs_.mutation_count(), 3u);

  // Nothing after the crash reached the base; reads and metadata calls still work.
  EXPECT_EQ(BaseContents("/d/f"), "abc");
  EXPECT_TRUE(base_.Exists("/d/existing"));
  EXPECT_FALSE(base_.Exists("/d/h"));
  auto contents = fs_.ReadFile("/d/existing", 100);
  ASSERT_TRUE(contents.ok());
  EXPECT_EQ(*contents, "0123456789");
  EXPECT_TRUE(fs_.ListDir("/d").ok());
  EXPECT_TRUE(fs_.Stat("/d/f").ok());

  // Simulate what survives the crash, as a power-loss test would.
  base_.SimulatePowerLoss();
  EXPECT_FALSE(base_.Exists("/d/f"));
}

TEST_F(FaultInjectionTest, CrashAfterZeroBlocksEverything) {
  fs_.CrashAfter(0);
  EXPECT_FALSE(fs_.CreateDir("/d/x").ok());
  EXPECT_FALSE(base_.Exists("/d/x"));
  EXPECT_EQ(fs_.count(Op::kCreateDir), 1u);
  EXPECT_EQ(fs_.mutation_count(), 0u);
}

TEST_F(FaultInjectionTest, FailedBaseCallsAreNotMutations) {
  EXPECT_THAT(fs_.CreateDir("/d"), StatusIs(StatusCode::kAlreadyExists));  // fails in the base
  EXPECT_EQ(fs_.count(Op::kCreateDir), 1u);
  EXPECT_EQ(fs_.mutation_count(), 0u);
}

TEST_F(FaultInjectionTest, ReadFaults) {
  auto file = fs_.NewRandomAccessFile("/d/existing", FileOptions{});
  ASSERT_TRUE(file.ok());
  fs_.FailNth(Op::kRead, 2, EIO);
  std::vector<std::byte> dst(4);
  EXPECT_TRUE((*file)->ReadAt(0, dst).ok());
  Status s = (*file)->ReadAt(4, dst);
  EXPECT_THAT(s, StatusIs(StatusCode::kIOError));
  EXPECT_EQ(s.message(), "read /d/existing at offset 4: Input/output error");
  EXPECT_TRUE((*file)->ReadAt(4, dst).ok());
  EXPECT_EQ(fs_.count(Op::kRead), 3u);
  EXPECT_EQ(fs_.mutation_count(), 0u);
}

TEST_F(FaultInjectionTest, CountsAndReset) {
  auto file = fs_.NewWritableFile("/d/f", FileOptions{});
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->WriteAt(0, AsBytes("a")).ok());
  ASSERT_TRUE((*file)->WriteAt(1, AsBytes("b")).ok());
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->Close().ok());
  ASSERT_TRUE(fs_.Rename("/d/f", "/d/g").ok());
  ASSERT_TRUE(fs_.SyncDir("/d").ok());
  EXPECT_EQ(fs_.count(Op::kCreate), 1u);
  EXPECT_EQ(fs_.count(Op::kWrite), 2u);
  EXPECT_EQ(fs_.count(Op::kSync), 1u);
  EXPECT_EQ(fs_.count(Op::kClose), 1u);
  EXPECT_EQ(fs_.count(Op::kRename), 1u);
  EXPECT_EQ(fs_.count(Op::kSyncDir), 1u);
  EXPECT_EQ(fs_.mutation_count(), 7u);

  fs_.FailNth(Op::kCreateDir, 1, EIO);
  fs_.ShortWriteNth(1, EIO);
  fs_.CrashAfter(7);
  fs_.Reset();
  EXPECT_EQ(fs_.mutation_count(), 0u);
  EXPECT_EQ(fs_.count(Op::kWrite), 0u);
  EXPECT_TRUE(fs_.CreateDir("/d/sub").ok());
  auto again = fs_.NewWritableFile("/d/h", FileOptions{});
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE((*again)->WriteAt(0, AsBytes("full")).ok());
  EXPECT_EQ(BaseContents("/d/h"), "full");
}

TEST_F(FaultInjectionTest, CrashAfterIsExactUnderConcurrency) {
  auto file = fs_.NewWritableFile("/d/f", FileOptions{});
  ASSERT_TRUE(file.ok());
  fs_.Reset();
  fs_.CrashAfter(50);
  const uint64_t base_writes_before = base_.write_calls();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 40; ++i) (*file)->WriteAt(t * 40 + i, AsBytes("x")).IgnoreError();
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(fs_.mutation_count(), 50u);
  EXPECT_EQ(fs_.count(Op::kWrite), 160u);
  EXPECT_EQ(base_.write_calls() - base_writes_before, 50u);
}

// Batches go through the default WriteAtMany / ReadAtMany, which call WriteAt / ReadAt once per
// op: every op is counted and can be failed on its own, and the batch stops at the failing op.
TEST_F(FaultInjectionTest, BatchedOpsAreCountedAndFailedOneByOne) {
  auto file = fs_.NewWritableFile("/d/f", FileOptions{});
  ASSERT_TRUE(file.ok());
  fs_.FailNth(Op::kWrite, 2, EIO);
  const std::vector<WriteOp> writes = {{0, AsBytes("ab")}, {2, AsBytes("cd")}, {4, AsBytes("ef")}};
  Status s = (*file)->WriteAtMany(writes);
  EXPECT_THAT(s, StatusIs(StatusCode::kIOError));
  EXPECT_EQ(s.message(), "write /d/f at offset 2: Input/output error");
  EXPECT_EQ(fs_.count(Op::kWrite), 2u);
  EXPECT_EQ(BaseContents("/d/f"), "ab");
  ASSERT_TRUE((*file)->WriteAtMany(writes).ok());
  EXPECT_EQ(fs_.count(Op::kWrite), 5u);
  EXPECT_EQ(BaseContents("/d/f"), "abcdef");

  auto reader = fs_.NewRandomAccessFile("/d/existing", FileOptions{});
  ASSERT_TRUE(reader.ok());
  fs_.FailNth(Op::kRead, 3, EIO);
  std::string a(3, '?'), b(3, '?'), c(3, '?');
  auto span = [](std::string& str) { return std::as_writable_bytes(std::span(str)); };
  const std::vector<ReadOp> reads = {{0, span(a)}, {3, span(b)}, {6, span(c)}};
  s = (*reader)->ReadAtMany(reads);
  EXPECT_EQ(s.message(), "read /d/existing at offset 6: Input/output error");
  EXPECT_EQ(a + b + c, "012345???");
  EXPECT_EQ(fs_.count(Op::kRead), 3u);
}

}  // namespace
}  // namespace savepoint
