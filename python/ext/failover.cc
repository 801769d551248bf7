// Binding of the failure-time checkpoint agent (savepoint/failover_rpc.h) as _core.FailoverAgent,
// used by savepoint/failover.py. Compiled only when the savepoint_failover library (gRPC) is
// built (python/CMakeLists.txt defines SAVEPOINT_PY_FAILOVER); without it _core has no
// FailoverAgent and savepoint.failover raises UnimplementedError.
//
// The dump source is a Python callable run on the agent's dump thread while the training thread
// is parked (in begin_update, or blocked in a collective outside an update), and on its snapshot
// thread after end_update when the controller keeps snapshots: the binding takes the GIL for the
// call, and the State it builds keeps what the call returned (which owns the tensors' memory)
// alive until the dump or snapshot is written. Every call that may block (connect, begin_update,
// finish, close) releases the GIL, so the dump thread can run the source meanwhile.
#include <chrono>
#include <memory>

#include "common.h"
#include "savepoint/failover_rpc.h"
#include "tables.h"

namespace savepoint::python {
namespace {

// (controller, token, rank, world): empty / -1 fields are taken from the environment
// (AgentOptionsFromEnv).
using AgentTarget = std::tuple<std::string, std::string, int, int>;
// (policy: "defer", "checkpoint" or "untouched"; budget and settle in seconds): SignalPolicy,
// AgentOptions::signal_budget, signal_settle.
using AgentSignals = std::tuple<std::string, double, double>;

std::chrono::milliseconds Seconds(double s, const char* what) {
  if (!(s >= 0 && s <= 86400)) {
    throw StatusError(InvalidArgumentError(std::string(what) + " must be in [0, 86400] seconds"));
  }
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
}

void SetSignals(AgentOptions& o, const AgentSignals& signals) {
  const auto& [policy, budget_s, settle_s] = signals;
  if (policy == "defer") {
    o.signals = SignalPolicy::kDefer;
  } else if (policy == "checkpoint") {
    o.signals = SignalPolicy::kCheckpoint;
  } else if (policy == "untouched") {
    o.signals = SignalPolicy::kUntouched;
  } else {
    throw StatusError(InvalidArgumentError(
        "signals must be 'defer', 'checkpoint' or 'untouched', not '" + policy + "'"));
  }
  o.signal_budget = Seconds(budget_s, "signal_budget");
  o.signal_settle = Seconds(settle_s, "signal_settle");
}

AgentOptions MakeAgentOptions(const AgentTarget& target, const std::vector<ReplicaGroup>& groups,
                              double connect_timeout_s, int io_threads, bool direct_io,
                              const AgentSignals& signals) {
  const auto& [controller, token, rank, world] = target;
  AgentOptions o;
  if (controller.empty() || token.empty() || rank < 0 || world < 1) {
    o = Take(AgentOptionsFromEnv());
  }
  if (!controller.empty()) o.controller = controller;
  if (!token.empty()) o.token = token;
  if (rank >= 0) o.rank = rank;
  if (world >= 1) o.world = world;
  o.groups = groups;
  o.connect_timeout = Seconds(connect_timeout_s, "connect_timeout");
  SetSignals(o, signals);
  o.io.io_threads = io_threads;
  o.io.direct_io = direct_io;
  return o;
}

class PyFailoverAgent {
 public:
  // `source`: None, or a callable returning (tensor specs, value specs, metadata JSON, owner) as
  // savepoint/failover.py builds them; `owner` keeps the tensors' memory alive.
  PyFailoverAgent(nb::object source, const AgentTarget& target,
                  const std::vector<ReplicaGroup>& groups, double connect_timeout_s, int io_threads,
                  bool direct_io, const AgentSignals& signals)
      : source_(std::move(source)) {
    AgentOptions o =
        MakeAgentOptions(target, groups, connect_timeout_s, io_threads, direct_io, signals);
    rank_ = o.rank;
    world_ = o.world;
    if (!source_.is_none()) o.source = [this] { return CallSource(); };
    Result<std::unique_ptr<FailoverAgent>> agent = InternalError("not connected");
    {
      nb::gil_scoped_release release;
      agent = FailoverAgent::Connect(std::move(o));
    }
    agent_ = Take(std::move(agent));
  }

  ~PyFailoverAgent() {
    if (agent_) {
      nb::gil_scoped_release release;
      agent_.reset();  // Abandon: joins the dump thread, which may need the GIL
    }
  }

  // "" to go on; else why the job is over for this rank (BeginUpdate's status message).
  std::string BeginUpdate(int64_t step) {
    FailoverAgent& a = Agent();
    Status s;
    {
      nb::gil_scoped_release release;
      s = a.BeginUpdate(step);
    }
    return s.ok() ? std::string() : s.message();
  }

  void EndUpdate(int64_t step, int64_t epoch, int64_t step_in_epoch) {
    FailoverAgent& a = Agent();
    nb::gil_scoped_release release;
    a.EndUpdate(step, epoch, step_in_epoch);
  }

  void Finish() {
    std::unique_ptr<FailoverAgent> a = std::move(agent_);
    if (!a) return;
    Status s;
    {
      nb::gil_scoped_release release;
      s = a->Finish();
      a.reset();
    }
    ReleaseSource();
    Check(s);
  }

  void Abandon() {
    std::unique_ptr<FailoverAgent> a = std::move(agent_);
    if (!a) return;
    {
      nb::gil_scoped_release release;
      a->Abandon();
      a.reset();
    }
    ReleaseSource();
  }

  // "" while connected (or closed); else why the controller was lost.
  std::string ControllerError() {
    if (!agent_) return {};
    Status s = agent_->controller_status();
    return s.ok() ? std::string() : s.message();
  }

  void PauseHeartbeats(bool paused) { Agent().PauseHeartbeatsForTesting(paused); }
  bool closed() const { return agent_ == nullptr; }
  int rank() const { return rank_; }
  int world() const { return world_; }

 private:
  FailoverAgent& Agent() {
    if (!agent_) throw StatusError(FailedPreconditionError("the failover agent is closed"));
    return *agent_;
  }

  // GIL held. Drops the source too: it usually refers to the Python Agent holding this object,
  // a cycle the garbage collector cannot see through.
  void ReleaseSource() { source_ = nb::none(); }

  // A reference to `owner` that may be dropped on any thread (it takes the GIL).
  static std::shared_ptr<const void> Hold(nb::object owner) {
    return std::shared_ptr<const void>(new nb::object(std::move(owner)), [](const void* p) {
      nb::gil_scoped_acquire gil;
      delete static_cast<const nb::object*>(p);
    });
  }

  // On the agent's dump or snapshot thread.
  Result<DumpSource> CallSource() {
    nb::gil_scoped_acquire gil;
    try {
      nb::tuple r = nb::cast<nb::tuple>(source_());
      if (r.size() != 5) return InternalError("failover dump source: bad result");
      DumpSource out;
      out.state = MakeState(nb::cast<std::vector<TensorSpec>>(r[0]),
                            nb::cast<std::vector<ValueSpec>>(r[1]), nb::cast<std::string>(r[2]));
      AddTables(out.state, nb::cast<std::vector<TableSpec>>(r[4]), "failover dump source");
      out.state.KeepAlive(Hold(r[3]));  // the tensors' and tables' memory
      return out;
    } catch (const StatusError& e) {
      return e.status();
    } catch (nb::python_error& e) {
      std::string what = e.what();
      return InternalError("failover dump source raised: " + what);
    } catch (const std::exception& e) {
      return InternalError(std::string("failover dump source: ") + e.what());
    }
  }

  nb::object source_;
  std::unique_ptr<FailoverAgent> agent_;
  int rank_ = -1, world_ = 0;
};

}  // namespace

void BindFailover(nb::module_& m) {
  nb::class_<PyFailoverAgent>(m, "FailoverAgent")
      .def(nb::init<nb::object, const AgentTarget&, const std::vector<ReplicaGroup>&, double, int,
                    bool, const AgentSignals&>(),
           nb::arg("source").none(), nb::arg("target"), nb::arg("groups"),
           nb::arg("connect_timeout_s"), nb::arg("io_threads"), nb::arg("direct_io"),
           nb::arg("signals"),
           "FailoverAgent::Connect (GIL released). target: (controller, token, rank, world); "
           "empty / negative fields come from the environment. signals: (policy, budget s, "
           "settle s).")
      .def("begin_update", &PyFailoverAgent::BeginUpdate, nb::arg("step"),
           "BeginUpdate (GIL released): '' to go on, else why the job stopped.")
      .def("end_update", &PyFailoverAgent::EndUpdate, nb::arg("step"), nb::arg("epoch") = 1,
           nb::arg("step_in_epoch") = 0)
      .def("finish", &PyFailoverAgent::Finish)
      .def("abandon", &PyFailoverAgent::Abandon)
      .def("controller_error", &PyFailoverAgent::ControllerError)
      .def("pause_heartbeats_for_testing", &PyFailoverAgent::PauseHeartbeats, nb::arg("paused"))
      .def_prop_ro("closed", &PyFailoverAgent::closed)
      .def_prop_ro("rank", &PyFailoverAgent::rank)
      .def_prop_ro("world", &PyFailoverAgent::world);
}

}  // namespace savepoint::python
