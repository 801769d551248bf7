"""savepoint.compact, savepoint.should_compact and sparse_chain's table_bytes (docs/SPARSE.md,
"Compaction"): a chain folded into a full checkpoint equals the chain loaded, survives the chain's
deletion, and bad inputs raise typed errors naming the checkpoints."""

import shutil

import numpy as np
import pytest

import savepoint


def _table(ids, version, dim=4):
    ids = np.asarray(ids, np.int64)
    emb = (ids[:, None] * 0.5 + version + np.arange(dim)).astype(np.float32)
    return savepoint.SparseTable(ids, {"embedding": emb, "exp_avg": emb * 2,
                                       "step": np.full(len(ids), version, np.int32)})  # fmt: skip


def _chain(root):
    """A full checkpoint and 3 deltas (inserts, updates, deletions); returns the head and the
    full table its chain stands for."""
    ids = np.arange(-50, 950, dtype=np.int64) * 65537
    full = _table(ids, 0)
    savepoint.save({"emb": full, "w": np.zeros(3, np.float32), "step": 0}, root / "c0",
                   metadata={"run": "r"})  # fmt: skip
    rows = {int(i): r for i, r in zip(ids, range(len(ids)))}
    current = dict.fromkeys(rows, 0)  # id -> version of its row
    base = root / "c0"
    for v in (1, 2, 3):
        touched = [int(i) for i in ids[v * 7 :: 13]] + [10**12 + v * 100 + k for k in range(5)]
        deleted = [int(i) for i in ids[v :: 97] if int(i) not in touched]
        for i in touched:
            current[i] = v
        for i in deleted:
            current.pop(i, None)
        delta = _table(touched, v)
        delta = savepoint.SparseTable(delta.ids, delta.slots, np.asarray(deleted, np.int64))
        savepoint.save({"emb": delta, "w": np.full(3, v, np.float32), "step": v}, root / f"c{v}",
                       base=base, metadata={"run": "r", "v": v})  # fmt: skip
        base = root / f"c{v}"
    return base, current


def _rows(t, slot="embedding"):
    return {i: np.asarray(r).tolist() for i, r in t.to_dict(slot).items()}


def test_compacted_chain_equals_the_chain_and_outlives_it(tmp_path):
    head, current = _chain(tmp_path)
    assert [link["depth"] for link in savepoint.sparse_chain(head)] == [3, 2, 1, 0]
    ref = savepoint.load(head)
    stats = savepoint.compact(head, tmp_path / "full", concurrency=2)
    assert stats["bytes"] > 0
    links = savepoint.sparse_chain(tmp_path / "full")
    assert len(links) == 1 and links[0]["depth"] == 0  # a full checkpoint
    assert savepoint.info(tmp_path / "full")["metadata"] == {"run": "r", "v": 3}
    for v in range(4):
        shutil.rmtree(tmp_path / f"c{v}")
    got = savepoint.load(tmp_path / "full")
    assert got["step"] == 3 and got["w"].tolist() == [3, 3, 3]
    assert got["emb"].ids.tolist() == ref["emb"].ids.tolist()
    assert set(got["emb"].ids.tolist()) == set(current)
    for slot in ("embedding", "exp_avg", "step"):
        assert _rows(got["emb"], slot) == _rows(ref["emb"], slot)
    assert {i: int(r) for i, r in got["emb"].to_dict("step").items()} == current
    part = savepoint.load(tmp_path / "full", shard_id=1, shard_num=3)["emb"]
    assert set(part.ids.tolist()) == {i for i in current if 21845 <= (i & 0xFFFF) < 43690}
    savepoint.verify(tmp_path / "full")


def test_compact_overwrite_key_and_compression(tmp_path):
    head, _ = _chain(tmp_path)
    dst = tmp_path / "full"
    savepoint.compact(head, dst)
    with pytest.raises(savepoint.AlreadyExistsError, match="full"):
        savepoint.compact(head, dst)
    savepoint.compact(head, dst, overwrite=True, compression="zstd")
    assert _rows(savepoint.load(dst)["emb"]) == _rows(savepoint.load(head)["emb"])
    key = bytes(range(32))
    savepoint.compact(head, tmp_path / "enc", dst_key=key)
    assert savepoint.info(tmp_path / "enc")["encrypted"]
    with pytest.raises(savepoint.SavepointError):
        savepoint.load(tmp_path / "enc")  # needs the key
    assert _rows(savepoint.load(tmp_path / "enc", key=key)["emb"]) == _rows(
        savepoint.load(head)["emb"])  # fmt: skip
    savepoint.compact(tmp_path / "enc", tmp_path / "plain", key=key, dst_key=None)
    assert not savepoint.info(tmp_path / "plain")["encrypted"]


def test_compact_bad_inputs(tmp_path):
    head, _ = _chain(tmp_path)
    with pytest.raises(savepoint.NotFoundError, match="savepoint.compact.*missing"):
        savepoint.compact(tmp_path / "missing", tmp_path / "out")
    with pytest.raises(savepoint.InvalidArgumentError, match="link of src's chain"):
        savepoint.compact(head, tmp_path / "c1", overwrite=True)  # would break the chain
    savepoint.save({"w": np.zeros(2)}, tmp_path / "dense")
    with pytest.raises(savepoint.InvalidArgumentError, match="no sparse tables"):
        savepoint.compact(tmp_path / "dense", tmp_path / "out")
    with pytest.raises(TypeError):
        savepoint.compact(head, tmp_path / "out", base=head)  # unknown option
    shutil.rmtree(tmp_path / "c1")  # a missing link
    with pytest.raises(savepoint.NotFoundError, match="c1"):
        savepoint.compact(head, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_should_compact_and_table_bytes(tmp_path):
    head, _ = _chain(tmp_path)
    links = savepoint.sparse_chain(head)
    base = links[-1]["table_bytes"]
    assert base == 1000 * (8 + 16 + 16 + 4)  # ids and slot rows, not the slice index
    deltas = sum(link["table_bytes"] for link in links[:-1])
    assert 0 < deltas < base
    assert not savepoint.should_compact(head)
    assert savepoint.should_compact(head, max_depth=2)  # 3 deltas
    assert savepoint.should_compact(head, max_delta_ratio=deltas / base / 2)
    assert not savepoint.should_compact(tmp_path / "c0", max_depth=0)  # a full one never is
