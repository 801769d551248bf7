// JobRunner: epoch-level training with checkpoints (after Caffe2's JobRunner).
//
//   init (fresh start only) -> [resume: load the checkpoint of the latest or a given epoch,
//   skipping init] -> save epoch 0 (fresh start only) -> run epochs until the job says stop,
//   saving after each -> exit
//
// The runner saves the manager's registered objects (CheckpointManager::SaveRegistered with
// epoch_end) and restores them (RestoreRegistered). An optional MetadataHandler decides which
// epoch to resume from, learns about each saved epoch, can veto saving while storage is not
// accessible, and receives the statistics of every checkpoint action.
//
// Thread safety: a JobRunner runs on the calling thread; Train is not reentrant.
#ifndef SAVEPOINT_JOB_RUNNER_H_
#define SAVEPOINT_JOB_RUNNER_H_

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "savepoint/manager.h"
#include "savepoint/status.h"

namespace savepoint {

// What is trained. The runner calls these from Train's thread.
class Job {
 public:
  virtual ~Job() = default;
  // Initialises a fresh run (not called when resuming).
  virtual Status Init() = 0;
  // Runs one epoch (1-based); returns true when training should stop after it.
  virtual Result<bool> RunEpoch(int64_t epoch) = 0;
  // Runs once after the last epoch. Default: nothing.
  virtual Status Exit() { return Status::OK(); }
};

// Where checkpoint metadata lives (e.g. a database of runs). Every method has a default.
class MetadataHandler {
 public:
  virtual ~MetadataHandler() = default;
  // The epoch to resume from: `user_epoch` if given, else the last recorded one; nullopt for a
  // fresh start. Default: user_epoch.
  virtual std::optional<int64_t> LastEpoch(std::optional<int64_t> user_epoch) { return user_epoch; }
  // Records that the checkpoint of `epoch` is committed. Default: nothing.
  virtual Status Write(int64_t epoch) {
    (void)epoch;
    return Status::OK();
  }
  // Whether checkpoint storage is accessible (for `epoch`, or at all when nullopt); when false
  // the runner skips the save and logs a warning. Default: true.
  virtual bool CpAccessible(std::optional<int64_t> epoch) {
    (void)epoch;
    return true;
  }
  // Statistics of the checkpoint actions of one runner step ("checkpoint_save",
  // "checkpoint_load"). Default: nothing.
  virtual void Report(std::string_view action, const std::vector<CheckpointStats>& stats) {
    (void)action;
    (void)stats;
  }
};

struct JobRunnerOptions {
  // Resume from the checkpoint of this epoch. Default: nullopt = the handler's LastEpoch, or
  // without a handler the newest epoch-end checkpoint in the manager's directory (fresh start if
  // there is none).
  std::optional<int64_t> resume_from_epoch;
  // Stop after this epoch even if the job does not say so. 0 = no limit. Default: 0.
  int64_t max_epochs = 0;
  // Step recorded for an epoch's checkpoint: a callable mapping the epoch to the global step.
  // Default: empty = the manager's global_step() (as advanced by its hooks), or the epoch number
  // when no hook ran.
  std::function<int64_t(int64_t epoch)> step_of_epoch;
};

class JobRunner {
 public:
  // `job` and `manager` are required; `handler` may be null. None are owned.
  JobRunner(Job* job, CheckpointManager* manager, MetadataHandler* handler = nullptr,
            JobRunnerOptions options = {});

  // Runs the flow above; returns the last epoch run. Errors of the job and of a resume load are
  // returned; a failed save is logged and training goes on (as Caffe2 does), unless it is the
  // initial save.
  Result<int64_t> Train();

 private:
  Result<std::optional<int64_t>> ResumeEpoch();
  Status Resume(int64_t epoch);
  Status SaveEpoch(int64_t epoch);
  void ReportSince(std::string_view action, size_t first_stat);

  Job* job_;
  CheckpointManager* manager_;
  MetadataHandler* handler_;
  JobRunnerOptions options_;
};

}  // namespace savepoint

#endif  // SAVEPOINT_JOB_RUNNER_H_
