// Child process for manager_crash_test: trains a ToyTrainer with a CheckpointManager (async saves
// every 3 steps, keep 2) and is SIGKILLed by the parent at a random moment.
//
// Usage: manager_trainer DIR TOTAL_STEPS SEED
// Resumes from the latest checkpoint in DIR if there is one, appending "resumed STEP" (or
// "fresh") to DIR/../trainer.log first; runs until TOTAL_STEPS, then OnTrainEnd and exits 0.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "helpers/toy_trainer.h"

int main(int argc, char** argv) {
  using namespace savepoint;
  if (argc != 4) {
    std::fprintf(stderr, "usage: manager_trainer DIR TOTAL_STEPS SEED\n");
    return 2;
  }
  const std::string dir = argv[1];
  const int64_t total = std::strtoll(argv[2], nullptr, 10);
  testing::ToyTrainer trainer(std::strtoull(argv[3], nullptr, 10));
  ManagerOptions o;
  o.naming.directory = dir;
  o.save_policy.interval_steps = 3;
  o.retention.keep_last_n = 2;
  o.async_save.enabled = true;
  o.async_save.checkpointer.staging_bytes = 1 << 20;
  o.async_save.checkpointer.slab_bytes = 64 << 10;
  auto opened = CheckpointManager::Open(o);
  Status s = opened.status();
  if (s.ok()) s = trainer.Register(**opened);
  std::string note = "fresh";
  if (s.ok() && (*opened)->LatestStep()) {
    Result<CheckpointRecord> rec = (*opened)->RestoreRegistered();
    s = rec.status();
    if (s.ok()) note = "resumed " + std::to_string(rec->step);
  }
  if (s.ok()) {
    FILE* log = std::fopen((Dirname(dir) + "/trainer.log").c_str(), "a");
    std::fprintf(log, "%s\n", note.c_str());
    std::fclose(log);
  }
  while (s.ok() && trainer.step() < total) {
    trainer.Step();
    s = (*opened)->OnStepEnd(trainer.step(), trainer.epoch(), {{"step", trainer.step()}});
  }
  if (s.ok()) s = (*opened)->OnTrainEnd();
  if (!s.ok()) {
    std::fprintf(stderr, "manager_trainer: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
