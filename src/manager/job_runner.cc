// JobRunner: init / resume -> epochs -> exit, saving after each epoch (savepoint/job_runner.h).
#include "savepoint/job_runner.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

namespace savepoint {

JobRunner::JobRunner(Job* job, CheckpointManager* manager, MetadataHandler* handler,
                     JobRunnerOptions options)
    : job_(job), manager_(manager), handler_(handler), options_(std::move(options)) {}

Result<std::optional<int64_t>> JobRunner::ResumeEpoch() {
  if (!options_.resume) return std::optional<int64_t>();
  if (handler_ != nullptr) {
    if (std::optional<int64_t> e = handler_->LastEpoch(options_.resume_from_epoch)) return e;
  }
  if (options_.resume_from_epoch) return options_.resume_from_epoch;
  return NewestEpochEnd();
}

std::optional<int64_t> JobRunner::NewestEpochEnd() {
  std::vector<CheckpointRecord> all = manager_->All();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->epoch_end) return it->epoch;
  }
  return std::nullopt;
}

Status JobRunner::Resume(int64_t epoch) {
  std::vector<CheckpointRecord> all = manager_->All();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (!it->epoch_end || it->epoch != epoch) continue;
    size_t first = manager_->stats().size();
    SP_RETURN_IF_ERROR(manager_->RestoreRegistered(Which::Name(it->name)).status());
    last_step_ = it->step;
    ReportSince("checkpoint_load", first);
    spdlog::info("savepoint: resumed from epoch {} ({})", epoch, it->path);
    return Status::OK();
  }
  return NotFoundError(fmt::format("resume from epoch {}: no epoch-end checkpoint of it in {}",
                                   epoch, manager_->directory()));
}

bool JobRunner::HooksAdvanced() {
  return !options_.step_of_epoch && manager_->global_step() > last_step_.value_or(0);
}

int64_t JobRunner::StepOfEpoch(int64_t epoch) {
  if (options_.step_of_epoch) return options_.step_of_epoch(epoch);
  return last_step_ ? std::max(epoch, *last_step_ + 1) : epoch;
}

Status JobRunner::SaveEpochAtStep(int64_t epoch, int64_t step) {
  SaveArgs args;
  args.force = true;
  args.epoch_end = true;
  args.epoch = epoch;
  args.step_in_epoch = 0;
  SP_ASSIGN_OR_RETURN(bool saved, manager_->SaveRegistered(step, args));
  if (saved) return Status::OK();
  return FailedPreconditionError(
      fmt::format("the checkpoint manager refused to save epoch {} as step {}: that step was "
                  "saved already (JobRunnerOptions::step_of_epoch must give each epoch its own "
                  "step)",
                  epoch, step));
}

Status JobRunner::SaveEpoch(int64_t epoch) {
  if (handler_ != nullptr && !handler_->CpAccessible(std::nullopt)) {
    spdlog::warn("savepoint: checkpoint storage is not accessible: epoch {} not saved", epoch);
    return Status::OK();
  }
  size_t first = manager_->stats().size();
  int64_t step = 0;
  if (HooksAdvanced()) {
    // The job drives the manager's hooks: save at their last step, or mark the checkpoint a hook
    // just saved there as this epoch's end.
    SP_RETURN_IF_ERROR(manager_->OnEpochEnd(epoch));
    step = manager_->global_step();
  } else {
    step = StepOfEpoch(epoch);
    SP_RETURN_IF_ERROR(SaveEpochAtStep(epoch, step));
  }
  SP_RETURN_IF_ERROR(manager_->Wait());
  last_step_ = step;
  if (handler_ != nullptr) SP_RETURN_IF_ERROR(handler_->Write(epoch));
  ReportSince("checkpoint_save", first);
  return Status::OK();
}

void JobRunner::ReportSince(std::string_view action, size_t first_stat) {
  if (handler_ == nullptr) return;
  std::vector<CheckpointStats> all = manager_->stats();
  std::vector<CheckpointStats> mine;
  for (size_t i = first_stat; i < all.size(); ++i) {
    if (all[i].action == action) mine.push_back(all[i]);
  }
  handler_->Report(action, mine);
}

Result<int64_t> JobRunner::Train() {
  SP_ASSIGN_OR_RETURN(std::optional<int64_t> resume, ResumeEpoch());
  if (resume) {
    SP_RETURN_IF_ERROR(Resume(*resume));
  } else {
    SP_RETURN_IF_ERROR(job_->Init());
    SP_RETURN_IF_ERROR(SaveEpoch(0).WithContext("initial checkpoint (epoch 0)"));
  }
  int64_t epoch = resume ? *resume + 1 : 1;
  for (;; ++epoch) {
    SP_ASSIGN_OR_RETURN(bool stop, job_->RunEpoch(epoch));
    if (Status s = SaveEpoch(epoch); !s.ok()) {
      ++failed_saves_;
      spdlog::error("savepoint: JobRunner: epoch {} was NOT checkpointed: {}", epoch, s.ToString());
      if (options_.stop_on_save_error) return s.WithContext(fmt::format("save epoch {}", epoch));
    }
    if (stop || (options_.max_epochs > 0 && epoch >= options_.max_epochs)) break;
  }
  SP_RETURN_IF_ERROR(job_->Exit());
  return epoch;
}

}  // namespace savepoint
