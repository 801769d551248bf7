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

#include "savepoint/export.h"
#include "savepoint/manager.h"
#include "savepoint/status.h"

namespace savepoint {

// What is trained. The runner calls these from Train's thread.
class SAVEPOINT_API Job {
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
class SAVEPOINT_API MetadataHandler {
 public:
  virtual ~MetadataHandler() = default;
  // The epoch to resume from: `user_epoch` if given, else the last one the handler recorded.
  // nullopt = the handler has no opinion: the runner resumes from the newest epoch-end checkpoint
  // in the manager's directory, or starts fresh when there is none (to always start fresh, set
  // JobRunnerOptions::resume = false). Default: user_epoch (so a handler that only wants Report
  // statistics leaves resuming as it is without a handler).
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

struct SAVEPOINT_API JobRunnerOptions {
  // Resume from the checkpoint of this epoch. Default: nullopt = the handler's LastEpoch, or
  // without a handler the newest epoch-end checkpoint in the manager's directory (fresh start if
  // there is none).
  std::optional<int64_t> resume_from_epoch;
  // Resume at all. false = always a fresh start (Init, epoch 0 save); with SeriesRule::kContinue
  // the fresh run's checkpoints then start a new series of names. Default: true.
  bool resume = true;
  // Stop after this epoch even if the job does not say so. 0 = no limit. Default: 0.
  int64_t max_epochs = 0;
  // Step recorded for an epoch's checkpoint: a callable mapping the epoch to the global step.
  // Default: empty = when the job's calls of the manager's hooks advanced its global step since
  // the runner's last save or resume, the epoch ends through CheckpointManager::OnEpochEnd (a save
  // at the hooks' last step, or that step's checkpoint marked as the epoch's end); otherwise the
  // epoch number, or one more than the last saved step if that is larger (so every epoch gets a
  // step of its own, before and after a resume).
  std::function<int64_t(int64_t epoch)> step_of_epoch;
  // A failed or refused epoch save (after the initial one) ends Train with its error. false = it
  // is logged as an error (and counted in failed_saves()) and training goes on, as Caffe2 does.
  // Default: false.
  bool stop_on_save_error = false;
};

class SAVEPOINT_API JobRunner {
 public:
  // `job` and `manager` are required; `handler` may be null. None are owned.
  JobRunner(Job* job, CheckpointManager* manager, MetadataHandler* handler = nullptr,
            JobRunnerOptions options = {});

  // Runs the flow above; returns the last epoch run. Errors of the job and of a resume load are
  // returned; a failed or refused epoch save is logged as an error and counted, and training goes
  // on (as Caffe2 does) unless it is the initial save or stop_on_save_error.
  Result<int64_t> Train();
  // Epoch saves that failed or were refused during Train.
  int failed_saves() const { return failed_saves_; }

 private:
  Result<std::optional<int64_t>> ResumeEpoch();
  std::optional<int64_t> NewestEpochEnd();
  Status Resume(int64_t epoch);
  bool HooksAdvanced();
  int64_t StepOfEpoch(int64_t epoch);
  Status SaveEpochAtStep(int64_t epoch, int64_t step);
  Status SaveEpoch(int64_t epoch);
  void ReportSince(std::string_view action, size_t first_stat);

  Job* job_;
  CheckpointManager* manager_;
  MetadataHandler* handler_;
  JobRunnerOptions options_;
  int failed_saves_ = 0;
  std::optional<int64_t> last_step_;  // step of the runner's last save or resume
};

}  // namespace savepoint

#endif  // SAVEPOINT_JOB_RUNNER_H_
