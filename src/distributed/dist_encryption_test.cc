// Encrypted multi-rank checkpoints (docs/FORMAT.md §10, docs/DISTRIBUTED.md) under the thread
// communicator: saved by 3 ranks (row-split, column-split and replicated tensors), read back whole
// by Load, into another layout by LoadDistributed and through a merge; every chunk's nonce unique
// across the ranks' files; ranks that disagree about the key are refused before anything is
// committed.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <utility>

#include "engine/box.h"
#include "engine/encryption_testutil.h"
#include "io/mem_fs.h"
#include "savepoint/distributed.h"
#include "testutil/ranks.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

using testing::EncLoad;
using testing::EncSave;
using testing::Has;
using testing::kKeyA;
using testing::kKeyB;
using testing::OnRanks;

constexpr int kRanks = 3;

// Global tensors: "w" split by rows over the ranks, "e" by columns, "b" replicated everywhere.
struct Global {
  std::map<std::string, Tensor> tensors;
  Global() {
    tensors.emplace("w", Tensor::Empty(DType::kF32, {37, 300}).value());  // ~44 KiB per rank
    tensors.emplace("e", Tensor::Empty(DType::kU8, {100, 3000}).value());
    tensors.emplace("b", Tensor::Empty(DType::kBF16, {40}).value());
    uint64_t seed = 1;
    for (auto& [name, t] : tensors) testing::FillPattern(t.view(), seed++);
  }
  ShardLayout Layout(int rank, int world) const {
    return {{"w", SplitDim(tensors.at("w").shape(), 0, world, rank).value()},
            {"e", SplitDim(tensors.at("e").shape(), 1, world, rank).value()}};
  }
  // A copy of the box `spec` of tensor `name`.
  Tensor Box(const std::string& name, const ShardSpec& spec) const {
    const Tensor& g = tensors.at(name);
    Tensor t = Tensor::Empty(g.dtype(), spec.sizes).value();
    engine::CopyRegion({g.data(), g.shape(), spec.offsets, 0},
                       {t.data(), t.shape(), Shape(spec.sizes.size(), 0), 0}, spec.sizes,
                       DTypeSize(g.dtype()));
    return t;
  }
  State Local(const ShardLayout& layout) const {
    State s;
    for (const auto& [name, g] : tensors) {
      auto it = layout.find(name);
      EXPECT_TRUE(
          s.Put(name, it == layout.end() ? Tensor::CopyOf(g.view()).value() : Box(name, it->second))
              .ok());
    }
    EXPECT_TRUE(s.PutValue("step", int64_t{7}).ok());
    return s;
  }
};

// Saves `g` with kRanks ranks; rank r's save options come from `options(r)`.
std::vector<Status> SaveAll(const Global& g, const std::string& path, const IoOptions& io,
                            const std::function<SaveOptions(int)>& options) {
  std::vector<State> locals;
  for (int r = 0; r < kRanks; ++r) locals.push_back(g.Local(g.Layout(r, kRanks)));
  return OnRanks(kRanks, [&](Communicator& c) {
    DistributedSaveOptions o;
    o.save = options(c.rank());
    o.save.chunk_bytes = 16 << 10;  // several chunks per shard
    return SaveDistributed(c, locals[c.rank()], g.Layout(c.rank(), kRanks), path, o, io);
  });
}

void ExpectWhole(const State& s, const Global& g) {
  for (const auto& [name, t] : g.tensors) {
    const TensorView* v = s.FindTensor(name);
    ASSERT_NE(v, nullptr) << name;
    ASSERT_EQ(v->shape(), t.shape()) << name;
    EXPECT_EQ(0, std::memcmp(v->data(), t.data(), t.nbytes())) << name;
  }
}

class DistributedEncryptionVersions : public ::testing::TestWithParam<uint32_t> {};

// Format version 2 (the JSON manifest) and 3 (the indexed one, its sections written from the
// coordinator's merged plan with the ranks' tags).
TEST_P(DistributedEncryptionVersions, SaveAndLoadIntoAnyLayout) {
  MemFileSystem fs;
  const IoOptions io{.fs = &fs, .io_threads = 2, .direct_io = false};
  const Global g;
  const auto options = [](int) {
    SaveOptions o = EncSave(kKeyA);
    o.format_version = GetParam();
    return o;
  };
  for (const Status& s : SaveAll(g, "/ckpt", io, options)) {
    SP_ASSERT_OK(s);
  }
  EXPECT_EQ(testing::ReadManifest(&fs, "/ckpt").version, GetParam());
  Result<State> whole = Load("/ckpt", EncLoad(kKeyA), io);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  ExpectWhole(*whole, g);
  SP_EXPECT_OK(VerifyCheckpoint("/ckpt", EncLoad(kKeyA), io));

  // Every rank wrote a file of its own; no two chunks share a nonce (file, offset).
  format::Manifest m = testing::ReadManifest(&fs, "/ckpt");
  EXPECT_TRUE(m.encryption.enabled);
  EXPECT_EQ(m.files.size(), size_t{kRanks});
  std::set<std::pair<uint32_t, uint64_t>> nonces;
  size_t chunks = 0;
  for (const auto& t : m.tensors) {
    for (const auto& s : t.shards) {
      ASSERT_EQ(s.tags.size(), s.crc32c.size()) << t.name;
      for (uint64_t c = 0; c < s.crc32c.size(); ++c) {
        nonces.emplace(s.file, format::ChunkOffset(s, c, m.chunk_bytes));
        ++chunks;
      }
    }
  }
  EXPECT_EQ(nonces.size(), chunks);
  EXPECT_GT(chunks, size_t{kRanks});

  // Into a 2-rank layout (columns of "w", rows of "e").
  for (int r = 0; r < 2; ++r) {
    ShardLayout two = {{"w", SplitDim(g.tensors.at("w").shape(), 1, 2, r).value()},
                       {"e", SplitDim(g.tensors.at("e").shape(), 0, 2, r).value()}};
    Result<State> part = LoadDistributedAlloc("/ckpt", two, EncLoad(kKeyA), io);
    ASSERT_TRUE(part.ok()) << part.status().ToString();
    for (const auto& [name, spec] : two) {
      Tensor expect = g.Box(name, spec);
      EXPECT_EQ(0, std::memcmp(part->FindTensor(name)->data(), expect.data(), expect.nbytes()))
          << name << " rank " << r;
    }
    Status s = LoadDistributedAlloc("/ckpt", two, {}, io).status();
    EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
    EXPECT_TRUE(Has(s, "is encrypted: pass LoadOptions::key")) << s.ToString();
    s = LoadDistributedAlloc("/ckpt", two, EncLoad(kKeyB), io).status();
    EXPECT_THAT(s, StatusIs(StatusCode::kUnauthenticated));
  }
  // Reading the plan needs no key (the manifest only).
  Result<ReadPlanSummary> plan = PlanDistributedLoad("/ckpt", g.Layout(0, kRanks), &fs);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();

  // Merged into one file, re-encrypted under another key.
  MergeOptions mo;
  mo.load = EncLoad(kKeyA);
  mo.save = EncSave(kKeyB);
  SP_ASSERT_OK(MergeCheckpoint("/ckpt", "/merged", mo, io));
  whole = Load("/merged", EncLoad(kKeyB), io);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  ExpectWhole(*whole, g);
  EXPECT_EQ(testing::ReadManifest(&fs, "/merged").files.size(), 1u);
}

INSTANTIATE_TEST_SUITE_P(Versions, DistributedEncryptionVersions, ::testing::Values(2u, 3u));

TEST(DistributedEncryption, RanksMustAgreeOnTheKey) {
  MemFileSystem fs;
  const IoOptions io{.fs = &fs, .io_threads = 2, .direct_io = false};
  const Global g;
  auto expect_refused = [&](const std::vector<Status>& st, std::string_view what) {
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_THAT(st[r], StatusIs(StatusCode::kInvalidArgument)) << r << ": " << st[r].ToString();
      EXPECT_TRUE(Has(st[r], "SaveOptions.key") && Has(st[r], what)) << st[r].ToString();
    }
    EXPECT_FALSE(fs.Exists("/ckpt"));
    EXPECT_EQ(fs.ListDir("/").value().size(), 0u) << "the temporary directory is removed";
  };
  expect_refused(
      SaveAll(g, "/ckpt", io, [](int r) { return r == 1 ? SaveOptions{} : EncSave(kKeyA); }),
      "is set on rank");
  expect_refused(SaveAll(g, "/ckpt", io, [](int r) { return EncSave(r == 2 ? kKeyB : kKeyA); }),
                 "rank 2: SaveOptions.key differs from rank 0's");
  // A key that cannot be used fails the save on every rank, naming the rank.
  std::vector<Status> st =
      SaveAll(g, "/ckpt", io, [](int r) { return r == 1 ? EncSave("short") : EncSave(kKeyA); });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_FALSE(st[r].ok()) << r;
    EXPECT_TRUE(Has(st[r], "rank 1")) << st[r].ToString();
  }
  EXPECT_FALSE(fs.Exists("/ckpt"));
}

}  // namespace
}  // namespace savepoint
