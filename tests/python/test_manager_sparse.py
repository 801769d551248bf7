"""CheckpointManager with sparse tables: delta saves on the newest checkpoint, restore through the
chain, retention that keeps the bases kept deltas need, and background compaction (docs/SPARSE.md,
"Checkpoint manager")."""

import os

import numpy as np
import pytest

import savepoint


class _Table:
    """A toy hash table: id -> row, with a DirtyTracker like a training loop keeps."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.rows = {}
        self.tracker = savepoint.DirtyTracker()

    def step(self):
        new = self.rng.integers(-(2**40), 2**40, size=20)
        old = list(self.rows)
        upd = [old[i] for i in self.rng.integers(0, len(old), size=10)] if old else []
        for i in list(new) + upd:
            self.rows[int(i)] = self.rng.standard_normal(4).astype(np.float32)
        self.tracker.touch(np.array(list(new) + upd, dtype=np.int64))
        if len(old) > 30:
            gone = [old[i] for i in self.rng.choice(len(old), size=5, replace=False)]
            for i in gone:
                self.rows.pop(i, None)
            self.tracker.delete(np.array(gone, dtype=np.int64))

    def table(self):
        ids = np.array(sorted(self.rows), dtype=np.int64)
        emb = np.stack([self.rows[int(i)] for i in ids]) if len(ids) else np.zeros((0, 4), np.float32)
        return savepoint.SparseTable(ids=ids, slots={"embedding": emb, "exp_avg": emb * 2})

    def state(self, delta):
        t = self.table()
        return {"emb": self.tracker.delta(t) if delta else t, "dense": np.arange(3.0)}


def _rows(state):
    t = state["emb"]
    return {int(i): r.tolist() for i, r in zip(np.asarray(t.ids), np.asarray(t.slots["embedding"]))}


def _ref(table):
    return {i: r.tolist() for i, r in table.rows.items()}


def _names(mgr):
    return [r["name"] for r in mgr._m.all()]


def _depth(mgr, name):
    return savepoint.sparse_chain(os.path.join(mgr._m.directory, name))[0]["depth"]


@pytest.mark.parametrize("async_", [False, True])
def test_deltas_restore_and_retention_keeps_bases(tmp_path, async_):
    t = _Table(seed=1)
    with savepoint.CheckpointManager(tmp_path, keep_last_n=2, compaction=False,
                                     async_=async_) as mgr:  # fmt: skip
        for step in range(1, 7):
            t.step()
            assert mgr.save(step, t.state(delta=step > 1), delta=step > 1)
            t.tracker.clear()
        mgr.wait()  # (an async manager commits the last delta here)
        # keep_last_n=2 keeps steps 5 and 6; their chain needs steps 1-4, so nothing is deleted
        assert [r["step"] for r in mgr._m.all()] == [1, 2, 3, 4, 5, 6]
        assert _depth(mgr, _names(mgr)[-1]) == 5
        assert _rows(mgr.restore()) == _ref(t)
        # two full saves: the old chain is needed by nothing kept, and goes
        for step in (7, 8):
            t.step()
            mgr.save(step, t.state(delta=False))
            t.tracker.clear()
        mgr.wait()
        assert [r["step"] for r in mgr._m.all()] == [7, 8]
        assert sorted(e for e in os.listdir(tmp_path) if e.startswith("ckpt")) == _names(mgr)


def test_reopened_manager_still_keeps_bases(tmp_path):
    t = _Table(seed=2)
    with savepoint.CheckpointManager(tmp_path, keep_last_n=1, compaction=False) as mgr:
        for step in (1, 2):
            t.step()
            mgr.save(step, t.state(delta=step > 1), delta=step > 1)
            t.tracker.clear()
    with savepoint.CheckpointManager(tmp_path, keep_last_n=1, compaction=False) as mgr:
        assert mgr.latest_step() == 2
        t.step()
        mgr.save(3, t.state(delta=True), delta=True)  # the new manager reads the bases back
        assert [r["step"] for r in mgr._m.all()] == [1, 2, 3]
        assert _rows(mgr.restore()) == _ref(t)


@pytest.mark.parametrize("async_", [False, True])
def test_compaction_folds_the_chain_in_the_background(tmp_path, async_):
    t = _Table(seed=3)
    opts = {"max_depth": 2, "max_delta_ratio": 100.0}
    with savepoint.CheckpointManager(tmp_path, keep_last_n=1, compaction=opts,
                                     async_=async_) as mgr:  # fmt: skip
        for step in range(1, 5):
            t.step()
            mgr.save(step, t.state(delta=step > 1), delta=step > 1)
            t.tracker.clear()
        mgr.wait()  # the compaction of step 4's chain (3 deltas > max_depth 2)
        assert [r["step"] for r in mgr._m.all()] == [4]
        assert _depth(mgr, _names(mgr)[0]) == 0
        assert any(s["action"] == "checkpoint_compact" for s in mgr.stats())
        assert _rows(mgr.restore()) == _ref(t)
        t.step()  # the next delta chains on the compacted checkpoint
        mgr.save(5, t.state(delta=True), delta=True)
        mgr.wait()
        assert _depth(mgr, _names(mgr)[-1]) == 1
        assert _rows(mgr.restore()) == _ref(t)


def test_delta_errors(tmp_path):
    t = _Table(seed=4)
    t.step()
    with savepoint.CheckpointManager(tmp_path / "a") as mgr:
        with pytest.raises(savepoint.FailedPreconditionError, match="no committed checkpoint"):
            mgr.save(1, t.state(delta=False), delta=True)
        mgr.save(1, {"dense": np.zeros(2)})  # a base without tables
        with pytest.raises(savepoint.SavepointError, match="ckpt-1_1 holds no sparse tables"):
            mgr.save(2, t.state(delta=False), delta=True)
    with pytest.raises(TypeError, match="max_depth"):
        savepoint.CheckpointManager(tmp_path / "b", compaction={"max_dept": 2})
    with pytest.raises(savepoint.InvalidArgumentError, match="max_delta_ratio"):
        savepoint.CheckpointManager(tmp_path / "c", compaction={"max_delta_ratio": 0})
    with savepoint.CheckpointManager(tmp_path / "d", format="safetensors") as mgr:
        for step, delta in ((1, False), (2, True)):  # tables need the native format
            with pytest.raises(savepoint.InvalidArgumentError, match="emb.*kNative"):
                mgr.save(step, t.state(delta=delta), delta=delta)
        assert mgr.latest_step() is None
