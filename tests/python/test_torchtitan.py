"""savepoint.torchtitan.CheckpointManager: torchtitan 0.3.0's own checkpoint manager, with its
optimizer and LR-scheduler containers, saves savepoint checkpoints (synchronously and with its
"async" mode) on one gloo rank on the CPU and loads the newest back, model, optimizer and schedule
equal; DCP's own step folders still count."""

import os

import pytest

import savepoint
from conftest import run_python


@pytest.mark.parametrize("async_mode", ["disabled", "async"])
def test_torchtitans_checkpointer_saves_and_loads_savepoint_checkpoints(tmp_path, async_mode):
    r = run_python("torchtitan_ckpt.py", tmp_path, async_mode, check=False, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ok ['step-2', 'step-4', 'step-6']" in r.stdout, r.stdout[-2000:]
    for step in ("step-2", "step-4", "step-6"):
        path = tmp_path / "ckpt" / step
        assert (path / "MANIFEST").is_file() and not (path / ".metadata").exists()
        savepoint.verify(path)


def test_newest_step_counts_savepoint_and_dcp_folders(tmp_path):
    import savepoint.torchtitan as stt

    folder = tmp_path / "ckpt"
    for name, marker in (("step-3", "MANIFEST"), ("step-7", ".metadata"), ("step-9", None),
                         ("step-11", "MANIFEST"), ("other-20", "MANIFEST")):  # fmt: skip
        (folder / name).mkdir(parents=True)
        if marker:
            (folder / name / marker).write_text("")
    manager = stt.CheckpointManager.__new__(stt.CheckpointManager)  # (only the folder scan)
    manager.folder = str(folder)
    assert manager._find_load_step() == 11
    os.remove(folder / "step-11" / "MANIFEST")  # an interrupted save is not a checkpoint
    assert manager._find_load_step() == 7
