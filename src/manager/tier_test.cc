// The manager's remote tier (ManagerOptions::remote): uploads in the background, per-tier
// retention, nothing deleted locally while it is being uploaded, restores from the remote when
// the local disk is gone, upload errors reported, delta chains uploaded base first. The remote is
// an in-memory directory tree or an in-memory object store; tests/python/test_s3.py runs the same
// against a real S3 server.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <utility>

#include "io/fault_fs.h"
#include "io/mem_fs.h"
#include "savepoint/catalog.h"
#include "savepoint/manager.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

// A remote whose file creations wait while the gate is closed.
class GatedFileSystem : public ForwardingFileSystem {
 public:
  explicit GatedFileSystem(FileSystem* base) : ForwardingFileSystem(base) {}
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                        const FileOptions& o) override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return open_; });
    return base()->NewWritableFile(path, o);
  }
  void Set(bool open) {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = open;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
};

State StateAt(int64_t step) { return testing::RandomState(step, 3, 64 << 10); }

class TierTest : public ::testing::Test {
 protected:
  ManagerOptions Options(FileSystem* remote_fs) {
    ManagerOptions o;
    o.naming.directory = "/local/run";
    o.io.fs = &local_;
    o.remote.location = "/bucket/run";
    o.remote.fs = remote_fs;
    return o;
  }
  std::unique_ptr<CheckpointManager> Open(const ManagerOptions& o) {
    auto m = CheckpointManager::Open(o);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? std::move(m).value() : nullptr;
  }
  static std::vector<std::string> Names(const std::vector<CheckpointRecord>& rs) {
    std::vector<std::string> out;
    for (const CheckpointRecord& r : rs) out.push_back(r.name);
    return out;
  }
  void SaveSteps(CheckpointManager& m, int64_t from, int64_t to) {
    for (int64_t step = from; step <= to; ++step) {
      Result<bool> saved = m.Save(step, StateAt(step));
      ASSERT_TRUE(saved.ok() && *saved) << saved.status().ToString();
    }
  }

  MemFileSystem local_;
  MemFileSystem remote_;
};

TEST_F(TierTest, UploadsInTheBackgroundWithItsOwnRetention) {
  ManagerOptions o = Options(&remote_);
  o.retention.keep_last_n = 2;
  o.remote.retention.keep_last_n = 1;
  o.remote.retention.keep_every_n_steps = 2;
  auto m = Open(o);
  ASSERT_NE(m, nullptr);
  SaveSteps(*m, 1, 5);
  SP_ASSERT_OK(m->Wait());
  EXPECT_EQ(Names(m->Remote()), (std::vector<std::string>{"ckpt-1_2", "ckpt-1_4", "ckpt-1_5"}));
  EXPECT_EQ(m->AllSteps(), (std::vector<int64_t>{2, 4, 5}));  // both tiers, once per name
  for (const CheckpointRecord& r : m->Remote()) {
    EXPECT_EQ(r.path, "/bucket/run/" + r.name);
    SP_EXPECT_OK(VerifyCheckpoint(r.path, {}, {.fs = &remote_}));
  }
  EXPECT_FALSE(remote_.Exists("/bucket/run/ckpt-1_1"));  // remote retention deleted it
  int uploads = 0;
  for (const CheckpointStats& st : m->stats()) uploads += st.action == "checkpoint_upload";
  EXPECT_EQ(uploads, 5);
  SP_ASSERT_OK(m->Close());
}

TEST_F(TierTest, ALostDiskRestoresFromTheRemote) {
  ManagerOptions o = Options(&remote_);
  State saved;
  {
    auto m = Open(o);
    ASSERT_NE(m, nullptr);
    SaveSteps(*m, 1, 3);
    SP_ASSERT_OK(m->Close());
    saved = Load("/local/run/ckpt-1_3", {}, {.fs = &local_}).value();
  }
  SP_ASSERT_OK(local_.RemoveAll("/local"));  // the node lost its disk
  auto m = Open(o);
  ASSERT_NE(m, nullptr);
  ASSERT_TRUE(m->Latest().has_value());
  EXPECT_EQ(m->Latest()->path, "/bucket/run/ckpt-1_3");
  SP_ASSERT_OK_AND_ASSIGN(State back, m->Restore());
  EXPECT_TRUE(testing::StatesEqual(back, saved));
  // Training goes on: the next save continues the series locally and is uploaded too.
  SaveSteps(*m, 4, 4);
  SP_ASSERT_OK(m->Wait());
  EXPECT_EQ(m->Latest()->path, "/local/run/ckpt-1_4");
  EXPECT_EQ(Names(m->Remote()).back(), "ckpt-1_4");
  EXPECT_THAT(m->Restore(Which::Step(99)), StatusIs(StatusCode::kNotFound, "/bucket/run"));
}

TEST_F(TierTest, NothingIsDeletedLocallyWhileItIsBeingUploaded) {
  GatedFileSystem gate(&remote_);
  ManagerOptions o = Options(&gate);
  o.retention.keep_last_n = 1;
  auto m = Open(o);
  ASSERT_NE(m, nullptr);
  gate.Set(false);
  SaveSteps(*m, 1, 3);  // training is not blocked by the stalled upload
  EXPECT_TRUE(local_.Exists("/local/run/ckpt-1_1"));
  EXPECT_TRUE(local_.Exists("/local/run/ckpt-1_2"));
  gate.Set(true);
  SP_ASSERT_OK(m->Wait());
  EXPECT_FALSE(local_.Exists("/local/run/ckpt-1_1"));
  EXPECT_FALSE(local_.Exists("/local/run/ckpt-1_2"));
  EXPECT_EQ(Names(m->Remote()), (std::vector<std::string>{"ckpt-1_1", "ckpt-1_2", "ckpt-1_3"}));
}

TEST_F(TierTest, AFailedUploadIsReportedAndTheLocalCheckpointStays) {
  FaultInjectionFileSystem faulty(&remote_);
  ManagerOptions o = Options(&faulty);
  auto m = Open(o);
  ASSERT_NE(m, nullptr);
  faulty.FailNth(FaultInjectionFileSystem::Op::kWrite, 1, EIO);
  SaveSteps(*m, 1, 1);
  EXPECT_THAT(m->Wait(), StatusIs(StatusCode::kIOError, "copy /local/run/ckpt-1_1 to /bucket/run"));
  SP_EXPECT_OK(VerifyCheckpoint("/local/run/ckpt-1_1", {}, {.fs = &local_}));
  EXPECT_TRUE(m->Remote().empty());
  SaveSteps(*m, 2, 2);  // the next upload goes through
  SP_ASSERT_OK(m->Wait());
  EXPECT_EQ(Names(m->Remote()), (std::vector<std::string>{"ckpt-1_2"}));
}

TEST_F(TierTest, UploadsEveryNthStepIntoAnObjectStore) {
  testing::MemObjectStore bucket(&remote_);
  ManagerOptions o = Options(&bucket);
  o.remote.upload_every_n_steps = 2;
  o.remote.retention.keep_all = true;
  {
    auto m = Open(o);
    ASSERT_NE(m, nullptr);
    SaveSteps(*m, 1, 5);
    SP_ASSERT_OK(m->Close());
  }
  // A new manager reads the remote index it left.
  SP_ASSERT_OK(local_.RemoveAll("/local"));
  auto m = Open(o);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(Names(m->Remote()), (std::vector<std::string>{"ckpt-1_2", "ckpt-1_4"}));
  SP_ASSERT_OK_AND_ASSIGN(State four, m->Restore());
  EXPECT_EQ(four.metadata()["step"], 4);
}

TEST_F(TierTest, LeftoversOfAnUploadWhoseProcessDiedDoNotBlockTheName) {
  testing::MemObjectStore bucket(&remote_);
  // A process killed mid-upload left a data object of ckpt-1_1 and no MANIFEST.
  SP_ASSERT_OK(bucket.WriteFileSynced("/bucket/run/ckpt-1_1/data-00000-00000.spd", "partial"));
  auto m = Open(Options(&bucket));
  ASSERT_NE(m, nullptr);
  SaveSteps(*m, 1, 1);
  SP_ASSERT_OK(m->Wait());
  EXPECT_EQ(Names(m->Remote()), (std::vector<std::string>{"ckpt-1_1"}));
  SP_EXPECT_OK(VerifyCheckpoint("/bucket/run/ckpt-1_1", {}, {.fs = &bucket}));
}

// Counts the listings made through it.
class ListCounter : public ForwardingFileSystem {
 public:
  explicit ListCounter(FileSystem* base) : ForwardingFileSystem(base) {}
  Result<std::vector<FileInfo>> ListDir(const std::string& path) override {
    ++lists;
    return base()->ListDir(path);
  }
  std::atomic<int> lists{0};
};

// An object store without compare-and-swap (a user's FileSystem that does not offer it).
class NoCasObjectStore : public testing::MemObjectStore {
 public:
  using MemObjectStore::MemObjectStore;
  Result<VersionedFile> ReadVersioned(const std::string& path, uint64_t) override {
    return UnimplementedError(path);
  }
};

TEST_F(TierTest, ARestoreFromTheIndexObjectListsNothing) {
  testing::MemObjectStore bucket(&remote_);
  State saved;
  {
    auto m = Open(Options(&bucket));
    ASSERT_NE(m, nullptr);
    SaveSteps(*m, 1, 3);
    SP_ASSERT_OK(m->Close());
    saved = Load("/local/run/ckpt-1_3", {}, {.fs = &local_}).value();
  }
  EXPECT_TRUE(bucket.Exists("/bucket/run/savepoint-index.json"));
  SP_ASSERT_OK(local_.RemoveAll("/local"));  // the node lost its disk
  ListCounter counted(&bucket);
  auto m = Open(Options(&counted));
  ASSERT_NE(m, nullptr);
  SP_ASSERT_OK_AND_ASSIGN(State back, m->Restore());
  EXPECT_TRUE(testing::StatesEqual(back, saved));
  EXPECT_EQ(counted.lists.load(), 0) << "index object, manifest, data: no listing";
  // The first upload reconciles the index with the bucket (a listing) and keeps it up to date.
  SaveSteps(*m, 4, 4);
  SP_ASSERT_OK(m->Wait());
  EXPECT_GT(counted.lists.load(), 0);
  EXPECT_EQ(Names(m->Remote()).back(), "ckpt-1_4");
}

TEST_F(TierTest, AnIndexWriterThatLostTheRaceAppliesItsChangeAgain) {
  // Another writer replaces the index object between this tier's read and its write.
  class Racer : public testing::MemObjectStore {
   public:
    using MemObjectStore::MemObjectStore;
    Result<std::string> WriteIfVersion(const std::string& path, std::string_view contents,
                                       const std::string& version) override {
      if (std::exchange(race, false)) {
        Result<VersionedFile> now = ReadVersioned(path, 1 << 20);
        EXPECT_TRUE(now.ok());
        Json j = Json::parse(now->contents);
        Json other = j["checkpoints"][0];
        other["name"] = "ckpt-1_0";
        j["checkpoints"].push_back(other);
        EXPECT_TRUE(MemObjectStore::WriteIfVersion(path, j.dump(), now->version).ok());
      }
      return MemObjectStore::WriteIfVersion(path, contents, version);
    }
    bool race = false;
  };
  Racer bucket(&remote_);
  auto m = Open(Options(&bucket));
  ASSERT_NE(m, nullptr);
  SaveSteps(*m, 1, 1);
  SP_ASSERT_OK(m->Wait());
  CopyOptions co;
  co.source_fs = &bucket;
  co.target_fs = &bucket;
  SP_ASSERT_OK(CopyCheckpoint("/bucket/run/ckpt-1_1", "/bucket/run/ckpt-1_0", co).status());
  bucket.race = true;
  SaveSteps(*m, 2, 2);
  SP_ASSERT_OK(m->Wait());
  EXPECT_FALSE(bucket.race);
  // Both changes are in the index: the other writer's record and this upload.
  SP_ASSERT_OK_AND_ASSIGN(VersionedFile index,
                          bucket.ReadVersioned("/bucket/run/savepoint-index.json", 1 << 20));
  EXPECT_NE(index.contents.find("ckpt-1_0"), std::string::npos);
  EXPECT_NE(index.contents.find("ckpt-1_2"), std::string::npos);
  EXPECT_EQ(Names(m->Remote()).back(), "ckpt-1_2");
}

TEST_F(TierTest, ADamagedIndexObjectIsRebuiltFromTheCheckpoints) {
  testing::MemObjectStore bucket(&remote_);
  {
    auto m = Open(Options(&bucket));
    ASSERT_NE(m, nullptr);
    SaveSteps(*m, 1, 2);
    SP_ASSERT_OK(m->Close());
  }
  for (const char* damage : {"{\"format\": \"savepoint-manager-index\", \"checkp", "[1, 2]",
                             "{\"generation\": 3, \"checkpoints\": [{\"name\": \"../x\"}]}"}) {
    SCOPED_TRACE(damage);
    const std::string index = "/bucket/run/savepoint-index.json";
    SP_ASSERT_OK_AND_ASSIGN(VersionedFile now, bucket.ReadVersioned(index, 1 << 20));
    SP_ASSERT_OK(bucket.WriteIfVersion(index, damage, now.version).status());
    SP_ASSERT_OK(local_.RemoveAll("/local"));
    auto m = Open(Options(&bucket));
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(Names(m->Remote()), (std::vector<std::string>{"ckpt-1_1", "ckpt-1_2"}));
    SP_ASSERT_OK_AND_ASSIGN(State two, m->Restore());
    EXPECT_EQ(two.metadata()["step"], 2);
    SP_ASSERT_OK(m->Close());
    EXPECT_NE(bucket.ReadVersioned(index, 1 << 20).value().contents.find("ckpt-1_2"),
              std::string::npos)
        << "the damaged index object is replaced";
  }
}

TEST_F(TierTest, IndexGenerationsMoveIntoTheIndexObject) {
  {  // a remote written by a store without compare-and-swap (or before index objects)
    NoCasObjectStore plain(&remote_);
    auto m = Open(Options(&plain));
    ASSERT_NE(m, nullptr);
    SaveSteps(*m, 1, 2);
    SP_ASSERT_OK(m->Close());
  }
  testing::MemObjectStore bucket(&remote_);
  EXPECT_FALSE(bucket.Exists("/bucket/run/savepoint-index.json"));
  SP_ASSERT_OK(local_.RemoveAll("/local"));
  {
    auto m = Open(Options(&bucket));
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(Names(m->Remote()), (std::vector<std::string>{"ckpt-1_1", "ckpt-1_2"}));
  }
  EXPECT_TRUE(bucket.Exists("/bucket/run/savepoint-index.json"));
  ListCounter counted(&bucket);
  auto m = Open(Options(&counted));
  ASSERT_NE(m, nullptr);
  SP_ASSERT_OK_AND_ASSIGN(State two, m->Restore());
  EXPECT_EQ(two.metadata()["step"], 2);
  EXPECT_EQ(counted.lists.load(), 0);
}

TEST_F(TierTest, OptionsAreChecked) {
  ManagerOptions o = Options(&remote_);
  o.io.fs = &local_;
  o.remote.location = "/local/run/remote";
  o.remote.fs = nullptr;
  EXPECT_THAT(CheckpointManager::Open(o), StatusIs(StatusCode::kInvalidArgument, "inside it"));
  o = Options(&remote_);
  o.storage.format = Format::kSafetensors;
  EXPECT_THAT(CheckpointManager::Open(o), StatusIs(StatusCode::kInvalidArgument, "native"));
  o = Options(&remote_);
  o.remote.threads = 0;
  EXPECT_THAT(CheckpointManager::Open(o), StatusIs(StatusCode::kInvalidArgument, "threads"));
  o = Options(&remote_);
  o.remote.retention.keep_best_n = 1;
  EXPECT_THAT(CheckpointManager::Open(o),
              StatusIs(StatusCode::kInvalidArgument, "remote.retention.keep_best_n"));
  o = Options(nullptr);
  o.remote.location.clear();
  o.remote.upload_every_n_steps = 3;
  EXPECT_THAT(CheckpointManager::Open(o),
              StatusIs(StatusCode::kInvalidArgument, "remote.location is empty"));
}

}  // namespace
}  // namespace savepoint
