// ManagerOptions validation (every invalid combination), policy resolution (MindSpore's
// precedence rules) and checkpoint naming with the prefix conflict rule (manager/options.h).
#include "manager/options.h"

#include <functional>

#include "testutil/testutil.h"

namespace savepoint {
namespace {

using Names = std::vector<std::string>;

ManagerOptions Valid() {
  ManagerOptions o;
  o.naming.directory = "/ckpt";
  return o;
}

struct BadCase {
  const char* what;
  std::function<void(ManagerOptions&)> change;
  StatusCode code;
  const char* message;
};

TEST(ManagerOptions, DefaultsAreValid) { SP_EXPECT_OK(ValidateManagerOptions(Valid())); }

TEST(ManagerOptions, EveryInvalidCombinationIsRejectedClearly) {
  const BadCase cases[] = {
      {"negative steps", [](auto& o) { o.save_policy.interval_steps = -1; },
       StatusCode::kInvalidArgument, "save_policy.interval_steps = -1"},
      {"negative seconds", [](auto& o) { o.save_policy.interval_seconds = -5; },
       StatusCode::kInvalidArgument, "save_policy.interval_seconds = -5"},
      {"negative keep", [](auto& o) { o.retention.keep_last_n = -2; }, StatusCode::kInvalidArgument,
       "keep_last_n = -2"},
      {"negative minutes", [](auto& o) { o.retention.keep_per_n_minutes = -1; },
       StatusCode::kInvalidArgument, "keep_per_n_minutes = -1"},
      {"negative every", [](auto& o) { o.retention.keep_every_n_steps = -3; },
       StatusCode::kInvalidArgument, "keep_every_n_steps = -3"},
      {"negative best", [](auto& o) { o.retention.keep_best_n = -1; }, StatusCode::kInvalidArgument,
       "keep_best_n = -1"},
      {"negative steps per epoch", [](auto& o) { o.save_policy.steps_per_epoch = -1; },
       StatusCode::kInvalidArgument, "steps_per_epoch = -1"},
      {"all zero",
       [](auto& o) {
         o.save_policy.interval_steps = 0;
         o.retention.keep_last_n = 0;
       },
       StatusCode::kInvalidArgument, "are all 0"},
      {"best without metric", [](auto& o) { o.retention.keep_best_n = 2; },
       StatusCode::kInvalidArgument, "retention.keep_best_n = 2 needs retention.best_metric"},
      {"metric without best", [](auto& o) { o.retention.best_metric = "loss"; },
       StatusCode::kInvalidArgument, "keep_best_n is 0"},
      {"no directory", [](auto& o) { o.naming.directory.clear(); }, StatusCode::kInvalidArgument,
       "directory is empty"},
      {"prefix with slash", [](auto& o) { o.naming.prefix = "a/b"; }, StatusCode::kInvalidArgument,
       "contain no '/'"},
      {"empty prefix", [](auto& o) { o.naming.prefix = ""; }, StatusCode::kInvalidArgument,
       "prefix"},
      {"hidden prefix", [](auto& o) { o.naming.prefix = ".x"; }, StatusCode::kInvalidArgument,
       "not start with '.'"},
      {"shard out of range", [](auto& o) { o.shard_id = 2, o.num_shards = 2; },
       StatusCode::kInvalidArgument, "shard_id = 2"},
      {"no shards", [](auto& o) { o.num_shards = 0; }, StatusCode::kInvalidArgument,
       "num_shards = 0"},
      {"io threads", [](auto& o) { o.io.io_threads = 0; }, StatusCode::kInvalidArgument,
       "IoOptions.io_threads = 0"},
      {"append_info item", [](auto& o) { o.storage.append_info = {"random_op"}; },
       StatusCode::kInvalidArgument, "\"random_op\" is not one of"},
      {"append_dict bytes", [](auto& o) { o.storage.append_dict["k"] = Value(Bytes{{1}}); },
       StatusCode::kInvalidArgument, "is a bytes value"},
      {"append_dict reserved", [](auto& o) { o.storage.append_dict["step_num"] = Value(1); },
       StatusCode::kInvalidArgument, "reserved"},
      {"append_dict bad name", [](auto& o) { o.storage.append_dict[""] = Value(1); },
       StatusCode::kInvalidArgument, "append_dict key"},
      {"file_checksum with native", [](auto& o) { o.storage.file_checksum = true; },
       StatusCode::kInvalidArgument, "storage.file_checksum: only with a file format"},
      {"safetensors with a key",
       [](auto& o) {
         o.storage.format = CheckpointFormat::kSafetensors;
         o.storage.key = EncryptionKey::FromBytes(std::string(32, 'k'));
       },
       StatusCode::kInvalidArgument, "safetensors files cannot be encrypted"},
      {"cipher without a key",
       [](auto& o) {
         o.storage.format = CheckpointFormat::kMindSporeCkpt;
         o.storage.cipher = MindSporeCipher::kSm4Cbc;
       },
       StatusCode::kInvalidArgument, "storage.cipher = SM4-CBC: only with format kMindSporeCkpt"},
      {"cipher with native",
       [](auto& o) {
         o.storage.key = EncryptionKey::FromBytes(std::string(32, 'k'));
         o.storage.cipher = MindSporeCipher::kAesCbc;
       },
       StatusCode::kInvalidArgument, "storage.cipher = AES-CBC"},
      {"file format with a staging option",
       [](auto& o) {
         o.storage.format = CheckpointFormat::kMindSporeCkpt;
         o.async_save.enabled = true;
         o.async_save.checkpointer.slab_bytes = 1 << 20;
       },
       StatusCode::kInvalidArgument, "async_save.checkpointer.slab_bytes: applies to native"},
      {"unknown format", [](auto& o) { o.storage.format = static_cast<CheckpointFormat>(7); },
       StatusCode::kInvalidArgument, "format = 7"},
      {"a read-only format", [](auto& o) { o.storage.format = Format::kDcp; },
       StatusCode::kInvalidArgument, "format = 4 (dcp): the manager writes kNative"},
  };
  for (const BadCase& c : cases) {
    ManagerOptions o = Valid();
    c.change(o);
    Status s = ValidateManagerOptions(o);
    EXPECT_EQ(s.code(), c.code) << c.what << ": " << s.ToString();
    EXPECT_NE(s.message().find(c.message), std::string::npos) << c.what << ": " << s.message();
    EXPECT_EQ(CheckpointManager::Open(o).status().code(), c.code) << c.what;
  }
}

TEST(ManagerOptions, PrecedenceRulesOfTheSeed) {
  ManagerOptions o = Valid();
  o.save_policy.interval_steps = 10;
  o.save_policy.interval_seconds = 30;  // ignored: steps win
  o.retention.keep_last_n = 3;
  o.retention.keep_per_n_minutes = 5;  // ignored: keep_last_n wins
  manager::Policy p = manager::ResolvePolicy(o);
  EXPECT_EQ(p.save_steps, 10);
  EXPECT_EQ(p.save_seconds, 0);
  EXPECT_EQ(p.keep_last_n, 3);
  EXPECT_EQ(p.keep_per_minutes, 0);

  o.save_policy.interval_steps = 0;
  o.retention.keep_last_n = 0;
  p = manager::ResolvePolicy(o);
  EXPECT_EQ(p.save_seconds, 30);
  EXPECT_EQ(p.keep_per_minutes, 5);
  EXPECT_EQ(p.keep_last_n, 0);

  o.retention.keep_per_n_minutes = 0;  // neither: keep one
  EXPECT_EQ(manager::ResolvePolicy(o).keep_last_n, 1);
  o.retention.keep_all = true;
  EXPECT_TRUE(manager::ResolvePolicy(o).keep_all);
}

TEST(ManagerNaming, NamesAndPrefixConflictRule) {
  EXPECT_EQ(manager::CheckpointName("ckpt", {150, 2, 50}, false), "ckpt-2_50");
  EXPECT_EQ(manager::CheckpointName("ckpt", {150, 2, 50}, true), "ckpt-2_50_breakpoint");
  using manager::ResolvePrefixConflict;
  EXPECT_EQ(ResolvePrefixConflict("ckpt", {}), "ckpt");
  EXPECT_EQ(ResolvePrefixConflict("ckpt", {"other-1_1", "ckptx-1_1"}), "ckpt");
  EXPECT_EQ(ResolvePrefixConflict("ckpt", {"ckpt-1_1"}), "ckpt_1");
  EXPECT_EQ(ResolvePrefixConflict("ckpt", {"ckpt-1_1", "ckpt_1-2_3"}), "ckpt_2");
  EXPECT_EQ(ResolvePrefixConflict("ckpt", {"ckpt_4-1_1", "ckpt-1_1", "ckpt_x-1"}), "ckpt_5");
}

}  // namespace
}  // namespace savepoint
