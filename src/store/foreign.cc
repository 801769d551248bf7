// The read-only stores: a PyTorch DCP directory (savepoint/dcp.h) and a RecIS checkpoint
// directory (savepoint/recis.h). Their readers decode the whole directory into memory, so these
// stores read it at open; Read then selects from what was read.
#include <fmt/format.h>

#include <chrono>
#include <memory>

#include "savepoint/dcp.h"
#include "savepoint/recis.h"
#include "store/formats.h"

namespace savepoint::store {
namespace {

class WholeReader final : public Reader {
 public:
  WholeReader(Format format, std::string path, State state, std::vector<std::string> notes,
              LoadStats stats, LoadStats* stats_out)
      : format_(format),
        path_(std::move(path)),
        state_(std::make_shared<const State>(std::move(state))),
        entries_(EntriesOf(*state_)),
        notes_(std::move(notes)),
        stats_(stats),
        stats_out_(stats_out) {}

  Format format() const override { return format_; }
  const std::string& path() const override { return path_; }
  Result<std::vector<Entry>> Entries() override { return entries_; }
  std::vector<std::string> notes() const override { return notes_; }

  Result<State> Read(const std::vector<std::string>& names) override {
    if (stats_out_ != nullptr) *stats_out_ = stats_;  // (the reading was done at open)
    return Select(state_, names, fmt::format("{} checkpoint {}", FormatName(format_), path_));
  }

  // Every tensor was read and decoded at open; these formats carry no checksums.
  Status Verify(LoadStats* stats) override {
    if (stats != nullptr) *stats = stats_;
    return Status::OK();
  }

 private:
  const Format format_;
  const std::string path_;
  const std::shared_ptr<const State> state_;
  const std::vector<Entry> entries_;
  const std::vector<std::string> notes_;
  const LoadStats stats_;
  LoadStats* const stats_out_;  // LoadOptions::stats
};

// The stats of reading `state` whole since `t0`.
LoadStats WholeStats(const State& state, std::chrono::steady_clock::time_point t0) {
  LoadStats s;
  s.bytes = s.stored_bytes = state.tensor_bytes();
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s;
}

}  // namespace

Result<std::unique_ptr<Reader>> OpenDcp(const std::string& path, const LoadOptions& options,
                                        const IoOptions& io) {
  const auto t0 = std::chrono::steady_clock::now();
  SP_ASSIGN_OR_RETURN(State state, LoadDcpCheckpoint(path, {.progress = options.progress}, io));
  const LoadStats stats = WholeStats(state, t0);
  return std::unique_ptr<Reader>(std::make_unique<WholeReader>(
      Format::kDcp, path, std::move(state), std::vector<std::string>{}, stats, options.stats));
}

Result<std::unique_ptr<Reader>> OpenRecis(const std::string& path, const LoadOptions& options,
                                          const IoOptions& io) {
  const auto t0 = std::chrono::steady_clock::now();
  SP_ASSIGN_OR_RETURN(RecisCheckpoint r,
                      LoadRecisCheckpoint(path, {.progress = options.progress}, io));
  std::vector<std::string> notes;
  if (r.path != path) notes.push_back(fmt::format("read {} (the newest listed)", r.path));
  for (const std::string& s : r.skipped) notes.push_back("skipped " + s);
  const LoadStats stats = WholeStats(r.state, t0);
  return std::unique_ptr<Reader>(std::make_unique<WholeReader>(
      Format::kRecis, path, std::move(r.state), std::move(notes), stats, options.stats));
}

}  // namespace savepoint::store
