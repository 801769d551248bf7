"""What the PyTorch distributed examples share: running a function on N local ranks (gloo on the
CPU, one process each), the three phases of the kill-and-resume demonstration, and the check.

Each example (torch_ddp.py, torch_dtensor.py) provides train(rank, world, run_dir, phase), which
trains to STEPS steps; rank 0 writes the loss of every step it ran and a digest of the final
parameters to <run_dir>/<phase>.json. The phases, each a fresh set of processes:
  1. "reference": 4 ranks train from scratch, uninterrupted;
  2. "crash": 4 ranks train with checkpoints every CKPT_EVERY steps (the last one asynchronous, so
     a save may be in flight) and every rank is killed with SIGKILL at step KILL_AT;
  3. "resume": 2 ranks load the latest committed checkpoint (another world size, another layout)
     and finish the run.
The resumed run must equal the reference from the checkpoint's step on, bit for bit.
"""

import datetime
import hashlib
import json
import os
import re
import signal
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import savepoint

STEPS = 40
CKPT_EVERY = 10
KILL_AT = 25


def _entry(rank, world, store, fn, args):
    torch.set_num_threads(1)  # the same arithmetic in every process, whatever the world size
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))  # fmt: skip
    fn(rank, world, *args)
    dist.destroy_process_group()


def run(world, fn, *args):
    """Runs fn(rank, world, *args) on `world` processes; returns their exit codes."""
    store = tempfile.mktemp(prefix="savepoint-store-")
    ctx = mp.start_processes(_entry, args=(world, store, fn, args), nprocs=world, join=False,
                             start_method="fork")  # fmt: skip
    for p in ctx.processes:
        p.join()
    return [p.exitcode for p in ctx.processes]


def latest_checkpoint(ckpt_dir):
    """(step, path) of the newest committed checkpoint under ckpt_dir, or (0, None)."""
    if not os.path.isdir(ckpt_dir):
        return 0, None
    best = (0, None)
    for c in savepoint.list_checkpoints(ckpt_dir):
        m = re.fullmatch(r"step-(\d+)", c["name"])
        if c["committed"] and m and int(m.group(1)) > best[0]:
            best = (int(m.group(1)), c["path"])
    return best


def checkpoint_path(run_dir, step):
    return os.path.join(run_dir, "ckpt", f"step-{step:06d}")


def maybe_die(step):
    """The crash phase: every rank is killed at step KILL_AT (as a scheduler would kill a job)."""
    if step == KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)


def digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def report(run_dir, phase, losses, params_digest, start_step):
    with open(os.path.join(run_dir, f"{phase}.json"), "w") as f:
        json.dump({"losses": losses, "digest": params_digest, "start": start_step}, f)


def main(train, name):
    run_dir = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix=f"{name}-")
    os.makedirs(run_dir, exist_ok=True)
    print(f"{name}: run directory {run_dir}")
    assert run(4, train, run_dir, "reference") == [0] * 4
    codes = run(4, train, run_dir, "crash")
    print(f"crash run: exit codes {codes} (-9: killed by SIGKILL at step {KILL_AT})")
    assert all(c == -signal.SIGKILL for c in codes), codes
    for c in savepoint.list_checkpoints(os.path.join(run_dir, "ckpt")):
        state = "committed" if c["committed"] else "not committed (killed mid-save: debris for gc)"
        print(f"  {c['name']}: {state}")
    assert run(2, train, run_dir, "resume") == [0] * 2
    with open(os.path.join(run_dir, "reference.json")) as f:
        ref = json.load(f)
    with open(os.path.join(run_dir, "resume.json")) as f:
        res = json.load(f)
    start = res["start"]
    same_losses = res["losses"] == ref["losses"][start:]
    same_params = res["digest"] == ref["digest"]
    print(f"resumed from the checkpoint of step {start} with 2 ranks (saved by 4): losses of steps "
          f"{start + 1}..{STEPS} {'equal' if same_losses else 'DIFFER FROM'} the uninterrupted "
          f"4-rank run; final parameters {'equal' if same_params else 'DIFFER'}")  # fmt: skip
    if not (same_losses and same_params):
        sys.exit(1)
    print("bit for bit: OK")
