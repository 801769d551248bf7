"""Asynchronous saves of sparse tables (docs/SPARSE.md, "Python"): savepoint.save(async_=True) and
AsyncCheckpointer.save return once the tables' rows are staged, so the caller may change them
right away (a large hash-ordered table copied as its rows lie, sorted in the background); delta
chains of async saves; ids that appear twice. Process groups: tests/python/test_sparse.py."""

import numpy as np
import pytest

import savepoint


def _table(rng, n, dim=16):
    ids = rng.choice(2**40, size=n, replace=False).astype(np.int64) - 2**39
    emb = rng.standard_normal((n, dim)).astype(np.float32)
    return savepoint.SparseTable(ids, {"embedding": emb, "step": np.arange(n, dtype=np.int64)})


def _rows(t):
    emb = np.asarray(t.slots["embedding"])
    step = np.asarray(t.slots["step"])
    return {int(i): (emb[k].tolist(), int(step[k])) for k, i in enumerate(np.asarray(t.ids))}


@pytest.fixture
def rng():
    seed = int(np.random.SeedSequence().entropy % 2**32)
    print(f"seed {seed}")
    return np.random.default_rng(seed)


def test_save_async_stages_the_rows_before_returning(tmp_path, rng):
    t = _table(rng, 30000)  # the embedding slot (1.8 MiB) is gathered into the slabs
    want = _rows(t)
    fut = savepoint.save({"emb": t, "dense": np.ones(4), "step": 3}, tmp_path / "a", async_=True)
    t.slots["embedding"][:] = -1.0  # training goes on: the save has its own copy
    t.slots["step"][:] = -1
    assert fut.result()["bytes"] > 0
    got = savepoint.load(tmp_path / "a")
    assert got["step"] == 3 and _rows(got["emb"]) == want


def test_async_delta_chain_through_a_checkpointer(tmp_path, rng):
    t = _table(rng, 5000)
    ref = _rows(t)
    tracker = savepoint.DirtyTracker()
    with savepoint.AsyncCheckpointer(slab_bytes=1 << 20, direct_io=False) as ckpt:
        ckpt.save({"emb": t}, tmp_path / "0")
        for step in (1, 2, 3):
            ids = np.asarray(t.ids)
            touched = rng.choice(ids, size=50, replace=False)
            pos = {int(i): k for k, i in enumerate(ids)}
            for i in touched:
                t.slots["embedding"][pos[int(i)]] = step
                t.slots["step"][pos[int(i)]] = step
                ref[int(i)] = ([float(step)] * 16, step)
            tracker.touch(touched)
            gone = [int(i) for i in touched[:3]]
            tracker.delete(np.array(gone, np.int64))
            for i in gone:
                ref.pop(i)
            # the base is the save before, still in flight: the checkpointer waits for it first
            ckpt.save({"emb": tracker.delta(t)}, tmp_path / str(step), base=tmp_path / str(step - 1))
            tracker.clear()
        ckpt.wait()
    assert [link["depth"] for link in savepoint.sparse_chain(tmp_path / "3")] == [3, 2, 1, 0]
    assert _rows(savepoint.load(tmp_path / "3")["emb"]) == ref


def test_large_hash_ordered_table_is_staged_and_sorted_after_save_returns(tmp_path, rng):
    t = _table(rng, 140000)  # ids of 1.1 MB: copied as they lie, sorted in the background
    want = _rows(t)
    ck = savepoint.AsyncCheckpointer()
    try:
        fut = ck.save({"emb": t}, tmp_path / "a")
        t.ids[:] = np.arange(len(t.ids))  # ids, rows: all changed while the save sorts its copy
        t.slots["embedding"][:] = -1.0
        fut.wait()
    finally:
        ck.close()
    assert _rows(savepoint.load(tmp_path / "a")["emb"]) == want


def test_an_id_twice_is_refused_by_save_or_its_future(tmp_path, rng):
    for n, where in ((1000, "save"), (140000, "future")):  # sorted now / staged, sorted later
        t = _table(rng, n)
        t.ids[n - 1] = t.ids[3]
        with pytest.raises(savepoint.InvalidArgumentError, match=f"id {t.ids[3]} appears twice"):
            fut = savepoint.save({"emb": t}, tmp_path / where, async_=True)
            assert where == "future", "the small table's duplicate is found before save() returns"
            fut.wait()
        assert not (tmp_path / where).exists()


def test_async_errors(tmp_path, rng):
    t = _table(rng, 10)
    with pytest.raises(savepoint.NotFoundError):
        savepoint.save({"emb": t}, tmp_path / "d", async_=True, base=tmp_path / "missing")
    with pytest.raises(savepoint.InvalidArgumentError, match="chunk_bytes"):
        savepoint.save({"emb": t}, tmp_path / "c", async_=True, chunk_bytes=1 << 20)
    assert not (tmp_path / "d").exists() and not (tmp_path / "c").exists()
