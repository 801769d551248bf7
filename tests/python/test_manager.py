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


# ----------------------------------------------------------------------------- options


def test_unknown_option_raises_type_error_with_suggestion(tmp_path):
    with pytest.raises(TypeError, match=r"'keep_lats_n'.*did you mean 'keep_last_n'"):
        savepoint.CheckpointManager(tmp_path / "a", keep_lats_n=3)
    with pytest.raises(TypeError, match=r"'exception_sav'.*did you mean 'exception_save'"):
        savepoint.CheckpointManager(tmp_path / "a", exception_sav=True)
    with pytest.raises(TypeError, match=r"'async'.*did you mean 'async_'"):
        savepoint.CheckpointManager(tmp_path / "a", **{"async": True})
    with pytest.raises(TypeError, match=r"'slab_byte'.*did you mean 'slab_bytes'"):
        savepoint.CheckpointManager(tmp_path / "a", async_=True, async_options={"slab_byte": 1})
    with pytest.raises(TypeError, match="save_interval_steps must be an int"):
        savepoint.CheckpointManager(tmp_path / "a", save_interval_steps="3")
    with pytest.raises(TypeError, match="directory"):
        savepoint.CheckpointManager()
    assert not (tmp_path / "a").exists()  # nothing was opened


@pytest.mark.parametrize("kwargs, match", [
    ({"keep_last_n": -1}, "keep_last_n"),
    ({"shard_id": 2, "num_shards": 2}, "shard_id"),
    ({"series": "sideways"}, "series"),
    ({"append_info": ["epochs"]}, "append_info"),
    ({"append_dict": {"x": [1]}}, "append_dict"),
    ({"append_dict": {"step_num": 1}}, "reserved"),
    ({"keep_best_n": 1}, "best_metric"),
    ({"prefix": "a/b"}, "prefix"),
    ({"save_interval_steps": 0, "keep_last_n": 0}, "nothing would ever be saved"),
])  # fmt: skip
def test_bad_option_values_raise_invalid_argument(tmp_path, kwargs, match):
    with pytest.raises(savepoint.InvalidArgumentError, match=match) as e:
        savepoint.CheckpointManager(tmp_path / "a", **kwargs)
    assert isinstance(e.value, ValueError)


def test_options_are_bound_classes_grouped_by_role(tmp_path):
    from savepoint import _core

    o = _core.ManagerOptions()
    assert o.retention.keep_last_n == 5 and o.save_policy.interval_steps == 1  # C++ defaults
    o.retention.keep_last_n = 3  # a group is the options' own, not a copy
    o.async_save.checkpointer.slab_bytes = 1 << 20
    assert o.retention.keep_last_n == 3 and o.async_save.checkpointer.slab_bytes == 1 << 20
    o.storage.cipher = "SM4-CBC"
    assert o.storage.cipher == "SM4-CBC"
    with pytest.raises(savepoint.InvalidArgumentError, match="cipher"):
        o.storage.cipher = "DES"
    o.storage.cipher = "AES-GCM"  # (another cipher needs format="ckpt" and a key)
    o.storage.append_dict = {"lr": 0.5, "run": "r1", "ok": True, "n": 2}
    assert o.storage.append_dict == {"lr": 0.5, "run": "r1", "ok": True, "n": 2}
    assert not o.storage.key and not o.naming.prefix_fn
    o.naming.prefix_fn = lambda step, epoch, step_in_epoch: f"s{step}"
    assert o.naming.prefix_fn
    o.naming.prefix_fn = None
    o.storage.key = None
    assert not o.naming.prefix_fn and not o.storage.key
    with pytest.raises(TypeError):
        o.retention.keep_all = 1  # the field's type, as in C++
    with pytest.raises(savepoint.InvalidArgumentError, match="naming.directory is empty"):
        o.validate()
    o.naming.directory = str(tmp_path)
    o.retention.keep_best_n = 1
    with pytest.raises(savepoint.InvalidArgumentError,
                       match=r"retention.keep_best_n = 1 needs retention.best_metric"):  # fmt: skip
        o.validate()
    o.retention.best_metric = "loss"
    o.validate()


def test_errors_name_the_keywords_not_the_cxx_fields(tmp_path):
    with pytest.raises(savepoint.InvalidArgumentError) as e:
        savepoint.CheckpointManager(tmp_path / "a", keep_best_n=1)
    assert str(e.value) == ("CheckpointManager: keep_best_n = 1 needs best_metric (the metric to "
                            "rank by)")  # fmt: skip
    with pytest.raises(savepoint.InvalidArgumentError) as e:
        savepoint.CheckpointManager(tmp_path / "a", append_dict={"sparse.compact": [1]})
    assert "append_dict" in str(e.value) and "storage." not in str(e.value)
    assert '"sparse.compact"' in str(e.value)  # the user's own name is left as it is


def test_append_info_and_dict_are_stored(tmp_path):
    extra = {"run": "r1", "lr": 0.5, "ok": True}
    with savepoint.CheckpointManager(tmp_path / "ck", steps_per_epoch=3,
                                     append_info=["epoch_num", "step_num"],
                                     append_dict=extra) as mgr:  # fmt: skip
        assert mgr.save(5, _state(5))
        path = mgr.checkpoints()[-1]["path"]
    values = savepoint.info(path)["values"]
    assert values["epoch_num"] == 2 and values["step_num"] == 5
    assert values["run"] == "r1" and values["lr"] == 0.5 and values["ok"] is True


def test_epoch_aware_names(tmp_path):
    with savepoint.CheckpointManager(tmp_path / "ck", steps_per_epoch=4, keep_all=True) as mgr:
        assert mgr.save(6, _state(6))  # derived: epoch 2, step 2 of it
        assert mgr.save(7, _state(7), epoch=5, step_in_epoch=1, epoch_end=True)
        assert mgr.save(8, _state(8), force=True, step_in_epoch=9)
        recs = mgr.checkpoints()
    assert [r["name"] for r in recs] == ["ckpt-2_2", "ckpt-5_1", "ckpt-2_9"]
    assert [(r["epoch"], r["step_in_epoch"], r["epoch_end"]) for r in recs] == [
        (2, 2, False), (5, 1, True), (2, 9, False)]  # fmt: skip


def test_series_continue_and_new(tmp_path):
    d = tmp_path / "ck"
    with savepoint.CheckpointManager(d, keep_all=True) as mgr:
        mgr.save(1, _state(1))
        mgr.save(2, _state(2))
    with savepoint.CheckpointManager(d, keep_all=True) as mgr:  # resumes: same series
        assert mgr.restore()["step"] == 2
        assert not mgr.should_save(2)  # the C++ manager knows it resumed at step 2
        assert mgr.save(3, _state(3)) and mgr.prefix == "ckpt"
    with savepoint.CheckpointManager(d, keep_all=True) as mgr:  # saves without resuming: new run
        assert mgr.save(4, _state(4), force=True) and mgr.prefix == "ckpt_1"
    with savepoint.CheckpointManager(d, keep_all=True, series="new") as mgr:
        mgr.restore(step=3)
        assert mgr.save(5, _state(5)) and mgr.prefix == "ckpt_2"
    with savepoint.CheckpointManager(d, keep_all=True) as mgr:
        assert mgr.resume_from(name="ckpt_1-1_4")["step"] == 4  # continue without loading
        assert mgr.save(6, _state(6), force=True) and mgr.prefix == "ckpt_1"
        names = [r["name"] for r in mgr.checkpoints()]
    assert names == ["ckpt-1_1", "ckpt-1_2", "ckpt-1_3", "ckpt_1-1_4", "ckpt_2-1_5", "ckpt_1-1_6"]


def test_prefix_fn_and_directory_fn(tmp_path):
    def prefix_fn(info):
        if info.step == 2:
            raise ZeroDivisionError("user bug")
        return f"run-e{info.epoch}-s{info.step_in_epoch}"

    with savepoint.CheckpointManager(tmp_path / "a", prefix_fn=prefix_fn, steps_per_epoch=2) as mgr:
        assert mgr.save(1, _state(1))
        with pytest.raises(ZeroDivisionError, match="user bug"):  # propagates as it was
            mgr.save(2, _state(2))
        assert mgr.save(3, _state(3))  # the manager is still usable
        assert [r["name"] for r in mgr.checkpoints()] == ["run-e1-s1", "run-e2-s1"]

    seen = []

    def directory_fn(info):
        seen.append(info)
        return tmp_path / f"part{max(info.epoch, 1)}"

    with savepoint.CheckpointManager(directory_fn=directory_fn, steps_per_epoch=2) as mgr:
        for step in (1, 2, 3):
            assert mgr.save(step, _state(step))
        assert mgr.directory == str(tmp_path / "part2")
    assert seen[0] == savepoint.StepInfo(0, 1, 0)
    def names(d):
        return sorted(p.name for p in d.iterdir() if p.is_dir())

    assert names(tmp_path / "part1") == ["ckpt-1_1", "ckpt-1_2"]
    assert names(tmp_path / "part2") == ["ckpt-2_1"]


def test_async_options(tmp_path):
    opts = {"slab_bytes": 1 << 20, "snapshot_threads": 1,
            "persist_during_snapshot": True, "allow_concurrent_saves": False}  # fmt: skip
    with savepoint.CheckpointManager(tmp_path / "ck", async_=True, staging_bytes=8 << 20,
                                     io_threads=1, async_options=opts) as mgr:  # fmt: skip
        for step in (1, 2, 3):
            assert mgr.save(step, _state(step))
        mgr.wait()
        assert mgr.restore()["step"] == 3
    with pytest.raises(savepoint.InvalidArgumentError, match="slab"):
        savepoint.CheckpointManager(tmp_path / "x", async_=True, async_options={"slab_bytes": 5})
    # One thread count for synchronous and asynchronous saves: the manager's io_threads.
    with pytest.raises(TypeError, match="unknown keyword argument 'io_threads'"):
        savepoint.CheckpointManager(tmp_path / "y", async_=True, async_options={"io_threads": 1})


def test_reserve_stages_before_the_first_save(tmp_path):
    """reserve= / reserve(): staging allocated in the background before the first async save;
    refused (not ignored) where nothing is staged."""
    state = _state(1)
    with savepoint.CheckpointManager(tmp_path / "a", async_=True, staging_bytes=8 << 20,
                                     reserve=state) as mgr:  # fmt: skip
        mgr.reserve(4 << 20)  # (raising the target is fine)
        assert mgr.save(1, state)
        mgr.wait()
        assert mgr.restore()["step"] == 1
        with pytest.raises(savepoint.InvalidArgumentError, match="-1 bytes is negative"):
            mgr.reserve(-1)
        with pytest.raises(TypeError, match="neither a state nor a byte count"):
            mgr.reserve(True)
    with pytest.raises(savepoint.FailedPreconditionError, match="closed"):
        mgr.reserve(1)
    with savepoint.CheckpointManager(tmp_path / "b") as sync:
        with pytest.raises(savepoint.FailedPreconditionError, match="only async native saves"):
            sync.reserve(1 << 20)
    with pytest.raises(savepoint.FailedPreconditionError, match="only async native saves"):
        savepoint.CheckpointManager(tmp_path / "c", async_=True, format="safetensors", reserve=1)
    savepoint.CheckpointManager(tmp_path / "c").close()  # the failed one released the directory
