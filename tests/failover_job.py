"""Shared by the Python failover tests (tests/python/test_failover.py and, under MindSpore's venv,
tests/mindspore/test_failover_dump.py): a `savepoint controller` and rank processes running a
rank script, as a launcher would start them (docs/FAILOVER.md, "Launching")."""

import os
import signal
import subprocess
import sys
import time


# One rank: numpy state updated between begin_update and end_update; stopped, it saves its own
# state (as of its last finished step) to <out>/rank<r> and exits 75. Environment: SIGNALS and
# BUDGET (the agent's signals= and signal_budget=), SLOW_SOURCE (seconds the dump source sleeps
# first). A KeyboardInterrupt (SIGINT acting) exits 130.
NUMPY_RANK = r"""
import os, sys, time
import numpy as np
import savepoint
from savepoint import failover

out, rank, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
w = np.zeros(1000, np.float32)
m = np.zeros(1000, np.float32)
agent = None
state = lambda: {"w": w, "m": m, "step": agent.step, "loader": {"position": agent.step}}
slow = float(os.environ.get("SLOW_SOURCE", "0"))

def source():
    time.sleep(slow)
    return state()

agent = failover.Agent(source=source, signals=os.environ.get("SIGNALS", "defer"),
                       signal_budget=float(os.environ.get("BUDGET", "25")))
progress = open(f"{out}/progress{rank}", "w")
try:
    for step in range(1, steps + 1):
        agent.begin_update(step)
        m[:] = 0.9 * m + np.float32(step % 7)
        w -= np.float32(0.01) * m
        agent.end_update(step)
        progress.write(f"{step}\n")
        progress.flush()
        time.sleep(0.01)
except failover.JobStopped as e:
    savepoint.save(state(), f"{out}/rank{rank}")
    print("stopped:", e.reason, file=sys.stderr)
    sys.exit(75)
except KeyboardInterrupt:
    print("KeyboardInterrupt at step", agent.step, file=sys.stderr)
    sys.exit(130)
agent.close()
"""


def start_controller(cli, tmp_path, world, token, *extra, dump_dir=None):
    """Starts `cli controller` for `world` ranks dumping into `dump_dir` (default tmp_path/ckpt;
    its --json outcome on stdout); returns the process and the controller's address."""
    port_file = tmp_path / "port"
    dump_dir = dump_dir or str(tmp_path / "ckpt")
    proc = subprocess.Popen([cli, "controller", "--world", str(world), *extra, "--dir",
                             dump_dir, "--port-file", str(port_file), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, SAVEPOINT_JOB_TOKEN=token))  # fmt: skip
    deadline = time.monotonic() + 10
    while not (port_file.exists() and port_file.read_text().strip()):
        assert time.monotonic() < deadline and proc.poll() is None, "the controller did not start"
        time.sleep(0.01)
    return proc, f"127.0.0.1:{port_file.read_text().strip()}"


def start_ranks(tmp_path, script_text, address, token, world, *args):
    """Starts `world` ranks of this Python running `script_text` with arguments tmp_path, the
    rank and `args`, each with the controller's address and the token in its environment."""
    script = tmp_path / "rank.py"
    script.write_text(script_text)
    procs = []
    for r in range(world):
        env = dict(os.environ, SAVEPOINT_CONTROLLER=address, SAVEPOINT_JOB_TOKEN=token,
                   SAVEPOINT_RANK=str(r), SAVEPOINT_WORLD_SIZE=str(world))  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, str(script), str(tmp_path), str(r),
                                       *map(str, args)], stderr=subprocess.PIPE, text=True,
                                      env=env))  # fmt: skip
    return procs


def progress(tmp_path, rank):
    """How many steps rank `rank` logged to tmp_path/progress<rank>."""
    p = tmp_path / f"progress{rank}"
    return len(p.read_text().split()) if p.exists() else 0


def kill_after(ctl, ranks, tmp_path, victim, steps=5, timeout=60):
    """SIGKILLs rank `victim` once it logged `steps` steps, then waits for the controller and the
    ranks (any still running at the end is killed). Returns the controller's stdout and stderr,
    and every rank's stderr."""
    try:
        deadline = time.monotonic() + timeout
        while progress(tmp_path, victim) < steps:
            assert time.monotonic() < deadline, "the ranks did not train"
            assert all(p.poll() is None for p in ranks), "a rank exited before the kill"
            time.sleep(0.005)
        ranks[victim].send_signal(signal.SIGKILL)
        out, err = ctl.communicate(timeout=30)
        errs = [p.communicate(timeout=30)[1] for p in ranks]
    finally:
        for p in [ctl, *ranks]:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out, err, errs
