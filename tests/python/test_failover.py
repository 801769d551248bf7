"""savepoint.failover: Python ranks under a `savepoint controller` (docs/FAILOVER.md, "Python and
PyTorch"). A rank SIGKILLed mid-training gives a dump of the last consistent step equal to the
survivors' state; the survivors get JobStopped; a single rank (no replica) is dumped from its
shared-memory snapshot; a wrong token is refused; a build without gRPC says so. The last test runs examples/failover_ddp.py through scripts/demo-failure --python."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from conftest import find_cli

import savepoint
from savepoint import failover

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tests"))
import failover_job  # noqa: E402
TOKEN = "test-failover-token-0123456789"
needs_agent = pytest.mark.skipif(
    not failover.available() or find_cli() is None,
    reason="no failover agent (gRPC) or no savepoint CLI in this build")

RANK = failover_job.NUMPY_RANK


def start_controller(tmp_path, world, *extra):
    return failover_job.start_controller(find_cli(), tmp_path, world, TOKEN, *extra)


def start_ranks(tmp_path, address, world, steps):
    return failover_job.start_ranks(tmp_path, RANK, address, TOKEN, world, steps)


def test_without_grpc_use_is_unimplemented(monkeypatch):
    monkeypatch.delattr(savepoint._core, "FailoverAgent", raising=False)
    assert not failover.available()
    with pytest.raises(savepoint.UnimplementedError, match="gRPC"):
        failover.Agent(source=dict)


@needs_agent
@pytest.mark.parametrize("victim", [0, 1])
def test_killed_rank_gives_dump_equal_to_survivors(tmp_path, victim):
    world = 3
    ctl, address = start_controller(tmp_path, world)
    ranks = start_ranks(tmp_path, address, world, steps=3000)
    out, err, errs = failover_job.kill_after(ctl, ranks, tmp_path, victim)
    outcome = json.loads(out)
    assert outcome["failed_rank"] == victim and outcome["dumped"], (out, err)
    n = outcome["dump_step"]
    assert os.path.basename(outcome["dump_path"]) == f"ckpt-1_{n}_failover"
    for r, p in enumerate(ranks):
        if r == victim:
            assert p.returncode == -signal.SIGKILL
            continue
        assert p.returncode == 75, errs[r]
        assert "job stopped: rank" in errs[r]
    dump = savepoint.load(outcome["dump_path"])
    assert dump["step"] == n and dump["loader"] == {"position": n}
    for w in outcome["writers"]:
        own = savepoint.load(tmp_path / f"rank{w}")
        assert own["step"] == n
        np.testing.assert_array_equal(dump["w"], own["w"])
        np.testing.assert_array_equal(dump["m"], own["m"])
    # The manager sees the dump as the newest checkpoint.
    m = savepoint.CheckpointManager(str(tmp_path / "ckpt"))
    try:
        assert m.latest_step() == n
    finally:
        m.close()


@needs_agent
def test_single_rank_killed_is_dumped_from_its_snapshot(tmp_path):
    """Data parallel = 1 (one rank, no replica): the dump comes from its shared-memory snapshot."""
    ctl, address = start_controller(tmp_path, 1, "--snapshot-dir", str(tmp_path / "shm"))
    ranks = start_ranks(tmp_path, address, 1, steps=3000)
    out, err, errs = failover_job.kill_after(ctl, ranks, tmp_path, 0, steps=20)
    outcome = json.loads(out)
    assert outcome["dumped"], (out, err, errs)
    assert outcome["writers"] == [] and outcome["snapshot_writers"] == [0], out
    n = outcome["dump_step"]
    assert n >= 19, out  # the last finished step, or the one before when its snapshot was torn
    dump = savepoint.load(outcome["dump_path"])
    assert dump["step"] == n and dump["loader"] == {"position": n}
    w = np.zeros(1000, np.float32)
    m = np.zeros(1000, np.float32)
    for step in range(1, n + 1):  # the rank's updates, replayed
        m[:] = 0.9 * m + np.float32(step % 7)
        w -= np.float32(0.01) * m
    np.testing.assert_array_equal(dump["w"], w)
    np.testing.assert_array_equal(dump["m"], m)
    assert os.listdir(tmp_path / "shm") == []  # the controller gave the memory back


# One rank holding the rows of its own slices of a sparse table beside the data-parallel w:
# after step s, the row of id i is s + i % 97 in every column.
TABLE_RANK = r"""
import os, sys, time
import numpy as np
import savepoint
from savepoint import failover, sparse

out, rank, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
world = int(os.environ["SAVEPOINT_WORLD_SIZE"])
lo, hi = sparse.gen_slice(rank, world)
ids = np.concatenate([np.arange(lo, min(hi, lo + 40)), np.arange(lo, min(hi, lo + 40)) + 65536])
emb = np.zeros((len(ids), 4), np.float32)
w = np.zeros(100, np.float32)
agent = None
state = lambda: {"w": w, "emb": sparse.SparseTable(ids, {"embedding": emb}), "step": agent.step}
agent = failover.Agent(source=state, groups=[list(range(world)), [rank]])
progress = open(f"{out}/progress{rank}", "w")


def arrived(r):  # the step rank r's all-reduce has reached
    try:
        return int(open(f"{out}/arrived{r}").read() or 0)
    except (OSError, ValueError):
        return 0


def all_reduce(step, timeout=3.0):  # the gradients' collective: every rank takes part
    with open(f"{out}/arrived{rank}.tmp", "w") as f:
        f.write(str(step))
    os.replace(f"{out}/arrived{rank}.tmp", f"{out}/arrived{rank}")
    deadline = time.monotonic() + timeout
    while any(arrived(r) < step for r in range(world)):
        if time.monotonic() > deadline:
            agent.collective_failed(RuntimeError(f"all-reduce of step {step}: a peer is gone"))
        time.sleep(0.002)


try:
    for step in range(1, steps + 1):
        all_reduce(step)
        agent.begin_update(step)
        w[:] = step
        emb[:] = (step + ids % 97)[:, None]
        agent.end_update(step)
        progress.write(f"{step}\n")
        progress.flush()
        time.sleep(0.01)
except failover.JobStopped:
    sys.exit(75)
agent.close()
"""


@needs_agent
def test_killed_rank_with_tables_is_dumped_with_every_ranks_rows(tmp_path):
    """Each rank's table rows are its own (the group [rank]): the dead one's come from its
    snapshot, the survivors' from their live state or their snapshots (a survivor a step ahead),
    all as of the dump's step."""
    world = 3
    ctl, address = start_controller(tmp_path, world, "--snapshot-dir", str(tmp_path / "shm"))
    ranks = failover_job.start_ranks(tmp_path, TABLE_RANK, address, TOKEN, world, 3000)
    out, err, errs = failover_job.kill_after(ctl, ranks, tmp_path, 1, steps=10)
    outcome = json.loads(out)
    assert outcome["dumped"], (out, err, errs)
    assert 1 in outcome["snapshot_writers"], out  # the survivors' parts: live or snapshots
    assert sorted(outcome["writers"] + outcome["snapshot_writers"]) == [0, 1, 2], out
    n = outcome["dump_step"]
    dump = savepoint.load(outcome["dump_path"])
    assert dump["step"] == n and (dump["w"] == n).all()
    ids = np.asarray(dump["emb"].ids)
    assert len(ids) == 3 * 80
    np.testing.assert_array_equal(np.asarray(dump["emb"].slots["embedding"])[:, 0], n + ids % 97)


@needs_agent
def test_wrong_token_is_refused(tmp_path):
    ctl, address = start_controller(tmp_path, 1)
    try:
        with pytest.raises(savepoint.SavepointError, match="(?i)unauthenticated|token"):
            failover.Agent(source=dict, controller=address, token="not-the-job-token-at-all",
                           rank=0, world=1, connect_timeout=2)  # fmt: skip
        # The right token is accepted; the job then ends normally.
        with failover.Agent(source=dict, controller=address, token=TOKEN, rank=0, world=1) as a:
            a.begin_update(1)
            a.end_update(1)
            assert a.step == 1 and a.controller_error is None
        out, _ = ctl.communicate(timeout=30)
    finally:
        if ctl.poll() is None:
            ctl.kill()
    outcome = json.loads(out)
    assert not outcome["failure"] and outcome["refused_calls"] >= 1


@needs_agent
def test_bad_settings_name_the_variable(monkeypatch):
    for v in ("SAVEPOINT_CONTROLLER", "SAVEPOINT_JOB_TOKEN"):
        monkeypatch.delenv(v, raising=False)
    with pytest.raises(savepoint.InvalidArgumentError, match="SAVEPOINT_CONTROLLER"):
        failover.Agent(source=dict)
    with pytest.raises(TypeError, match="callable"):
        failover.Agent(source=42)


@needs_agent
def test_ddp_example_killed_dumps_and_resumes_bit_exact():
    torch = pytest.importorskip("torch")
    del torch
    build = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(savepoint.__file__))))
    r = subprocess.run([os.path.join(ROOT, "scripts", "demo-failure"), "--python", "--trials",
                        "1", "--steps", "40", "--build", build], capture_output=True, text=True,
                       timeout=240)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "trials 1, dumps committed 1, resumed bit-exact 1, torn 0" in r.stdout
