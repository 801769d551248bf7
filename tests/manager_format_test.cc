// CheckpointManager with file formats: MindSpore .ckpt files ("{prefix}-{epoch}_{step}.ckpt",
// CRC trailer, encryption, async) and safetensors files; indexing files MindSpore wrote itself.
#include <fmt/format.h>

#include "helpers/toy_trainer.h"
#include "io/mem_fs.h"
#include "savepoint/mindspore.h"
#include "savepoint/safetensors.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

using testing::ToyTrainer;

ManagerOptions FileOptions(FileSystem* fs, CheckpointFormat format) {
  ManagerOptions o;
  o.naming.directory = "/ckpt";
  o.io.fs = fs;
  o.storage.format = format;
  return o;
}

std::unique_ptr<CheckpointManager> OpenOrDie(const ManagerOptions& o) {
  auto m = CheckpointManager::Open(o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(m).value() : nullptr;
}

// Dtypes both MindSpore and safetensors hold.
State StateAt(int64_t step) {
  State s;
  Tensor w = Tensor::Zeros(DType::kF32, {64, 33}).value();
  Tensor b = Tensor::Zeros(DType::kBF16, {17}).value();
  Tensor n = Tensor::Zeros(DType::kI64, {5}).value();
  for (Tensor* t : {&w, &b, &n}) {
    for (uint64_t i = 0; i < t->nbytes(); ++i) {
      t->data()[i] = static_cast<std::byte>((i * 7 + static_cast<uint64_t>(step) * 13) & 0x7f);
    }
  }
  EXPECT_TRUE(s.Put("net.w", std::move(w)).ok());
  EXPECT_TRUE(s.Put("net.b", std::move(b)).ok());
  EXPECT_TRUE(s.Put("opt.n", std::move(n)).ok());
  EXPECT_TRUE(s.PutValue("lr", 0.5).ok());
  return s;
}

std::vector<std::string> Listing(MemFileSystem& fs) {
  std::vector<std::string> names;
  for (const FileInfo& e : fs.ListDir("/ckpt").value()) {
    if (!e.name.starts_with("savepoint-")) names.push_back(e.name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// A value saved in a file: a Value (safetensors) or a 0-d Int64 tensor (.ckpt).
int64_t IntOf(const State& s, const std::string& name) {
  if (const Value* v = s.FindValue(name)) return v->as_int();
  const TensorView* t = s.FindTensor(name);
  EXPECT_TRUE(t != nullptr && t->dtype() == DType::kI64 && t->shape().empty()) << name;
  int64_t x = -1;
  if (t != nullptr) std::memcpy(&x, t->data(), sizeof x);
  return x;
}

// The entries of `want` are in `got`, its tensors with equal bytes.
void ExpectHolds(const State& got, const State& want) {
  for (const auto& [name, e] : want.entries()) {
    ASSERT_TRUE(got.Contains(name)) << name;
    if (!e.is_tensor()) continue;  // a .ckpt file holds values as 0-d tensors: see Scalar
    const TensorView* t = got.FindTensor(name);
    ASSERT_NE(t, nullptr) << name;
    ASSERT_EQ(t->nbytes(), e.tensor().nbytes()) << name;
    EXPECT_EQ(std::memcmp(t->data(), e.tensor().data(), t->nbytes()), 0) << name;
  }
}

TEST(ManagerFormat, MindSporeFilesAreNamedIndexedKeptAndRestored) {
  MemFileSystem fs;
  ManagerOptions o = FileOptions(&fs, CheckpointFormat::kMindSporeCkpt);
  o.naming.prefix = "net";
  o.retention.keep_last_n = 3;
  o.save_policy.steps_per_epoch = 4;
  o.storage.file_checksum = true;
  o.storage.append_info = {"epoch_num", "step_num"};
  auto m = OpenOrDie(o);
  ASSERT_NE(m, nullptr);
  for (int64_t step = 1; step <= 6; ++step) {
    Result<bool> saved = m->Save(step, StateAt(step));
    ASSERT_TRUE(saved.ok() && *saved) << saved.status().ToString();
  }
  EXPECT_EQ(Listing(fs), (std::vector<std::string>{"net-1_4.ckpt", "net-2_1.ckpt", "net-2_2.ckpt",
                                                   "savepoint.lock"}));
  EXPECT_EQ(m->AllSteps(), (std::vector<int64_t>{4, 5, 6}));
  EXPECT_EQ(m->Latest()->name, "net-2_2.ckpt");
  // A plain MindSpore file: CRC trailer, append_info values, the tensors.
  Result<MindSporeCheckpointInfo> info = InspectMindSporeCheckpoint("/ckpt/net-2_2.ckpt", &fs);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_TRUE(info->has_crc);
  Result<State> file = LoadMindSporeCheckpoint("/ckpt/net-2_2.ckpt", {}, {.fs = &fs});
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  ExpectHolds(*file, StateAt(6));
  EXPECT_EQ(IntOf(*file, "epoch_num"), 2);
  EXPECT_EQ(IntOf(*file, "step_num"), 6);
  // Restore by step and by name, with or without the suffix.
  Result<State> five = m->Restore(Which::Step(5));
  ASSERT_TRUE(five.ok()) << five.status().ToString();
  ExpectHolds(*five, StateAt(5));
  EXPECT_TRUE(m->Restore(Which::Name("net-1_4")).ok());
  EXPECT_TRUE(m->Restore(Which::Name("net-1_4.ckpt")).ok());
  EXPECT_THAT(m->Restore(Which::Step(1)), StatusIs(StatusCode::kNotFound));
  SP_ASSERT_OK(m->Close());

  // Reopened: the index is read back; a lost index is rebuilt from the files' metadata.
  for (const FileInfo& e : fs.ListDir("/ckpt").value()) {
    if (e.name.starts_with("savepoint-index-")) SP_ASSERT_OK(fs.RemoveFile("/ckpt/" + e.name));
  }
  auto again = OpenOrDie(o);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->AllSteps(), (std::vector<int64_t>{4, 5, 6}));
  EXPECT_EQ(again->Latest()->epoch, 2);
  EXPECT_EQ(again->Latest()->step_in_epoch, 2);
}

TEST(ManagerFormat, IndexesFilesMindSporeWroteByTheirNames) {
  MemFileSystem fs;
  // As MindSpore's ModelCheckpoint names them, without savepoint's metadata entry.
  for (auto [epoch, step] : {std::pair{1, 10}, std::pair{2, 10}, std::pair{3, 5}}) {
    State s = StateAt(epoch * 100 + step);
    SP_ASSERT_OK(SaveMindSporeCheckpoint(s, fmt::format("/ckpt/lenet-{}_{}.ckpt", epoch, step), {},
                                         {.fs = &fs}));
  }
  SP_ASSERT_OK(fs.WriteFileSynced("/ckpt/lenet-graph.meta", "graph"));
  // A file named like a checkpoint that is not a readable .ckpt (cut short by a copy) is not
  // indexed.
  std::string cut = fs.ReadFile("/ckpt/lenet-3_5.ckpt", 1 << 30).value();
  SP_ASSERT_OK(fs.WriteFileSynced("/ckpt/lenet-3_9.ckpt", cut.substr(0, cut.size() / 2)));
  ManagerOptions o = FileOptions(&fs, CheckpointFormat::kMindSporeCkpt);
  o.naming.prefix = "lenet";
  o.save_policy.steps_per_epoch = 10;
  o.retention.keep_all = true;
  auto m = OpenOrDie(o);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->AllSteps(), (std::vector<int64_t>{10, 20, 25}));
  Result<CheckpointRecord> rec = m->ResumeFrom();
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  EXPECT_EQ(rec->name, "lenet-3_5.ckpt");
  EXPECT_EQ(m->global_step(), 25);
  // The series continues after a resume: the next name is in the same series.
  Result<bool> saved = m->Save(30, StateAt(30));
  ASSERT_TRUE(saved.ok() && *saved) << saved.status().ToString();
  EXPECT_EQ(m->Latest()->name, "lenet-3_10.ckpt");
  // Without resuming, a new run starts a new series (MindSpore's conflict rule).
  SP_ASSERT_OK(m->Close());
  auto fresh = OpenOrDie(o);
  ASSERT_NE(fresh, nullptr);
  EXPECT_EQ(fresh->prefix(), "lenet_1");
}

TEST(ManagerFormat, EncryptedMindSporeFilesWithEachCipher) {
  const EncryptionKey key = EncryptionKey::FromBytes(std::string(16, 'k'));
  for (MindSporeCipher cipher :
       {MindSporeCipher::kAesGcm, MindSporeCipher::kAesCbc, MindSporeCipher::kSm4Cbc}) {
    SCOPED_TRACE(std::string(MindSporeCipherName(cipher)));
    MemFileSystem fs;
    ManagerOptions o = FileOptions(&fs, CheckpointFormat::kMindSporeCkpt);
    o.retention.keep_last_n = 1;
    o.storage.key = key;
    o.storage.cipher = cipher;
    o.storage.file_checksum = true;
    auto m = OpenOrDie(o);
    ASSERT_NE(m, nullptr);
    for (int64_t step = 1; step <= 2; ++step) SP_ASSERT_OK(m->Save(step, StateAt(step)).status());
    // Retention removed the first file and, for CBC, its MAC sidecar.
    std::vector<std::string> want = {"ckpt-1_2.ckpt", "savepoint.lock"};
    if (cipher != MindSporeCipher::kAesGcm) want.insert(want.begin() + 1, "ckpt-1_2.ckpt.mac");
    EXPECT_EQ(Listing(fs), want);
    Result<MindSporeCheckpointInfo> info =
        InspectMindSporeCheckpoint("/ckpt/ckpt-1_2.ckpt", &fs, key);
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    EXPECT_EQ(info->cipher, MindSporeCipherName(cipher));
    Result<State> back = m->Restore();
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    ExpectHolds(*back, StateAt(2));
    SP_ASSERT_OK(m->Close());
    // Another key: listing works, restoring is refused.
    o.storage.key = EncryptionKey::FromBytes(std::string(16, 'x'));
    auto other = OpenOrDie(o);
    ASSERT_NE(other, nullptr);
    EXPECT_EQ(other->AllSteps(), (std::vector<int64_t>{2}));
    EXPECT_THAT(other->Restore(), StatusIs(StatusCode::kUnauthenticated));
  }
}

TEST(ManagerFormat, AsyncSavesSnapshotTheState) {
  for (CheckpointFormat format :
       {CheckpointFormat::kMindSporeCkpt, CheckpointFormat::kSafetensors}) {
    MemFileSystem fs;
    ManagerOptions o = FileOptions(&fs, format);
    o.async_save.enabled = true;
    o.retention.keep_last_n = 2;
    auto m = OpenOrDie(o);
    ASSERT_NE(m, nullptr);
    for (int64_t step = 1; step <= 4; ++step) {
      State live = StateAt(step);
      SP_ASSERT_OK(m->Save(step, live).status());
      // Training goes on at once: the save holds its own copy.
      Tensor scratch = Tensor::Zeros(DType::kF32, {64, 33}).value();
      std::memcpy(const_cast<std::byte*>(live.FindTensor("net.w")->data()), scratch.data(),
                  scratch.nbytes());
    }
    SP_ASSERT_OK(m->Wait());
    EXPECT_EQ(m->AllSteps(), (std::vector<int64_t>{3, 4}));
    for (int64_t step : {3, 4}) {
      Result<State> back = m->Restore(Which::Step(step));
      ASSERT_TRUE(back.ok()) << back.status().ToString();
      ExpectHolds(*back, StateAt(step));
    }
    int saves = 0;
    for (const CheckpointStats& st : m->stats()) {
      if (st.action != "checkpoint_save") continue;
      ++saves;
      EXPECT_GT(st.bytes, 0u);
      EXPECT_LE(st.blocked_seconds, st.seconds);
    }
    EXPECT_EQ(saves, 4);
  }
}

TEST(ManagerFormat, SafetensorsFilesInMindSporeFlavourWithCrc) {
  MemFileSystem fs;
  ManagerOptions o = FileOptions(&fs, CheckpointFormat::kSafetensors);
  o.storage.file_checksum = true;
  o.breakpoints.on_exception = true;
  auto m = OpenOrDie(o);
  ASSERT_NE(m, nullptr);
  SP_ASSERT_OK(m->Save(3, StateAt(3)).status());
  EXPECT_EQ(m->Latest()->name, "ckpt-1_3.safetensors");
  Result<SafetensorsInfo> info = InspectSafetensors("/ckpt/ckpt-1_3.safetensors", &fs);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_TRUE(info->mindspore_format);
  EXPECT_TRUE(info->has_crc_num);
  Result<State> back = m->Restore();
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ExpectHolds(*back, StateAt(3));
}

TEST(ManagerFormat, RegisteredObjectsRoundTripThroughFiles) {
  for (CheckpointFormat format :
       {CheckpointFormat::kMindSporeCkpt, CheckpointFormat::kSafetensors}) {
    MemFileSystem fs;
    ManagerOptions o = FileOptions(&fs, format);
    o.save_policy.interval_steps = 5;
    o.save_policy.steps_per_epoch = ToyTrainer::kStepsPerEpoch;
    ToyTrainer trainer(7);
    ToyTrainer at10(0);
    {
      auto m = OpenOrDie(o);
      ASSERT_NE(m, nullptr);
      SP_ASSERT_OK(trainer.Register(*m));
      for (int i = 0; i < 12; ++i) {
        trainer.Step();
        SP_ASSERT_OK(m->OnStepEnd(trainer.step(), trainer.epoch()));
        if (trainer.step() == 10) at10 = trainer;
      }
      SP_ASSERT_OK(m->Close());
    }
    ToyTrainer resumed(99);
    auto m = OpenOrDie(o);
    ASSERT_NE(m, nullptr);
    SP_ASSERT_OK(resumed.Register(*m));
    Result<CheckpointRecord> rec = m->RestoreRegistered();
    ASSERT_TRUE(rec.ok()) << rec.status().ToString();
    EXPECT_EQ(rec->step, 10);
    EXPECT_TRUE(resumed == at10);
  }
}

TEST(ManagerFormat, CorruptFileIsReportedOnRestore) {
  MemFileSystem fs;
  ManagerOptions o = FileOptions(&fs, CheckpointFormat::kMindSporeCkpt);
  o.storage.file_checksum = true;
  auto m = OpenOrDie(o);
  ASSERT_NE(m, nullptr);
  SP_ASSERT_OK(m->Save(1, StateAt(1)).status());
  std::string bytes = fs.ReadFile("/ckpt/ckpt-1_1.ckpt", 1 << 30).value();
  bytes[bytes.size() / 2] ^= 0x10;
  SP_ASSERT_OK(fs.RemoveFile("/ckpt/ckpt-1_1.ckpt"));
  SP_ASSERT_OK(fs.WriteFileSynced("/ckpt/ckpt-1_1.ckpt", bytes));
  Status s = m->Restore().status();
  EXPECT_THAT(s, StatusIs(StatusCode::kCorruption, "ckpt-1_1.ckpt"));
}

}  // namespace
}  // namespace savepoint
