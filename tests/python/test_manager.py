"""savepoint.CheckpointManager from Python: intervals, retention, restore (latest, by step, like=),
async saves, metrics, the directory lock, context manager, and errors as typed exceptions."""

import numpy as np
import pytest
import torch

import savepoint


def _state(step):
    return {"w": torch.full((64, 64), float(step)), "a": np.arange(4) * step, "step": step}


def test_save_interval_retention_and_restore(tmp_path):
    with savepoint.CheckpointManager(tmp_path / "ck", save_interval_steps=2, keep_last_n=2) as mgr:
        assert mgr.latest_step() is None and mgr.all_steps() == []
        saved = [step for step in range(1, 8) if mgr.save(step, _state(step))]
        assert saved == [2, 4, 6]
        assert not mgr.save(6, _state(6), force=True)  # never one step twice
        assert mgr.save(7, _state(7), force=True)
        assert mgr.all_steps() == [6, 7] and mgr.latest_step() == 7
        back = mgr.restore()
        assert back["step"] == 7 and torch.equal(back["w"], _state(7)["w"])
        assert (mgr.restore(step=6)["a"] == _state(6)["a"]).all()
        with pytest.raises(savepoint.NotFoundError, match="no checkpoint at step 2"):
            mgr.restore(step=2)
        names = [c["name"] for c in mgr.checkpoints()]
        assert names == ["ckpt-1_6", "ckpt-1_7"] and mgr.prefix == "ckpt"
        assert [s["action"] for s in mgr.stats()].count("checkpoint_save") == 4
    # Reopened: the index is there; restore into existing tensors in place.
    with savepoint.CheckpointManager(tmp_path / "ck") as mgr:
        assert mgr.all_steps() == [6, 7]
        w = torch.zeros(64, 64)
        back = mgr.restore(like={"w": w})
        assert back["w"] is w and bool((w == 7).all())


def test_async_manager_and_best_metric_retention(tmp_path):
    mgr = savepoint.CheckpointManager(tmp_path / "ck", async_=True, keep_last_n=1, keep_best_n=1,
                                      best_metric="loss", best_mode="min")  # fmt: skip
    losses = {1: 0.5, 2: 0.1, 3: 0.7, 4: 0.9}
    state = _state(0)
    for step, loss in losses.items():
        state["w"].fill_(step)
        assert mgr.save(step, state, metrics={"loss": loss})
    mgr.wait()
    assert mgr.all_steps() == [2, 4]  # the best (0.1) and the newest
    assert bool((mgr.restore(step=2)["w"] == 2).all())
    assert mgr.checkpoints()[0]["metrics"] == {"loss": 0.1}
    mgr.close()
    mgr.close()  # idempotent
    with pytest.raises(savepoint.FailedPreconditionError):
        mgr.save(5, state)


def test_directory_lock_and_bad_options(tmp_path):
    with savepoint.CheckpointManager(tmp_path / "ck"):
        with pytest.raises(savepoint.FailedPreconditionError, match="lock"):
            savepoint.CheckpointManager(tmp_path / "ck")
    with pytest.raises(savepoint.InvalidArgumentError, match="io_threads"):
        savepoint.CheckpointManager(tmp_path / "x", io_threads=0)
    with pytest.raises(savepoint.InvalidArgumentError, match="best_mode"):
        savepoint.CheckpointManager(tmp_path / "y", best_mode="median")
    with pytest.raises(TypeError, match=r"obj\['bad'\]"):
        with savepoint.CheckpointManager(tmp_path / "z") as mgr:
            mgr.save(1, {"bad": object()})
