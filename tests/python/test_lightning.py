"""savepoint.lightning.CheckpointIO with the real Lightning: a Trainer that is SIGKILLed mid-run
resumes with ckpt_path="last" and repeats the uninterrupted run's losses bit for bit; the plug-in
keeps what savepoint's tree cannot hold (hyper-parameters as an AttributeDict, tuples of objects,
tuple keys), removes only its own files, reads Lightning's own files, and says what is wrong."""

import argparse
import collections
import os
import signal

import lightning as L
import numpy as np
import pytest
import torch
from lightning.fabric.utilities.data import AttributeDict
from lightning.pytorch.plugins.io import TorchCheckpointIO

import savepoint
import savepoint.lightning
from conftest import read_losses as _losses
from conftest import run_training

def _train(root, losses, *args, expect_kill=False):
    run_training("lightning_train.py", root, losses, *args,
                 rc=-signal.SIGKILL if expect_kill else 0)  # fmt: skip


def _checkpoint():
    torch.manual_seed(3)
    w = torch.nn.Parameter(torch.randn(4, 3))
    return {
        "epoch": 2, "global_step": 17, "pytorch-lightning_version": L.__version__,
        "state_dict": collections.OrderedDict(w=w.detach(), b=torch.arange(3.0)),
        "optimizer_states": [{"state": {0: {"step": torch.tensor(17.0),
                                            "exp_avg": torch.randn(4, 3)}},
                              "param_groups": [{"lr": 0.01, "betas": (0.9, 0.999), "params": [0],
                                                "foreach": None}]}],
        "hyper_parameters": AttributeDict(width=32, lr=0.01, name="run"),
        "callbacks": {("Recorder", 1): {"seen": 5}},
        "loops": {"fit_loop": {"state_dict": {}, "epoch_progress": {"total": {"ready": 3}}}},
        "namespace": argparse.Namespace(a=1, t=torch.ones(2)),
        "mixed": (1, argparse.Namespace(b=2)),
        "bf16": torch.randn(5).to(torch.bfloat16),
    }  # fmt: skip


def _same(a, b, path="ckpt"):
    assert type(a) is type(b), (path, type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), path
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            _same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, argparse.Namespace):
        _same(vars(a), vars(b), path)
    else:
        assert a == b, path


def test_a_trainer_killed_mid_run_resumes_with_the_same_losses_bit_for_bit(tmp_path):
    _train(tmp_path / "ref", tmp_path / "ref.txt", "--io", "torch")
    reference = _losses(tmp_path / "ref.txt")
    assert len(reference) == 48

    root, losses = tmp_path / "ckpts", tmp_path / "run.txt"
    _train(root, losses, "--io", "savepoint", "--kill-at", "27", expect_kill=True)
    before = _losses(losses)
    assert before == reference[: len(before)] and len(before) == 27
    _train(root, losses, "--io", "savepoint", "--resume")
    after = _losses(losses)[len(before):]
    first = int(after[0][0])
    assert first in (17, 25), after[:2]  # resumed from the end of epoch 2 or 3
    assert after == reference[first - 1:], "the resumed run's losses differ"

    # The killed run's debris is gone (savepoint.gc at the first save). Resumed from epoch 1's
    # last.ckpt (epoch 2's was still being written when the process died), Lightning saves epoch
    # 2 again as "epoch=2-step=24-v1.ckpt" and leaves the first run's file: Lightning's doing.
    names = sorted(set(os.listdir(root)) - ({"epoch=2-step=24.ckpt"} if first == 17 else set()))
    assert names == ["epoch=5-step=48.ckpt", "last.ckpt"], names  # older epochs removed
    for n in names:
        savepoint.verify(root / n)
        assert os.path.isfile(root / n / "MANIFEST")


def test_a_checkpoint_comes_back_with_what_the_tree_cannot_hold(tmp_path):
    io = savepoint.lightning.CheckpointIO()
    ckpt = _checkpoint()
    io.save_checkpoint(ckpt, tmp_path / "a.ckpt", storage_options={"metadata": {"run": 7}})
    ckpt["state_dict"]["b"] += 1  # staged already: the saved checkpoint keeps the old values
    # An AttributeDict and a Namespace need weights_only=False, as with Lightning's own plug-in.
    back = io.load_checkpoint(tmp_path / "a.ckpt", weights_only=False)
    ckpt["state_dict"]["b"] -= 1
    _same(ckpt, back)
    assert isinstance(back["hyper_parameters"], AttributeDict)
    assert back["hyper_parameters"].width == 32
    info = savepoint.info(tmp_path / "a.ckpt")
    assert info["metadata"] == {"run": 7}
    names = {t["name"] for t in info["tensors"]}
    assert "checkpoint.state_dict.w" in names
    assert "checkpoint.optimizer_states.0.state.0.exp_avg" in names
    io.teardown()


def test_a_synchronous_plugin_is_durable_when_save_returns(tmp_path):
    io = savepoint.lightning.CheckpointIO(async_=False)
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}, "epoch": 1}, tmp_path / "s.ckpt")
    assert savepoint.verify(tmp_path / "s.ckpt")["bytes"] >= 12
    assert savepoint.load(tmp_path / "s.ckpt")["checkpoint"]["epoch"] == 1


def test_remove_takes_only_the_checkpoints_own_files(tmp_path):
    io = savepoint.lightning.CheckpointIO()
    path = tmp_path / "x.ckpt"
    io.save_checkpoint({"w": torch.ones(4)}, path)
    io.wait()
    (path / "notes.txt").write_text("mine")
    io.remove_checkpoint(path)  # waits for the save first, then removes the checkpoint's files
    assert os.listdir(path) == ["notes.txt"]
    io.remove_checkpoint(tmp_path / "missing.ckpt")  # nothing there: nothing to do
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "f").write_text("x")
    with pytest.raises(savepoint.NotFoundError):
        io.remove_checkpoint(tmp_path / "other")  # not a checkpoint: nothing deleted
    assert os.listdir(tmp_path / "other") == ["f"]


def test_a_file_that_is_not_a_checkpoint_is_neither_replaced_nor_removed(tmp_path):
    io = savepoint.lightning.CheckpointIO()
    path = tmp_path / "notes.ckpt"
    path.write_text("a user's file, not torch.save's")
    with pytest.raises(savepoint.NotFoundError, match="not a checkpoint"):
        io.remove_checkpoint(path)
    with pytest.raises(savepoint.SavepointError):
        io.save_checkpoint({"w": torch.ones(2)}, path)
        io.teardown()
    assert path.read_text() == "a user's file, not torch.save's"
    assert os.listdir(tmp_path) == ["notes.ckpt"]


def test_files_of_lightnings_own_plugin_load_and_are_removed(tmp_path):
    path = tmp_path / "torch.ckpt"
    ckpt = {"state_dict": {"w": torch.arange(6.0)}, "epoch": 4}
    TorchCheckpointIO().save_checkpoint(ckpt, path)
    io = savepoint.lightning.CheckpointIO()
    _same(ckpt, io.load_checkpoint(path))
    io.remove_checkpoint(path)
    assert not path.exists()


def test_an_overwritten_checkpoint_is_replaced_whole(tmp_path):
    io = savepoint.lightning.CheckpointIO()
    path = tmp_path / "last.ckpt"
    for step in range(3):  # Lightning saves "last.ckpt" again and again
        io.save_checkpoint({"global_step": step, "w": torch.full((1000,), float(step))}, path)
    back = io.load_checkpoint(path)
    assert back["global_step"] == 2 and bool((back["w"] == 2).all())


def test_bad_options_and_foreign_checkpoints_are_clear_errors(tmp_path):
    io = savepoint.lightning.CheckpointIO()
    with pytest.raises(savepoint.InvalidArgumentError, match="storage_options"):
        io.save_checkpoint({"w": torch.ones(1)}, tmp_path / "a", storage_options={"x": 1})
    io.save_checkpoint({"w": torch.ones(1)}, tmp_path / "a")
    with pytest.raises(savepoint.InvalidArgumentError, match="map_location"):
        io.load_checkpoint(tmp_path / "a", map_location=lambda s, loc: s)
    savepoint.save({"w": torch.ones(1)}, tmp_path / "plain")
    with pytest.raises(savepoint.InvalidArgumentError, match="not one written by"):
        io.load_checkpoint(tmp_path / "plain")
    with pytest.raises(savepoint.NotFoundError):
        io.load_checkpoint(tmp_path / "nothing")
    with pytest.raises(savepoint.InvalidArgumentError, match="belong to the checkpointer"):
        savepoint.lightning.CheckpointIO(checkpointer=savepoint.AsyncCheckpointer(), cuda=False)
    with pytest.raises(savepoint.InvalidArgumentError, match="async_"):
        savepoint.lightning.CheckpointIO(async_=1)
    with pytest.raises(savepoint.InvalidArgumentError, match="package"):
        savepoint.lightning.checkpoint_io_class("keras")


class Custom:  # not allowed by torch.load(weights_only=True)
    pass


def test_weights_only_guards_the_pickled_part(tmp_path):
    io = savepoint.lightning.CheckpointIO()

    io.save_checkpoint({"w": torch.ones(2), "obj": Custom()}, tmp_path / "c")
    with pytest.raises(Exception, match="[Ww]eights.only"):
        io.load_checkpoint(tmp_path / "c", weights_only=True)
    assert type(io.load_checkpoint(tmp_path / "c", weights_only=False)["obj"]).__name__ == "Custom"


def test_a_failed_save_is_raised_and_replaces_nothing(tmp_path):
    io = savepoint.lightning.CheckpointIO()
    (tmp_path / "taken").write_text("a file where a directory of the path goes")
    with pytest.raises(savepoint.SavepointError):
        io.save_checkpoint({"w": torch.ones(2)}, tmp_path / "taken" / "x.ckpt")
        io.teardown()
    assert (tmp_path / "taken").read_text().startswith("a file")


def test_a_file_of_lightnings_own_plugin_is_replaced_when_the_run_switches(tmp_path):
    path = tmp_path / "last.ckpt"
    TorchCheckpointIO().save_checkpoint({"w": torch.zeros(3), "epoch": 1}, path)
    io = savepoint.lightning.CheckpointIO()
    assert io.load_checkpoint(path)["epoch"] == 1  # resumed from the file ...
    io.save_checkpoint({"w": torch.ones(3), "epoch": 2}, path)  # ... then saved over it
    assert (path / "MANIFEST").is_file() and os.listdir(tmp_path) == ["last.ckpt"]
    assert io.load_checkpoint(path)["epoch"] == 2


def test_a_failed_save_over_a_torch_file_puts_the_file_back(tmp_path):
    path = tmp_path / "last.ckpt"
    TorchCheckpointIO().save_checkpoint({"w": torch.zeros(3), "epoch": 1}, path)
    io = savepoint.lightning.CheckpointIO()
    with pytest.raises(savepoint.InvalidArgumentError):  # (refused after the file was set aside)
        io.save_checkpoint({"w": torch.ones(3)}, path, storage_options={"compression": "bogus"})
    assert path.is_file() and io.load_checkpoint(path)["epoch"] == 1
    assert os.listdir(tmp_path) == ["last.ckpt"]


def test_removing_the_previous_checkpoint_waits_for_the_next_to_commit(tmp_path):
    io = savepoint.lightning.CheckpointIO()
    io.save_checkpoint({"w": torch.ones(4)}, tmp_path / "a.ckpt")
    io.save_checkpoint({"w": torch.ones(64 << 20, dtype=torch.uint8)}, tmp_path / "b.ckpt")
    io.remove_checkpoint(tmp_path / "a.ckpt")  # what ModelCheckpoint does right after saving b
    assert (tmp_path / "b.ckpt" / "MANIFEST").is_file()  # b committed before a went
    assert not (tmp_path / "a.ckpt").exists()


def test_numpy_values_come_back_as_numpy(tmp_path):
    io = savepoint.lightning.CheckpointIO()
    ckpt = {"state_dict": {"w": torch.ones(2)}, "callbacks": {"cb": {"hist": np.arange(5)}}}
    io.save_checkpoint(ckpt, tmp_path / "n.ckpt")
    back = io.load_checkpoint(tmp_path / "n.ckpt")
    assert isinstance(back["callbacks"]["cb"]["hist"], np.ndarray)
    assert back["callbacks"]["cb"]["hist"].tolist() == [0, 1, 2, 3, 4]
    assert isinstance(back["state_dict"]["w"], torch.Tensor)


def test_fabric_saves_and_loads_through_the_plugin(tmp_path):
    fabric = L.Fabric(accelerator="cpu", devices=1, plugins=[savepoint.lightning.CheckpointIO()])
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = fabric.setup(model, opt)
    fabric.save(tmp_path / "f.ckpt", {"model": model, "optimizer": opt, "step": 5})
    want = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    state = {"model": model, "optimizer": opt}
    rest = fabric.load(tmp_path / "f.ckpt", state)
    assert rest == {"step": 5}
    for k, v in model.state_dict().items():
        assert torch.equal(v, want[k]), k


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_gpu
def test_cuda_tensors_are_snapshotted_by_dma_and_load_where_asked(tmp_path):
    io = savepoint.lightning.CheckpointIO()
    g = torch.Generator(device="cuda").manual_seed(5)
    w = torch.randn(4096, 1024, device="cuda", generator=g)
    want = w.cpu()
    ckpt = {"state_dict": {"w": w, "half": w[:, :7].to(torch.bfloat16)}, "epoch": 1}
    io.save_checkpoint(ckpt, tmp_path / "g.ckpt")
    assert io._checkpointer().cuda  # the snapshot copier, not to("cpu")
    w.add_(1)  # after save_checkpoint returns, training may change the tensors
    back = io.load_checkpoint(tmp_path / "g.ckpt")  # Lightning's default: onto the CPU
    w = back["state_dict"]["w"]
    assert w.device.type == "cpu" and torch.equal(w, want)
    on_gpu = io.load_checkpoint(tmp_path / "g.ckpt", map_location="cuda")
    assert on_gpu["state_dict"]["half"].is_cuda
    assert torch.equal(on_gpu["state_dict"]["half"].cpu(), want[:, :7].to(torch.bfloat16))
    io.teardown()


@needs_gpu
def test_a_gpu_trainer_killed_mid_run_resumes_bit_for_bit(tmp_path):
    gpu = ("--accelerator", "gpu")
    _train(tmp_path / "ref", tmp_path / "ref.txt", "--io", "torch", *gpu)
    reference = _losses(tmp_path / "ref.txt")
    root, losses = tmp_path / "ckpts", tmp_path / "run.txt"
    _train(root, losses, "--io", "savepoint", "--kill-at", "27", *gpu, expect_kill=True)
    before = _losses(losses)
    _train(root, losses, "--io", "savepoint", "--resume", *gpu)
    after = _losses(losses)[len(before):]
    first = int(after[0][0])
    assert first in (17, 25) and after == reference[first - 1:]


def _forged(tmp_path, name, objects):
    """A savepoint checkpoint in the plug-in's layout whose "objects" entry is `objects`."""
    tree = {"savepoint.lightning": 1, "checkpoint": {"w": torch.ones(2), "hole": None},
            "objects": objects}  # fmt: skip
    savepoint.save(tree, tmp_path / name)
    return tmp_path / name


def _pickled(value):
    import io

    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def test_pickled_objects_that_do_not_fit_the_checkpoint_are_corruption(tmp_path):
    io = savepoint.lightning.CheckpointIO()
    good = _forged(tmp_path, "good", _pickled([[["hole"], 5]]))
    assert io.load_checkpoint(good)["hole"] == 5
    for name, objects, match in [
        ("missing", _pickled([[["gone", "x"], 5]]), "not a place left"),
        ("taken", _pickled([[["w"], 5]]), "not a place left"),  # (a tensor is there)
        ("twice", _pickled([[["hole"], 5], [["hole"], 6]]), "not a place left"),
        ("not_pairs", _pickled([1, 2, 3]), "not a list of"),
        ("not_bytes", "a string", "not bytes"),
    ]:
        with pytest.raises(savepoint.CorruptCheckpointError, match=match):
            io.load_checkpoint(_forged(tmp_path, name, objects))
    with pytest.raises(Exception):  # truncated: torch.load's own error
        io.load_checkpoint(_forged(tmp_path, "truncated", _pickled([[["hole"], 5]])[:20]))
