"""CheckpointManager with registered objects: registration, the C++ entry layout, restore into the
objects (categories, strictness, renames, only-filters), the training-loop hooks, breakpoints on
exceptions, and SIGTERM / SIGINT handling (in a subprocess)."""

import os
import signal
import subprocess
import sys
import threading

import pytest
import torch

import savepoint
from conftest import HERE


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


class Trainer:
    """A model, Adam, a StepLR schedule, a counter dict and a torch RNG state holder."""

    def __init__(self, seed=0):
        self.model = _model(seed)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=0.01)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=3, gamma=0.5)
        self.counters = {"samples": 0}
        self.gen = torch.Generator().manual_seed(1234)

    def register(self, mgr):
        mgr.register("model", self.model)  # default category: dense
        mgr.register("optim", self.opt, category="optimizer")
        mgr.register("sched", self.sched, category="extra")
        mgr.register("counters", self.counters, category="extra")
        mgr.register("rng", RngHolder(self.gen), category="rng")

    def train_step(self):
        x = torch.randn(5, 4, generator=self.gen)
        loss = self.model(x).pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.sched.step()
        self.counters["samples"] += 5
        return float(loss.detach())


class RngHolder:
    """A user class with state_dict / load_state_dict."""

    def __init__(self, gen):
        self.gen = gen

    def state_dict(self):
        return {"state": self.gen.get_state()}

    def load_state_dict(self, sd):
        self.gen.set_state(sd["state"])


def _equal_state(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal_state(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


def test_register_errors(tmp_path):
    with savepoint.CheckpointManager(tmp_path / "ck") as mgr:
        with pytest.raises(savepoint.FailedPreconditionError, match="no objects are registered"):
            mgr.save_registered(1)
        mgr.register("model", _model())
        with pytest.raises(savepoint.AlreadyExistsError, match="already registered"):
            mgr.register("model", _model())
        with pytest.raises(savepoint.InvalidArgumentError, match="'.'"):
            mgr.register("a.b", {})
        with pytest.raises(TypeError, match="state_dict"):
            mgr.register("x", object())
        with pytest.raises(savepoint.InvalidArgumentError, match="unknown category 'weights'"):
            mgr.register("x", {}, category="weights")
        with pytest.raises(savepoint.NotFoundError):
            mgr.unregister("nope")
        mgr.register("x", {"v": 1}, category="data")
        assert mgr.registered == {"model": "dense", "x": "io_state"}
        mgr.unregister("x")
        assert mgr.registered == {"model": "dense"}
        with pytest.raises(TypeError, match=r"'exclud'.*did you mean 'exclude'"):
            mgr.restore_registered(exclud=["dense"])


def test_resume_is_bit_exact(tmp_path):
    """Train 8 steps uninterrupted vs. 5 steps, stop, restore into fresh objects, 3 more."""
    ref = Trainer()
    for _ in range(8):
        ref.train_step()

    run = Trainer()
    with savepoint.CheckpointManager(tmp_path / "ck", save_interval_steps=5) as mgr:
        run.register(mgr)
        for step in range(1, 6):
            run.train_step()
            mgr.on_step_end(step, 1)
        assert mgr.all_steps() == [5]

    resumed = Trainer(seed=99)  # different initial weights, fresh optimizer (no moments yet)
    with savepoint.CheckpointManager(tmp_path / "ck", save_interval_steps=5) as mgr:
        resumed.register(mgr)
        rec = mgr.restore_registered()
        assert rec["step"] == 5 and rec["name"] == "ckpt-1_5" and mgr.global_step == 5
        for step in range(6, 9):
            resumed.train_step()
            mgr.on_step_end(step, 1)
    assert _equal_state(resumed.model.state_dict(), ref.model.state_dict())
    assert _equal_state(resumed.opt.state_dict(), ref.opt.state_dict())
    assert resumed.sched.state_dict() == ref.sched.state_dict()
    assert resumed.counters == ref.counters == {"samples": 40}
    assert torch.equal(resumed.gen.get_state(), ref.gen.get_state())


def test_layout_matches_the_cpp_registry(tmp_path):
    """Entries "<name>.<key path>", io_state per shard, categories in the metadata."""
    model = _model()
    with savepoint.CheckpointManager(tmp_path / "ck", shard_id=1, num_shards=2) as mgr:
        mgr.register("model", model)
        mgr.register("loader", {"pos": 17, "epoch_seed": 3}, category="io_state")
        assert mgr.save_registered(1)
        path = mgr.checkpoints()[-1]["path"]
    info = savepoint.info(path)
    assert {t["name"] for t in info["tensors"]} == {f"model.{k}" for k in model.state_dict()}
    assert info["values"]["loader.shard-1.pos"] == 17
    objects = info["metadata"]["savepoint.manager"]["objects"]
    assert objects == {"loader": {"category": "io_state", "num_shards": 2},
                       "model": {"category": "dense", "num_shards": 2}}  # fmt: skip
    # A run with another number of shards must not take this data position.
    with savepoint.CheckpointManager(tmp_path / "ck", shard_id=0, num_shards=3) as mgr:
        mgr.register("loader", {"pos": 0}, category="io_state")
        with pytest.raises(savepoint.InvalidArgumentError, match="saved with 2 shards"):
            mgr.restore_registered()


def test_reads_a_flat_cpp_registered_checkpoint(tmp_path):
    """A checkpoint in the C++ registry's layout without Python structure (as the C++ manager
    writes it) loads into Python objects: tensors in place, nested where the template is."""
    from savepoint._tree import Flattener

    src = _model(5)
    flat = Flattener()
    flat.flatten({"model": src.state_dict(), "extra": {"step": 12, "lr": 0.5}})
    meta = ('{"savepoint.manager": {"objects": {"model": {"category": "dense", "num_shards": 1},'
            ' "extra": {"category": "extra", "num_shards": 1}}}}')  # fmt: skip
    path = tmp_path / "cpp"
    savepoint._core.save(str(path), [t.spec() for t in flat.tensors], flat.values, meta,
                         overwrite=False, create_parents=True, direct_io=True, io_threads=2,
                         chunk_bytes=8 << 20)  # fmt: skip
    model, extra = _model(6), {"step": 0, "lr": 0.1}
    weight = model[0].weight
    with savepoint.CheckpointManager(tmp_path / "ck") as mgr:
        mgr.register("model", model)
        mgr.register("extra", extra, category="extra")
        mgr.load_from(path)
    assert _equal_state(model.state_dict(), src.state_dict())
    assert model[0].weight is weight  # filled in place
    assert extra == {"step": 12, "lr": 0.5}


def test_include_exclude_strict_renames_only(tmp_path):
    t = Trainer()
    for _ in range(3):
        t.train_step()
    saved_model = {k: v.clone() for k, v in t.model.state_dict().items()}
    with savepoint.CheckpointManager(tmp_path / "ck") as mgr:
        t.register(mgr)
        assert mgr.save_registered(3)

    # include / exclude by category.
    fresh = Trainer(seed=7)
    before_model = {k: v.clone() for k, v in fresh.model.state_dict().items()}
    with savepoint.CheckpointManager(tmp_path / "ck") as mgr:
        fresh.register(mgr)
        mgr.restore_registered(include=["optimizer", "extra"])
        assert _equal_state(fresh.model.state_dict(), before_model)  # dense excluded
        assert fresh.counters == {"samples": 15} and len(fresh.opt.state_dict()["state"]) == 4
        mgr.restore_registered(exclude=["optimizer", "rng", "extra"])  # aliases work too
        assert _equal_state(fresh.model.state_dict(), saved_model)

    # Strict: a shape mismatch or an object the checkpoint lacks is an error; lenient skips.
    wide = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    with savepoint.CheckpointManager(tmp_path / "ck") as mgr:
        mgr.register("model", wide)
        mgr.register("ghost", {"x": torch.zeros(2)}, category="extra")
        mismatch = r"'model.2.weight' is F32 \[2, 8\]"
        with pytest.raises(savepoint.InvalidArgumentError, match=mismatch):
            mgr.restore_registered(exclude=["extra"])
        with pytest.raises(savepoint.NotFoundError, match="no tensor 'ghost.x'"):
            mgr.restore_registered(include=["extra"])
        mgr.restore_registered(strict=False)
        assert torch.equal(wide[0].weight, saved_model["0.weight"])  # matching entries loaded
        assert wide[2].weight.shape == (3, 8)

    # Renames and only: warm-start "net" from "model", first layer only.
    net = _model(3)
    last = net[2].weight.detach().clone()
    renames = {f"model.0.{p}": f"net.0.{p}" for p in ("weight", "bias")}
    with savepoint.CheckpointManager(tmp_path / "ck") as mgr:
        mgr.register("net", net)
        with pytest.raises(savepoint.NotFoundError, match="no tensor 'net.2.weight'"):
            mgr.restore_registered(renames=renames)
        mgr.restore_registered(renames=renames, only=["net.0.*"])
    assert torch.equal(net[0].weight, saved_model["0.weight"])
    assert torch.equal(net[0].bias, saved_model["0.bias"]) and torch.equal(net[2].weight, last)


def test_hooks_epochs_and_global_step(tmp_path):
    holder = {"w": torch.zeros(3)}
    with savepoint.CheckpointManager(tmp_path / "ck", save_interval_steps=2, keep_all=True) as mgr:
        mgr.register("m", holder)
        saved = []
        for epoch in (1, 2):
            for i in range(1, 4):
                step = (epoch - 1) * 3 + i
                holder["w"].fill_(step)
                saved.append(mgr.on_step_end(step, epoch, {"loss": 1.0 / step}))
            saved.append(mgr.on_epoch_end(epoch))
        # Due when step >= last saved + 2; an epoch end forces a save of its last step.
        assert saved == [False, True, False, True, False, True, False, True]
        assert mgr.global_step == 6
        assert not mgr.on_train_end()  # step 6 was just saved
        recs = mgr.checkpoints()
        assert [r["name"] for r in recs] == ["ckpt-1_2", "ckpt-1_3", "ckpt-2_2", "ckpt-2_3"]
        assert [r["epoch_end"] for r in recs] == [False, True, False, True]
        assert recs[0]["metrics"] == {"loss": 0.5}
    with savepoint.CheckpointManager(tmp_path / "rec", save_interval_steps=3,
                                     steps_per_epoch=4) as mgr:  # fmt: skip
        mgr.register("m", holder)
        assert [mgr.step() for _ in range(7)] == [False, False, True, False, False, True, False]
        assert mgr.global_step == 7 and mgr.on_train_end()
        assert [r["name"] for r in mgr.checkpoints()] == ["ckpt-1_3", "ckpt-2_2", "ckpt-2_3"]
    with savepoint.CheckpointManager(tmp_path / "rec", save_interval_steps=3,
                                     steps_per_epoch=4) as mgr:  # fmt: skip
        mgr.register("m", holder)
        assert mgr.restore_registered()["step"] == 7 and mgr.global_step == 7
        assert bool((holder["w"] == 6).all())
        assert [mgr.step() for _ in range(2)] == [False, True]  # 8, 9
    # An epoch whose last step a hook saved: that checkpoint is marked as the epoch's end.
    with savepoint.CheckpointManager(tmp_path / "mark", save_interval_steps=3, keep_all=True) as mgr:
        mgr.register("m", holder)
        assert [mgr.on_step_end(step, 1) for step in (1, 2, 3)] == [False, False, True]
        assert not mgr.on_epoch_end(1)
        assert [(r["name"], r["epoch_end"]) for r in mgr.checkpoints()] == [("ckpt-1_3", True)]


def test_breakpoints_on_exception(tmp_path):
    holder = {"w": torch.zeros(3)}
    with savepoint.CheckpointManager(tmp_path / "off") as mgr:
        mgr.register("m", holder)
        with pytest.raises(savepoint.FailedPreconditionError, match="exception_save"):
            mgr.save_breakpoint()
        with pytest.raises(savepoint.FailedPreconditionError, match="exception_save"):
            with mgr.exception_guard():
                pass

    mgr = savepoint.CheckpointManager(tmp_path / "ck", exception_save=True, save_interval_steps=10)
    mgr.register("m", holder)
    with pytest.raises(RuntimeError, match="boom"):
        with mgr.exception_guard():
            for step in range(1, 5):
                holder["w"].fill_(step)
                mgr.on_step_end(step, 1)
                if step == 3:
                    raise RuntimeError("boom")
    rec = mgr.checkpoints()[-1]
    assert rec["name"] == "ckpt-1_3_breakpoint" and rec["breakpoint"] and rec["step"] == 3
    assert mgr.save_breakpoint()["name"] == "ckpt-1_3_breakpoint"  # explicit, overwrites
    mgr.close()

    # The manager as a context manager: leaving by an exception saves one, then closes.
    with pytest.raises(KeyError):
        with savepoint.CheckpointManager(tmp_path / "cm", exception_save=True,
                                         save_interval_steps=10) as mgr:  # fmt: skip
            mgr.register("m", holder)
            holder["w"].fill_(7)
            mgr.on_step_end(7, 2)
            raise KeyError("x")
    with pytest.raises(savepoint.FailedPreconditionError, match="closed"):
        mgr.on_step_end(8, 2)
    back = savepoint.load(tmp_path / "cm" / "ckpt-2_1_breakpoint")
    assert bool((back["m"]["w"] == 7).all())


def test_handle_signals_preconditions(tmp_path):
    errors = []

    def other_thread():
        try:
            savepoint.CheckpointManager(tmp_path / "t", handle_signals=True)
        except savepoint.FailedPreconditionError as e:
            errors.append(str(e))

    th = threading.Thread(target=other_thread)
    th.start()
    th.join()
    assert errors and "main thread" in errors[0]
    before = signal.getsignal(signal.SIGTERM)
    with savepoint.CheckpointManager(tmp_path / "a", handle_signals=True):
        assert signal.getsignal(signal.SIGTERM) is not before
        with pytest.raises(savepoint.FailedPreconditionError, match="already handles signals"):
            savepoint.CheckpointManager(tmp_path / "b", handle_signals=True)
    assert signal.getsignal(signal.SIGTERM) is before  # restored by close()


def _run_until_signal(root, sig):
    cmd = [sys.executable, os.path.join(HERE, "helpers", "manager_signal.py"), str(root)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    last = 0
    for line in proc.stdout:
        last = int(line.split()[1])
        if last >= 5:
            break
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, err, last


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_saves_breakpoint_and_reraises(tmp_path, sig):
    code, err, last = _run_until_signal(tmp_path, sig)
    if sig == signal.SIGTERM:
        assert code == -signal.SIGTERM, (code, err[-2000:])  # re-raised with the default handler
    else:
        assert code != 0 and "KeyboardInterrupt" in err, (code, err[-2000:])
    assert "re-raising" in err
    names = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert len(names) == 1 and names[0].endswith("_breakpoint"), names
    step = int(names[0].split("_")[1])
    assert step in (last, last + 1)  # the step the next hook saw
    back = savepoint.load(tmp_path / names[0])
    assert back["counters"]["step"] == step and bool((back["model"]["w"] == step).all())
    savepoint.verify(tmp_path / names[0])


def test_second_signal_reraises_at_once(tmp_path):
    helper = os.path.join(HERE, "helpers", "manager_signal.py")
    cmd = [sys.executable, helper, str(tmp_path), "twice"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGTERM and "survived" not in r.stdout, (r.returncode, r.stdout)
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]  # no hook ran: no breakpoint
