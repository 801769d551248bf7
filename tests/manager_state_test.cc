// Registered state and loading under a LoadConfig (categories, strict/lenient, renames, model
// bank), the JobRunner, and crash consistency of the manager's index: a manager session is cut
// off after every single file-system mutation, power is lost, and a new manager must see exactly
// the committed checkpoints, each restoring the state saved at its step.
#include <fmt/format.h>

#include "helpers/toy_trainer.h"
#include "io/fault_fs.h"
#include "io/mem_fs.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

using testing::ToyTrainer;

ManagerOptions MemOptions(FileSystem* fs, std::string dir) {
  ManagerOptions o;
  o.naming.directory = std::move(dir);
  o.io.fs = fs;
  o.retention.keep_all = true;
  return o;
}

std::unique_ptr<CheckpointManager> OpenOrDie(const ManagerOptions& o) {
  auto m = CheckpointManager::Open(o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(m).value() : nullptr;
}

ToyTrainer TrainedTo(int64_t step, uint64_t seed = 1) {
  ToyTrainer t(seed);
  while (t.step() < step) t.Step();
  return t;
}

// A vector of floats as a Stateful ("v").
struct Vec : Stateful {
  std::vector<float> v;
  explicit Vec(size_t n, float fill) : v(n, fill) {}
  Status SaveState(State& out) override {
    return out.PutView("v", TensorView(v.data(), DType::kF32, {static_cast<int64_t>(v.size())}));
  }
  Status LoadState(const State&) override { return Status::OK(); }
};

// Saves trainer state at step 5 under /src and returns the checkpoint path.
std::string SaveToy(MemFileSystem& fs) {
  auto m = OpenOrDie(MemOptions(&fs, "/src"));
  ToyTrainer t = TrainedTo(5);
  EXPECT_TRUE(t.Register(*m).ok());
  SaveArgs force;
  force.force = true;
  EXPECT_TRUE(m->SaveRegistered(5, force).ok());
  return m->Latest()->path;
}

TEST(ManagerLoadConfig, IncludeAndExcludeCategories) {
  MemFileSystem fs;
  const std::string path = SaveToy(fs);
  const ToyTrainer want = TrainedTo(5), fresh = TrainedTo(0, 77);
  auto load = [&](std::vector<std::string> include, std::vector<std::string> exclude) {
    auto m = OpenOrDie(MemOptions(&fs, "/dst"));
    ToyTrainer t(77);
    EXPECT_TRUE(t.Register(*m).ok());
    LoadConfig c;
    c.include = std::move(include);
    c.exclude = std::move(exclude);
    Status s = m->LoadFrom(path, c);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return t;
  };
  ToyTrainer dense = load({"dense"}, {});
  EXPECT_EQ(dense.weights(), want.weights());
  EXPECT_EQ(dense.momentum(), fresh.momentum());
  EXPECT_EQ(dense.step(), 0);
  ToyTrainer no_opt = load({"*"}, {"optimizer"});
  EXPECT_EQ(no_opt.weights(), want.weights());
  EXPECT_EQ(no_opt.momentum(), fresh.momentum());
  EXPECT_EQ(no_opt.step(), 5);  // io_state loaded
  ToyTrainer none = load({"*"}, {"*"});
  EXPECT_TRUE(none == fresh);
  EXPECT_TRUE(load({"dense", "optimizer", "io_state", "extra"}, {}) == want);

  auto m = OpenOrDie(MemOptions(&fs, "/dst"));
  LoadConfig bad;
  bad.include = {"weights"};
  Status s = m->LoadFrom(path, bad);
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "\"weights\""));
}

TEST(ManagerLoadConfig, StrictFailsWithoutTouchingAnythingLenientLoadsWhatMatches) {
  MemFileSystem fs;
  const std::string path = SaveToy(fs);
  auto m = OpenOrDie(MemOptions(&fs, "/dst"));
  ToyTrainer t(77);
  SP_ASSERT_OK(t.Register(*m));
  Vec head(8, 1.0f);
  SP_ASSERT_OK(m->Register("head", &head, Category::kDense));
  Status s = m->LoadFrom(path, {});
  EXPECT_THAT(s, StatusIs(StatusCode::kNotFound, "\"head.v\""));
  EXPECT_TRUE(t == TrainedTo(0, 77)) << "a failed strict load must not change anything";
  LoadConfig lenient;
  lenient.strict = false;
  SP_ASSERT_OK(m->LoadFrom(path, lenient));
  EXPECT_TRUE(t == TrainedTo(5));
  EXPECT_EQ(head.v, std::vector<float>(8, 1.0f));

  // Strict also refuses a shape mismatch and checkpoint entries the object does not have.
  SP_ASSERT_OK(m->Unregister("head"));
  SP_ASSERT_OK(m->Unregister("model"));
  Vec small(3, 0.0f);
  SP_ASSERT_OK(m->Register("model", &small, Category::kDense));
  s = m->LoadFrom(path, {});
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "F32 [4096]"));
}

TEST(ManagerLoadConfig, ModelBankFromTwoCheckpointsWithRenames) {
  MemFileSystem fs;
  std::string a, b;
  {
    auto m = OpenOrDie(MemOptions(&fs, "/a"));
    Vec encoder(4, 1.5f), decoder(4, 2.5f);
    SP_ASSERT_OK(m->Register("encoder", &encoder, Category::kDense));
    SP_ASSERT_OK(m->Register("decoder", &decoder, Category::kDense));
    ASSERT_TRUE(*m->SaveRegistered(1));
    a = m->Latest()->path;
  }
  {
    auto m = OpenOrDie(MemOptions(&fs, "/b"));
    Vec teacher(4, 7.0f);
    SP_ASSERT_OK(m->Register("teacher", &teacher, Category::kDense));
    ASSERT_TRUE(*m->SaveRegistered(1));
    b = m->Latest()->path;
  }
  auto m = OpenOrDie(MemOptions(&fs, "/student"));
  Vec encoder(4, 0.0f), decoder(4, 0.0f), head(4, 0.0f);
  SP_ASSERT_OK(m->Register("encoder", &encoder, Category::kDense));
  SP_ASSERT_OK(m->Register("decoder", &decoder, Category::kDense));
  SP_ASSERT_OK(m->Register("head", &head, Category::kDense));
  LoadConfig from_a;
  from_a.only = {"encoder.*"};
  SP_ASSERT_OK(m->LoadFrom(a, from_a));
  LoadConfig from_b;
  from_b.only = {"head.*", "decoder.*"};
  from_b.renames = {{"teacher.v", "head.v"}};
  from_b.strict = false;  // decoder is not in B: skipped
  SP_ASSERT_OK(m->LoadFrom(b, from_b));
  EXPECT_EQ(encoder.v, std::vector<float>(4, 1.5f));
  EXPECT_EQ(head.v, std::vector<float>(4, 7.0f));
  EXPECT_EQ(decoder.v, std::vector<float>(4, 0.0f));
}

TEST(ManagerLoadConfig, IoStateIsPerShard) {
  MemFileSystem fs;
  std::string path;
  for (int shard = 0; shard < 2; ++shard) {
    ManagerOptions o = MemOptions(&fs, fmt::format("/shard{}", shard));
    o.shard_id = shard;
    o.num_shards = 2;
    auto m = OpenOrDie(o);
    Vec pos(2, static_cast<float>(10 + shard));
    SP_ASSERT_OK(m->Register("loader", &pos, Category::kIoState));
    ASSERT_TRUE(*m->SaveRegistered(1));
    if (shard == 1) path = m->Latest()->path;
  }
  ManagerOptions o = MemOptions(&fs, "/reader");
  o.shard_id = 1;
  o.num_shards = 2;
  auto m = OpenOrDie(o);
  Vec pos(2, 0.0f);
  SP_ASSERT_OK(m->Register("loader", &pos, Category::kIoState));
  SP_ASSERT_OK(m->LoadFrom(path, {}));
  EXPECT_EQ(pos.v, std::vector<float>(2, 11.0f));
  auto single = OpenOrDie(MemOptions(&fs, "/single"));
  SP_ASSERT_OK(single->Register("loader", &pos, Category::kIoState));
  Status s = single->LoadFrom(path, {});
  EXPECT_FALSE(s.ok());  // 1 shard now: shard-0 entries do not exist, and the count differs
}

// A job that trains a ToyTrainer for 3 steps per epoch and stops after `stop_at` epochs.
struct ToyJob : Job {
  ToyTrainer trainer{1};
  int inits = 0;
  int64_t stop_at = 0;
  std::vector<int64_t> epochs;
  Status Init() override {
    ++inits;
    return Status::OK();
  }
  Result<bool> RunEpoch(int64_t epoch) override {
    epochs.push_back(epoch);
    for (int i = 0; i < 3; ++i) trainer.Step();
    return epoch >= stop_at;
  }
};

struct RecordingHandler : MetadataHandler {
  std::vector<int64_t> written;
  std::vector<std::string> reports;
  bool accessible = true;
  Status Write(int64_t epoch) override {
    written.push_back(epoch);
    return Status::OK();
  }
  bool CpAccessible(std::optional<int64_t>) override { return accessible; }
  void Report(std::string_view action, const std::vector<CheckpointStats>& stats) override {
    for (const CheckpointStats& s : stats) {
      reports.push_back(fmt::format("{} {} {}", action, s.name, s.bytes > 0));
    }
  }
};

TEST(JobRunner, InitEpochsResumeAndReport) {
  MemFileSystem fs;
  JobRunnerOptions opts;
  opts.step_of_epoch = [](int64_t epoch) { return epoch * 3; };
  {
    auto m = OpenOrDie(MemOptions(&fs, "/job"));
    ToyJob job;
    job.stop_at = 2;
    SP_ASSERT_OK(job.trainer.Register(*m));
    RecordingHandler handler;
    JobRunner runner(&job, m.get(), &handler, opts);
    Result<int64_t> last = runner.Train();
    ASSERT_TRUE(last.ok()) << last.status().ToString();
    EXPECT_EQ(*last, 2);
    EXPECT_EQ(job.inits, 1);
    EXPECT_EQ(handler.written, (std::vector<int64_t>{0, 1, 2}));
    EXPECT_EQ(handler.reports.size(), 3u);
    EXPECT_EQ(handler.reports[1], "checkpoint_save ckpt-1_0 true");
    EXPECT_EQ(m->AllSteps(), (std::vector<int64_t>{0, 3, 6}));
  }
  auto m = OpenOrDie(MemOptions(&fs, "/job"));
  ToyJob job;  // resumes from epoch 2 without Init and runs epochs 3 and 4
  job.trainer = ToyTrainer(55);
  job.stop_at = 4;
  SP_ASSERT_OK(job.trainer.Register(*m));
  JobRunner runner(&job, m.get(), nullptr, opts);
  Result<int64_t> last = runner.Train();
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  EXPECT_EQ(job.inits, 0);
  EXPECT_EQ(job.epochs, (std::vector<int64_t>{3, 4}));
  EXPECT_TRUE(job.trainer == TrainedTo(12));
}

TEST(JobRunner, GivenEpochAndInaccessibleStorage) {
  MemFileSystem fs;
  JobRunnerOptions opts;
  opts.step_of_epoch = [](int64_t epoch) { return epoch * 3; };
  {
    auto m = OpenOrDie(MemOptions(&fs, "/job"));
    ToyJob job;
    job.stop_at = 3;
    SP_ASSERT_OK(job.trainer.Register(*m));
    ASSERT_TRUE(JobRunner(&job, m.get(), nullptr, opts).Train().ok());
  }
  auto m = OpenOrDie(MemOptions(&fs, "/job"));
  ToyJob job;
  job.trainer = ToyTrainer(55);
  job.stop_at = 2;
  SP_ASSERT_OK(job.trainer.Register(*m));
  RecordingHandler handler;
  handler.accessible = false;
  opts.resume_from_epoch = 1;
  ASSERT_TRUE(JobRunner(&job, m.get(), &handler, opts).Train().ok());
  EXPECT_EQ(job.epochs, (std::vector<int64_t>{2}));
  EXPECT_TRUE(job.trainer == TrainedTo(6));
  EXPECT_TRUE(handler.written.empty());                                 // nothing saved
  EXPECT_EQ(handler.reports.front(), "checkpoint_load ckpt-1_0 true");  // epoch 1 loaded
  opts.resume_from_epoch = 9;
  EXPECT_THAT(JobRunner(&job, m.get(), nullptr, opts).Train(), StatusIs(StatusCode::kNotFound));
}

// One manager session: saves at steps 1..6 (keep 2, every 2nd step kept too) until the file
// system refuses. Returns the last step whose save returned OK (0 if none).
int64_t Session(FileSystem* fs) {
  ManagerOptions o;
  o.naming.directory = "/ckpt";
  o.io.fs = fs;
  o.retention.keep_last_n = 2;
  o.retention.keep_every_n_steps = 4;
  auto m = CheckpointManager::Open(o);
  if (!m.ok()) return 0;
  int64_t last_ok = 0;
  for (int64_t step = 1; step <= 6; ++step) {
    State s = testing::RandomState(step, 2, 32 << 10);
    if (!(*m)->Save(step, s).ok()) break;
    last_ok = step;
  }
  return last_ok;
}

TEST(ManagerCrash, PowerLossAfterEveryMutationLeavesAConsistentIndex) {
  MemFileSystem probe_base;
  FaultInjectionFileSystem probe(&probe_base);
  ASSERT_EQ(Session(&probe), 6);
  const uint64_t total = probe.mutation_count();
  ASSERT_GT(total, 20u);
  for (uint64_t n = 0; n <= total; ++n) {
    SCOPED_TRACE(fmt::format("crash after {} of {} mutations", n, total));
    MemFileSystem mem;
    FaultInjectionFileSystem faulty(&mem);
    faulty.CrashAfter(n);
    const int64_t last_ok = Session(&faulty);
    mem.SimulatePowerLoss();
    auto m = OpenOrDie(MemOptions(&mem, "/ckpt"));
    ASSERT_NE(m, nullptr);
    std::vector<CheckpointRecord> all = m->All();
    Result<std::vector<CheckpointEntry>> listed = ListCheckpoints("/ckpt", &mem);
    ASSERT_TRUE(listed.ok());
    size_t committed = 0;
    for (const CheckpointEntry& e : *listed) committed += e.committed;
    EXPECT_EQ(all.size(), committed) << "index and directory disagree";
    if (last_ok > 0) {
      ASSERT_FALSE(all.empty());
      EXPECT_GE(all.back().step, last_ok) << "a save that returned OK was lost";
    }
    for (const CheckpointRecord& r : all) {
      Result<State> s = Load(r.path, {}, {.fs = &mem});
      ASSERT_TRUE(s.ok()) << r.path << ": " << s.status().ToString();
      State want = testing::RandomState(r.step, 2, 32 << 10);
      for (const auto& [name, e] : want.entries()) {
        if (!e.is_tensor()) continue;
        const TensorView* got = s->FindTensor(name);
        ASSERT_NE(got, nullptr) << name;
        EXPECT_EQ(0, std::memcmp(got->data(), e.tensor().data(), e.tensor().nbytes())) << name;
      }
    }
  }
}

}  // namespace
}  // namespace savepoint
