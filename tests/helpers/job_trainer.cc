// Child process for manager_crash_test's JobRunner cases: a JobRunner job (a ToyTrainer, 3 steps
// per epoch, no manager hooks) that SIGKILLs itself at the start of a given epoch.
//
// Usage: job_trainer DIR EPOCHS KILL_AT_EPOCH MODE
//   KILL_AT_EPOCH: 0 = never; else raise SIGKILL when that epoch starts (after the previous
//   epoch's checkpoint is committed).
//   MODE: "plain" (no MetadataHandler) or "report" (a handler that only collects Report stats).
// Appends to DIR/../job.log: "fresh" or "resumed E" when training starts, and "done E failed=N"
// at the end (E: the last epoch; N: the runner's failed or refused epoch saves).
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "helpers/toy_trainer.h"

namespace {

using namespace savepoint;

void Log(const std::string& dir, const std::string& line) {
  FILE* log = std::fopen((Dirname(dir) + "/job.log").c_str(), "a");
  std::fprintf(log, "%s\n", line.c_str());
  std::fclose(log);
}

struct ToyJob : Job {
  testing::ToyTrainer trainer{7};  // the seed of manager_crash_test's Reference()
  std::string dir;
  int64_t epochs = 0, kill_at = 0;
  bool started = false;
  Status Init() override {
    Log(dir, "fresh");
    return Status::OK();
  }
  Result<bool> RunEpoch(int64_t epoch) override {
    if (!started && trainer.step() > 0) Log(dir, "resumed " + std::to_string(epoch - 1));
    started = true;
    if (epoch == kill_at) ::raise(SIGKILL);
    for (int i = 0; i < 3; ++i) trainer.Step();
    return epoch >= epochs;
  }
};

struct ReportOnly : MetadataHandler {
  int reports = 0;
  void Report(std::string_view, const std::vector<CheckpointStats>&) override { ++reports; }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: job_trainer DIR EPOCHS KILL_AT_EPOCH plain|report\n");
    return 2;
  }
  ToyJob job;
  job.dir = argv[1];
  job.epochs = std::strtoll(argv[2], nullptr, 10);
  job.kill_at = std::strtoll(argv[3], nullptr, 10);
  ManagerOptions o;
  o.naming.directory = job.dir;
  o.retention.keep_all = true;
  auto m = CheckpointManager::Open(o);
  Status s = m.status();
  if (s.ok()) s = job.trainer.Register(**m);
  ReportOnly handler;
  MetadataHandler* h = std::string(argv[4]) == "report" ? &handler : nullptr;
  JobRunner runner(&job, s.ok() ? m->get() : nullptr, h);
  Result<int64_t> last = s.ok() ? runner.Train() : Result<int64_t>(s);
  if (!last.ok()) {
    std::fprintf(stderr, "job_trainer: %s\n", last.status().ToString().c_str());
    return 1;
  }
  Log(job.dir,
      "done " + std::to_string(*last) + " failed=" + std::to_string(runner.failed_saves()));
  return 0;
}
