// Topology as an option of the verbs: Save with SaveOptions::topology is SaveDistributed, Load and
// LoadInto with LoadOptions::topology read this rank's boxes, and every call that takes no
// topology refuses one that is set.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>

#include "io/mem_fs.h"
#include "savepoint/async.h"
#include "savepoint/checkpoint.h"
#include "savepoint/distributed.h"
#include "savepoint/sparse.h"
#include "testutil/ranks.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

constexpr int kWorld = 2;

// Whether `got` (null when missing) holds the dtype, shape and bytes of `want`.
bool Same(const TensorView* got, const TensorView& want) {
  return got != nullptr && got->dtype() == want.dtype() && got->shape() == want.shape() &&
         std::memcmp(got->data(), want.data(), want.nbytes()) == 0;
}

// A [4, 3] f32 tensor "w" split by rows over two ranks, an i32 "bias" whole on both, and a value.
struct Job {
  Tensor global = Tensor::Empty(DType::kF32, {4, 3}).value();
  Tensor bias = Tensor::Empty(DType::kI32, {3}).value();
  std::vector<ShardLayout> layouts;

  Job() {
    testing::FillPattern(global.view(), 7);
    testing::FillPattern(bias.view(), 8);
    for (int r = 0; r < kWorld; ++r) {
      layouts.push_back({{"w", SplitDim(global.shape(), 0, kWorld, r).value()}});
    }
  }
  // Rank r's rows of w (rows 2r, 2r+1), as a fresh tensor.
  Tensor Rows(int r) const {
    Tensor t = Tensor::Empty(DType::kF32, {2, 3}).value();
    std::memcpy(t.data(), global.data() + r * t.nbytes(), t.nbytes());
    return t;
  }
  State Local(int r) const {
    State s;
    EXPECT_TRUE(s.Put("w", Rows(r)).ok());
    EXPECT_TRUE(s.Put("bias", Tensor::CopyOf(bias.view()).value()).ok());
    EXPECT_TRUE(s.PutValue("step", Value(int64_t{5})).ok());
    return s;
  }
};

class TopologyTest : public ::testing::Test {
 protected:
  std::unique_ptr<MemFileSystem> fs_ = std::make_unique<MemFileSystem>();
  IoOptions io_{.fs = fs_.get(), .io_threads = 2, .direct_io = false};
  Job job_;

  // Every rank saves its part through Save(..., {.topology}).
  std::vector<Status> SaveOnRanks(const std::string& path, bool with_layout = true) {
    return testing::OnRanks(kWorld, [&](Communicator& c) {
      SaveOptions o;
      o.topology = {.comm = &c, .layout = with_layout ? &job_.layouts[c.rank()] : nullptr};
      return Save(job_.Local(c.rank()), path, o, io_);
    });
  }
};

TEST_F(TopologyTest, SaveOfRanksWritesOneCheckpointThatLoadsWholeAndByBoxes) {
  for (const Status& s : SaveOnRanks("/ckpt")) SP_ASSERT_OK(s);
  State whole = Load("/ckpt", {}, io_).value();
  EXPECT_TRUE(Same(whole.FindTensor("w"), job_.global.view()));
  EXPECT_TRUE(Same(whole.FindTensor("bias"), job_.bias.view()));
  ASSERT_NE(whole.FindValue("step"), nullptr);
  EXPECT_EQ(whole.FindValue("step")->as_int(), 5);
  for (int r = 0; r < kWorld; ++r) {
    LoadOptions lo;
    lo.topology.layout = &job_.layouts[r];
    // Load returns the layout's tensors, LoadInto fills the caller's.
    State got = Load("/ckpt", lo, io_).value();
    EXPECT_EQ(got.num_tensors(), 1u);
    EXPECT_TRUE(Same(got.FindTensor("w"), job_.Rows(r).view()));
    State into;
    ASSERT_TRUE(into.Put("w", Tensor::Zeros(DType::kF32, {2, 3}).value()).ok());
    SP_ASSERT_OK(LoadInto("/ckpt", into, lo, io_));
    EXPECT_TRUE(Same(into.FindTensor("w"), job_.Rows(r).view()));
    ASSERT_NE(into.FindValue("step"), nullptr);
    EXPECT_EQ(into.FindValue("step")->as_int(), 5);
  }
}

TEST_F(TopologyTest, SaveOfRanksIsSaveDistributed) {
  for (const Status& s : SaveOnRanks("/a")) SP_ASSERT_OK(s);
  auto old = testing::OnRanks(kWorld, [&](Communicator& c) {
    return SaveDistributed(c, job_.Local(c.rank()), job_.layouts[c.rank()], "/b", {}, io_);
  });
  for (const Status& s : old) SP_ASSERT_OK(s);
  EXPECT_TRUE(testing::StatesEqual(Load("/a", {}, io_).value(), Load("/b", {}, io_).value()));
}

TEST_F(TopologyTest, SaveOfRanksWithoutALayoutSavesWholeReplicatedTensors) {
  auto st = testing::OnRanks(kWorld, [&](Communicator& c) {
    SaveOptions o;
    o.topology.comm = &c;
    State s;
    EXPECT_TRUE(s.Put("bias", Tensor::CopyOf(job_.bias.view()).value()).ok());
    return Save(s, "/whole", o, io_);
  });
  for (const Status& s : st) SP_ASSERT_OK(s);
  EXPECT_TRUE(Same(Load("/whole", {}, io_).value().FindTensor("bias"), job_.bias.view()));
}

TEST_F(TopologyTest, WhatATopologyCannotDoIsRefusedNamingTheField) {
  State one = job_.Local(0);
  SaveOptions layout_alone;
  layout_alone.topology.layout = &job_.layouts[0];
  EXPECT_THAT(Save(one, "/x", layout_alone, io_),
              StatusIs(StatusCode::kInvalidArgument, "topology.layout needs topology.comm"));
  auto files = testing::OnRanks(kWorld, [&](Communicator& c) {
    SaveOptions o;
    o.topology = {.comm = &c, .layout = &job_.layouts[c.rank()]};
    o.format = Format::kAuto;
    return Save(job_.Local(c.rank()), "/x.safetensors", o, io_);
  });
  for (const Status& s : files) {
    EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, "native checkpoints only"));
  }
  EXPECT_FALSE(fs_->Exists("/x.safetensors"));
  EXPECT_FALSE(fs_->Exists("/x"));

  for (const Status& s : SaveOnRanks("/ckpt")) SP_ASSERT_OK(s);
  SaveOptions timeout_alone;
  timeout_alone.topology.timeout = std::chrono::seconds(5);
  EXPECT_THAT(Save(one, "/x", timeout_alone, io_),
              StatusIs(StatusCode::kInvalidArgument, "topology.timeout applies to saves of ranks"));
  LoadOptions names;
  names.topology.layout = &job_.layouts[0];
  names.names = {"w"};
  EXPECT_THAT(Load("/ckpt", names, io_).status(),
              StatusIs(StatusCode::kInvalidArgument, "LoadOptions.names is set"));
  auto comms = NewThreadCommunicators(1);
  LoadOptions with_comm;
  with_comm.topology.comm = comms[0].get();
  EXPECT_THAT(Load("/ckpt", with_comm, io_).status(),
              StatusIs(StatusCode::kInvalidArgument, "loads take no communicator"));
  State into;
  EXPECT_THAT(LoadInto("/ckpt", into, with_comm, io_),
              StatusIs(StatusCode::kInvalidArgument, "loads take no communicator"));
}

TEST_F(TopologyTest, CallsThatTakeNoTopologyRefuseOne) {
  for (const Status& s : SaveOnRanks("/ckpt")) SP_ASSERT_OK(s);
  const ShardLayout& layout = job_.layouts[0];
  LoadOptions lo;
  lo.topology.layout = &layout;
  const auto refused = StatusIs(StatusCode::kInvalidArgument, "LoadOptions.topology is set");
  EXPECT_THAT(VerifyCheckpoint("/ckpt", lo, io_), refused);
  EXPECT_THAT(Verify("/ckpt", lo, io_), refused);
  EXPECT_THAT(CheckpointReader::Open("/ckpt", lo, io_).status(), refused);
  State targets;
  EXPECT_THAT(LoadDistributed("/ckpt", targets, layout, lo, io_), refused);

  auto comms = NewThreadCommunicators(1);
  SaveOptions so;
  so.topology.comm = comms[0].get();
  const auto save_refused = StatusIs(StatusCode::kInvalidArgument, "SaveOptions.topology is set");
  EXPECT_THAT(SaveSparse(job_.Local(0), "/s", {.save = so}, io_), save_refused);
  EXPECT_THAT(SaveDistributed(*comms[0], job_.Local(0), {}, "/d", {.save = so}, io_), save_refused);
  auto ckpt = Checkpointer::Create({}, io_).value();
  EXPECT_THAT(ckpt->SaveAsync(job_.Local(0), "/async", so).status(), save_refused);
  MergeOptions merge;
  merge.load.topology.layout = &layout;  // would have merged this rank's boxes as whole tensors
  EXPECT_THAT(MergeCheckpoint("/ckpt", "/m", merge, io_),
              StatusIs(StatusCode::kInvalidArgument, "MergeOptions.load.topology is set"));
  MergeSafetensorsOptions to_files;
  to_files.load.topology.layout = &layout;
  EXPECT_THAT(MergeToSafetensors("/ckpt", "/m", to_files, io_),
              StatusIs(StatusCode::kInvalidArgument, "MergeOptions.load.topology is set"));
  merge = {};
  merge.save.topology.timeout = std::chrono::seconds(1);
  EXPECT_THAT(MergeCheckpoint("/ckpt", "/m", merge, io_),
              StatusIs(StatusCode::kInvalidArgument, "MergeOptions.save.topology is set"));
  EXPECT_FALSE(fs_->Exists("/s"));
  EXPECT_FALSE(fs_->Exists("/d"));
  EXPECT_FALSE(fs_->Exists("/async"));
  EXPECT_FALSE(fs_->Exists("/m"));
}

}  // namespace
}  // namespace savepoint
