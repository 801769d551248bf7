"""savepoint.hf with the real Transformers Trainer: a tiny GPT-2 built from a config, trained with
dropout and a shuffled sampler, SIGKILLed or SIGTERMed mid-run, resumes with
resume_from_checkpoint=True and repeats the uninterrupted plain Trainer's losses bit for bit; an
interrupted save is passed over; rotation keeps committed checkpoints only."""

import os
import signal

import pytest

import savepoint
import savepoint.hf
from conftest import read_losses as _losses
from conftest import reference_losses, run_training


def _train(out, losses, *args, rc=0):
    run_training("hf_train.py", out, losses, *args, rc=rc)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):  # the plain Trainer, uninterrupted
    return reference_losses(tmp_path_factory, "hf_train.py", "--trainer", "plain")


def _checkpoints(out):
    return sorted(n for n in os.listdir(out) if n.startswith("checkpoint-"))


def test_a_killed_trainer_resumes_with_the_same_losses_bit_for_bit(tmp_path, reference):
    out, losses = tmp_path / "out", tmp_path / "losses.txt"
    _train(out, losses, "--trainer", "savepoint", "--kill-at", "15", rc=-signal.SIGKILL)
    before = _losses(losses)
    assert before == reference[:15]
    assert _checkpoints(out) == ["checkpoint-12", "checkpoint-6"]
    for name in _checkpoints(out):  # no model.safetensors / optimizer.pt: savepoint holds them
        assert savepoint.hf.is_committed(out / name)
        assert not (out / name / "optimizer.pt").exists()
        assert not (out / name / "model.safetensors").exists()
        assert (out / name / "config.json").exists()  # the small files are the Trainer's as before
        assert (out / name / "training_args.bin").exists()
        savepoint.verify(savepoint.hf.state_path(out / name))
    _train(out, losses, "--trainer", "savepoint", "--resume")
    after = _losses(losses)[len(before):]
    assert after == reference[12:], "the resumed run's losses differ"
    assert _checkpoints(out) == ["checkpoint-18", "checkpoint-24"]


def test_sigterm_saves_the_current_step_and_stops(tmp_path, reference):
    out, losses = tmp_path / "out", tmp_path / "losses.txt"
    _train(out, losses, "--trainer", "savepoint", "--term-at", "9")
    before = _losses(losses)
    assert before == reference[:9]
    assert "checkpoint-9" in _checkpoints(out)
    assert savepoint.hf.last_checkpoint(out) == os.path.join(out, "checkpoint-9")
    _train(out, losses, "--trainer", "savepoint", "--resume")
    assert _losses(losses)[9:] == reference[9:]


def test_an_interrupted_save_is_passed_over(tmp_path, reference):
    out, losses = tmp_path / "out", tmp_path / "losses.txt"
    _train(out, losses, "--trainer", "savepoint", "--kill-at", "14", rc=-signal.SIGKILL)
    # As if the process had died while writing checkpoint-18's state: trainer_state.json is not
    # written yet, and the savepoint part is the temporary of an unfinished save.
    torn = out / "checkpoint-18" / ".savepoint.savepoint-tmp.999999.0123456789abcdef"
    torn.mkdir(parents=True)
    (torn / "data-00000-00000.spd").write_bytes(b"partial")
    assert savepoint.hf.last_checkpoint(out) == os.path.join(out, "checkpoint-12")
    # Died after the state committed but before trainer_state.json was written: passed over too.
    state = out / "checkpoint-12" / "trainer_state.json"
    state.rename(out / "held")
    assert savepoint.hf.last_checkpoint(out) == os.path.join(out, "checkpoint-6")
    (out / "held").rename(state)
    with pytest.raises(savepoint.NotFoundError, match="interrupted"):
        import transformers

        class Probe(savepoint.hf.TrainerMixin, transformers.Trainer):
            def __init__(self):  # only what train()'s check reads
                self.args = type("A", (), {"output_dir": str(out)})()

        Probe().train(resume_from_checkpoint=str(out / "checkpoint-18"))
    _train(out, losses, "--trainer", "savepoint", "--resume")
    assert _losses(losses)[14:] == reference[12:]
    assert not torn.exists()  # the debris went when checkpoint-18 was saved again


def test_checkpoints_of_the_plain_trainer_still_resume(tmp_path, reference):
    out, losses = tmp_path / "out", tmp_path / "losses.txt"
    _train(out, losses, "--trainer", "plain", "--kill-at", "8", rc=-signal.SIGKILL)
    assert savepoint.hf.last_checkpoint(out) == os.path.join(out, "checkpoint-6")
    _train(out, losses, "--trainer", "savepoint", "--resume")
    assert _losses(losses)[8:] == reference[6:]


def test_a_gpu_trainer_resumes_from_its_savepoint_state(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    import transformers

    def trainer(steps):
        transformers.set_seed(0)
        config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128,
                                         n_positions=16)  # fmt: skip
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / "out"), max_steps=steps, per_device_train_batch_size=4,
            save_steps=3, report_to=[], seed=0, disable_tqdm=True, learning_rate=1e-3)  # fmt: skip
        ids = torch.randint(0, 128, (32, 16), generator=torch.Generator().manual_seed(1))
        data = [{"input_ids": r, "labels": r} for r in ids]
        return savepoint.hf.Trainer(model=transformers.GPT2LMHeadModel(config), args=args,
                                    train_dataset=data)  # fmt: skip

    first = trainer(6)
    first.train()
    assert next(first.model.parameters()).is_cuda
    saved = savepoint.load(savepoint.hf.state_path(tmp_path / "out" / "checkpoint-6"))
    again = trainer(6)  # resumes at step 6 of 6: loads everything (Transformers then runs one
    again.train(resume_from_checkpoint=True)  # more step, at the schedule's learning rate of 0)
    assert again.state.global_step >= 6
    for k, v in again.model.state_dict().items():
        assert v.is_cuda and torch.equal(v.cpu(), saved["checkpoint"]["model"][k].cpu()), k
