// CopyCheckpoint: a committed checkpoint copied between file systems (a directory tree and an
// object store), whole or not at all, its own files only, the target refused when it stands.
#include <gtest/gtest.h>

#include <atomic>

#include "io/fault_fs.h"
#include "io/mem_fs.h"
#include "savepoint/catalog.h"
#include "savepoint/checkpoint.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

class CopyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_ = testing::RandomState(testing::TestSeed("CopyTest"), 5, 3 << 20);
    SP_ASSERT_OK(Save(state_, "/src/ck", {}, {.fs = &src_}));
    SP_ASSERT_OK(src_.WriteFileSynced("/src/ck/notes.txt", "not the checkpoint's"));
  }
  CopyOptions Between(FileSystem* to) {
    CopyOptions o;
    o.source_fs = &src_;
    o.target_fs = to;
    o.block_bytes = 1 << 20;
    return o;
  }

  State state_;
  MemFileSystem src_;
  MemFileSystem dst_;
};

TEST_F(CopyTest, CopiesEveryFileOfTheCheckpointAndNothingElse) {
  std::atomic<uint64_t> last{0}, total{0};
  CopyOptions o = Between(&dst_);
  o.progress = [&](uint64_t done, uint64_t all) {
    last = done;
    total = all;
  };
  o.threads = 3;
  SP_ASSERT_OK_AND_ASSIGN(CopyStats st, CopyCheckpoint("/src/ck", "/dst/run/ck", o));
  EXPECT_EQ(st.files, 2u);  // the data file and the MANIFEST
  EXPECT_EQ(last.load(), total.load());
  EXPECT_EQ(st.bytes, total.load());
  EXPECT_FALSE(dst_.Exists("/dst/run/ck/notes.txt"));
  SP_ASSERT_OK_AND_ASSIGN(State back, Load("/dst/run/ck", {}, {.fs = &dst_}));
  EXPECT_TRUE(testing::StatesEqual(back, state_));
  SP_EXPECT_OK(VerifyCheckpoint("/dst/run/ck", {}, {.fs = &dst_}));
  // Only the committed target is visible: no temporary is left beside it.
  EXPECT_EQ(dst_.ListDir("/dst/run").value().size(), 1u);
}

TEST_F(CopyTest, RefusesAnExistingTargetUnlessOverwritingAndAMissingSource) {
  SP_ASSERT_OK(CopyCheckpoint("/src/ck", "/dst/ck", Between(&dst_)).status());
  EXPECT_THAT(CopyCheckpoint("/src/ck", "/dst/ck", Between(&dst_)),
              StatusIs(StatusCode::kAlreadyExists));
  CopyOptions o = Between(&dst_);
  o.overwrite = true;
  SP_EXPECT_OK(CopyCheckpoint("/src/ck", "/dst/ck", o).status());
  EXPECT_THAT(CopyCheckpoint("/src/none", "/dst/x", Between(&dst_)),
              StatusIs(StatusCode::kNotFound, "/src/none"));
  SP_ASSERT_OK(src_.CreateDirs("/src/half"));
  SP_ASSERT_OK(src_.WriteFileSynced("/src/half/data-00000-00000.spd", "x"));
  EXPECT_THAT(CopyCheckpoint("/src/half", "/dst/half", Between(&dst_)),
              StatusIs(StatusCode::kNotFound, "not a committed checkpoint"));
  o.threads = 0;
  EXPECT_THAT(CopyCheckpoint("/src/ck", "/dst/y", o),
              StatusIs(StatusCode::kInvalidArgument, "threads"));
}

TEST_F(CopyTest, IntoAnObjectStoreTheManifestIsWrittenLastAndOnlyIfAbsent) {
  testing::MemObjectStore bucket(&dst_);
  SP_ASSERT_OK(CopyCheckpoint("/src/ck", "/bucket/run/ck", Between(&bucket)).status());
  SP_ASSERT_OK_AND_ASSIGN(State back, Load("/bucket/run/ck", {}, {.fs = &bucket}));
  EXPECT_TRUE(testing::StatesEqual(back, state_));
  EXPECT_THAT(CopyCheckpoint("/src/ck", "/bucket/run/ck", Between(&bucket)),
              StatusIs(StatusCode::kAlreadyExists));
  // And back from the bucket to a disk.
  MemFileSystem disk;
  CopyOptions back_opts;
  back_opts.source_fs = &bucket;
  back_opts.target_fs = &disk;
  SP_ASSERT_OK(CopyCheckpoint("/bucket/run/ck", "/restored/ck", back_opts).status());
  EXPECT_TRUE(testing::StatesEqual(Load("/restored/ck", {}, {.fs = &disk}).value(), state_));
}

TEST_F(CopyTest, AFailedWriteLeavesNoTargetAndNoDebrisThatLooksCommitted) {
  FaultInjectionFileSystem faulty(&dst_);
  faulty.FailNth(FaultInjectionFileSystem::Op::kWrite, 3, ENOSPC);
  EXPECT_THAT(CopyCheckpoint("/src/ck", "/dst/ck", Between(&faulty)),
              StatusIs(StatusCode::kNoSpace));
  EXPECT_FALSE(dst_.Exists("/dst/ck"));
  SP_ASSERT_OK_AND_ASSIGN(std::vector<CheckpointEntry> listed, ListCheckpoints("/dst", &dst_));
  for (const CheckpointEntry& e : listed) EXPECT_FALSE(e.committed) << e.name;
}

TEST_F(CopyTest, BandwidthBoundSlowsTheCopy) {
  CopyOptions o = Between(&dst_);
  o.max_bytes_per_second = 40ull << 20;  // ~3 MiB at 40 MiB/s: at least ~50 ms
  SP_ASSERT_OK_AND_ASSIGN(CopyStats st, CopyCheckpoint("/src/ck", "/dst/ck", o));
  EXPECT_GE(st.seconds, 0.9 * (st.bytes - (1 << 20)) / double(40ull << 20));
}

}  // namespace
}  // namespace savepoint
