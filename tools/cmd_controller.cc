// `savepoint controller --world N --dir DIR [--listen HOST:PORT] [--prefix P] [--naming N]
// [--heartbeat-ms MS] [--heartbeat-timeout-ms MS] [--snapshot-dir DIR [--snapshot-every N]]
// [--max-restarts N] [--port-file FILE] [--json]`: watches the ranks
// of one training job and, when one fails, has the survivors dump the last consistent step
// (docs/FAILOVER.md); with --max-restarts it then serves the launcher's restarted job, up to N
// times. The job token comes from SAVEPOINT_JOB_TOKEN (never the command line, which other users
// can read); the address defaults to SAVEPOINT_CONTROLLER. Each generation's outcome is printed
// as it ends (--json: one JSON object per line). Exits when the job is over: 0 when every rank
// finished or the last failure's dump (or a preemption checkpoint) was committed, 1 when no dump
// was allowed (the reason is printed).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "commands.h"
#include "common.h"
#include "savepoint/failover_rpc.h"

namespace savepoint::cli {
namespace {

constexpr char kCommand[] = "controller";

struct ControllerArgs {
  ControllerOptions options;
  std::string naming = "manager";
  int64_t heartbeat_ms = 100;
  int64_t timeout_ms = 1000;
  std::string port_file;
  bool json = false;
};

Json OutcomeJson(const JobOutcome& o) {
  return Json{
      {"generation", o.generation},
      {"failure", o.failure},
      {"preempted", o.preempted},
      {"preempted_by", o.preempted_by},
      {"failed_rank", o.failed_rank},
      {"reason", o.reason},
      {"dead", o.dead},
      {"dumped", o.dumped},
      {"dump_path", o.dump_path},
      {"dump_step", o.dump_step},
      {"writers", o.writers},
      {"snapshot_writers", o.snapshot_writers},
      {"why_no_dump", (o.failure || o.preempted) && !o.dumped ? o.dump_status.ToString() : ""},
      {"detected_unix_ns", o.detected_unix_ns},
      {"detect_to_commit_ms", o.detect_to_commit_ms},
      {"refused_calls", o.refused_calls},
      {"late_messages", o.late_messages}};
}

void PrintOutcome(const JobOutcome& o) {
  if (o.preempted && !o.failure) {
    fmt::print(stderr, "savepoint controller: generation {}: preempted ({}); {}\n", o.generation,
               o.reason,
               o.dumped ? fmt::format("checkpoint of step {} committed at {} in {:.0f} ms",
                                      o.dump_step, o.dump_path, o.detect_to_commit_ms)
                        : o.dump_status.message());
  } else if (!o.failure) {
    fmt::print(stderr, "savepoint controller: every rank finished\n");
  } else if (o.dumped) {
    fmt::print(stderr,
               "savepoint controller: rank {} failed ({}); dump of step {} committed at {} in "
               "{:.0f} ms{}\n",
               o.failed_rank, o.reason, o.dump_step, o.dump_path, o.detect_to_commit_ms,
               o.snapshot_writers.empty()
                   ? ""
                   : fmt::format(" (ranks {} from their snapshots)", o.snapshot_writers));
  } else {
    fmt::print(stderr, "savepoint controller: rank {} failed ({}); {}\n", o.failed_rank, o.reason,
               o.dump_status.message());
  }
}

int RunController(ControllerArgs& a) {
  const char* token = std::getenv("SAVEPOINT_JOB_TOKEN");
  a.options.token = token != nullptr ? token : "";
  if (a.options.listen.empty()) {
    const char* env = std::getenv("SAVEPOINT_CONTROLLER");
    a.options.listen = env != nullptr ? env : "127.0.0.1:0";
  }
  a.options.naming = a.naming == "mindspore"        ? DumpNaming::kMindSpore
                     : a.naming == "mindspore-ckpt" ? DumpNaming::kMindSporeCkpt
                                                    : DumpNaming::kManager;
  a.options.heartbeat_interval = std::chrono::milliseconds(a.heartbeat_ms);
  a.options.heartbeat_timeout = std::chrono::milliseconds(a.timeout_ms);
  const bool json = a.json;
  a.options.on_generation_end = [json](const JobOutcome& o) {
    if (json) PrintJson(OutcomeJson(o));
    PrintOutcome(o);
  };
  Result<std::unique_ptr<FailoverController>> c = FailoverController::Start(a.options);
  if (!c.ok()) return Fail(kCommand, c.status());
  fmt::print(stderr, "savepoint controller: listening on port {} for {} ranks\n", (*c)->port(),
             a.options.world);
  if (!a.port_file.empty()) {
    std::ofstream(a.port_file + ".tmp") << (*c)->port() << "\n";
    std::rename((a.port_file + ".tmp").c_str(), a.port_file.c_str());
  }
  Result<JobOutcome> out = (*c)->Wait();
  if (!out.ok()) return Fail(kCommand, out.status());
  return (out->failure || out->preempted) && !out->dumped ? kExitError : kExitOk;
}

}  // namespace

void RegisterController(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<ControllerArgs>();
  args->options.listen.clear();
  CLI::App* sub = app.add_subcommand(
      kCommand, "Watch a training job's ranks; on a failure, dump the last consistent step");
  sub->add_option("--world", args->options.world, "Number of ranks")->required();
  sub->add_option("--dir", args->options.directory,
                  "Where dumps go (the manager directory, or an s3:// bucket prefix)")
      ->required();
  sub->add_option("--listen", args->options.listen,
                  "HOST:PORT to listen on (default: $SAVEPOINT_CONTROLLER, else 127.0.0.1:0)");
  sub->add_option("--prefix", args->options.prefix, "Name prefix of dumps")->capture_default_str();
  sub->add_option("--naming", args->naming,
                  "manager: {prefix}-{epoch}_{step}_failover; mindspore: "
                  "tft_saved_checkpoints-step_{step} (native checkpoint); mindspore-ckpt: "
                  "tft_saved_checkpoints-step_{step}/rank_{r}/ttp_rank_{r}-{epoch}_{step}.ckpt "
                  "for every rank (MindSpore .ckpt files)")
      ->check(CLI::IsMember({"manager", "mindspore", "mindspore-ckpt"}))
      ->capture_default_str();
  sub->add_option("--heartbeat-ms", args->heartbeat_ms, "Heartbeat interval of the agents")
      ->check(CLI::Range(int64_t{1}, int64_t{60000}))
      ->capture_default_str();
  sub->add_option("--heartbeat-timeout-ms", args->timeout_ms,
                  "Declare a rank dead after this long without a heartbeat")
      ->check(CLI::Range(int64_t{2}, int64_t{600000}))
      ->capture_default_str();
  sub->add_option("--snapshot-dir", args->options.snapshot_dir,
                  "Have the ranks on this host keep snapshots in this memory-backed directory "
                  "(e.g. /dev/shm), so that a rank without a live replica can still be dumped");
  sub->add_option("--snapshot-every", args->options.snapshot_every,
                  "Steps between two snapshots of a rank")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  sub->add_option("--max-restarts", args->options.max_restarts,
                  "Serve the launcher's restarted job after a failure, up to N times (as "
                  "torchrun's --max-restarts)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  sub->add_option("--port-file", args->port_file, "Write the port listened on to this file");
  sub->add_flag("--json", args->json, "Print the outcome as one JSON object");
  sub->callback([args, exit_code] {
    *exit_code = RunGuarded(kCommand, [&] { return RunController(*args); });
  });
}

}  // namespace savepoint::cli
