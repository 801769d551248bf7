"""Failure-time checkpoints from Python: the per-rank agent and a torch optimizer guard.

When a rank of a data-parallel job dies, a `savepoint controller` (started by the launcher,
outside the ranks) stops the survivors at a step boundary and has one of them dump the state of
the last consistent step into the checkpoint directory (docs/FAILOVER.md). Each rank runs an
Agent that reports its step state to the controller::

    agent = savepoint.failover.Agent(source=lambda: {"model": model.state_dict(), ...})
    savepoint.failover.guard_optimizer(optimizer, agent)   # begin/end_update around step()
    ...
    agent.close()

The C++ agent (savepoint/failover_rpc.h) needs gRPC at build time; without it every call here
raises UnimplementedError.
"""

import os
import time

from . import _core, _errors, _sparse_io, _tree, _write

__all__ = ["Agent", "JobStopped", "available", "env_configured", "guard_optimizer"]


class JobStopped(_errors.FailedPreconditionError):
    """The controller stopped the job (another rank failed; the dump, if allowed, is over).

    Raised by Agent.begin_update (and so by a guarded optimizer.step()): the rank should exit
    without touching its state. `reason` is the controller's message, e.g.
    "job stopped: rank 2 failed ...; dump committed at /ckpt/ckpt-1_57_failover"."""

    def __init__(self, reason):
        super().__init__(reason)
        self.reason = reason


def available():
    """Whether this build of savepoint has the failover agent (gRPC)."""
    return hasattr(_core, "FailoverAgent")


def _require():
    if not available():
        raise _errors.UnimplementedError(
            "savepoint.failover: this build has no failover agent (savepoint_failover needs gRPC: "
            "Debian's libgrpc++-dev and protobuf-compiler-grpc; docs/FAILOVER.md)")


def _flat_source(source):
    """The callable the C++ agent calls on its dump thread: source() flattened as savepoint.save
    does, as (tensor specs, values, metadata JSON, owner of the memory, table specs)."""

    def call():
        flattener = _tree.Flattener()
        flattener.allow_tables = True  # a native dump (the .ckpt layout refuses them, naming why)
        flat, meta_json = _write.flatten(source(), None, flattener)
        tables, owners = _sparse_io.table_specs(flat.tables)
        return ([t.spec() for t in flat.tensors], flat.values, meta_json, (flat, owners), tables)

    return call


class Agent:
    """One rank's connection to the failover controller.

    source: a callable returning the state a dump of this rank writes: a nested structure as
        savepoint.save takes (model.state_dict(), optimizer.state_dict(), RNG states, the step,
        the data loader's position). It is called on the agent's dump thread while the training
        thread is parked outside an update (in begin_update, or blocked in a collective with the
        dead rank), so it must return the state of the last step passed to end_update: read the
        live tensors (they are not copied; the result is kept alive until the dump is over), but
        nothing the training thread changes between updates (e.g. an RNG consumed by forward()).
        Default None: this rank is never a dump writer (it reports no finished step).
        When the controller keeps snapshots (`savepoint controller --snapshot-dir /dev/shm`), it
        is also called after every snapshot_every-th end_update, on the agent's snapshot thread,
        which writes the state into shared memory while the next step computes; the next
        begin_update waits until that copy is written. A dead rank's part of a dump then comes
        from its snapshot when no live replica holds it (data parallel = 1).
    groups: the replica groups of this rank's state, a list of sorted rank lists (the ranks
        holding identical copies of one part of it; savepoint's ReplicaGroupsOf). Default None:
        every rank holds the same state (pure data parallel). Sparse tables (SparseTable leaves)
        hold the rank's own rows, the group [rank]: with a data-parallel rest, pass
        groups=[list(range(world)), [rank]] (a dump whose writer holds tables outside its groups
        fails rather than leave rows out).
    controller: "host:port" of the controller. Default: $SAVEPOINT_CONTROLLER.
    token: the job token, the same as the controller's (at least 16 characters). Default:
        $SAVEPOINT_JOB_TOKEN.
    rank, world: this rank and the job's size. Default: $SAVEPOINT_RANK / $SAVEPOINT_WORLD_SIZE,
        else $RANK / $WORLD_SIZE (torchrun), else the OpenMPI variables.
    connect_timeout: seconds to wait for the controller to answer (it may still be starting).
        Default 10. The constructor then waits until every rank of the job has registered.
    io_threads (4), direct_io (True): I/O of the dump's save.
    signals: what SIGTERM and SIGINT do while the agent is open (docs/FAILOVER.md, "Launchers
        and signals"). Launchers (torchrun, Slurm, Kubernetes) answer one rank's death by
        sending SIGTERM to the others, SIGKILL a grace period later; a rank writing the dump
        must outlive it.
        "defer" (default): while the controller handles a failure, a caught signal waits until
        this rank's part of the dump is written (at most signal_budget seconds), then acts as
        it would have without the agent (Python's default for SIGTERM ends the process by it;
        SIGINT raises KeyboardInterrupt); with no failure in sight for signal_settle seconds,
        it acts at once.
        "checkpoint": as "defer", but a signal with no failure in sight first has the
        controller commit a checkpoint of the job's current step (preemption: Slurm's
        --signal, Kubernetes' grace period, spot notices), then acts.
        "untouched": the agent leaves both signals alone.
        A handler installed with signal.signal() after the agent replaces the agent's.
    signal_budget: seconds a caught signal may wait (default 25, inside torchrun's and Slurm's
        30 s grace). Past it the rank gives up (one line on stderr): the dump commits nothing
        and the newest checkpoint stays the newest.
    signal_settle: seconds a signal with no failure in sight waits for the controller's stop
        (a launcher may signal before the controller saw the death). Default 0.5.
    The launcher's restart count ($TORCHELASTIC_RESTART_COUNT, or $SAVEPOINT_GENERATION) tells
    a controller started with --max-restarts which generation of the job this rank belongs to.

    Raises InvalidArgumentError (a missing or malformed setting, naming the variable),
    AuthenticationError (a token the controller refuses), FailedPreconditionError (the
    controller refuses this rank: taken, or declared dead), UnimplementedError (no gRPC in this
    build). Usable as a context manager: leaving the block normally calls close() (the job is
    over for this rank), leaving it by an exception abandons the connection (as a crash would).

    Thread safety: begin_update / end_update / close from the training thread.
    """

    def __init__(self, source=None, *, groups=None, controller=None, token=None, rank=None,
                 world=None, connect_timeout=10.0, io_threads=4, direct_io=True,
                 signals="defer", signal_budget=25.0, signal_settle=0.5):  # fmt: skip
        _require()
        if source is not None and not callable(source):
            raise TypeError("savepoint.failover.Agent: source must be callable (or None)")
        target = (controller or "", token or "", -1 if rank is None else int(rank),
                  0 if world is None else int(world))  # fmt: skip
        groups = [sorted(int(r) for r in g) for g in (groups or [])]
        src = None if source is None else _flat_source(source)
        self._a = _core.FailoverAgent(src, target, groups, float(connect_timeout),
                                      int(io_threads), bool(direct_io),
                                      (str(signals), float(signal_budget),
                                       float(signal_settle)))  # fmt: skip
        self._step = None

    @property
    def rank(self):
        return self._a.rank

    @property
    def world(self):
        return self._a.world

    @property
    def step(self):
        """The last step passed to end_update (None before the first)."""
        return self._step

    @property
    def controller_error(self):
        """None while the controller is reachable; else why it was lost (training goes on, but
        without failure dumps)."""
        return self._a.controller_error() or None

    def begin_update(self, step):
        """Before the state changes for `step`. Returns at once normally; when the controller
        has stopped the job, blocks until the dump is over and raises JobStopped."""
        reason = self._a.begin_update(int(step))
        if reason:
            raise JobStopped(reason)

    def end_update(self, step, epoch=1, step_in_epoch=0):
        """After the update of `step`: the state is now that of `step`. epoch / step_in_epoch
        name a dump of this step ("{prefix}-{epoch}_{step_in_epoch}_failover"; default epoch 1,
        step_in_epoch = step)."""
        self._step = int(step)  # first: a dump of `step` may start as soon as the agent knows
        self._a.end_update(self._step, int(epoch), int(step_in_epoch))

    def collective_failed(self, error, timeout=10.0):
        """For a collective that failed outside an update (a peer died mid all-reduce; the state
        still holds step `self.step`): waits up to `timeout` seconds for the controller to stop
        the job, then raises JobStopped (from `error`) once the dump is over. Re-raises `error`
        if the controller does not stop the job in time (it was not a rank failure)."""
        deadline = time.monotonic() + timeout
        last = -1 if self._step is None else self._step
        while True:
            reason = self._a.begin_update(last + 1)
            if reason:
                raise JobStopped(reason) from error
            self._a.end_update(last, 1, 0)  # no update happened: back to step `last`
            if time.monotonic() >= deadline:
                raise error
            time.sleep(0.02)

    def close(self):
        """The job is over for this rank: tells the controller and disconnects. Idempotent."""
        self._a.finish()

    def abandon(self):
        """Drops the connection without a word, as a crash does (tests). Idempotent."""
        self._a.abandon()

    @property
    def closed(self):
        return self._a.closed

    def wrap(self, optimizer, step_fn=None, start_step=0):
        """guard_optimizer(optimizer, self, step_fn, start_step)."""
        return guard_optimizer(optimizer, self, step_fn=step_fn, start_step=start_step)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abandon()
        return False


class _Guard:
    """What guard_optimizer returns: the hooks' handles and the step counter."""

    def __init__(self, agent, step_fn, start_step):
        self.agent, self._step_fn, self.step = agent, step_fn, int(start_step)
        self._current = None
        self._handles = []

    def _pre(self, optimizer, args, kwargs):
        step = self._step_fn() if self._step_fn is not None else self.step + 1
        self.agent.begin_update(step)
        self._current = step

    def _post(self, optimizer, args, kwargs):
        step, self._current = self._current, None
        self.step = step
        self.agent.end_update(step)

    def remove(self):
        """Removes the hooks."""
        for h in self._handles:
            h.remove()
        self._handles = []


def guard_optimizer(optimizer, agent, step_fn=None, start_step=0):
    """Makes every optimizer.step() an update of `agent`: begin_update(step) before it (which
    raises JobStopped out of optimizer.step() when the job was stopped) and end_update(step) after
    (torch's register_step_pre_hook / register_step_post_hook).

    step_fn: a callable returning the step number of the update about to run. Default None:
        start_step + 1, start_step + 2, ... (one per optimizer.step() call).
    start_step: the step the state holds now (the resumed checkpoint's; default 0).

    Only the optimizer's update is inside the update window: forward, backward and DDP's
    gradient all-reduce happen outside it, so a survivor blocked in an all-reduce with a dead
    rank still holds a consistent step (docs/FAILOVER.md, "Python and PyTorch"). State that
    changes outside optimizer.step() (an RNG consumed by forward) must not be read live by the
    agent's source. Returns a handle with .remove() and .step (the last finished step)."""
    if not isinstance(agent, Agent):
        raise TypeError("savepoint.failover.guard_optimizer: agent must be a failover.Agent")
    guard = _Guard(agent, step_fn, start_step)
    guard._handles = [optimizer.register_step_pre_hook(guard._pre),
                      optimizer.register_step_post_hook(guard._post)]  # fmt: skip
    return guard


def env_configured():
    """Whether the environment names a controller and a job token (SAVEPOINT_CONTROLLER,
    SAVEPOINT_JOB_TOKEN): a launcher started this rank under failover protection."""
    return bool(os.environ.get("SAVEPOINT_CONTROLLER") and os.environ.get("SAVEPOINT_JOB_TOKEN"))

