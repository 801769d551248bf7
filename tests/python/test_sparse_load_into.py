"""Loads of sparse tables into the caller's own structures (docs/SPARSE.md, "Loading into your
own tables"): savepoint.sparse.load_into hands each table to its target's __savepoint_set_table__
in batches, with the delta chain applied; errors; the streaming compaction's parts."""

import os

import numpy as np
import pytest

import savepoint
from savepoint import sparse


class HashTable:
    """A RecIS-style hash table: an id -> row map over preallocated slot storage."""

    def __init__(self, capacity, dim):
        self.index = {}
        self.emb = np.zeros((capacity, dim), np.float32)
        self.step = np.zeros(capacity, np.int64)
        self.batches = []

    def __savepoint_set_table__(self, batch):
        ids = np.asarray(batch.ids)
        self.batches.append(len(ids))
        for k, i in enumerate(ids.tolist()):
            row = self.index.setdefault(i, len(self.index))
            self.emb[row] = np.asarray(batch.slots["embedding"][k])
            if "step" in batch.slots:
                self.step[row] = int(batch.slots["step"][k])

    def rows(self):
        return {i: (self.emb[r].tolist(), int(self.step[r])) for i, r in self.index.items()}


def _rows(t):
    emb, step = np.asarray(t.slots["embedding"]), np.asarray(t.slots["step"])
    return {int(i): (emb[k].tolist(), int(step[k])) for k, i in enumerate(np.asarray(t.ids))}


@pytest.fixture
def chain(tmp_path):
    """A full save and a delta (updates, inserts, deletions) of table "emb", plus table "small"."""
    seed = int(np.random.SeedSequence().entropy % 2**32)
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    n, dim = 6000, 8
    ids = rng.choice(2**40, size=n, replace=False).astype(np.int64) - 2**39
    emb = rng.standard_normal((n, dim)).astype(np.float32)
    table = sparse.SparseTable(ids, {"embedding": emb, "step": np.zeros(n, np.int64)})
    small = sparse.SparseTable(np.array([3, 5], np.int64),
                               {"embedding": np.ones((2, dim), np.float32),
                                "step": np.zeros(2, np.int64)})  # fmt: skip
    savepoint.save({"emb": table, "small": small, "w": np.ones(3)}, tmp_path / "base")
    tracker = sparse.DirtyTracker()
    emb[:50] += 1
    table.slots["step"][:50] = 1
    tracker.touch(ids[:50])
    tracker.delete(ids[50:80])
    delta = tracker.delta(table)
    savepoint.save({"emb": delta, "w": np.ones(3)}, tmp_path / "d1", base=tmp_path / "base")
    return tmp_path / "d1"


def test_load_into_fills_the_targets_batch_by_batch(chain):
    want = _rows(sparse.load_tables(chain)["emb"])
    target, small = HashTable(8000, 8), HashTable(4, 8)
    rows = sparse.load_into(chain, {"emb": target, "small": small}, batch_bytes=16 << 10)
    assert rows == {"emb": len(want), "small": 2}
    assert len(target.batches) > 4 and sum(target.batches) == len(want)
    assert target.rows() == want
    assert sorted(small.index) == [3, 5]


def test_load_into_a_shard_some_slots_as_torch(chain):
    torch = pytest.importorskip("torch")
    got = {}

    class Target:
        def __savepoint_set_table__(self, batch):
            assert isinstance(batch.ids, torch.Tensor)
            assert set(batch.slots) == {"embedding"}
            got.update(zip(batch.ids.tolist(), batch.slots["embedding"].tolist()))

    sparse.load_into(chain, {"emb": Target()}, slots="embedding", shard_id=1, shard_num=3,
                     framework="pt", batch_bytes=4096)  # fmt: skip
    shard = sparse.load_tables(chain, shard_id=1, shard_num=3)["emb"]
    assert got == {int(i): e.tolist() for i, e in zip(shard.ids, shard.slots["embedding"])}
    lo, hi = sparse.gen_slice(1, 3)
    assert all(lo <= i % 65536 < hi for i in got)


def test_load_into_errors(chain):
    with pytest.raises(TypeError, match="table 'emb'"):
        sparse.load_into(chain, {"emb": object()})
    with pytest.raises(savepoint.NotFoundError, match='no table matches "nope"'):
        sparse.load_into(chain, {"nope": HashTable(1, 8)})

    class Full:
        calls = 0

        def __savepoint_set_table__(self, batch):
            Full.calls += 1
            raise MemoryError("the hash table is full")

    with pytest.raises(savepoint.NotFoundError, match="no table 'em\\*'"):
        sparse.load_into(chain, {"em*": HashTable(1, 8)})  # a glob matching others names none
    assert sparse.load_into(chain, {}) == {}
    with pytest.raises(savepoint.InvalidArgumentError, match="batch_bytes=-1"):
        sparse.compact(chain, chain.parent / "x", batch_bytes=-1)

    with pytest.raises(MemoryError, match="the hash table is full"):
        sparse.load_into(chain, {"emb": Full()}, batch_bytes=4096)
    assert Full.calls == 1  # the first error stops the load


def test_compaction_in_parts_loads_as_the_chain(chain, tmp_path):
    want = savepoint.load(chain)
    stats = sparse.compact(chain, tmp_path / "full", batch_bytes=32 << 10)
    assert stats["bytes"] > 0
    data = [f for f in os.listdir(tmp_path / "full") if f.startswith("data-")]
    assert len(data) > 2
    got = savepoint.load(tmp_path / "full")
    assert set(got) == set(want) and _rows(got["emb"]) == _rows(want["emb"])
    assert np.array_equal(got["w"], want["w"])
    assert [link["depth"] for link in sparse.chain(tmp_path / "full")] == [0]
