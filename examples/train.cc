// savepoint_train: a small, real training program that checkpoints with CheckpointManager.
//
// A 3-layer MLP (ReLU) trained with Adam on a generated 5-class classification set (Gaussian
// clusters), mini-batches drawn from a per-epoch shuffle. Everything is derived from --seed and
// all math is single-threaded float32 in a fixed order, so a run is bit-reproducible; and since
// the checkpoint holds the weights, Adam's moments and step count, the data loader's position and
// shuffle, and the RNG, a run killed at any moment and resumed from its latest checkpoint prints
// exactly the losses an uninterrupted run prints.
//
// Usage: savepoint_train --dir DIR [--epochs 8] [--seed 1] [--save-every 20] [--sync]
//                        [--delay-ms 0] [--keep 3]
// Prints "step S epoch E loss L (HEX)" per step (HEX: the float's exact bits, %a), then the
// checkpoint statistics. Resumes automatically when DIR holds a checkpoint.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "savepoint/savepoint.h"

namespace {

using savepoint::Category;
using savepoint::DType;
using savepoint::State;
using savepoint::Status;
using savepoint::TensorView;

constexpr int kFeatures = 20, kHidden = 64, kClasses = 5, kSamples = 2048, kBatch = 32;

struct Args {
  std::string dir;
  int epochs = 8;
  uint64_t seed = 1;
  int save_every = 20;
  bool async = true;
  int delay_ms = 0;
  int keep = 3;
};

float Uniform(std::mt19937_64& rng) { return static_cast<float>((rng() >> 11) * 0x1.0p-53); }

float Gaussian(std::mt19937_64& rng) {  // Box-Muller, so the numbers do not depend on the STL
  float u = std::max(Uniform(rng), 1e-7f), v = Uniform(rng);
  return std::sqrt(-2.0f * std::log(u)) * std::cos(6.2831853f * v);
}

struct Dataset {
  std::vector<float> x;  // kSamples x kFeatures
  std::vector<int> y;
  explicit Dataset(uint64_t seed) : x(kSamples * kFeatures), y(kSamples) {
    std::mt19937_64 rng(seed ^ 0xda7a);
    std::vector<float> centers(kClasses * kFeatures);
    for (float& c : centers) c = Gaussian(rng);
    for (int i = 0; i < kSamples; ++i) {
      y[i] = static_cast<int>(rng() % kClasses);
      for (int d = 0; d < kFeatures; ++d) {
        x[i * kFeatures + d] = centers[y[i] * kFeatures + d] + 2.0f * Gaussian(rng);
      }
    }
  }
};

// A dense layer y = x W + b with gradients.
struct Linear {
  int in, out;
  std::vector<float> w, b, gw, gb;
  Linear(int i, int o) : in(i), out(o), w(i * o), b(o), gw(i * o), gb(o) {}
  void Init(std::mt19937_64& rng) {
    float scale = 1.0f / std::sqrt(static_cast<float>(in));
    for (float& v : w) v = (2 * Uniform(rng) - 1) * scale;
    std::fill(b.begin(), b.end(), 0.0f);
  }
  void Forward(const float* x, int n, float* y) const {
    for (int r = 0; r < n; ++r) {
      for (int o = 0; o < out; ++o) y[r * out + o] = b[o];
      for (int i = 0; i < in; ++i) {
        const float xi = x[r * in + i];
        for (int o = 0; o < out; ++o) y[r * out + o] += xi * w[i * out + o];
      }
    }
  }
  // Accumulates gw, gb; writes dx (if not null).
  void Backward(const float* x, const float* dy, int n, float* dx) {
    for (int r = 0; r < n; ++r) {
      for (int o = 0; o < out; ++o) gb[o] += dy[r * out + o];
      for (int i = 0; i < in; ++i) {
        float acc = 0;
        for (int o = 0; o < out; ++o) {
          gw[i * out + o] += x[r * in + i] * dy[r * out + o];
          acc += w[i * out + o] * dy[r * out + o];
        }
        if (dx != nullptr) dx[r * in + i] = acc;
      }
    }
  }
};

void Relu(std::vector<float>& v) {
  for (float& x : v) x = std::max(x, 0.0f);
}
void ReluBackward(const std::vector<float>& act, std::vector<float>& d) {
  for (size_t i = 0; i < d.size(); ++i) d[i] = act[i] > 0 ? d[i] : 0.0f;
}

TensorView View(std::vector<float>& v) {
  return TensorView(v.data(), DType::kF32, {static_cast<int64_t>(v.size())});
}

// The model: three layers. Registered as "model" (dense); filled in place on restore.
struct Mlp : savepoint::Stateful {
  Linear l1{kFeatures, kHidden}, l2{kHidden, kHidden}, l3{kHidden, kClasses};
  std::vector<Linear*> layers() { return {&l1, &l2, &l3}; }
  std::vector<std::vector<float>*> params() { return {&l1.w, &l1.b, &l2.w, &l2.b, &l3.w, &l3.b}; }
  std::vector<std::vector<float>*> grads() {
    return {&l1.gw, &l1.gb, &l2.gw, &l2.gb, &l3.gw, &l3.gb};
  }
  Status SaveState(State& out) override {
    auto ps = params();
    for (size_t i = 0; i < ps.size(); ++i) {
      SP_RETURN_IF_ERROR(out.PutView(fmt::format("p{}", i), View(*ps[i])));
    }
    return Status::OK();
  }
  Status LoadState(const State&) override { return Status::OK(); }  // filled in place

  // One step's forward and backward pass; returns the mean cross-entropy.
  float LossAndGrad(const Dataset& data, const int* idx) {
    for (auto* g : grads()) std::fill(g->begin(), g->end(), 0.0f);
    std::vector<float> x(kBatch * kFeatures), h1(kBatch * kHidden), h2(kBatch * kHidden),
        z(kBatch * kClasses);
    for (int r = 0; r < kBatch; ++r) {
      std::memcpy(&x[r * kFeatures], &data.x[idx[r] * kFeatures], kFeatures * sizeof(float));
    }
    l1.Forward(x.data(), kBatch, h1.data());
    Relu(h1);
    l2.Forward(h1.data(), kBatch, h2.data());
    Relu(h2);
    l3.Forward(h2.data(), kBatch, z.data());
    float loss = 0;
    std::vector<float> dz(z.size());
    for (int r = 0; r < kBatch; ++r) {
      float* zr = &z[r * kClasses];
      float mx = *std::max_element(zr, zr + kClasses), sum = 0;
      for (int c = 0; c < kClasses; ++c) sum += std::exp(zr[c] - mx);
      const int label = data.y[idx[r]];
      loss += std::log(sum) + mx - zr[label];
      for (int c = 0; c < kClasses; ++c) {
        dz[r * kClasses + c] = (std::exp(zr[c] - mx) / sum - (c == label ? 1.0f : 0.0f)) / kBatch;
      }
    }
    std::vector<float> dh2(h2.size()), dh1(h1.size());
    l3.Backward(h2.data(), dz.data(), kBatch, dh2.data());
    ReluBackward(h2, dh2);
    l2.Backward(h1.data(), dh2.data(), kBatch, dh1.data());
    ReluBackward(h1, dh1);
    l1.Backward(x.data(), dh1.data(), kBatch, nullptr);
    return loss / kBatch;
  }
};

// Adam. Registered as "adam" (optimizer): moments m/v per parameter and the step count t.
struct Adam : savepoint::Stateful {
  float lr = 3e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  int64_t t = 0;
  std::vector<std::vector<float>> m, v;
  explicit Adam(Mlp& model) {
    for (auto* p : model.params()) {
      m.emplace_back(p->size(), 0.0f);
      v.emplace_back(p->size(), 0.0f);
    }
  }
  void Update(Mlp& model) {
    ++t;
    const float c1 = 1.0f - static_cast<float>(std::pow(beta1, t));
    const float c2 = 1.0f - static_cast<float>(std::pow(beta2, t));
    auto ps = model.params();
    auto gs = model.grads();
    for (size_t k = 0; k < ps.size(); ++k) {
      for (size_t i = 0; i < ps[k]->size(); ++i) {
        const float g = (*gs[k])[i];
        m[k][i] = beta1 * m[k][i] + (1 - beta1) * g;
        v[k][i] = beta2 * v[k][i] + (1 - beta2) * g * g;
        (*ps[k])[i] -= lr * (m[k][i] / c1) / (std::sqrt(v[k][i] / c2) + eps);
      }
    }
  }
  Status SaveState(State& out) override {
    for (size_t k = 0; k < m.size(); ++k) {
      SP_RETURN_IF_ERROR(out.PutView(fmt::format("m{}", k), View(m[k])));
      SP_RETURN_IF_ERROR(out.PutView(fmt::format("v{}", k), View(v[k])));
    }
    return out.PutValue("t", t);
  }
  Status LoadState(const State& in) override {
    t = in.FindValue("t")->as_int();
    return Status::OK();
  }
};

// The data loader: epoch, position in the epoch and the epoch's shuffle. Registered as
// "loader" (io_state); the shuffle RNG is registered separately as "rng" (extra).
struct Loader : savepoint::Stateful {
  std::mt19937_64* rng;
  int64_t epoch = 0, cursor = kSamples;
  std::vector<int32_t> perm = std::vector<int32_t>(kSamples);
  explicit Loader(std::mt19937_64* r) : rng(r) {}
  bool EpochDone() const { return cursor >= kSamples; }
  void NewEpoch() {
    ++epoch;
    cursor = 0;
    std::iota(perm.begin(), perm.end(), 0);
    for (int i = kSamples - 1; i > 0; --i) std::swap(perm[i], perm[(*rng)() % (i + 1)]);
  }
  std::vector<int> Next() {
    std::vector<int> idx(perm.begin() + cursor, perm.begin() + cursor + kBatch);
    cursor += kBatch;
    return idx;
  }
  Status SaveState(State& out) override {
    SP_RETURN_IF_ERROR(out.PutValue("epoch", epoch));
    SP_RETURN_IF_ERROR(out.PutValue("cursor", cursor));
    return out.PutView("perm", TensorView(perm.data(), DType::kI32, {kSamples}));
  }
  Status LoadState(const State& in) override {
    epoch = in.FindValue("epoch")->as_int();
    cursor = in.FindValue("cursor")->as_int();
    return Status::OK();
  }
};

bool ParseArgs(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : "0"; };
    if (k == "--dir")
      a->dir = next();
    else if (k == "--epochs")
      a->epochs = std::atoi(next());
    else if (k == "--seed")
      a->seed = std::strtoull(next(), nullptr, 10);
    else if (k == "--save-every")
      a->save_every = std::atoi(next());
    else if (k == "--sync")
      a->async = false;
    else if (k == "--delay-ms")
      a->delay_ms = std::atoi(next());
    else if (k == "--keep")
      a->keep = std::atoi(next());
    else
      return false;
  }
  return !a->dir.empty();
}

void PrintStats(savepoint::CheckpointManager& m) {
  int saves = 0, loads = 0, deletes = 0;
  double blocked = 0, persist = 0, bytes = 0;
  for (const savepoint::CheckpointStats& s : m.stats()) {
    if (s.action == "checkpoint_save") {
      ++saves;
      blocked += s.blocked_seconds;
      persist += s.seconds;
      bytes += static_cast<double>(s.bytes);
    }
    loads += s.action == "checkpoint_load";
    deletes += s.action == "checkpoint_delete";
  }
  std::printf(
      "checkpoints: %d saves (%.0f KiB each), training blocked %.2f ms per save, "
      "%.2f ms per save to commit; %d loads, %d deleted by retention; kept:",
      saves, saves ? bytes / saves / 1024 : 0, saves ? 1e3 * blocked / saves : 0,
      saves ? 1e3 * persist / saves : 0, loads, deletes);
  for (const savepoint::CheckpointRecord& r : m.All()) std::printf(" %s", r.name.c_str());
  std::printf("\n");
}

int Fail(const Status& s) {
  std::fprintf(stderr, "savepoint_train: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!ParseArgs(argc, argv, &a)) {
    std::fprintf(stderr,
                 "usage: savepoint_train --dir DIR [--epochs N] [--seed S] "
                 "[--save-every K] [--sync] [--delay-ms MS] [--keep N]\n");
    return 2;
  }
  savepoint::ManagerOptions o;
  o.naming.directory = a.dir;
  o.naming.prefix = "mlp";
  o.save_policy.interval_steps = a.save_every;
  o.retention.keep_last_n = a.keep;
  o.async_save.enabled = a.async;
  o.async_save.checkpointer.staging_bytes = 4 << 20;
  o.async_save.checkpointer.slab_bytes = 1 << 20;
  o.breakpoints.on_exception = true;
  o.breakpoints.handle_signals = true;
  auto opened = savepoint::CheckpointManager::Open(o);
  if (!opened.ok()) return Fail(opened.status());
  savepoint::CheckpointManager& m = **opened;

  const Dataset data(a.seed);
  std::mt19937_64 rng(a.seed);
  Mlp model;
  Adam adam(model);
  Loader loader(&rng);
  savepoint::Mt19937Stateful rng_state(&rng);
  for (Status s : {m.Register("model", &model, Category::kDense),
                   m.Register("adam", &adam, Category::kOptimizer),
                   m.Register("loader", &loader, Category::kIoState),
                   m.Register("rng", &rng_state, Category::kExtra)}) {
    if (!s.ok()) return Fail(s);
  }
  if (m.LatestStep()) {
    auto rec = m.RestoreRegistered();
    if (!rec.ok()) return Fail(rec.status());
    std::printf("resumed from %s (step %lld)\n", rec->name.c_str(),
                static_cast<long long>(rec->step));
  } else {
    for (Linear* l : model.layers()) l->Init(rng);
  }
  const int64_t total = int64_t{a.epochs} * (kSamples / kBatch);
  savepoint::ExceptionSaveGuard guard(m);
  for (int64_t step = m.global_step(); step < total;) {
    if (loader.EpochDone()) loader.NewEpoch();
    std::vector<int> idx = loader.Next();
    const float loss = model.LossAndGrad(data, idx.data());
    adam.Update(model);
    ++step;
    std::printf("step %lld epoch %lld loss %.6f (%a)\n", static_cast<long long>(step),
                static_cast<long long>(loader.epoch), loss, loss);
    std::fflush(stdout);
    Status s = m.OnStepEnd(step, loader.epoch, {{"loss", loss}});
    if (s.ok() && loader.EpochDone()) s = m.OnEpochEnd(loader.epoch);
    if (!s.ok()) return Fail(s);
    if (a.delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(a.delay_ms));
  }
  if (Status s = m.OnTrainEnd(); !s.ok()) return Fail(s);
  PrintStats(m);
  return 0;
}
