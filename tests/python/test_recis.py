"""savepoint.recis: RecIS's Saver / CheckpointManager interface over savepoint checkpoints (docs/
SPARSE.md, "RecIS integration"): save and load of tables, dense parameters, extra objects and IO
states; load_conf categories; the `checkpoint` list and max_keep; restore of the newest or a given
step; model banks; a 2-worker save loaded by 3 workers; and incremental saves (deltas from the
tables' dirty trackers, compaction by full saves, retention of the bases listed checkpoints
need)."""

import os

import pytest

torch = pytest.importorskip("torch")

import savepoint  # noqa: E402
from savepoint import recis  # noqa: E402


class HashEmbedding(torch.nn.Module):
    """A minimal torch-side hash embedding: ids, rows and an optimizer slot, in its own tensors."""

    def __init__(self, dim):
        super().__init__()
        self.ids = torch.zeros(0, dtype=torch.int64)
        self.emb = torch.zeros(0, dim)
        self.exp_avg = torch.zeros(0, dim)

    def insert(self, ids, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.cat([self.ids, ids])
        self.emb = torch.cat([self.emb, torch.randn(len(ids), self.emb.shape[1], generator=g)])
        self.exp_avg = torch.cat([self.exp_avg, torch.rand(len(ids), self.emb.shape[1],
                                                           generator=g)])  # fmt: skip

    def rows(self):
        return {int(i): (self.emb[r].clone(), self.exp_avg[r].clone())
                for r, i in enumerate(self.ids)}  # fmt: skip

    def __savepoint_table__(self):
        return savepoint.SparseTable(self.ids, {"embedding": self.emb, "exp_avg": self.exp_avg})

    def __savepoint_set_table__(self, table):
        self.ids = table.ids.clone()
        zeros = torch.zeros(len(table.ids), self.emb.shape[1])
        self.emb = table.slots["embedding"].clone() if "embedding" in table.slots else zeros
        self.exp_avg = table.slots["exp_avg"].clone() if "exp_avg" in table.slots else zeros


class Model(torch.nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.user = HashEmbedding(4)
        self.mlp = torch.nn.Linear(4, 1)


class Reader:
    def __init__(self, pos=0):
        self.pos, self._worker_num = pos, 1

    def dump_io_state(self):
        return {"pos": self.pos}

    def load_io_state(self, s):
        self.pos = s["pos"]


def _trained(seed=1, n=500):
    m = Model(seed)
    m.user.insert(torch.arange(n, dtype=torch.int64) * 7919 - 100, seed)
    return m


def test_save_and_load_everything(tmp_path):
    m = _trained()
    saver = recis.Saver(m, output_dir=str(tmp_path), max_keep=2)
    reader, counter = Reader(42), {"epochs": 3}
    saver.register_io_state("train", reader)
    saver.register_for_checkpointing("counter", counter)
    for i in range(3):
        saver.save(f"ckpt_{i}")
    assert recis.read_checkpoint_ids(str(tmp_path)) == ["ckpt_1", "ckpt_2"]
    assert not (tmp_path / "ckpt_0").exists() and (tmp_path / "ckpt_2").exists()
    savepoint.verify(tmp_path / "ckpt_2")  # an ordinary savepoint checkpoint

    fresh, reader2 = Model(99), Reader(0)
    saver2 = recis.Saver(fresh, output_dir=str(tmp_path))
    saver2.register_io_state("train", reader2)
    saver2.register_for_checkpointing("counter", {})
    assert saver2.load() == os.path.join(str(tmp_path), "ckpt_2")
    assert {k: [t.tolist() for t in v] for k, v in fresh.user.rows().items()} == {
        k: [t.tolist() for t in v] for k, v in m.user.rows().items()}
    assert torch.equal(fresh.mlp.weight, m.mlp.weight)
    assert reader2.pos == 42 and saver2.get_extra_data("counter") == {"epochs": 3}


def test_bad_options_and_modules(tmp_path):
    with pytest.raises(savepoint.InvalidArgumentError, match="max_keep=0"):
        recis.Saver(_trained(), output_dir=str(tmp_path), max_keep=0)
    with pytest.raises(savepoint.FailedPreconditionError, match="shard 1 of 2"):
        recis.Saver(_trained(), output_dir=str(tmp_path)).save("c", 1, 2)  # no torch.distributed
    assert recis.read_checkpoint_ids(str(tmp_path)) == []  # nothing listed

    class HalfTable(torch.nn.Module):  # saves a table but cannot take one back
        def __savepoint_table__(self):
            return savepoint.SparseTable(torch.zeros(0, dtype=torch.int64), {"e": torch.zeros(0)})

    model = torch.nn.Sequential(HalfTable())
    with pytest.raises(TypeError, match="no __savepoint_set_table__"):
        recis.Saver(model, output_dir=str(tmp_path))


def test_load_conf_categories(tmp_path):
    m = _trained()
    recis.Saver(m, output_dir=str(tmp_path)).save("c")
    warm = Model(5)
    recis.Saver(warm, output_dir=str(tmp_path)).load(load_conf={"exclude": ["sparse_opt", "dense"]})
    rows = warm.user.rows()
    assert set(rows) == set(m.user.rows())
    some = int(m.user.ids[3])
    assert torch.equal(rows[some][0], m.user.rows()[some][0])
    assert torch.count_nonzero(warm.user.exp_avg) == 0  # the optimizer slot was not loaded
    assert not torch.equal(warm.mlp.weight, m.mlp.weight)  # dense excluded
    with pytest.raises(savepoint.InvalidArgumentError, match="categories"):
        recis.Saver(Model(), output_dir=str(tmp_path)).load(load_conf={"load": ["weights"]})
    assert recis.Saver(Model(), output_dir=str(tmp_path / "none")).load() is None


def test_checkpoint_manager_steps_and_restores(tmp_path):
    m = _trained()
    mgr = recis.CheckpointManager(recis.Saver(m, output_dir=str(tmp_path), max_keep=3), 4)
    for _ in range(10):
        mgr.step()
        with torch.no_grad():
            m.mlp.bias += 1
    assert recis.read_checkpoint_ids(str(tmp_path)) == ["ckpt_4", "ckpt_8"]
    fresh = Model(3)
    mgr2 = recis.CheckpointManager(recis.Saver(fresh, output_dir=str(tmp_path)), 4)
    assert mgr2.restore() == 8
    assert fresh.mlp.bias.item() == pytest.approx(m.mlp.bias.item() - 3)  # saved before the 8th +1
    assert mgr2.restore(global_step=4) == 4
    bank = Model(7)
    mgr3 = recis.CheckpointManager(recis.Saver(bank, output_dir=str(tmp_path / "b")), 4)
    mgr3.load_model_bank([{"path": str(tmp_path / "ckpt_8"), "load": ["sparse"]}])
    assert set(bank.user.rows()) == set(m.user.rows())
    assert not torch.equal(bank.mlp.weight, m.mlp.weight)


def _save_rank(rank, n, out):
    m = _trained()
    mine = savepoint.SparseTable(m.user.ids, {"embedding": m.user.emb, "exp_avg": m.user.exp_avg})
    part = mine.shard(rank, n)  # the rows this worker owns
    m.user.ids, m.user.emb, m.user.exp_avg = part.ids, part.slots["embedding"], part.slots["exp_avg"]
    saver = recis.Saver(m, output_dir=out)
    saver.register_io_state("train", Reader(100 + rank))
    saver.save("ckpt_1", rank, n)
    return len(part.ids)


def _load_rank(rank, n, out, exclude_io):
    m = Model(9)
    saver = recis.Saver(m, output_dir=out)
    saver.register_io_state("train", Reader())
    saver.load(load_conf={"exclude": ["io_state"]} if exclude_io else None, shard_id=rank)
    return {int(i): m.user.emb[r].tolist() for r, i in enumerate(m.user.ids)}


def test_two_workers_save_three_load(tmp_path):
    from test_torch_distributed import run_ranks, values

    out = str(tmp_path / "ck")
    assert sum(values(run_ranks(tmp_path, 2, _save_rank, out))) == 500
    got = run_ranks(tmp_path, 3, _load_rank, out, True)
    rows = {}
    for r in range(3):
        assert got[r][0] == "ok", got[r]
        assert not set(rows) & set(got[r][1])  # each id on one worker
        rows.update(got[r][1])
    ref = _trained().user.rows()
    assert {k: v[0].tolist() for k, v in ref.items()} == rows
    refused = run_ranks(tmp_path, 3, _load_rank, out, False)  # IO states of 2 workers
    assert all(v[1] == "FailedPreconditionError" and "IO states of 2 workers" in v[2]
               for v in refused.values()), refused  # fmt: skip


# ------------------------------------------------------------------ incremental saves


class PlainEmbedding(torch.nn.Module):
    """A hash embedding with inserts, updates and evictions, owning the ids of its shard (rank of
    world); rows are exact functions of (id, step), so any run of the same ops is bit-equal."""

    def __init__(self, dim=4, rank=0, world=1):
        super().__init__()
        self.dim, self.slices = dim, savepoint.gen_slice(rank, world)
        self.ids = torch.zeros(0, dtype=torch.int64)
        self.emb, self.exp_avg = torch.zeros(0, dim), torch.zeros(0, dim)
        self.where = {}
        self.dirty = savepoint.DirtyTracker()

    def _mine(self, ids):
        s = ids & 0xFFFF
        return ids[(s >= self.slices[0]) & (s < self.slices[1])]

    def _rows(self, ids, step):
        e = (ids % 9973).float()[:, None] * 0.5 + step + torch.arange(self.dim)
        return e, e * 0.25 - 1

    def upsert(self, ids, step):
        """Inserts or updates the rows of `ids` (those this shard owns)."""
        ids = self._mine(ids)
        e, m = self._rows(ids, step)
        old = torch.tensor([i in self.where for i in ids.tolist()], dtype=torch.bool)
        at = torch.tensor([self.where[i] for i in ids[old].tolist()], dtype=torch.int64)
        self.emb[at], self.exp_avg[at] = e[old], m[old]
        new = ids[~old]
        self.ids = torch.cat([self.ids, new])
        self.emb, self.exp_avg = torch.cat([self.emb, e[~old]]), torch.cat([self.exp_avg, m[~old]])
        self.where.update({i: len(self.ids) - len(new) + k for k, i in enumerate(new.tolist())})
        self.dirty.touch(ids)

    def evict(self, ids):
        ids = self._mine(ids)
        keep = ~torch.isin(self.ids, ids)
        self.ids, self.emb, self.exp_avg = self.ids[keep], self.emb[keep], self.exp_avg[keep]
        self.where = {i: r for r, i in enumerate(self.ids.tolist())}
        self.dirty.delete(ids)

    def __savepoint_table__(self):
        return savepoint.SparseTable(self.ids, {"embedding": self.emb, "exp_avg": self.exp_avg})

    def __savepoint_set_table__(self, table):
        self.ids = table.ids.clone()
        self.emb, self.exp_avg = table.slots["embedding"].clone(), table.slots["exp_avg"].clone()
        self.where = {i: r for r, i in enumerate(self.ids.tolist())}


class DirtyEmbedding(PlainEmbedding):
    """The same with the dirty protocol: its tracker records what changed since the last save."""

    def __savepoint_dirty__(self):
        return self.dirty


class IncModel(torch.nn.Module):
    def __init__(self, rank=0, world=1, n=500, dim=4, plain_item=True):
        super().__init__()
        torch.manual_seed(0)
        self.user = DirtyEmbedding(dim, rank, world)
        self.item = (PlainEmbedding if plain_item else DirtyEmbedding)(dim, rank, world)
        self.mlp = torch.nn.Linear(dim, 1)
        self.user.upsert(_BASE_IDS(n), 0)
        self.item.upsert(_BASE_IDS(n)[::3] + 11, 0)


def _BASE_IDS(n):  # noqa: N802
    return torch.arange(n, dtype=torch.int64) * 7919 - 100


def _evolve(m, step, n=500, updates=11):
    """Step `step` of training: updates, inserts and evictions in both tables, the dense bias."""
    ids = _BASE_IDS(n)
    m.user.upsert(torch.cat([ids[step * 7 :: updates], torch.arange(20) * 65537 + step * 1000]),
                  step)  # fmt: skip
    m.user.evict(ids[step :: 37])
    m.item.upsert(ids[step :: 29] + 11, step)
    m.item.evict(ids[step + 1 :: 41] + 11)
    with torch.no_grad():
        m.mlp.bias += 1


def _loaded(path):
    got = savepoint.load(path)
    return {k: (got["sparse"][k].ids, got["sparse"][k].slots) for k in ("user", "item")}, got


def _assert_same(a, b):
    ta, da = _loaded(a)
    tb, db = _loaded(b)
    for name in ta:
        assert torch.equal(ta[name][0], tb[name][0]), name
        for slot in ta[name][1]:
            assert torch.equal(ta[name][1][slot], tb[name][1][slot]), (name, slot)
    assert all(torch.equal(da["dense"][k], db["dense"][k]) for k in da["dense"])


def _depth(path):
    return savepoint.sparse_chain(path)[0]["depth"]


def test_incremental_saves_equal_full_saves(tmp_path):
    inc, full = IncModel(), IncModel()
    s_inc = recis.Saver(inc, output_dir=str(tmp_path / "inc"), max_keep=10, incremental=True,
                        max_delta_ratio=10.0)  # fmt: skip
    s_full = recis.Saver(full, output_dir=str(tmp_path / "full"), max_keep=10)
    for step in range(5):
        if step:
            _evolve(inc, step)
            _evolve(full, step)
        a, b = s_inc.save(f"ckpt_{step}"), s_full.save(f"ckpt_{step}")
        assert _depth(a) == step and _depth(b) == 0
        _assert_same(a, b)
    assert len(inc.user.dirty.touched()) == 0  # cleared once committed
    fresh = IncModel(n=3)
    recis.Saver(fresh, output_dir=str(tmp_path / "inc")).load()  # the newest: a chain of 4
    assert torch.equal(fresh.user.ids, _loaded(tmp_path / "full" / "ckpt_4")[0]["user"][0])
    assert torch.equal(fresh.mlp.bias, full.mlp.bias)


def _dir_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def test_delta_writes_only_touched_rows(tmp_path):
    m = IncModel(n=60000, dim=32, plain_item=False)
    saver = recis.Saver(m, output_dir=str(tmp_path), max_keep=3, incremental=True)
    full = saver.save("ckpt_0")
    m.user.upsert(_BASE_IDS(60000)[::200], 1)  # 0.5 % of the rows
    m.user.evict(_BASE_IDS(60000)[1::500])
    delta = saver.save("ckpt_1")
    assert _depth(delta) == 1
    assert _dir_bytes(delta) * 5 < _dir_bytes(full), (_dir_bytes(delta), _dir_bytes(full))
    links = savepoint.sparse_chain(delta)
    assert links[0]["table_bytes"] * 50 < links[1]["table_bytes"]
    _assert_same(delta, recis.Saver(m, output_dir=str(tmp_path / "ref")).save("full"))


def test_retention_keeps_bases_listed_deltas_need(tmp_path):
    m = IncModel()
    saver = recis.Saver(m, output_dir=str(tmp_path), max_keep=2, incremental=True, max_chain=2,
                        max_delta_ratio=10.0)  # fmt: skip
    expect = {  # after saving c<k>: (listed, directories left)
        1: (["c1"], {"c1"}),
        2: (["c1", "c2"], {"c1", "c2"}),
        3: (["c2", "c3"], {"c1", "c2", "c3"}),  # c1 unlisted but c2's base
        4: (["c3", "c4"], {"c1", "c2", "c3", "c4"}),  # c4 full (a chain of 2 deltas)
        5: (["c4", "c5"], {"c4", "c5"}),  # c1..c3 needed by nothing listed
        6: (["c5", "c6"], {"c4", "c5", "c6"}),
        7: (["c6", "c7"], {"c4", "c5", "c6", "c7"}),
    }
    depths = []
    for k in range(1, 8):
        _evolve(m, k)
        depths.append(_depth(saver.save(f"c{k}")))
        listed, left = expect[k]
        assert recis.read_checkpoint_ids(str(tmp_path)) == listed, k
        assert {p.name for p in tmp_path.iterdir() if p.is_dir()} == left, k
        for i in listed:
            savepoint.load(tmp_path / i)  # every listed id loads (its chain is there)
    assert depths == [0, 1, 2, 0, 1, 2, 0]


def test_compaction_by_delta_bytes_and_fallbacks(tmp_path):
    m = IncModel(plain_item=False)
    saver = recis.Saver(m, output_dir=str(tmp_path), max_keep=5, incremental=True,
                        max_delta_ratio=0.3)  # fmt: skip
    saver.save("c0")
    _evolve(m, 1)
    assert _depth(saver.save("c1")) == 1  # small delta
    m.user.upsert(_BASE_IDS(500)[::2], 2)  # half the user rows: the deltas now exceed 0.3 x base
    assert _depth(saver.save("c2")) == 2
    assert savepoint.should_compact(tmp_path / "c2", max_delta_ratio=0.3)
    assert _depth(saver.save("c3")) == 0  # full: the compaction
    assert _depth(saver.save("c3")) == 0  # the same id again: never a delta on itself
    saver.load()
    assert _depth(saver.save("c4")) == 0  # the first save after a load is full
    assert _depth(saver.save("c5")) == 1
    with pytest.raises(savepoint.InvalidArgumentError, match="max_chain=-1"):
        recis.Saver(m, output_dir=str(tmp_path), max_chain=-1)


def _incremental_rank(rank, n, out):
    m = IncModel(rank, n)
    saver = recis.Saver(m, output_dir=out, max_keep=3, incremental=True, max_delta_ratio=10.0)
    saver.register_io_state("train", Reader(rank))
    for step in range(4):
        if step:
            _evolve(m, step)
        saver.save(f"ckpt_{step}", rank, n)
    return len(m.user.ids)


def _load_incremental_rank(rank, n, out):
    m = IncModel(rank, n, n=0)
    saver = recis.Saver(m, output_dir=out)
    saver.load(load_conf={"exclude": ["io_state"]}, shard_id=rank)
    return {name: _rows_of(t) for name, t in (("user", m.user), ("item", m.item))}


def _rows_of(t):
    return {int(i): (t.emb[r].tolist(), t.exp_avg[r].tolist()) for r, i in enumerate(t.ids)}


def test_two_workers_save_deltas_three_load(tmp_path):
    from test_torch_distributed import run_ranks, values

    out = str(tmp_path / "ck")
    ref = IncModel()
    for step in range(1, 4):
        _evolve(ref, step)
    assert sum(values(run_ranks(tmp_path, 2, _incremental_rank, out))) == len(ref.user.ids)
    assert [link["depth"] for link in savepoint.sparse_chain(os.path.join(out, "ckpt_3"))] == [
        3, 2, 1, 0]  # fmt: skip
    got = values(run_ranks(tmp_path, 3, _load_incremental_rank, out))
    for name, table in (("user", ref.user), ("item", ref.item)):
        rows = {}
        for r in range(3):
            assert not set(rows) & set(got[r][name])  # each id on one worker
            rows.update(got[r][name])
        assert rows == _rows_of(table), name


def _bad_dirty_rank(rank, n, out):
    m = IncModel(rank, n)
    saver = recis.Saver(m, output_dir=out, incremental=True, max_delta_ratio=10.0)
    saver.save("ckpt_0", rank, n)
    m.user.upsert(_BASE_IDS(500)[:40], 1)
    if rank == 1:  # evictions the tracker did not record
        m.user.where.clear()
        m.user.ids, m.user.emb, m.user.exp_avg = m.user.ids[:0], m.user.emb[:0], m.user.exp_avg[:0]
    saver.save("ckpt_1", rank, n)


def test_a_bad_dirty_tracker_fails_every_worker(tmp_path):
    from test_torch_distributed import run_ranks

    got = run_ranks(tmp_path, 2, _bad_dirty_rank, str(tmp_path / "ck"))
    assert all(v[0] == "error" and "table 'user'" in v[2] for v in got.values()), got
    assert "rank 1 failed" in got[0][2] and got[1][1] == "NotFoundError"
    assert recis.read_checkpoint_ids(str(tmp_path / "ck")) == ["ckpt_0"]
