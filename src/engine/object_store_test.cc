// The object-storage rules of the commit, delete and gc (docs/FORMAT.md §5.1) on an in-memory file
// system that says it is an object store and whose objects can be aged: what a prefix may hold
// when a save begins, that a delete removes the MANIFEST first and only the checkpoint's own
// objects, and that gc removes unfinished saves and aborts abandoned uploads only past the grace
// period. The same rules against a real S3 server: tests/s3/s3_store_test.cc.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>

#include "engine/data_objects.h"
#include "io/commit.h"
#include "io/mem_fs.h"
#include "savepoint/catalog.h"
#include "savepoint/checkpoint.h"
#include "savepoint/distributed.h"
#include "savepoint/encryption.h"
#include "testutil/ranks.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

// MemFileSystem as an object store: IsObjectStore, and every listed object `age_ns` older.
class AgedObjectStore : public testing::MemObjectStore {
 public:
  explicit AgedObjectStore(FileSystem* base) : MemObjectStore(base) {}
  Result<std::vector<FileInfo>> ListDir(const std::string& p) override {
    SP_ASSIGN_OR_RETURN(std::vector<FileInfo> entries, MemObjectStore::ListDir(p));
    for (FileInfo& e : entries) e.mtime_ns -= age_ns.load();
    return entries;
  }
  // One multipart upload under "/bucket/run", begun `age_ns` ago; aborted once.
  Result<std::vector<std::string>> AbortAbandonedWrites(const std::string& root, int64_t before_ns,
                                                        bool dry_run) override {
    const int64_t begun = std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count() -
                          age_ns.load();
    if (root != "/bucket/run" || aborted || begun >= before_ns) return std::vector<std::string>{};
    aborted = !dry_run;
    return std::vector<std::string>{"/bucket/run/x/data-00000-00000.spd (upload 7)"};
  }
  std::atomic<int64_t> age_ns{0};
  bool aborted = false;
};

class ObjectStoreTest : public ::testing::Test {
 protected:
  void SetUp() override { SP_ASSERT_OK(mem_.CreateDirs("/bucket/run")); }
  // A prefix holding the objects `names` (as the writer would leave them).
  void Objects(const std::string& dir, std::initializer_list<const char*> names) {
    SP_ASSERT_OK(mem_.CreateDirs(dir));
    for (const char* n : names) SP_ASSERT_OK(mem_.WriteFileSynced(dir + "/" + n, "bytes"));
  }

  MemFileSystem mem_;
  AgedObjectStore fs_{&mem_};
};

TEST_F(ObjectStoreTest, CommitWritesInPlaceAndRefusesWhatStandsThere) {
  io::CommitOptions co;
  co.owns = [](std::string_view name) { return name == "MANIFEST"; };  // a checkpoint's commit
  auto c =
      io::DurableCommit::Begin(&fs_, "/bucket/run/new", io::DurableCommit::Kind::kDirectory, co);
  SP_ASSERT_OK(c.status());
  EXPECT_EQ(c->tmp(), c->path());  // no temporary, no rename
  EXPECT_THAT(c->Commit(), StatusIs(StatusCode::kInternal, "no MANIFEST"));
  Objects("/bucket/run/done", {"MANIFEST", "data-00000-00000.spd"});
  EXPECT_THAT(
      io::DurableCommit::Begin(&fs_, "/bucket/run/done", io::DurableCommit::Kind::kDirectory, co),
      StatusIs(StatusCode::kAlreadyExists));
  co.overwrite = true;
  EXPECT_THAT(
      io::DurableCommit::Begin(&fs_, "/bucket/run/done", io::DurableCommit::Kind::kDirectory, co),
      StatusIs(StatusCode::kFailedPrecondition, "delete it first"));
  Objects("/bucket/run/half", {"data-00000-00000.spd"});
  EXPECT_THAT(
      io::DurableCommit::Begin(&fs_, "/bucket/run/half", io::DurableCommit::Kind::kDirectory, co),
      StatusIs(StatusCode::kFailedPrecondition, "data-00000-00000.spd"));
}

TEST_F(ObjectStoreTest, DeleteRemovesTheManifestFirstAndOnlyTheCheckpointsObjects) {
  Objects("/bucket/run/ck",
          {"MANIFEST", "data-00000-00000.spd", "data-00001-00000.spd", "notes.txt"});
  SP_ASSERT_OK(DeleteCheckpoint("/bucket/run/ck", &fs_));
  std::vector<FileInfo> left = mem_.ListDir("/bucket/run/ck").value();
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].name, "notes.txt");
  EXPECT_THAT(DeleteCheckpoint("/bucket/run/ck", &fs_), StatusIs(StatusCode::kNotFound));
}

TEST_F(ObjectStoreTest, GcRemovesUnfinishedSavesOnlyPastTheGracePeriod) {
  Objects("/bucket/run/committed", {"MANIFEST", "data-00000-00000.spd"});
  Objects("/bucket/run/unfinished", {"data-00000-00000.spd", "data-00001-00000.spd"});
  Objects("/bucket/run/theirs", {"data-00000-00000.spd", "report.csv"});
  // Young: a save may still be writing them, whatever min_age_seconds says.
  EXPECT_TRUE(GarbageCollect("/bucket/run", {.fs = &fs_}).value().empty());
  fs_.age_ns = int64_t{2} * 3600 * 1'000'000'000;
  const std::string upload = "/bucket/run/x/data-00000-00000.spd (upload 7)";
  EXPECT_EQ(GarbageCollect("/bucket/run", {.fs = &fs_, .dry_run = true}).value(),
            (std::vector<std::string>{"/bucket/run/unfinished", upload}));
  EXPECT_FALSE(fs_.aborted);
  EXPECT_TRUE(mem_.Exists("/bucket/run/unfinished/data-00000-00000.spd"));
  EXPECT_EQ(GarbageCollect("/bucket/run", {.fs = &fs_, .min_age_seconds = 3 * 3600}).value().size(),
            0u);
  EXPECT_EQ(GarbageCollect("/bucket/run", {.fs = &fs_}).value(),
            (std::vector<std::string>{"/bucket/run/unfinished", upload}));
  EXPECT_TRUE(fs_.aborted);
  EXPECT_TRUE(mem_.ListDir("/bucket/run/unfinished").value().empty());
  EXPECT_EQ(mem_.ListDir("/bucket/run/committed").value().size(), 2u);
  EXPECT_EQ(mem_.ListDir("/bucket/run/theirs").value().size(), 2u);
}

// A store whose conditional writes race (as some S3 servers' have): another save of the same
// prefix replaced a data object after this save created it. Just before the MANIFEST is written,
// the data object is swapped for the one another save wrote (of the same size).
class RacyObjectStore : public testing::MemObjectStore {
 public:
  using MemObjectStore::MemObjectStore;
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                        const FileOptions& options) override {
    if (path == "/bucket/run/race/MANIFEST" && remove) {  // (as a gc that took it for abandoned)
      SP_RETURN_IF_ERROR(base()->RemoveFile("/bucket/run/race/data-00000-00000.spd"));
    } else if (path == "/bucket/run/race/MANIFEST") {
      const std::string data = "/data-00000-00000.spd";
      SP_ASSIGN_OR_RETURN(std::string theirs,
                          base()->ReadFile("/bucket/run/other" + data, 1 << 30));
      SP_RETURN_IF_ERROR(base()->RemoveFile("/bucket/run/race" + data));
      SP_RETURN_IF_ERROR(base()->WriteFileSynced("/bucket/run/race" + data, theirs));
    }
    return MemObjectStore::NewWritableFile(path, options);
  }
  bool remove = false;  // remove the data object instead of replacing it
};

// The save that finds, once its MANIFEST is written, that a data object is another save's takes
// the MANIFEST back and fails, naming the object: no torn checkpoint is left committed.
TEST_F(ObjectStoreTest, ADataObjectReplacedBeforeTheCommitUncommitsTheSave) {
  RacyObjectStore racy(&mem_);
  const State a = testing::RandomState(1, 3, 64 << 10), b = testing::RandomState(2, 3, 64 << 10);
  const IoOptions io{.fs = &racy, .direct_io = false};
  SP_ASSERT_OK(Save(b, "/bucket/run/other", {}, io));
  EXPECT_THAT(Save(a, "/bucket/run/race", {}, io),
              StatusIs(StatusCode::kIOError,
                       "data object /bucket/run/race/data-00000-00000.spd is not this save's "
                       "(its header: data file belongs to another checkpoint"));
  EXPECT_FALSE(mem_.Exists("/bucket/run/race/MANIFEST"));
  EXPECT_THAT(Load("/bucket/run/race", {}, io), StatusIs(StatusCode::kNotFound, "MANIFEST"));
  SP_ASSERT_OK_AND_ASSIGN(State back, Load("/bucket/run/other", {}, io));  // (the other's stands)
  EXPECT_TRUE(testing::StatesEqual(b, back));
}

// A data object removed just before the MANIFEST is written (another process's gc) fails the save
// the same way, naming it.
TEST_F(ObjectStoreTest, ADataObjectRemovedBeforeTheCommitUncommitsTheSave) {
  RacyObjectStore racy(&mem_);
  racy.remove = true;
  const IoOptions io{.fs = &racy, .direct_io = false};
  EXPECT_THAT(Save(testing::RandomState(1, 3, 64 << 10), "/bucket/run/race", {}, io),
              StatusIs(StatusCode::kIOError,
                       "data object /bucket/run/race/data-00000-00000.spd is not found"));
  EXPECT_FALSE(mem_.Exists("/bucket/run/race/MANIFEST"));
  EXPECT_THAT(Load("/bucket/run/race", {}, io), StatusIs(StatusCode::kNotFound, "MANIFEST"));
}

// Saves whose data objects are their own pass the checks: indexed and encrypted ones, and a
// distributed one whose only data file is rank 1's (index 0 in the manifest).
TEST_F(ObjectStoreTest, OwnDataObjectsPassTheCommitsChecks) {
  const State random = testing::RandomState(3, 3, 64 << 10);
  State a;  // (tensors only: a distributed save takes values from rank 0, which has none here)
  for (const auto& [name, e] : random.entries()) {
    if (e.is_tensor()) SP_ASSERT_OK(a.Put(name, Tensor::CopyOf(e.tensor()).value()));
  }
  const IoOptions io{.fs = &fs_, .direct_io = false};
  const std::string key(32, 'k');
  const SaveOptions indexed{.format_version = 4}, sealed{.key = EncryptionKey::FromBytes(key)};
  SP_ASSERT_OK(Save(a, "/bucket/run/v4", indexed, io));
  SP_ASSERT_OK(Save(a, "/bucket/run/sealed", sealed, io));
  ShardLayout whole;  // rank 1's: each tensor whole, held by rank 1 alone
  for (const auto& [name, e] : a.entries()) {
    const Shape& shape = e.tensor().shape();
    whole[name] = ShardSpec{shape, Shape(shape.size(), 0), shape, {}};
  }
  for (const Status& s : testing::OnRanks(2, [&](Communicator& c) {
         const State none;
         const bool one = c.rank() == 1;
         return SaveDistributed(c, one ? a : none, one ? whole : ShardLayout(), "/bucket/run/ranks",
                                {}, io);
       })) {
    SP_ASSERT_OK(s);
  }
  EXPECT_TRUE(mem_.Exists("/bucket/run/ranks/data-00001-00000.spd"));
  EXPECT_FALSE(mem_.Exists("/bucket/run/ranks/data-00000-00000.spd"));
  for (const char* path : {"/bucket/run/v4", "/bucket/run/ranks"}) {
    SP_ASSERT_OK_AND_ASSIGN(State back, Load(path, {}, io));
    EXPECT_TRUE(testing::StatesEqual(a, back)) << path;
  }
  SP_EXPECT_OK(VerifyCheckpoint("/bucket/run/sealed", {.key = EncryptionKey::FromBytes(key)}, io));
}

// A MANIFEST is taken back only when it is the one the save wrote.
TEST_F(ObjectStoreTest, OnlyTheSavesOwnManifestIsTakenBack) {
  SP_ASSERT_OK(mem_.CreateDirs("/bucket/run/m"));
  SP_ASSERT_OK(mem_.WriteFileSynced("/bucket/run/m/MANIFEST", "header of another save"));
  engine::RemoveOwnManifest(&fs_, "/bucket/run/m/MANIFEST", "header of this save");
  EXPECT_TRUE(mem_.Exists("/bucket/run/m/MANIFEST"));
  engine::RemoveOwnManifest(&fs_, "/bucket/run/m/MANIFEST", "header of another save");
  EXPECT_FALSE(mem_.Exists("/bucket/run/m/MANIFEST"));
}

}  // namespace
}  // namespace savepoint
