"""savepoint.accelerate with the real Accelerate: a training loop SIGKILLed mid-epoch resumes with
accelerator.load_state() and repeats the uninterrupted run (Accelerate's own save_state) loss for
loss, bit for bit (Accelerate's own load_state does not: it restarts the prepared dataloader's
epoch count, so the data order differs); automatic naming and total_limit delete only committed
checkpoints; Accelerate's own directories still load; bad calls are clear errors."""

import os
import signal

import pytest
import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration

import savepoint
import savepoint.accelerate
from conftest import read_losses as _losses
from conftest import reference_losses, run_training


def _train(project, losses, *args, rc=0):
    run_training("accelerate_train.py", project, losses, *args, rc=rc)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):  # Accelerate's own save_state, uninterrupted
    return reference_losses(tmp_path_factory, "accelerate_train.py", "--io", "accelerate")


def _committed(project):
    root = project / "checkpoints"
    return sorted(n for n in os.listdir(root) if (root / n / "savepoint" / "MANIFEST").is_file())


@pytest.mark.parametrize("mode", [(), ("--async",)], ids=["sync", "async"])
def test_a_killed_loop_resumes_with_the_same_losses_bit_for_bit(tmp_path, reference, mode):
    project, losses = tmp_path / "project", tmp_path / "losses.txt"
    _train(project, losses, "--io", "savepoint", *mode, "--kill-at", "19", rc=-signal.SIGKILL)
    before = _losses(losses)
    assert before == reference[:19]
    done = _committed(project)
    assert done in (["checkpoint_0", "checkpoint_1"], ["checkpoint_0"]), done  # 1: maybe in flight
    _train(project, losses, "--io", "savepoint", *mode, "--resume")
    after = _losses(losses)[19:]
    resumed_at = 16 if done == ["checkpoint_0", "checkpoint_1"] else 8
    assert after == reference[resumed_at:], "the resumed run's losses differ"
    # total_limit=2: the two newest committed checkpoints remain, each loadable and verified.
    assert _committed(project) == ["checkpoint_1", "checkpoint_2"]
    for n in _committed(project):
        savepoint.verify(savepoint.accelerate.state_path(project / "checkpoints" / n))
        assert os.listdir(project / "checkpoints" / n) == ["savepoint"]  # no debris left
    assert sorted(os.listdir(project / "checkpoints")) == ["checkpoint_1", "checkpoint_2"]


def test_accelerates_own_checkpoints_still_load(tmp_path):
    torch.manual_seed(0)
    acc = Accelerator(cpu=True)
    model = acc.prepare(torch.nn.Linear(4, 3))
    acc.save_state(str(tmp_path / "theirs"))
    want = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.zero_()
    savepoint.accelerate.install(acc)
    acc.load_state(str(tmp_path / "theirs"))
    assert all(torch.equal(v, want[k]) for k, v in model.state_dict().items())


def test_a_state_round_trips_with_hooks_and_custom_objects(tmp_path):
    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, opt = acc.prepare(model, opt)
    acc.backward(model(torch.ones(3, 4)).sum())
    opt.step()
    seen = []
    acc.register_save_state_pre_hook(lambda models, weights, d: seen.append(("save", d)))
    acc.register_load_state_pre_hook(lambda models, d: seen.append(("load", d)))
    acc.step = 7
    path = savepoint.accelerate.save_state(acc, tmp_path / "s")
    want = {k: v.clone() for k, v in opt.state_dict()["state"][0].items()}
    opt.state_dict()["state"][0]["momentum_buffer"].zero_()
    acc.step = 0
    savepoint.accelerate.load_state(acc, path)
    assert acc.step == 7
    assert torch.equal(opt.state_dict()["state"][0]["momentum_buffer"], want["momentum_buffer"])
    assert seen == [("save", path), ("load", path)]
    names = {t["name"] for t in savepoint.info(savepoint.accelerate.state_path(path))["tensors"]}
    assert "checkpoint.models.0.weight" in names and "checkpoint.rng.torch" in names


def test_bad_calls_are_clear_errors(tmp_path):
    acc = Accelerator(cpu=True)
    acc.prepare(torch.nn.Linear(2, 2))
    with pytest.raises(savepoint.InvalidArgumentError, match="no output_dir"):
        savepoint.accelerate.save_state(acc)
    with pytest.raises(savepoint.InvalidArgumentError, match="unknown options"):
        savepoint.accelerate.install(acc, overwrite=True)
    savepoint.save({"w": torch.ones(2)}, tmp_path / "plain")
    with pytest.raises(savepoint.NotFoundError, match="holds no savepoint state"):
        savepoint.accelerate.load_state(acc, tmp_path / "plain")
    savepoint.save({"w": torch.ones(2)}, tmp_path / "other" / "savepoint")
    with pytest.raises(savepoint.InvalidArgumentError, match="not an Accelerator state"):
        savepoint.accelerate.load_state(acc, tmp_path / "other")
    with pytest.raises(savepoint.InvalidArgumentError, match="checkpointer= is for"):
        savepoint.accelerate.save_state(acc, tmp_path / "x", checkpointer=object())
    with pytest.raises(savepoint.InvalidArgumentError, match="io_threads= is for"):
        savepoint.accelerate.save_state(acc, tmp_path / "x", async_=True, io_threads=2)
    path = savepoint.accelerate.save_state(acc, tmp_path / "one")
    acc.prepare(torch.nn.Linear(2, 2))  # a second model: no longer the saved set
    with pytest.raises(savepoint.InvalidArgumentError, match="holds 1 models"):
        savepoint.accelerate.load_state(acc, path)
    auto = Accelerator(cpu=True, project_config=ProjectConfiguration(
        project_dir=str(tmp_path / "p"), automatic_checkpoint_naming=True))
    with pytest.raises(savepoint.NotFoundError, match="no committed checkpoint"):
        savepoint.accelerate.load_state(auto)


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_gpu
@pytest.mark.parametrize("async_", [False, True], ids=["sync", "async"])
def test_cuda_state_round_trips_and_stays_on_the_gpu(tmp_path, async_):
    acc = Accelerator()
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Tanh(), torch.nn.Linear(512, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, opt = acc.prepare(model, opt)
    for _ in range(2):
        acc.backward(model(torch.randn(16, 256, device=acc.device)).square().mean())
        opt.step()
        opt.zero_grad()
    want = {k: v.clone() for k, v in model.state_dict().items()}
    want_avg = opt.state_dict()["state"][0]["exp_avg"].clone()
    out = savepoint.accelerate.save_state(acc, tmp_path / "g", async_=async_)
    with torch.no_grad():  # training goes on while an asynchronous save is written
        for p in model.parameters():
            p.add_(1)
    if async_:
        assert out.wait()
    savepoint.accelerate.load_state(acc, tmp_path / "g")
    for k, v in model.state_dict().items():
        assert v.is_cuda and torch.equal(v, want[k]), k
    avg = opt.state_dict()["state"][0]["exp_avg"]
    assert avg.is_cuda and torch.equal(avg, want_avg)


def test_hooks_may_take_models_and_write_beside_the_state(tmp_path):
    acc = Accelerator(cpu=True)
    kept, own = acc.prepare(torch.nn.Linear(3, 3), torch.nn.Linear(2, 2))

    def save_hook(models, weights, directory):  # the diffusers pattern: save one model yourself
        torch.save(models[1].state_dict(), os.path.join(directory, "own.pt"))
        models.pop(1)
        weights.pop(1)

    def load_hook(models, directory):
        models.pop(1).load_state_dict(torch.load(os.path.join(directory, "own.pt")))

    acc.register_save_state_pre_hook(save_hook)
    acc.register_load_state_pre_hook(load_hook)
    want = [{k: v.clone() for k, v in m.state_dict().items()} for m in (kept, own)]
    savepoint.accelerate.save_state(acc, tmp_path / "h")
    assert sorted(os.listdir(tmp_path / "h")) == ["own.pt", "savepoint"]
    with torch.no_grad():
        kept.weight.zero_()
        own.weight.zero_()
    savepoint.accelerate.load_state(acc, tmp_path / "h")
    assert len(acc._models) == 2  # the hooks popped from copies
    for m, w in zip((kept, own), want):
        assert all(torch.equal(v, w[k]) for k, v in m.state_dict().items())


def test_a_numbered_checkpoint_is_never_replaced_but_debris_is_cleared(tmp_path):
    acc = Accelerator(cpu=True, project_config=ProjectConfiguration(
        project_dir=str(tmp_path), automatic_checkpoint_naming=True))
    acc.prepare(torch.nn.Linear(2, 2))
    first = savepoint.accelerate.save_state(acc)
    assert first.endswith("checkpoint_0") and acc.project_configuration.iteration == 1
    acc.project_configuration.iteration = 0
    with pytest.raises(savepoint.AlreadyExistsError, match="checkpoint_0 already exists"):
        savepoint.accelerate.save_state(acc)
    # checkpoint_1 holds only what a killed save left: it is cleaned and used.
    debris = (tmp_path / "checkpoints" / "checkpoint_1" /
              ".savepoint.savepoint-tmp.999999.00000000000000ff")
    debris.mkdir(parents=True)
    acc.project_configuration.iteration = 1
    second = savepoint.accelerate.save_state(acc)
    assert os.listdir(second) == ["savepoint"]
    assert savepoint.accelerate.load_state(acc) == second
