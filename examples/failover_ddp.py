"""One rank of a PyTorch DDP job (gloo, CPU) protected by failure-time checkpoints.

    SAVEPOINT_CONTROLLER=host:port SAVEPOINT_JOB_TOKEN=... RANK=r WORLD_SIZE=4 \\
    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \\
        python examples/failover_ddp.py --dir DIR [--steps 60] [--save-every 25] [--step-ms 10]
                                        [--log FILE] [--timeout 30] [--state-mb N]
                                        [--on-signal defer|checkpoint|untouched]
                                        [--signal-budget S] [--dump-delay S]

Started once per rank next to a `savepoint controller`, or by torchrun (it sets RANK /
WORLD_SIZE / MASTER_* and TORCHELASTIC_RESTART_COUNT; with `--max-restarts` the controller's
--max-restarts lets it protect every restarted generation). scripts/demo-failure --python runs 4
ranks, SIGKILLs one, and resumes; scripts/demo-failure --launcher torchrun does the same under
torchrun, twice in a row (docs/FAILOVER.md, "Python and PyTorch", "Launchers and signals"). The
Python twin of examples/failover_train.cc.

The model: a small MLP trained with DistributedDataParallel and Adam. The data loader is a pure
function of its position: the batch of step s on rank r is generated from (s, r). Inside each
update, gradient noise is drawn from a torch.Generator that is part of the state (the same seed
on every rank, so every rank's state is a replica). savepoint.failover.guard_optimizer makes each
optimizer.step() an update (begin_update before, end_update after); forward, backward and DDP's
all-reduce run outside it, so a survivor blocked in an all-reduce with the dead rank holds a
consistent step: its agent dumps that step, and when the all-reduce fails, collective_failed()
turns the error into JobStopped. A rank stopped by the controller exits with code 75.

Checkpoints: rank 0 saves every --save-every steps through savepoint.CheckpointManager; a failure
dump goes to the same directory ("ckpt-1_{n}_failover"). On start, every rank restores the newest
checkpoint, periodic or dump, and continues at n+1. Each rank appends "step S loss HEX" per step
to --log (HEX: float.hex of the loss), so a script can compare runs bit for bit; "{rank}" and
"{generation}" in --log are replaced (one command line serves every rank under torchrun), and
the rank's pid is written to the log's path + ".pid".

--state-mb N adds N MiB of state per rank (a float32 tensor changed inside every update, saved,
dumped and restored with the rest), to measure and test dumps of a realistic size. --on-signal and
--signal-budget are the agent's signals= and signal_budget= (savepoint.failover.Agent).
--dump-delay S makes the dump source
sleep S seconds first: a dump slower than the signal budget (the grace-exceeded trial).
"""

import argparse
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import savepoint
from savepoint import failover

EXIT_STOPPED = 75  # stopped by the controller after another rank failed
DIM = 16


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", required=True, help="checkpoint directory (shared by all ranks)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--save-every", type=int, default=25, help="periodic checkpoints (0: none)")
    p.add_argument("--step-ms", type=int, default=10, help="sleep after each step")
    # --loss-log under torchrun, whose own parser would take --log for a prefix of --log-dir.
    p.add_argument("--log", "--loss-log", dest="log", default="",
                   help="append 'step S loss HEX' per step")  # fmt: skip
    p.add_argument("--timeout", type=float, default=30.0, help="gloo collective timeout, s")
    p.add_argument("--state-mb", type=int, default=0, help="MiB of extra state per rank")
    p.add_argument("--on-signal", default="defer", choices=["defer", "checkpoint", "untouched"])
    p.add_argument("--signal-budget", type=float, default=25.0, help="seconds")
    p.add_argument("--dump-delay", type=float, default=0.0, help="seconds the dump source sleeps")
    return p.parse_args()


def env_int(*names):
    for n in names:
        if os.environ.get(n):
            return int(os.environ[n])
    raise SystemExit(f"failover_ddp: {names[0]} is not set")


def batch(position, rank):
    """The data loader: batch `position` (0-based) of `rank`."""
    g = torch.Generator().manual_seed(7919 * position + rank)
    x = torch.randn(8, DIM, generator=g)
    return x, torch.sin(x.sum(dim=1, keepdim=True))


class Trainer:
    def __init__(self, state_mb=0):
        torch.manual_seed(0)
        # Extra state (--state-mb): distinct values, one element changed inside each update.
        self.ballast = torch.arange(state_mb * (1 << 18), dtype=torch.float32)
        self.model = torch.nn.Sequential(torch.nn.Linear(DIM, 32), torch.nn.Tanh(),
                                         torch.nn.Linear(32, 1))  # fmt: skip
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-2)
        self.noise = torch.Generator().manual_seed(1234)
        self.step = 0  # steps done = the data loader's position

    def state(self, step):
        """What a checkpoint holds: the live tensors at `step` (no copies)."""
        return {"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                "rng": {"noise": self.noise.get_state()}, "ballast": self.ballast,
                "train": {"step": step, "loader_position": step}}  # fmt: skip

    def load(self, s):
        self.model.load_state_dict(s["model"])
        self.opt.load_state_dict(s["optimizer"])
        self.noise.set_state(s["rng"]["noise"])
        self.ballast.copy_(torch.as_tensor(s["ballast"]))
        self.step = int(s["train"]["step"])

    def add_noise(self, optimizer, args, kwargs):
        """A step pre-hook: gradient noise, drawn inside the update (so the RNG is part of it)."""
        for p in self.model.parameters():
            p.grad.add_(torch.randn(p.grad.shape, generator=self.noise), alpha=1e-4)
        if self.ballast.numel():
            self.ballast[(self.step * 7919) % self.ballast.numel()] += 1


def ordered_allreduce(world):
    """A DDP comm hook: the mean of the ranks' gradients summed in rank order. DDP rebuilds its
    buckets after the first iteration (of every run: a resumed run's first step is one), and
    gloo's ring all-reduce adds each element in an order that depends on where it sits in the
    bucket; an all-gather copies, so the sum is the same whatever the bucket layout."""

    def hook(_, bucket):
        buf = bucket.buffer()
        parts = [torch.empty_like(buf) for _ in range(world)]
        fut = dist.all_gather(parts, buf, async_op=True).get_future()

        def mean(done):
            done.value()  # raises the all-gather's error (a dead peer): no step on garbage
            total = parts[0].clone()
            for p in parts[1:]:
                total += p
            return total.div_(world)

        return fut.then(mean)

    return hook


def open_manager(directory):
    """The manager's directory lock admits one process at a time: ranks take turns."""
    while True:
        try:
            return savepoint.CheckpointManager(directory, keep_last_n=3, save_interval_steps=0)
        except savepoint.FailedPreconditionError:
            time.sleep(0.01)


def resume(directory, t):
    m = open_manager(directory)
    try:
        if m.latest_step() is not None:
            name = max(m.checkpoints(), key=lambda c: c["step"])["name"]
            t.load(m.restore(mmap=True))  # copied into the live tensors
            print(f"resumed from {name} at step {t.step}", file=sys.stderr)
    finally:
        m.close()


def train(args, t, agent, rank):
    """The training loop; returns the exit code."""
    ddp = DistributedDataParallel(t.model)
    ddp.register_comm_hook(None, ordered_allreduce(dist.get_world_size()))
    guard = failover.guard_optimizer(t.opt, agent, start_step=t.step)
    t.opt.register_step_pre_hook(t.add_noise)  # after the guard's: inside the update
    manager = open_manager(args.dir) if rank == 0 and args.save_every > 0 else None
    log = open(args.log, "a") if args.log else None
    try:
        for step in range(t.step + 1, args.steps + 1):
            x, y = batch(step - 1, rank)
            t.opt.zero_grad()
            try:
                loss = torch.nn.functional.mse_loss(ddp(x), y)
                loss.backward()  # DDP's all-reduce: outside the update
            except RuntimeError as e:  # a peer died mid all-reduce
                agent.collective_failed(e)
            t.opt.step()  # begin_update(step) ... end_update(step); may raise JobStopped
            t.step = guard.step
            if log:
                log.write(f"step {step} loss {loss.item().hex()}\n")
                log.flush()
            if manager and step % args.save_every == 0:
                manager.save(step, t.state(step), force=True)
            time.sleep(args.step_ms / 1000)
    except failover.JobStopped as e:
        print(f"rank {rank}: {e.reason}", file=sys.stderr)
        return EXIT_STOPPED
    finally:
        if log:
            log.close()
        if manager:
            manager.close()
    return 0


def main():
    args = parse_args()
    torch.set_num_threads(1)
    rank = env_int("SAVEPOINT_RANK", "RANK")
    world = env_int("SAVEPOINT_WORLD_SIZE", "WORLD_SIZE")
    if args.log:
        generation = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        args.log = args.log.replace("{rank}", str(rank)).replace("{generation}", generation)
        with open(args.log + ".pid", "w") as f:
            f.write(f"{os.getpid()}\n")
    t = Trainer(args.state_mb)
    resume(args.dir, t)
    agent = None

    def source():
        """The dump source: the live state at the agent's last finished step (the training
        thread is parked while it runs; the noise generator and the ballast only change inside
        updates)."""
        time.sleep(args.dump_delay)
        return t.state(agent.step)

    agent = failover.Agent(source=source, rank=rank, world=world, signals=args.on_signal,
                           signal_budget=args.signal_budget)  # fmt: skip
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=timedelta(seconds=args.timeout))  # fmt: skip
    code = train(args, t, agent, rank)
    sys.stderr.flush()
    if code != 0:
        os._exit(code)  # the process group holds a dead peer: no orderly teardown
    agent.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
