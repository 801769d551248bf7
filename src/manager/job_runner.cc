// JobRunner: init / resume -> epochs -> exit, saving after each epoch (savepoint/job_runner.h).
#include "savepoint/job_runner.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace savepoint {

JobRunner::JobRunner(Job* job, CheckpointManager* manager, MetadataHandler* handler,
                     JobRunnerOptions options)
    : job_(job), manager_(manager), handler_(handler), options_(std::move(options)) {}

Result<std::optional<int64_t>> JobRunner::ResumeEpoch() {
  if (handler_ != nullptr) return handler_->LastEpoch(options_.resume_from_epoch);
  if (options_.resume_from_epoch) return options_.resume_from_epoch;
  std::vector<CheckpointRecord> all = manager_->All();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->epoch_end) return std::optional<int64_t>(it->epoch);
  }
  return std::optional<int64_t>();
}

Status JobRunner::Resume(int64_t epoch) {
  std::vector<CheckpointRecord> all = manager_->All();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (!it->epoch_end || it->epoch != epoch) continue;
    size_t first = manager_->stats().size();
    SP_RETURN_IF_ERROR(manager_->RestoreRegistered(Which::Name(it->name)).status());
    ReportSince("checkpoint_load", first);
    spdlog::info("savepoint: resumed from epoch {} ({})", epoch, it->path);
    return Status::OK();
  }
  return NotFoundError(fmt::format("resume from epoch {}: no epoch-end checkpoint of it in {}",
                                   epoch, manager_->directory()));
}

Status JobRunner::SaveEpoch(int64_t epoch) {
  if (handler_ != nullptr && !handler_->CpAccessible(std::nullopt)) {
    spdlog::warn("savepoint: checkpoint storage is not accessible: epoch {} not saved", epoch);
    return Status::OK();
  }
  size_t first = manager_->stats().size();
  SaveArgs args;
  args.force = true;
  args.epoch_end = true;
  args.epoch = epoch;
  int64_t step = options_.step_of_epoch ? options_.step_of_epoch(epoch) : manager_->global_step();
  if (!options_.step_of_epoch && step == 0) step = epoch;
  args.step_in_epoch = 0;
  SP_RETURN_IF_ERROR(manager_->SaveRegistered(step, args).status());
  SP_RETURN_IF_ERROR(manager_->Wait());
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
      spdlog::warn("savepoint: could not save epoch {}: {}", epoch, s.ToString());
    }
    if (stop || (options_.max_epochs > 0 && epoch >= options_.max_epochs)) break;
  }
  SP_RETURN_IF_ERROR(job_->Exit());
  return epoch;
}

}  // namespace savepoint
