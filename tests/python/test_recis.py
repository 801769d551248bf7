"""savepoint.recis: RecIS's Saver / CheckpointManager interface over savepoint checkpoints (docs/
SPARSE.md, "RecIS integration"): save and load of tables, dense parameters, extra objects and IO
states; load_conf categories; the `checkpoint` list and max_keep; restore of the newest or a given
step; model banks; and a 2-worker save loaded by 3 workers."""

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
