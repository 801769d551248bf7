// savepoint_failover_train: one rank of a data-parallel training job protected by failure-time
// checkpoints (docs/FAILOVER.md). Started once per rank by a launcher, next to a
// `savepoint controller`; scripts/demo-failure runs 4 of them, kills one, and resumes.
//
// The model: linear regression (64 weights) trained by SGD with momentum on batches generated
// from the data loader's position (the step), plus gradient noise from an RNG whose state is part
// of the training state. Every rank computes the same global batch, which is what a data-parallel
// all-reduce gives each replica, so all ranks hold identical replicas; the math is single-threaded
// float32 in a fixed order, so runs are bit-reproducible.
//
// Each step: compute the loss and gradient (the state is untouched), then
// agent->BeginUpdate(step), update weights, momentum and RNG, agent->EndUpdate(step). When another
// rank fails, BeginUpdate parks this rank, the controller has one survivor dump the state of the
// last consistent step, and BeginUpdate returns the reason: the rank exits with code 75.
//
// Usage: savepoint_failover_train --dir DIR [--steps 200] [--save-every 50] [--step-ms 10]
//                                 [--log FILE] [--extra-mib 0]
// --extra-mib adds a constant tensor of that size to the state (to time dumps of a larger state).
// Environment: SAVEPOINT_CONTROLLER, SAVEPOINT_JOB_TOKEN, SAVEPOINT_RANK, SAVEPOINT_WORLD_SIZE.
// Resumes from the newest checkpoint of DIR (periodic, saved by rank 0 through CheckpointManager,
// or a failure dump). Appends "step S loss HEX" per step to FILE (HEX: the float's bits, %a).
#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "savepoint/failover_rpc.h"
#include "savepoint/savepoint.h"

namespace {

using savepoint::DType;
using savepoint::Result;
using savepoint::State;
using savepoint::Status;
using savepoint::TensorView;

constexpr int kDim = 64, kBatch = 16;
constexpr int kExitStopped = 75;  // stopped by the controller after another rank failed

struct Args {
  std::string dir;
  int64_t steps = 200;
  int64_t save_every = 50;
  int step_ms = 10;
  std::string log;
  int64_t extra_mib = 0;
};

// The training state: what a checkpoint holds.
struct Trainer {
  std::vector<float> w = std::vector<float>(kDim, 0.0f);
  std::vector<float> momentum = std::vector<float>(kDim, 0.0f);
  int64_t step = 0;            // steps done; also the data loader's position (batch index)
  uint64_t rng = 0x5eed;       // gradient-noise generator (splitmix64 state)
  std::vector<uint8_t> extra;  // --extra-mib: constant bytes, saved like the rest
};

uint64_t SplitMix(uint64_t* s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
float Uniform(uint64_t* s) { return static_cast<float>(SplitMix(s) >> 40) / (1 << 24) - 0.5f; }

// Loss and gradient on batch `index` (the data loader: a pure function of the position).
float LossAndGrad(const Trainer& t, int64_t index, std::vector<float>* grad) {
  uint64_t data = 0xda7a0000ull + static_cast<uint64_t>(index);
  grad->assign(kDim, 0.0f);
  float loss = 0;
  for (int b = 0; b < kBatch; ++b) {
    std::vector<float> x(kDim);
    float y = 0, pred = 0;
    for (int i = 0; i < kDim; ++i) {
      x[i] = Uniform(&data);
      y += x[i] * static_cast<float>((i % 7) - 3);  // the true weights
      pred += x[i] * t.w[i];
    }
    const float err = pred - y;
    loss += err * err / kBatch;
    for (int i = 0; i < kDim; ++i) (*grad)[i] += 2 * err * x[i] / kBatch;
  }
  return loss;
}

void Update(Trainer& t, const std::vector<float>& grad) {
  for (int i = 0; i < kDim; ++i) {
    const float noise = 1e-3f * Uniform(&t.rng);
    t.momentum[i] = 0.9f * t.momentum[i] + grad[i] + noise;
    t.w[i] -= 0.01f * t.momentum[i];
  }
  ++t.step;
}

// The state as views of the trainer (valid while `t` lives and is not being updated).
State StateOf(Trainer& t) {
  State s;
  s.PutView("model.w", TensorView(t.w.data(), DType::kF32, {kDim})).IgnoreError();
  s.PutView("optimizer.momentum", TensorView(t.momentum.data(), DType::kF32, {kDim})).IgnoreError();
  if (!t.extra.empty()) {
    s.PutView("model.extra", TensorView(t.extra.data(), DType::kU8, {int64_t(t.extra.size())}))
        .IgnoreError();
  }
  s.PutValue("train.step", t.step).IgnoreError();
  s.PutValue("loader.position", t.step).IgnoreError();
  s.PutValue("rng.state", static_cast<int64_t>(t.rng)).IgnoreError();
  return s;
}

Status Restore(const State& s, Trainer& t) {
  const TensorView* w = s.FindTensor("model.w");
  const TensorView* m = s.FindTensor("optimizer.momentum");
  if (w == nullptr || m == nullptr || w->nbytes() != kDim * 4 || m->nbytes() != kDim * 4) {
    return savepoint::InvalidArgumentError("checkpoint lacks model.w / optimizer.momentum");
  }
  std::memcpy(t.w.data(), w->data(), kDim * 4);
  std::memcpy(t.momentum.data(), m->data(), kDim * 4);
  t.step = s.FindValue("train.step")->as_int();
  t.rng = static_cast<uint64_t>(s.FindValue("rng.state")->as_int());
  return Status::OK();
}

savepoint::ManagerOptions ManagerOpts(const std::string& dir) {
  savepoint::ManagerOptions o;
  o.naming.directory = dir;
  o.retention.keep_last_n = 3;
  o.save_policy.interval_steps = 0;
  return o;
}

// Every rank restores the newest checkpoint, periodic or dump. The manager's directory lock
// admits one process at a time, so ranks take turns (before the job starts: no saver holds it).
Status ResumeLatest(const std::string& dir, Trainer& t) {
  for (;;) {
    Result<std::unique_ptr<savepoint::CheckpointManager>> m =
        savepoint::CheckpointManager::Open(ManagerOpts(dir));
    if (!m.ok() && m.status().code() == savepoint::StatusCode::kFailedPrecondition) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    if (!m.ok()) return m.status();
    if (!(*m)->Latest()) return (*m)->Close();
    Result<State> s = (*m)->Restore();
    if (!s.ok()) return s.status();
    fmt::print(stderr, "resumed from {} at step {}\n", (*m)->Latest()->name,
               s->FindValue("train.step")->as_int());
    SP_RETURN_IF_ERROR(Restore(*s, t));
    return (*m)->Close();
  }
}

Result<Args> ParseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--dir")
      a.dir = v;
    else if (k == "--steps")
      a.steps = std::stoll(v);
    else if (k == "--save-every")
      a.save_every = std::stoll(v);
    else if (k == "--step-ms")
      a.step_ms = std::stoi(v);
    else if (k == "--log")
      a.log = v;
    else if (k == "--extra-mib")
      a.extra_mib = std::stoll(v);
    else
      return savepoint::InvalidArgumentError("unknown option " + k);
  }
  if (a.dir.empty()) return savepoint::InvalidArgumentError("--dir is required");
  return a;
}

// The training loop; returns the process exit code.
int Train(const Args& a, Trainer& t, savepoint::FailoverAgent& agent, int rank) {
  std::unique_ptr<savepoint::CheckpointManager> manager;
  if (rank == 0 && a.save_every > 0) {
    auto m = savepoint::CheckpointManager::Open(ManagerOpts(a.dir));
    if (!m.ok()) {
      fmt::print(stderr, "rank 0: manager: {}\n", m.status().ToString());
      return 1;
    }
    manager = std::move(m).value();
  }
  std::FILE* log = a.log.empty() ? nullptr : std::fopen(a.log.c_str(), "a");
  std::vector<float> grad;
  int code = 0;
  while (t.step < a.steps) {
    const int64_t step = t.step + 1;
    const float loss = LossAndGrad(t, t.step, &grad);
    if (Status s = agent.BeginUpdate(step); !s.ok()) {
      fmt::print(stderr, "rank {}: {}\n", rank, s.ToString());
      code = kExitStopped;
      break;
    }
    Update(t, grad);
    agent.EndUpdate(step);
    if (log != nullptr) {
      std::fprintf(log, "step %lld loss %a\n", static_cast<long long>(step), loss);
      std::fflush(log);
    }
    if (manager && step % a.save_every == 0) {
      savepoint::SaveArgs args;
      args.force = true;
      if (Result<bool> saved = manager->Save(step, StateOf(t), args); !saved.ok()) {
        fmt::print(stderr, "rank 0: save: {}\n", saved.status().ToString());
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(a.step_ms));
  }
  if (log != nullptr) std::fclose(log);
  if (manager) manager->Close().IgnoreError();
  if (code == 0) agent.Finish().IgnoreError();
  return code;
}

int Main(int argc, char** argv) {
  Result<Args> a = ParseArgs(argc, argv);
  Result<savepoint::AgentOptions> ao = savepoint::AgentOptionsFromEnv();
  if (!a.ok() || !ao.ok()) {
    fmt::print(stderr, "failover_train: {}\n", (!a.ok() ? a.status() : ao.status()).ToString());
    return 1;
  }
  Trainer t;
  t.extra.assign(static_cast<size_t>(a->extra_mib) << 20, 0x5a);
  if (Status s = ResumeLatest(a->dir, t); !s.ok()) {
    fmt::print(stderr, "failover_train: resume: {}\n", s.ToString());
    return 1;
  }
  const int rank = ao->rank;
  ao->source = [&t]() -> Result<savepoint::DumpSource> {
    return savepoint::DumpSource{StateOf(t), {}};
  };
  Result<std::unique_ptr<savepoint::FailoverAgent>> agent =
      savepoint::FailoverAgent::Connect(*std::move(ao));
  if (!agent.ok()) {
    fmt::print(stderr, "failover_train: {}\n", agent.status().ToString());
    return 1;
  }
  return Train(*a, t, **agent, rank);
}

}  // namespace

int main(int argc, char** argv) { return Main(argc, argv); }
