// A tiny deterministic "training" state for manager tests: weights and a momentum buffer updated
// from an RNG stream, a step counter and a data-loader position. Registering it with a
// CheckpointManager covers every category the crash tests need (dense, optimizer, io_state,
// extra). Header-only: used by tests/manager_*_test.cc and the manager_trainer helper.
#ifndef SAVEPOINT_TESTS_HELPERS_TOY_TRAINER_H_
#define SAVEPOINT_TESTS_HELPERS_TOY_TRAINER_H_

#include <cstring>
#include <random>
#include <vector>

#include "savepoint/savepoint.h"

namespace savepoint::testing {

class ToyTrainer {
 public:
  static constexpr int kSize = 4096;
  static constexpr int64_t kStepsPerEpoch = 10;

  explicit ToyTrainer(uint64_t seed) : rng_(seed), w_(kSize), m_(kSize, 0.0f) {
    for (float& x : w_) x = static_cast<float>(rng_() >> 40) / 16777216.0f;
  }

  // Copies the training state (not registrations: the copy's Stateful adapters point at the copy).
  ToyTrainer(const ToyTrainer& o) : rng_(o.rng_), w_(o.w_), m_(o.m_) { CopyLoader(o); }
  ToyTrainer& operator=(const ToyTrainer& o) {
    rng_ = o.rng_;
    w_ = o.w_;
    m_ = o.m_;
    CopyLoader(o);
    return *this;
  }

  void Step() {
    for (int i = 0; i < kSize; ++i) {
      const float g = static_cast<float>(rng_() >> 40) / 16777216.0f - 0.5f;
      m_[i] = 0.9f * m_[i] + 0.1f * g;
      w_[i] -= 0.01f * m_[i];
    }
    ++loader_.t;
    if (++loader_.cursor == kStepsPerEpoch) {
      loader_.cursor = 0;
      ++loader_.epoch;
    }
  }
  int64_t step() const { return loader_.t; }
  const std::vector<float>& weights() const { return w_; }
  const std::vector<float>& momentum() const { return m_; }
  int64_t epoch() const { return loader_.t == 0 ? 1 : (loader_.t - 1) / kStepsPerEpoch + 1; }

  Status Register(CheckpointManager& m) {
    SP_RETURN_IF_ERROR(m.Register("model", &model_, Category::kDense));
    SP_RETURN_IF_ERROR(m.Register("opt", &opt_, Category::kOptimizer));
    SP_RETURN_IF_ERROR(m.Register("loader", &loader_, Category::kIoState));
    return m.Register("rng", &rng_state_, Category::kExtra);
  }

  bool operator==(const ToyTrainer& o) const {
    return std::memcmp(w_.data(), o.w_.data(), kSize * 4) == 0 &&
           std::memcmp(m_.data(), o.m_.data(), kSize * 4) == 0 && rng_ == o.rng_ &&
           loader_.t == o.loader_.t && loader_.epoch == o.loader_.epoch &&
           loader_.cursor == o.loader_.cursor;
  }

 private:
  struct Vec : Stateful {
    std::vector<float>* v;
    explicit Vec(std::vector<float>* p) : v(p) {}
    Status SaveState(State& out) override {
      return out.PutView("v", TensorView(v->data(), DType::kF32, {kSize}));
    }
    Status LoadState(const State&) override { return Status::OK(); }
  };
  struct Loader : Stateful {
    int64_t t = 0, epoch = 1, cursor = 0;
    Status SaveState(State& out) override {
      SP_RETURN_IF_ERROR(out.PutValue("t", t));
      SP_RETURN_IF_ERROR(out.PutValue("epoch", epoch));
      return out.PutValue("cursor", cursor);
    }
    Status LoadState(const State& in) override {
      t = in.FindValue("t")->as_int();
      epoch = in.FindValue("epoch")->as_int();
      cursor = in.FindValue("cursor")->as_int();
      return Status::OK();
    }
  };

  void CopyLoader(const ToyTrainer& o) {
    loader_.t = o.loader_.t;
    loader_.epoch = o.loader_.epoch;
    loader_.cursor = o.loader_.cursor;
  }

  std::mt19937_64 rng_;
  std::vector<float> w_, m_;
  Vec model_{&w_}, opt_{&m_};
  Loader loader_;
  Mt19937Stateful rng_state_{&rng_};
};

}  // namespace savepoint::testing

#endif  // SAVEPOINT_TESTS_HELPERS_TOY_TRAINER_H_
