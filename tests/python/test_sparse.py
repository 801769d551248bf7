"""Sparse embedding tables from Python (docs/SPARSE.md, "Python"): savepoint.SparseTable leaves of
savepoint.save, delta chains (base=), deletions, loads into any number of shards (shard_id /
shard_num and process groups), table / slot filters and renames, bad input, DirtyTracker, and
`savepoint inspect` of a chain."""

import json
import os
import subprocess
import time

import numpy as np
import pytest

import savepoint
from conftest import find_cli


def _table(ids, dim=4, seed=0):
    ids = np.asarray(ids, np.int64)
    rng = np.random.default_rng(seed)
    emb = rng.standard_normal((len(ids), dim)).astype(np.float32)
    return savepoint.SparseTable(ids, {"embedding": emb, "exp_avg": emb * 2,
                                       "step": np.arange(len(ids), dtype=np.int32)})  # fmt: skip


def _rows(t, slot="embedding"):
    return {i: np.asarray(r).tolist() for i, r in t.to_dict(slot).items()}


def _storage_order(ids):
    ids = np.asarray(ids)
    return sorted(ids.tolist(), key=lambda i: (i & 0xFFFF, i))


IDS = [5, -1, 3, 70000, 65536 * 3 + 5, -(2**62), 2**62 + 17, 123456789]


def test_round_trip_numpy_beside_dense_and_values(tmp_path):
    t = _table(IDS)
    state = {"emb": t, "dense": {"w": np.ones((2, 3), np.float32)}, "step": 7, "name": "x"}
    savepoint.save(state, tmp_path / "a")
    got = savepoint.load(tmp_path / "a")
    assert set(got) == {"emb", "dense", "step", "name"}
    assert got["step"] == 7 and got["name"] == "x"
    np.testing.assert_array_equal(got["dense"]["w"], np.ones((2, 3), np.float32))
    e = got["emb"]
    assert isinstance(e, savepoint.SparseTable) and len(e) == len(IDS)
    assert e.ids.tolist() == _storage_order(IDS)  # rows in storage order (slice, id)
    assert set(e.slots) == {"embedding", "exp_avg", "step"}
    assert e.slots["step"].dtype == np.int32
    for slot in e.slots:
        assert _rows(e, slot) == _rows(t, slot)


def test_round_trip_torch_and_framework(tmp_path):
    torch = pytest.importorskip("torch")
    ids = torch.tensor(IDS, dtype=torch.int64)
    t = savepoint.SparseTable(ids, {"embedding": torch.randn(len(IDS), 3, dtype=torch.bfloat16)})
    savepoint.save({"emb": t, "w": torch.ones(2)}, tmp_path / "a")
    got = savepoint.load(tmp_path / "a")
    assert isinstance(got["emb"].ids, torch.Tensor)
    assert got["emb"].slots["embedding"].dtype == torch.bfloat16
    want = {int(i): r for i, r in zip(ids, t.slots["embedding"])}
    for i, r in zip(got["emb"].ids.tolist(), got["emb"].slots["embedding"]):
        assert torch.equal(r, want[i])
    assert isinstance(savepoint.load(tmp_path / "a", framework="np")["emb"].ids, np.ndarray)
    t2 = _table([1, 2])
    savepoint.save({"emb": t2}, tmp_path / "b")
    assert isinstance(savepoint.load(tmp_path / "b", framework="pt")["emb"].ids, torch.Tensor)


class HashEmbedding:
    """A user's own table: hands its storage over through __savepoint_table__ (no copy)."""

    def __init__(self, ids, rows):
        self.keys, self.rows = ids, rows

    def __savepoint_table__(self):
        return savepoint.SparseTable(self.keys, {"embedding": self.rows})


def test_protocol_object_is_saved_as_a_table(tmp_path):
    m = HashEmbedding(np.array([4, 9], np.int64), np.eye(2, dtype=np.float32))
    savepoint.save({"model": {"emb": m}}, tmp_path / "a")
    got = savepoint.load(tmp_path / "a")["model"]["emb"]
    assert _rows(got) == {4: [1.0, 0.0], 9: [0.0, 1.0]}

    class Bad:
        def __savepoint_table__(self):
            return {"ids": 1}

    with pytest.raises(TypeError, match="not a savepoint.SparseTable"):
        savepoint.save({"x": Bad()}, tmp_path / "b")


def _reference_chain(tmp_path):
    """A full save and two deltas; returns (paths, reference dict of the head)."""
    ids = np.arange(-50, 150, dtype=np.int64) * 7919
    full = _table(ids, seed=1)
    ref = _rows(full)
    paths = [tmp_path / "step-0", tmp_path / "step-1", tmp_path / "step-2"]
    savepoint.save({"emb": full, "step": 0}, paths[0])
    # delta 1: update 10 rows, insert 5 new ids, delete 7
    upd = _table(np.concatenate([ids[:10], np.arange(1, 6) * -3]), seed=2)
    deleted = ids[100:107]
    d1 = savepoint.SparseTable(upd.ids, upd.slots, deleted=deleted)
    savepoint.save({"emb": d1, "step": 1}, paths[1], base=paths[0])
    ref.update(_rows(upd))
    for i in deleted.tolist():
        del ref[i]
    # delta 2 through the DirtyTracker: re-insert a deleted id, delete an inserted one
    tracker = savepoint.DirtyTracker()
    head = _table(np.array([ids[100], ids[20]]), seed=3)
    tracker.touch([ids[100], ids[20]])
    tracker.delete(np.array([-3]))
    d2 = tracker.delta(head)
    assert d2.deleted.tolist() == [-3] and sorted(d2.ids.tolist()) == sorted([ids[100], ids[20]])
    savepoint.save({"emb": d2, "step": 2}, paths[2], base=paths[1])
    ref.update(_rows(head))
    del ref[-3]
    return paths, ref


def test_delta_chain_applied_with_deletions(tmp_path):
    paths, ref = _reference_chain(tmp_path)
    got = savepoint.load(paths[2])
    assert got["step"] == 2
    assert _rows(got["emb"]) == ref
    assert -3 not in got["emb"].ids.tolist()
    chain = savepoint.sparse_chain(paths[2])
    assert [link["depth"] for link in chain] == [2, 1, 0]
    assert [os.path.basename(link["path"]) for link in chain] == ["step-2", "step-1", "step-0"]
    assert all(len(link["checkpoint_id"]) == 16 for link in chain)
    # a delta holds only its rows (2 here, of 200)
    rows = lambda p: {t["name"].rsplit("/", 1)[-1]: t["shape"][0]  # noqa: E731
                      for t in savepoint.info(p)["tensors"] if "/slot/" in t["name"]}
    assert rows(paths[2]) == {"embedding": 2, "exp_avg": 2, "step": 2}
    assert rows(paths[0]) == {"embedding": 200, "exp_avg": 200, "step": 200}


def test_n_to_m_shards(tmp_path):
    paths, ref = _reference_chain(tmp_path)
    for m in (1, 2, 3, 7):
        union = {}
        for s in range(m):
            part = savepoint.load(paths[2], shard_id=s, shard_num=m)["emb"]
            begin, end = savepoint.gen_slice(s, m)
            assert all(begin <= (i & 0xFFFF) < end for i in part.ids.tolist())
            assert not set(union) & set(_rows(part))
            union.update(_rows(part))
        assert union == ref
    # the same shards through SparseTable.shard
    whole = savepoint.load(paths[2])["emb"]
    shard = savepoint.load(paths[2], shard_id=1, shard_num=3)["emb"]
    assert _rows(whole.shard(1, 3)) == _rows(shard)


def test_filters_rename_and_slot_dtypes(tmp_path):
    savepoint.save({"user": _table([1, 2, 3]), "item": _table([7, 8], seed=4), "w": np.zeros(2)},
                   tmp_path / "a")  # fmt: skip
    got = savepoint.load(tmp_path / "a", tables="user", slots="embedding")
    assert set(got) == {"user", "w"} and set(got["user"].slots) == {"embedding"}
    got = savepoint.load_tables(tmp_path / "a", tables=["it*"], rename={"item": "goods"},
                                slots=["embedding", "exp_*"])  # fmt: skip
    assert set(got) == {"goods"} and set(got["goods"].slots) == {"embedding", "exp_avg"}
    assert _rows(got["goods"]) == _rows(_table([7, 8], seed=4))
    with pytest.raises(savepoint.NotFoundError, match="nope"):
        savepoint.load_tables(tmp_path / "a", tables="nope")
    with pytest.raises(savepoint.InvalidArgumentError, match="embedding"):
        savepoint.load_tables(tmp_path / "a", slot_dtypes={"embedding": np.float16})
    ok = savepoint.load_tables(tmp_path / "a", slot_dtypes={"embedding": "F32", "step": np.int32})
    assert set(ok) == {"user", "item"}
    savepoint.save({"w": np.zeros(2)}, tmp_path / "dense")
    with pytest.raises(savepoint.InvalidArgumentError, match="sparse tables"):
        savepoint.load(tmp_path / "dense", shard_num=2)


def test_bad_inputs(tmp_path):
    with pytest.raises(savepoint.InvalidArgumentError, match="int64"):
        savepoint.SparseTable(np.array([1, 2], np.int32), {"e": np.zeros((2, 1))})
    with pytest.raises(savepoint.InvalidArgumentError, match="1-D"):
        savepoint.SparseTable(np.zeros((2, 2), np.int64), {"e": np.zeros((2, 1))})
    with pytest.raises(savepoint.InvalidArgumentError, match="'exp_avg'.*dim 0 must be the 3 rows"):
        savepoint.SparseTable(np.arange(3), {"e": np.zeros((3, 2)), "exp_avg": np.zeros((2, 2))})
    with pytest.raises(savepoint.InvalidArgumentError, match="slots"):
        savepoint.SparseTable(np.arange(3), {})
    dup = savepoint.SparseTable(np.array([4, 9, 4], np.int64), {"e": np.zeros((3, 2))})
    with pytest.raises(savepoint.InvalidArgumentError, match=r'table "emb".*\b4\b'):
        savepoint.save({"emb": dup}, tmp_path / "dup")
    assert not (tmp_path / "dup").exists()
    both = savepoint.SparseTable(np.array([1], np.int64), {"e": np.zeros((1, 2))},
                                 deleted=np.array([1], np.int64))  # fmt: skip
    savepoint.save({"emb": _table([1, 2])}, tmp_path / "base")
    with pytest.raises(savepoint.InvalidArgumentError, match="both a row and deleted"):
        savepoint.save({"emb": both}, tmp_path / "both", base=tmp_path / "base")
    # a delta whose slot changed dtype, a missing base, deletions in a full save
    other = savepoint.SparseTable(np.array([1], np.int64), {
        "embedding": np.zeros((1, 4), np.float16), "exp_avg": np.zeros((1, 4), np.float32),
        "step": np.zeros(1, np.int32)})  # fmt: skip
    with pytest.raises(savepoint.InvalidArgumentError, match="embedding"):
        savepoint.save({"emb": other}, tmp_path / "d", base=tmp_path / "base")
    with pytest.raises(savepoint.NotFoundError):
        savepoint.save({"emb": _table([1])}, tmp_path / "d", base=tmp_path / "missing")
    with pytest.raises(savepoint.InvalidArgumentError):
        savepoint.save({"emb": both}, tmp_path / "full")
    with pytest.raises(TypeError, match="SparseTable"):  # writers that cannot save tables
        savepoint.save_safetensors({"emb": _table([1])}, tmp_path / "x.safetensors")
    with pytest.raises(savepoint.NotFoundError, match="touched id 99"):
        _table([1, 2]).delta([2, 99])


def test_negative_ids_and_empty_table(tmp_path):
    ids = np.array([-1, -65536, -65537, -(2**63), 2**63 - 1], np.int64)
    t = _table(ids)
    empty = savepoint.SparseTable(np.zeros(0, np.int64), {"e": np.zeros((0, 3), np.float32)})
    savepoint.save({"neg": t, "empty": empty}, tmp_path / "a")
    got = savepoint.load(tmp_path / "a")
    assert _rows(got["neg"]) == _rows(t) and len(got["empty"]) == 0
    assert got["empty"].slots["e"].shape == (0, 3)
    assert (-1 & 0xFFFF) == 65535  # slice of -1, the last shard's
    last = savepoint.load(tmp_path / "a", shard_id=1, shard_num=2)["neg"].ids.tolist()
    assert -1 in last and -65537 in last and -65536 not in last


def test_dirty_tracker():
    d = savepoint.DirtyTracker()
    d.touch(np.array([3, 1, 2]))
    d.delete([2, 5])
    d.touch([5])
    assert d.touched().tolist() == [1, 3, 5] and d.deleted().tolist() == [2]
    d.clear()
    assert d.touched().size == 0 and d.deleted().size == 0
    with pytest.raises(savepoint.InvalidArgumentError):
        d.touch(np.array([1.5]))


def _inspect(cli, path):
    return subprocess.run([cli, "inspect", str(path)], capture_output=True, text=True,
                          check=True).stdout  # fmt: skip


def test_cli_inspect_shows_tables_and_chain(tmp_path, savepoint_cli):
    paths, _ = _reference_chain(tmp_path)
    text = _inspect(savepoint_cli, paths[2])
    assert "sparse tables (delta, depth 2, base step-1" in text
    assert "delta chain (newest first):" in text
    for p in paths:
        assert str(p) in text
    assert "embedding F32 [4]" in text and "[0, 65536)" in text
    j = json.loads(subprocess.run([savepoint_cli, "inspect", "--json", str(paths[2])],
                                  capture_output=True, text=True, check=True).stdout)
    sp = j["sparse"]
    assert sp["depth"] == 2 and sp["base"]["path"] == "step-1"
    assert [link["depth"] for link in sp["chain"]] == [2, 1, 0]
    (emb,) = sp["tables"]
    assert emb["name"] == "emb" and emb["rows"] == 2 and emb["deleted"] == 1
    assert {s["name"]: s["dtype"] for s in emb["slots"]} == {"embedding": "F32", "exp_avg": "F32",
                                                              "step": "I32"}
    assert emb["files"] == [{"file": "data-00000-00000.spd", "slices": [0, 65536], "rows": 2}]
    # a broken chain is shown, not fatal
    import shutil

    shutil.rmtree(paths[0])
    assert "broken:" in _inspect(savepoint_cli, paths[2])
    tree = subprocess.run([savepoint_cli, "inspect", "--tree", str(paths[2])],
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert '"emb": sparse emb' in tree


# ---------------------------------------------------------------------- process groups (gloo)

ALL_IDS = (np.arange(-300, 300, dtype=np.int64) * 40503) ^ 0x5A5A


def _dist_table(ids, version):
    ids = np.asarray(ids, np.int64)
    emb = (ids[:, None] * 1.0 + version + np.arange(3)[None, :]).astype(np.float32)
    return savepoint.SparseTable(ids, {"embedding": emb, "exp_avg": -emb})


def _dist_save(rank, n, path, base, touched, deleted):
    import torch
    import torch.distributed as dist

    whole = _dist_table(ALL_IDS if touched is None else touched, 0 if base is None else 1)
    mine = whole.shard(rank, n)
    if deleted is not None:  # each rank passes the deleted ids it owns
        begin, end = savepoint.gen_slice(rank, n)
        d = np.asarray(deleted, np.int64)
        d = d[((d & 0xFFFF) >= begin) & ((d & 0xFFFF) < end)]
        mine = savepoint.SparseTable(mine.ids, mine.slots, deleted=d)
    state = {"emb": mine, "dense": torch.arange(4.0), "step": 1 if base is None else 2,
             "rng": savepoint.PerRank(torch.tensor([rank]))}
    savepoint.save(state, path, process_group=dist.group.WORLD, base=base, timeout=30)
    return True


def _dist_load(rank, n, path):
    import torch.distributed as dist

    got = savepoint.load(path, process_group=dist.group.WORLD, timeout=30, per_rank="modulo")
    assert got["rng"].tolist() == [rank % 2]
    return (_rows(got["emb"]), got["dense"].tolist(), got["step"], savepoint.gen_slice(rank, n))


def _dist_async(rank, n, full, delta):
    """An async full save, then an async delta on it while it may still run; the caller changes
    its tables (numpy and torch) as soon as each save returns."""
    import torch
    import torch.distributed as dist

    mine = _dist_table(ALL_IDS, 0).shard(rank, n)
    ids, emb = mine.ids.copy(), np.ascontiguousarray(mine.slots["embedding"])
    avg = torch.from_numpy(-emb)
    world = dist.group.WORLD
    f1 = savepoint.save({"emb": savepoint.SparseTable(ids, {"embedding": emb, "exp_avg": avg}),
                         "step": 1}, full, process_group=world, async_=True, timeout=30)
    ids[:] = np.arange(len(ids))  # training goes on: the checkpoint holds the rows saved
    emb[:] = -7.0
    touched = _dist_table(ALL_IDS[::5], 1).shard(rank, n)
    f2 = savepoint.save({"emb": touched, "step": 2}, delta, process_group=world, async_=True,
                        base=full, timeout=30)  # fmt: skip
    touched.slots["embedding"][:] = -9.0
    assert f1.wait(60) and f2.wait(60)
    return type(f2).__name__


def _dist_bad(rank, n, path, kind):
    import torch.distributed as dist

    t = _dist_table(ALL_IDS, 0)  # every id on every rank: not the rows each rank owns
    if kind == "duplicate":  # rank 1 alone has a duplicate id: every rank fails at once
        t = t.shard(rank, n)
        if rank == 1:
            t = savepoint.SparseTable(np.concatenate([t.ids, t.ids[:1]]), {
                k: np.concatenate([v, v[:1]]) for k, v in t.slots.items()})  # fmt: skip
    savepoint.save({"emb": t}, path, process_group=dist.group.WORLD, timeout=30)


def _ok(results):
    for r, res in results.items():
        assert res[0] == "ok", f"rank {r}: {res[1:]}"
    return [results[r][1] for r in sorted(results)]


def _in_fresh_interpreter(tmp_path, scenario):
    """Runs scenario_<scenario>(tmp_path) through helpers/sparse_ranks.py: its ranks are forked
    from a process that has run no torch op yet (forking after the earlier tests of this file ran
    torch's thread pools can hang the children)."""
    pytest.importorskip("torch")
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch without gloo")
    from conftest import run_python

    r = run_python("sparse_ranks.py", tmp_path, scenario, check=False, timeout=240)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout[-4000:] + r.stderr[-8000:]


def test_process_group_2_ranks_save_3_load_with_a_delta(tmp_path):
    _in_fresh_interpreter(tmp_path, "delta")


def test_process_group_async_saves_of_tables(tmp_path):
    _in_fresh_interpreter(tmp_path, "async")


def scenario_async(tmp_path):
    """2 ranks save tables asynchronously (a full save and a delta on it, both in flight); one
    process loads the chain: the rows as they were when each save returned."""
    from test_torch_distributed import run_ranks

    full, delta = str(tmp_path / "full"), str(tmp_path / "delta")
    kinds = _ok(run_ranks(tmp_path, 2, _dist_async, full, delta))
    assert kinds == ["DistributedSaveFuture"] * 2
    want = _rows(_dist_table(ALL_IDS, 0))
    got = savepoint.load(full)
    assert _rows(got["emb"]) == want and got["step"] == 1
    assert _rows(got["emb"], "exp_avg") == {i: [-x for x in r] for i, r in want.items()}
    want.update(_rows(_dist_table(ALL_IDS[::5], 1)))
    got = savepoint.load(delta)
    assert _rows(got["emb"]) == want and got["step"] == 2
    assert len(savepoint.sparse.chain(delta)) == 2


def test_process_group_dtensors_beside_tables(tmp_path):
    _in_fresh_interpreter(tmp_path, "dtensors")


def scenario_delta(tmp_path):
    """2 ranks save a full checkpoint and a delta on it, 3 ranks load each; bad rows fail every
    rank."""
    from test_torch_distributed import run_ranks

    full, delta = str(tmp_path / "full"), str(tmp_path / "delta")
    _ok(run_ranks(tmp_path, 2, _dist_save, full, None, None, None))
    touched = ALL_IDS[::5]
    deleted = np.setdiff1d(ALL_IDS[1::7], touched)
    _ok(run_ranks(tmp_path, 2, _dist_save, delta, full, touched, deleted))
    ref = _rows(_dist_table(ALL_IDS, 0))
    ref.update(_rows(_dist_table(touched, 1)))
    for i in deleted.tolist():
        ref.pop(i, None)
    for path, want, step in ((full, _rows(_dist_table(ALL_IDS, 0)), 1), (delta, ref, 2)):
        union = {}
        for rows, dense, got_step, (begin, end) in _ok(run_ranks(tmp_path, 3, _dist_load, path)):
            assert dense == [0.0, 1.0, 2.0, 3.0] and got_step == step
            assert all(begin <= (i & 0xFFFF) < end for i in rows)
            union.update(rows)
        assert union == want
    # the same chain in one process, and the files of the 2 saving ranks
    assert _rows(savepoint.load(delta)["emb"]) == ref
    assert sorted(f for f in os.listdir(full) if f.endswith(".spd")) == [
        "data-00000-00000.spd", "data-00001-00000.spd"]
    cli = find_cli()
    if cli is not None:  # inspect shows the slice range of each saving rank's file
        j = json.loads(subprocess.run([cli, "inspect", "--json", full], capture_output=True,
                                      text=True, check=True).stdout)  # fmt: skip
        files = j["sparse"]["tables"][0]["files"]
        assert [(f["file"], f["slices"]) for f in files] == [
            ("data-00000-00000.spd", [0, 32768]), ("data-00001-00000.spd", [32768, 65536])]
        assert sum(f["rows"] for f in files) == len(ALL_IDS)
    # rows a rank does not own are refused on every rank, naming the id
    for kind, words in (("not owned", "slice"), ("duplicate", "appears twice")):
        start = time.monotonic()
        results = run_ranks(tmp_path, 2, _dist_bad, str(tmp_path / "bad"), kind)
        assert time.monotonic() - start < 25  # (not the 30 s timeout)
        for r, res in results.items():
            assert res[0] == "error" and res[1] == "InvalidArgumentError", res
        assert words in results[1][2], results[1][2]
        assert not (tmp_path / "bad").exists()


def test_like_is_filled_beside_tables(tmp_path):
    torch = pytest.importorskip("torch")
    w = torch.arange(6.0).reshape(2, 3)
    savepoint.save({"emb": _table([1, 2]), "model": {"w": w}, "a": np.ones(2)}, tmp_path / "a")
    like = {"model": {"w": torch.zeros(2, 3)}, "a": np.zeros(2)}
    got = savepoint.load(tmp_path / "a", like=like)
    assert got["model"]["w"] is like["model"]["w"] and torch.equal(like["model"]["w"], w)
    assert got["a"] is like["a"] and like["a"].tolist() == [1.0, 1.0]
    assert _rows(got["emb"]) == _rows(_table([1, 2]))
    with pytest.raises(savepoint.InvalidArgumentError, match=r"like\['model'\]\['w'\]"):
        savepoint.load(tmp_path / "a", like={"model": {"w": torch.zeros(3, 2)}})
    with pytest.raises(savepoint.NotFoundError, match="nope"):
        savepoint.load(tmp_path / "a", like={"nope": torch.zeros(1)})
    got = savepoint.load(tmp_path / "a", like={"nope": torch.zeros(1)}, strict=False)
    assert "nope" not in got


def _dist_dtensor(rank, n, path, save):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (n,))
    full = torch.arange(24.0).reshape(6, 4)
    if save:
        w = distribute_tensor(full, mesh, [Shard(0)])
        state = {"w": w, "emb": _dist_table(ALL_IDS, 0).shard(rank, n)}
        savepoint.save(state, path, process_group=dist.group.WORLD, timeout=30)
        return True
    like = {"w": distribute_tensor(torch.zeros(6, 4), mesh, [Shard(1)])}
    got = savepoint.load(path, like=like, process_group=dist.group.WORLD, timeout=30)
    assert got["w"] is like["w"]
    assert torch.equal(got["w"].redistribute(placements=[Replicate()]).to_local(), full)
    return _rows(got["emb"])


def scenario_dtensors(tmp_path):
    """2 ranks save a DTensor (Shard(0)) beside a table, 4 ranks load it into Shard(1)."""
    from test_torch_distributed import run_ranks

    path = str(tmp_path / "c")
    _ok(run_ranks(tmp_path, 2, _dist_dtensor, path, True))
    union = {}
    for rows in _ok(run_ranks(tmp_path, 4, _dist_dtensor, path, False)):
        union.update(rows)
    assert union == _rows(_dist_table(ALL_IDS, 0))


def test_table_placed_on_an_unavailable_device_is_a_clear_error(tmp_path):
    """map_location naming a device this process lacks: InvalidArgumentError naming the table."""
    torch = pytest.importorskip("torch")
    table = savepoint.SparseTable(torch.arange(4), {"emb": torch.ones(4, 2)})
    savepoint.save({"t": table}, tmp_path / "c")
    bad = "cuda:63" if torch.cuda.is_available() else "cuda:0"
    with pytest.raises(savepoint.InvalidArgumentError, match="cannot place table 't' on device"):
        savepoint.load(tmp_path / "c", map_location=bad)
