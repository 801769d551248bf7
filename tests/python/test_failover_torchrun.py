"""Failure dumps under a real torchrun (docs/FAILOVER.md, "Launchers and signals"): one trial of
each kind of scripts/failover_torchrun.py with a small state (scripts/demo-failure --launcher
torchrun runs them with 1 GiB per rank, and --trials 10 behind the flag):

- two failures in a row under `torchrun --max-restarts 2` and one `savepoint controller
  --max-restarts 2`: each leaves a dump of the last step although torchrun SIGTERMs the survivors
  at once, and each restarted generation resumes from it at n+1, bit-exact;
- preemption: SIGTERM to torchrun, ranks with --on-signal checkpoint commit the current step and
  go within the grace; the job started again resumes from it;
- grace exceeded: a dump slower than the budget is given up, nothing torn or committed, and
  torchrun's restart resumes from the periodic checkpoint.
The last test runs `python -m savepoint.launch` (the controller and torchrun in one command)."""

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import find_cli

import savepoint
from savepoint import failover

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


@pytest.mark.skipif(not failover.available() or find_cli() is None,
                    reason="no failover agent (gRPC) or no savepoint CLI in this build")
@pytest.mark.parametrize("kind", ["failures", "preempt", "grace"])
def test_torchrun_trial(kind):
    pytest.importorskip("torch")
    package = os.path.dirname(os.path.dirname(os.path.abspath(savepoint.__file__)))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "failover_torchrun.py"),
                        "--cli", find_cli(), "--pythonpath", package, "--kinds", kind,
                        "--state-mb", "16", "--steps", "50"],
                       capture_output=True, text=True, timeout=400)  # fmt: skip
    print(r.stdout)  # the seed and each kill's time
    assert r.returncode == 0, r.stdout + r.stderr
    dumps = {"failures": 2, "preempt": 1, "grace": 0}[kind]
    assert f"trials 1, dumps committed {dumps}, resumed bit-exact 1, torn 0" in r.stdout, r.stdout


@pytest.mark.skipif(not failover.available() or find_cli() is None,
                    reason="no failover agent (gRPC) or no savepoint CLI in this build")
def test_savepoint_launch_protects_torchrun_across_a_restart(tmp_path):
    """`python -m savepoint.launch` starts the controller and torchrun: a killed rank is dumped
    and the restarted generation resumes from the dump."""
    pytest.importorskip("torch")
    package = os.path.dirname(os.path.dirname(os.path.abspath(savepoint.__file__)))
    env = dict(os.environ, SAVEPOINT_CLI=find_cli(), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([package, os.environ.get("PYTHONPATH", "")]))
    env.pop("SAVEPOINT_JOB_TOKEN", None)  # made by savepoint launch
    ckpt, log = tmp_path / "ckpt", str(tmp_path / "loss.{generation}.{rank}")
    job = subprocess.Popen(
        [sys.executable, "-m", "savepoint.launch", "--dump-dir", str(ckpt), "--standalone",
         "--nproc-per-node", "2", "--max-restarts", "1", "--monitor-interval", "0.1",
         os.path.join(ROOT, "examples", "failover_ddp.py"), "--dir", str(ckpt), "--steps", "40",
         "--save-every", "0", "--loss-log", log],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)  # fmt: skip
    try:
        first = tmp_path / "loss.0.1"
        deadline = time.monotonic() + 120
        while not (first.exists() and len(first.read_text().splitlines()) >= 6):
            assert job.poll() is None and time.monotonic() < deadline, "the job did not train"
            time.sleep(0.01)
        os.kill(int((tmp_path / "loss.0.1.pid").read_text()), signal.SIGKILL)
        out, _ = job.communicate(timeout=240)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == 0, out
    dumps = [n for n in os.listdir(ckpt) if n.endswith("_failover")]
    assert len(dumps) == 1, (dumps, out)
    n = int(dumps[0].split("_")[1])
    for r in range(2):
        steps = [int(line.split()[1]) for line in open(tmp_path / f"loss.1.{r}")]
        assert steps[0] == n + 1 and steps[-1] == 40, (r, steps[:3], out)
