// The fault-injection and power-loss cases every single-file writer of src/interop/ must pass
// (SaveSafetensors, SaveMindSporeCheckpoint): shared by their unit tests.
#ifndef SAVEPOINT_INTEROP_FILE_WRITER_TESTUTIL_H_
#define SAVEPOINT_INTEROP_FILE_WRITER_TESTUTIL_H_

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "io/fault_fs.h"
#include "io/mem_fs.h"
#include "testutil/testutil.h"

namespace savepoint::testing {

// Writes `state` at `path` through `fs` (overwriting when asked).
using FileSaveFn = std::function<Status(const State&, const std::string&, bool, FileSystem*)>;
// Reads the file at `path` through `fs`.
using FileLoadFn = std::function<Result<State>(const std::string&, FileSystem*)>;

// Every injected failure while `new_state` overwrites `old_state` at `path` (in directory "/d")
// leaves either no file or the previous file at the path, never a partial one; a plain error (not
// a crash) also leaves no temporary file behind. After power loss at any crash point the path
// holds the old or the new file, complete. In object storage, a writer that lost the race for the
// key to another fails with AlreadyExists and leaves the other's file.
inline void ExpectFaultsNeverLeaveAPartialFile(const FileSaveFn& save, const FileLoadFn& load,
                                               const std::string& path, const State& old_state,
                                               const State& new_state) {
  auto run = [&](const std::function<void(FaultInjectionFileSystem&)>& arm, bool crash) {
    MemFileSystem base;
    SP_ASSERT_OK(save(old_state, path, false, &base));  // creates /d durably
    FaultInjectionFileSystem fs(&base);
    arm(fs);
    Status st = save(new_state, path, true, &fs);
    if (crash) base.SimulatePowerLoss();
    Result<State> now = load(path, &base);
    if (st.ok()) {
      SP_ASSERT_OK(now.status());
      EXPECT_TRUE(StatesEqual(new_state, *now));
      return;
    }
    if (!now.ok()) {  // only a crash between the two renames may leave no file at the path...
      EXPECT_TRUE(crash) << st.ToString() << " / " << now.status().ToString();
      EXPECT_THAT(now, StatusIs(StatusCode::kNotFound));
      std::vector<FileInfo> left = base.ListDir("/d").value();  // ...and the old file beside it
      ASSERT_EQ(left.size(), 1u);
      EXPECT_NE(left[0].name.find(".savepoint-old."), std::string::npos) << left[0].name;
      return;
    }
    EXPECT_TRUE(StatesEqual(old_state, *now) || StatesEqual(new_state, *now));
    if (crash) return;
    for (const FileInfo& f : base.ListDir("/d").value()) {
      EXPECT_EQ(f.name.find(".savepoint-tmp."), std::string::npos)
          << f.name << ": " << st.ToString();
    }
  };
  MemFileSystem probe;
  SP_ASSERT_OK(probe.CreateDir("/d"));
  FaultInjectionFileSystem counter(&probe);
  SP_ASSERT_OK(save(old_state, path, false, &counter));
  counter.Reset();
  SP_ASSERT_OK(save(new_state, path, true, &counter));
  const uint64_t mutations = counter.mutation_count();
  ASSERT_GE(mutations, 5u);
  for (uint64_t k = 0; k <= mutations; ++k) {
    SCOPED_TRACE(fmt::format("crash after {} of {} mutations", k, mutations));
    run([k](FaultInjectionFileSystem& fs) { fs.CrashAfter(k); }, true);
  }
  using Op = FaultInjectionFileSystem::Op;
  for (Op op : {Op::kCreate, Op::kWrite, Op::kSync, Op::kClose, Op::kRename, Op::kSyncDir}) {
    for (uint64_t n = 1; n <= 3; ++n) {
      SCOPED_TRACE(fmt::format("{} #{} fails", FaultInjectionFileSystem::OpName(op), n));
      run([op, n](FaultInjectionFileSystem& fs) { fs.FailNth(op, n, EIO); }, false);
    }
  }

  // In object storage the file is written in place: a writer that finds another writer's file
  // published under the same key meanwhile (a race it lost) fails with AlreadyExists and leaves
  // that file as it is.
  class Racer : public MemObjectStore {
   public:
    Racer(FileSystem* base, std::string path) : MemObjectStore(base), path_(std::move(path)) {}
    Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& p,
                                                          const FileOptions& o) override {
      if (p == path_ && !std::exchange(raced_, true)) {
        EXPECT_TRUE(base()->CreateDirs(Dirname(p)).ok());
        EXPECT_TRUE(base()->WriteFileSynced(p, "theirs").ok());
      }
      return MemObjectStore::NewWritableFile(p, o);
    }

   private:
    const std::string path_;
    bool raced_ = false;
  };
  MemFileSystem bucket;
  Racer racer(&bucket, path);
  EXPECT_THAT(save(new_state, path, false, &racer), StatusIs(StatusCode::kAlreadyExists));
  Result<std::string> kept = bucket.ReadFile(path, 1 << 20);
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_EQ(*kept, "theirs");
}

}  // namespace savepoint::testing

#endif  // SAVEPOINT_INTEROP_FILE_WRITER_TESTUTIL_H_
