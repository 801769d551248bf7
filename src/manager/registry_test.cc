// The registry's load (manager/registry.h) against a checkpoint's manager metadata, which is read
// from a file: the shard count of an io_state object is checked when recorded, and a record with
// members of the wrong type is Corruption naming them, never an exception.
#include "manager/registry.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "manager/options.h"
#include "testutil/testutil.h"

namespace savepoint {
namespace {

using ::savepoint::testing::StatusIs;

// A data loader's position: one F32 [2] tensor "pos".
struct Position : Stateful {
  std::vector<float> pos = std::vector<float>(2, 0.0f);
  Status SaveState(State& out) override {
    return out.PutView("pos", TensorView(pos.data(), DType::kF32, {2}));
  }
  Status LoadState(const State&) override { return Status::OK(); }
};

class RegistryTest : public ::testing::Test {
 protected:
  void SetUp() override { SP_ASSERT_OK(registry_.Add("loader", &loader_, Category::kIoState)); }

  // Loads a checkpoint holding shard 1's "loader" entry, with `meta` as its metadata.
  Status LoadWith(const Json& meta) {
    State s;
    SP_RETURN_IF_ERROR(s.Put("loader.shard-1.pos", Tensor::Zeros(DType::kF32, {2}).value()));
    s.metadata() = meta;
    std::unique_ptr<manager::EntrySource> source = manager::SourceOf(std::move(s), "/ck");
    return registry_.Load(*source, {});
  }

  Position loader_;
  manager::Registry registry_{/*shard_id=*/1, /*num_shards=*/2};
};

Json ManagerMeta(const Json& record) { return Json{{manager::kMetaKey, record}}; }

TEST_F(RegistryTest, SavedShardCountIsChecked) {
  SP_ASSERT_OK_AND_ASSIGN(manager::Gathered g, registry_.Gather());
  SP_EXPECT_OK(LoadWith(g.state.metadata()));
  SP_EXPECT_OK(LoadWith(ManagerMeta({{"objects", {{"loader", {{"num_shards", 2}}}}}})));
  EXPECT_THAT(LoadWith(ManagerMeta({{"objects", {{"loader", {{"num_shards", 3}}}}}})),
              StatusIs(StatusCode::kInvalidArgument, "saved with 3 shards, this run has 2"));
}

// value() on members of the wrong type threw nlohmann's type_error out of the load.
TEST_F(RegistryTest, ManagerMetadataOfTheWrongTypeIsCorruption) {
  // Not the manager's record (as for the index): nothing to check, the entries load.
  for (const Json& meta : {Json(), Json::array(), Json("x"), ManagerMeta(Json::array()),
                           ManagerMeta(7), ManagerMeta(Json::object())}) {
    SCOPED_TRACE(meta.dump());
    SP_EXPECT_OK(LoadWith(meta));
  }
  const std::pair<Json, std::string> cases[] = {
      {ManagerMeta({{"objects", 5}}), "savepoint.manager.objects is not an object"},
      {ManagerMeta({{"objects", Json::array({1})}}), "savepoint.manager.objects is not an object"},
      {ManagerMeta({{"objects", {{"loader", "x"}}}}),
       "savepoint.manager.objects.loader is not an object"},
      {ManagerMeta({{"objects", {{"loader", {{"num_shards", "2"}}}}}}),
       "savepoint.manager.objects.loader.num_shards is not an integer"},
      {ManagerMeta({{"objects", {{"loader", {{"num_shards", 2.0}}}}}}),
       "savepoint.manager.objects.loader.num_shards is not an integer"}};
  for (const auto& [meta, message] : cases) {
    EXPECT_THAT(LoadWith(meta),
                StatusIs(StatusCode::kCorruption,
                         "load \"loader\" (io_state) from /ck: metadata " + message))
        << meta.dump();
  }
}

}  // namespace
}  // namespace savepoint
