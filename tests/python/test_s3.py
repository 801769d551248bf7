"""Checkpoints at s3:// URIs from Python, against a real S3 server (SeaweedFS on 127.0.0.1, started
once for this file by tests/s3/seaweed.py), with s5cmd as the reference client: what s5cmd copies
into a bucket loads, and what savepoint writes there s5cmd copies out as a valid checkpoint."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import savepoint
import savepoint.failover

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "s3"))
from seaweed import Seaweed  # noqa: E402

from conftest import assert_same, find_cli, run_python  # noqa: E402


@pytest.fixture(scope="module")
def s3():
    with Seaweed() as server:
        # The default file system reads its S3 settings from the environment on first use.
        os.environ.update(server.env)
        yield server


def _state(seed):
    g = torch.Generator().manual_seed(seed)
    return {
        "model": {"w": torch.randn(64, 33, generator=g).to(torch.bfloat16),
                  "b": torch.randn(33, generator=g), "ids": torch.arange(7, dtype=torch.int64)},
        "step": seed, "lr": 3e-4, "name": "run-s3",
    }


def test_save_load_verify_info_at_an_s3_uri(s3, seed):
    uri = f"s3://{s3.bucket}/py/step-{seed}"
    state = _state(seed)
    savepoint.save(state, uri)
    assert_same(state, savepoint.load(uri))
    savepoint.verify(uri)
    assert {t["name"] for t in savepoint.info(uri)["tensors"]} == {"model.w", "model.b",
                                                                   "model.ids"}
    listed = s3.s5cmd("ls", f"{uri}/*").stdout
    assert "MANIFEST" in listed and "data-00000-00000.spd" in listed
    with pytest.raises(savepoint.AlreadyExistsError, match="already exists"):
        savepoint.save(state, uri)


def test_checkpoints_move_between_disk_and_bucket_with_s5cmd(s3, tmp_path, seed):
    state = _state(seed + 1)
    local = tmp_path / "local"
    savepoint.save(state, local)
    s3.s5cmd("cp", f"{local}/*", f"s3://{s3.bucket}/copied-in/")
    assert_same(state, savepoint.load(f"s3://{s3.bucket}/copied-in"))

    savepoint.save(state, f"s3://{s3.bucket}/written")
    s3.s5cmd("cp", f"s3://{s3.bucket}/written/*", f"{tmp_path}/copied-out/")
    assert_same(state, savepoint.load(tmp_path / "copied-out"))


def test_bad_uris_and_foreign_objects_are_typed_errors(s3):
    with pytest.raises(savepoint.InvalidArgumentError, match='"gs"'):
        savepoint.save({"x": torch.zeros(2)}, "gs://bucket/run")
    with pytest.raises(savepoint.InvalidArgumentError, match="s3:// URI"):
        savepoint.save({"x": torch.zeros(2)}, f"s3://{s3.bucket}/a//b")
    with pytest.raises(savepoint.NotFoundError, match="no-such-bucket"):
        savepoint.load("s3://no-such-bucket/run")
    s3.s5cmd("cp", __file__, f"s3://{s3.bucket}/theirs/notes.py")
    with pytest.raises(savepoint.FailedPreconditionError, match="notes.py"):
        savepoint.save({"x": torch.zeros(2)}, f"s3://{s3.bucket}/theirs")
    assert "notes.py" in s3.s5cmd("ls", f"s3://{s3.bucket}/theirs/*").stdout


def test_a_damaged_object_is_a_corruption_error_naming_it(s3, tmp_path):
    uri = f"s3://{s3.bucket}/damaged"
    savepoint.save({"w": torch.arange(4096, dtype=torch.float32)}, uri)
    s3.s5cmd("cp", f"{uri}/data-00000-00000.spd", f"{tmp_path}/d.spd")
    raw = bytearray((tmp_path / "d.spd").read_bytes())
    raw[-100] ^= 0xFF
    (tmp_path / "d.spd").write_bytes(bytes(raw))
    s3.s5cmd("cp", f"{tmp_path}/d.spd", f"{uri}/data-00000-00000.spd")
    with pytest.raises(savepoint.CorruptCheckpointError, match="data-00000-00000.spd"):
        savepoint.load(uri)


def test_manager_saves_retires_and_restores_in_a_bucket(s3):
    root = f"s3://{s3.bucket}/managed"
    with savepoint.CheckpointManager(root, keep_last_n=2) as mgr:
        for step in range(1, 5):
            assert mgr.save(step, _state(step))
        assert mgr.all_steps() == [3, 4]
        assert_same(_state(4), mgr.restore())
        assert_same(_state(3), mgr.restore(step=3))
    listed = s3.s5cmd("ls", f"{root}/*").stdout
    assert "ckpt-1_1/" not in listed and "ckpt-1_2/" not in listed, listed
    with savepoint.CheckpointManager(root) as mgr:  # reopened: the index is in the bucket
        assert mgr.all_steps() == [3, 4]
        assert_same(_state(4), mgr.restore())


def test_cli_lists_inspects_and_verifies_in_a_bucket(s3, savepoint_cli):
    root = f"s3://{s3.bucket}/cli"
    savepoint.save(_state(5), f"{root}/step-5")
    env = dict(os.environ, **s3.env)

    def cli(*args):
        r = subprocess.run([savepoint_cli, *args], env=env, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stdout

    assert "step-5" in cli("ls", root)
    assert "model.w" in cli("inspect", f"{root}/step-5")
    cli("verify", f"{root}/step-5")
    # cp: disk -> bucket -> disk, each copy committed whole; s5cmd sees the uploaded objects.
    cli("cp", f"{root}/step-5", f"{root}/copy-5")
    assert "MANIFEST" in s3.s5cmd("ls", f"{root}/copy-5/*").stdout
    assert_same(_state(5), savepoint.load(f"{root}/copy-5"))


def test_cli_cp_between_disk_and_bucket(s3, savepoint_cli, tmp_path):
    state = _state(11)
    savepoint.save(state, tmp_path / "local")
    env = dict(os.environ, **s3.env)
    up = f"s3://{s3.bucket}/cp/up"

    def cli(*args, ok=True):
        r = subprocess.run([savepoint_cli, *args], env=env, capture_output=True, text=True,
                           timeout=120)
        assert (r.returncode == 0) == ok, r.stderr
        return r

    assert "copied" in cli("cp", str(tmp_path / "local"), up).stdout
    assert_same(state, savepoint.load(up))
    cli("cp", up, str(tmp_path / "down"))
    assert_same(state, savepoint.load(tmp_path / "down"))
    again = cli("cp", str(tmp_path / "local"), up, ok=False)
    assert "already exists" in again.stderr


def test_manager_uploads_to_a_bucket_and_a_new_node_resumes_from_it(s3, tmp_path):
    remote = f"s3://{s3.bucket}/tiered"
    options = {"keep_last_n": 0, "keep_every_n_steps": 2}  # the newest, and every even step
    with savepoint.CheckpointManager(tmp_path / "node1", keep_last_n=1, remote=remote,
                                     remote_options=options) as mgr:
        for step in range(1, 6):
            assert mgr.save(step, _state(step))
        mgr.wait()
        assert [r["step"] for r in mgr.remote_checkpoints()] == [2, 4, 5]
        assert mgr.all_steps() == [2, 4, 5]  # local: the newest only; the rest remote
        assert sorted(os.listdir(tmp_path / "node1"))[0] == "ckpt-1_5"  # then the index
        assert_same(_state(4), mgr.restore(step=4))  # from the bucket
        uploads = [s for s in mgr.stats() if s["action"] == "checkpoint_upload"]
        assert len(uploads) == 5 and all(s["bytes"] > 0 for s in uploads)
    listed = s3.s5cmd("ls", f"{remote}/*").stdout
    assert "ckpt-1_1/" not in listed and "ckpt-1_4/" in listed, listed
    # A second node with an empty disk: it resumes from the bucket, then saves locally again.
    before = savepoint._core.s3_requests()
    with savepoint.CheckpointManager(tmp_path / "node2", remote=remote) as mgr:
        assert mgr.latest_step() == 5
        assert_same(_state(5), mgr.restore())
        after = savepoint._core.s3_requests()
        assert after["list"] == before["list"], "the index object, the MANIFEST, the data: no LIST"
        assert after["get"] > before["get"]
        assert mgr.save(6, _state(6))
    with pytest.raises(savepoint.InvalidArgumentError, match="remote"):
        savepoint.CheckpointManager(tmp_path / "x", remote=tmp_path / "x" / "inside")
    with pytest.raises(TypeError, match="keep_lats_n"):
        savepoint.CheckpointManager(tmp_path / "y", remote=remote,
                                    remote_options={"keep_lats_n": 1})


def test_dcp_saves_into_and_loads_from_a_bucket(s3):
    import warnings

    import torch.distributed.checkpoint as dcp

    import savepoint.torch as spt

    uri = f"s3://{s3.bucket}/dcp/step-3"
    state = {"model": {"w": torch.randn(40, 9), "b": torch.arange(9, dtype=torch.int32)},
             "step": 3}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(state, storage_writer=spt.StorageWriter(uri, overwrite=False))
        out = {"model": {"w": torch.zeros(40, 9), "b": torch.zeros(9, dtype=torch.int32)},
               "step": 0}
        dcp.load(out, storage_reader=spt.StorageReader(uri))
    assert torch.equal(out["model"]["w"], state["model"]["w"]) and out["step"] == 3
    assert torch.equal(out["model"]["b"], state["model"]["b"])
    assert "MANIFEST" in s3.s5cmd("ls", f"{uri}/*").stdout
    from torch.distributed.checkpoint.api import CheckpointException

    with pytest.raises(CheckpointException, match="Checkpoint already exists and"), \
            warnings.catch_warnings():  # fmt: skip
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(state, storage_writer=spt.StorageWriter(uri, overwrite=False))


def test_dcp_ranks_save_into_a_bucket_and_another_world_reshards(s3, tmp_path):
    """4 gloo ranks dcp.save and dcp.async_save DTensors into a bucket (each rank uploads its own
    objects, one MANIFEST commits); 3 ranks load them into another mesh with ranged reads."""
    root = f"s3://{s3.bucket}/dcp-ranks"
    r = run_python("dcp_ranks.py", "save", 4, root, check=False)
    assert r.returncode == 0, r.stderr[-4000:]
    for name in ("sync", "async"):
        listed = s3.s5cmd("ls", f"{root}/{name}/*").stdout
        assert "MANIFEST" in listed and listed.count(".spd") >= 2, listed
        savepoint.verify(f"{root}/{name}")
    r = run_python("dcp_ranks.py", "load", 3, root, check=False)
    assert r.returncode == 0, r.stderr[-4000:]


def test_an_async_save_streams_into_a_bucket(s3, tmp_path, monkeypatch):
    """save(..., async_=True) at an s3:// URI: the caller is blocked for the copy into staging;
    the background writes the staged chunks into the objects' parts; nothing touches a disk."""
    monkeypatch.chdir(tmp_path)
    uri = f"s3://{s3.bucket}/async/step-1"
    g = torch.Generator().manual_seed(11)
    state = {"w": torch.randn(6 << 20, generator=g), "step": 1}  # 24 MiB: several 16 MiB parts
    future = savepoint.save(state, uri, async_=True)
    stats = future.result()
    assert 0 < stats["blocked_seconds"] < stats["seconds"], stats
    assert stats["bytes"] >= state["w"].nbytes
    assert os.listdir(tmp_path) == []  # no local directory named after the URI
    assert_same(state, savepoint.load(uri))
    with pytest.raises(savepoint.AlreadyExistsError):
        savepoint.save(state, uri, async_=True).result()


@pytest.mark.skipif(not savepoint.failover.available() or find_cli() is None,
                    reason="no failover agent (gRPC) or no savepoint CLI in this build")
def test_a_failure_dump_is_committed_into_the_bucket(s3, tmp_path):
    """A rank SIGKILLed under `savepoint controller --dir s3://...`: the survivors' dump of the
    last consistent step is committed in the bucket (MANIFEST last), where a manager finds it."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import failover_job
    from test_failover import RANK, TOKEN

    root = f"s3://{s3.bucket}/dumps"
    ctl, address = failover_job.start_controller(find_cli(), tmp_path, 3, TOKEN, dump_dir=root)
    ranks = failover_job.start_ranks(tmp_path, RANK, address, TOKEN, 3, 3000)
    out, err, errs = failover_job.kill_after(ctl, ranks, tmp_path, 1)
    outcome = json.loads(out)
    assert outcome["dumped"], (out, err, errs)
    n = outcome["dump_step"]
    assert outcome["dump_path"] == f"{root}/ckpt-1_{n}_failover", out
    dump = savepoint.load(outcome["dump_path"])
    assert dump["step"] == n and dump["loader"] == {"position": n}
    own = savepoint.load(tmp_path / f"rank{outcome['writers'][0]}")
    np.testing.assert_array_equal(dump["w"], own["w"])
    with savepoint.CheckpointManager(root) as m:
        assert m.latest_step() == n


def test_a_node_killed_while_uploading_leaves_the_remote_consistent(s3, tmp_path, seed):
    import random
    import signal
    import time

    rng = random.Random(seed)
    remote = f"s3://{s3.bucket}/killed-{seed}"
    helper = os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers", "tier_trainer.py")
    child = subprocess.Popen([sys.executable, helper, str(tmp_path / "node1"), remote],
                             stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(rng.randint(2, 5)):
            assert child.stdout.readline(), "the trainer died"
        time.sleep(rng.uniform(0, 0.5))
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    # A new node: every remote checkpoint it finds is whole; it resumes from the newest one.
    with savepoint.CheckpointManager(tmp_path / "node2", remote=remote,
                                     remote_options={"keep_last_n": 3}) as mgr:
        records = mgr.remote_checkpoints()
        for r in records:
            savepoint.verify(r["path"])
        if records:
            latest = mgr.latest_step()
            back = mgr.restore()
            assert back["step"] == latest and back["w"][0] == latest
        else:
            latest = 0
        # Training goes on under the same names; uploads of names an interrupted upload left
        # objects under go through.
        state = {"w": np.zeros(16, dtype=np.float32), "step": 0}
        for step in range(latest + 1, latest + 4):
            state["step"] = step
            assert mgr.save(step, state)
        mgr.wait()
        assert [r["step"] for r in mgr.remote_checkpoints()][-1] == latest + 3
