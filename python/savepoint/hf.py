"""savepoint for Hugging Face Transformers' `Trainer`.

    import savepoint.hf

    trainer = savepoint.hf.Trainer(model=model, args=args, train_dataset=data,
                                   callbacks=[savepoint.hf.SaveOnSignal()])
    trainer.train(resume_from_checkpoint=True)

or, for a Trainer subclass of your own (Seq2SeqTrainer, SFTTrainer, ...):

    class MyTrainer(savepoint.hf.TrainerMixin, transformers.Seq2SeqTrainer): ...

Each checkpoint the Trainer writes (`checkpoint-N/` under `output_dir`, every `save_steps`) keeps
Transformers' own `trainer_state.json` (and the files of strategies savepoint does not take over),
while the model weights, optimizer, scheduler, gradient scaler and RNG states go into one savepoint
checkpoint, `checkpoint-N/savepoint/`: parallel, checksummed, crash-consistent. It is committed
before the Trainer writes `trainer_state.json` and before it rotates older checkpoints out
(`save_total_limit`), so a crash never leaves fewer committed checkpoints than it found.
`train(resume_from_checkpoint=True)` resumes from the newest `checkpoint-N` whose state committed
(Transformers' own choice is the highest N, finished or not); a `checkpoint-N` written by the plain
Trainer still resumes as before. `SaveOnSignal` saves a checkpoint at the end of the step in which
SIGTERM (by default) arrives, then stops training, so that a preempted job keeps its last step.

Final models are not checkpoints: `trainer.save_model()` called by you writes Transformers' usual
files (`from_pretrained` reads them). Several processes (DDP), DeepSpeed, FSDP, XLA and SageMaker
model parallelism keep the Trainer's own checkpoint files. The layout is docs/FORMAT.md §13;
docs/INTEROP.md has the details.
"""

from __future__ import annotations

import json
import os
import re
import signal

from . import _errors, _load, _objects, _save

try:
    import torch
    import transformers
except ImportError as e:  # pragma: no cover (the test venv has both)
    raise ImportError(f"savepoint.hf needs torch and transformers (pip install transformers): "
                      f"{e}") from e  # fmt: skip

SUBDIR = "savepoint"  # the savepoint checkpoint inside checkpoint-N/
_MARK = "savepoint.hf"  # top-level key of the saved tree (docs/FORMAT.md §13)
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def state_path(checkpoint_dir):
    """The savepoint checkpoint of a Trainer checkpoint directory."""
    return os.path.join(os.fspath(checkpoint_dir), SUBDIR)


def is_committed(checkpoint_dir):
    """Whether `checkpoint_dir` holds a committed savepoint state (its MANIFEST is there)."""
    return os.path.isfile(os.path.join(state_path(checkpoint_dir), "MANIFEST"))


def last_checkpoint(output_dir):
    """The newest `checkpoint-N` under `output_dir` that can be resumed from: its savepoint state
    committed, or (written by the plain Trainer) no savepoint state at all. None if there is
    none. An interrupted save (a `savepoint/` without a MANIFEST, or debris, or no readable
    `trainer_state.json`, which the Trainer writes after the savepoint state) is passed over."""
    found = []
    for name in os.listdir(output_dir) if os.path.isdir(output_dir) else ():
        m = _CHECKPOINT.match(name)
        path = os.path.join(output_dir, name)
        if m and os.path.isdir(path):
            found.append((int(m.group(1)), path))
    for _, path in sorted(found, reverse=True):
        if not _readable_trainer_state(path):
            continue  # (the Trainer reads it first; it is written after the savepoint state)
        if is_committed(path) or not _has_savepoint_part(path):
            return path
    return None


def _readable_trainer_state(checkpoint_dir):
    try:
        with open(os.path.join(checkpoint_dir, "trainer_state.json"), encoding="utf-8") as f:
            json.load(f)
        return True
    except (OSError, ValueError):
        return False


def _has_savepoint_part(checkpoint_dir):
    prefix = f".{SUBDIR}.savepoint-"
    return any(n == SUBDIR or n.startswith(prefix) for n in os.listdir(checkpoint_dir))


class TrainerMixin:
    """Takes over the checkpoint files of a `transformers.Trainer` (see the module's text).
    Put it before the Trainer class: `class T(savepoint.hf.TrainerMixin, transformers.Trainer)`.

    savepoint_io_threads: writer and reader threads (default 4).
    savepoint_compression: per-chunk compression (savepoint.save's compression=; default None).
    """

    def __init__(self, *args, savepoint_io_threads: int = 4, savepoint_compression=None,
                 **kwargs) -> None:  # fmt: skip
        super().__init__(*args, **kwargs)
        if self.args.push_to_hub:
            raise _errors.InvalidArgumentError(
                "savepoint.hf: push_to_hub=True would push checkpoints without their weights "
                "(they are in checkpoint-N/savepoint/): use transformers.Trainer for that run, or "
                "push the final save_model() yourself")
        self._sp_io_threads = savepoint_io_threads
        self._sp_compression = savepoint_compression
        self._sp_parts = None  # while a checkpoint is being written: its pieces
        self._sp_parts_with_tensors = {}  # savepoint state path -> parts that hold tensors

    # ------------------------------------------------------------------ saving

    def _save_checkpoint(self, model, trial):
        self._sp_parts = {} if self._sp_takes_over() else None
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._sp_parts = None

    def save_model(self, output_dir=None, _internal_call=False):
        if self._sp_parts is None or not _internal_call:
            return super().save_model(output_dir, _internal_call=_internal_call)
        self._sp_parts["model"] = self.model.state_dict()
        self._sp_small_files(output_dir)
        if self.args.save_only_model:  # no optimizer, scaler or RNG states follow
            self._sp_commit(output_dir)
        return None

    def _sp_small_files(self, output_dir):
        """What the Trainer writes beside the weights (the model's config and generation config,
        the tokenizer or processor, the training arguments), so that checkpoint-N describes its
        model as before."""
        if not self.args.should_save:
            return
        os.makedirs(output_dir, exist_ok=True)
        for obj in (getattr(self.model, "config", None),
                    getattr(self.model, "generation_config", None), self.processing_class):
            if obj is not None and hasattr(obj, "save_pretrained"):
                obj.save_pretrained(output_dir)
        torch.save(self.args, os.path.join(output_dir, "training_args.bin"))

    def _save_optimizer_and_scheduler(self, output_dir):
        if self._sp_parts is None:
            return super()._save_optimizer_and_scheduler(output_dir)
        self._sp_parts["optimizer"] = self.optimizer.state_dict()
        if self.lr_scheduler is not None:
            self._sp_parts["scheduler"] = self.lr_scheduler.state_dict()
        return None

    def _save_scaler(self, output_dir):
        if self._sp_parts is None:
            return super()._save_scaler(output_dir)
        scaler = getattr(self.accelerator, "scaler", None)
        if scaler is not None:
            self._sp_parts["scaler"] = scaler.state_dict()
        return None

    def _save_rng_state(self, output_dir):
        if self._sp_parts is None:
            return super()._save_rng_state(output_dir)
        self._sp_parts["rng"] = _objects.capture_rng()
        self._sp_commit(output_dir)  # the last piece: commit before trainer_state.json
        return None

    def _sp_commit(self, output_dir):
        tree = _objects.pack(_MARK, self._sp_parts)
        if self.args.should_save:
            if os.path.isdir(output_dir):
                _load.gc(output_dir)  # debris of a save of this step that a crash interrupted
            _save.save(tree, state_path(output_dir), overwrite=True, create_parents=True,
                       io_threads=self._sp_io_threads,
                       compression=self._sp_compression)  # fmt: skip

    def _sp_takes_over(self):
        """Single-process training: several processes (each with RNG states of its own) and
        strategies with checkpoint code of their own (DeepSpeed, FSDP, XLA, SageMaker MP) keep
        the Trainer's files."""
        return self.args.world_size == 1 and not (self.is_deepspeed_enabled or self.is_fsdp_enabled
                    or getattr(self, "is_fsdp_xla_enabled", False)
                    or transformers.utils.is_sagemaker_mp_enabled()
                    or transformers.utils.is_torch_xla_available())  # fmt: skip

    # ------------------------------------------------------------------ resuming

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        if resume_from_checkpoint is True:
            resume_from_checkpoint = last_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                raise _errors.InvalidArgumentError(  # (a ValueError, as the Trainer raises)
                    f"No valid checkpoint found in output directory ({self.args.output_dir})")
        elif resume_from_checkpoint and _has_savepoint_part(resume_from_checkpoint):
            if not is_committed(resume_from_checkpoint):
                raise _errors.NotFoundError(
                    f"savepoint.hf: {resume_from_checkpoint} holds no committed savepoint state "
                    f"(its save was interrupted): resume from savepoint.hf.last_checkpoint("
                    f"output_dir) or with resume_from_checkpoint=True")
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _sp_load(self, checkpoint, part):
        """Part `part` of a checkpoint's savepoint state (None when it was not saved)."""
        path = state_path(checkpoint)
        if path not in self._sp_parts_with_tensors:  # (one manifest read per checkpoint)
            self._sp_parts_with_tensors[path] = {
                t["name"].split(".")[1] for t in _load.info(path)["tensors"]}
        names = [f"checkpoint.{part}.*"] if part in self._sp_parts_with_tensors[path] else []
        tree = _load.load(path, map_location="cpu", names=names,
                          io_threads=self._sp_io_threads)  # fmt: skip
        return _objects.unpack(tree, _MARK, True, path, "a Trainer state").get(part)

    def _sp_resumes(self, checkpoint):
        return checkpoint is not None and self._sp_takes_over() and is_committed(checkpoint)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        if not self._sp_resumes(resume_from_checkpoint):
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        (model or self.model).load_state_dict(self._sp_load(resume_from_checkpoint, "model"))
        return None

    def _load_best_model(self):
        if not self._sp_resumes(self.state.best_model_checkpoint):
            return super()._load_best_model()
        self.model.load_state_dict(self._sp_load(self.state.best_model_checkpoint, "model"))
        return None

    def _load_optimizer_and_scheduler(self, checkpoint):
        if not self._sp_resumes(checkpoint):
            return super()._load_optimizer_and_scheduler(checkpoint)
        optimizer = self._sp_load(checkpoint, "optimizer")
        if optimizer is not None:
            self.optimizer.load_state_dict(optimizer)
            scheduler = self._sp_load(checkpoint, "scheduler")
            if scheduler is not None and self.lr_scheduler is not None:
                self.lr_scheduler.load_state_dict(scheduler)
        return None

    def _load_scaler(self, checkpoint):
        if not self._sp_resumes(checkpoint):
            return super()._load_scaler(checkpoint)
        scaler = getattr(self.accelerator, "scaler", None)
        state = self._sp_load(checkpoint, "scaler") if scaler is not None else None
        if state is not None:
            scaler.load_state_dict(state)
        return None

    def _load_rng_state(self, checkpoint):
        if not self._sp_resumes(checkpoint):
            return super()._load_rng_state(checkpoint)
        rng = self._sp_load(checkpoint, "rng")
        if rng is None:
            return None
        _objects.restore_rng(rng, f"savepoint.hf: {checkpoint}")
        return None


class Trainer(TrainerMixin, transformers.Trainer):
    """`transformers.Trainer` with its checkpoints in savepoint (TrainerMixin)."""


class SaveOnSignal(transformers.TrainerCallback):
    """Saves a checkpoint at the end of the step in which one of `signals` (default SIGTERM)
    arrives, then stops training (the Trainer returns from train()). The handler is installed when
    training begins (from the main thread) and the previous one put back when it ends. With
    `exit_code` set, the process then exits with it (after the save is durable); default None:
    train() returns and the script goes on."""

    def __init__(self, signals=(signal.SIGTERM,), exit_code=None):
        self.signals, self.exit_code = tuple(signals), exit_code
        self.received = None
        self._previous = {}

    def on_train_begin(self, args, state, control, **kwargs):
        self.received = None
        for s in self.signals:
            self._previous[s] = signal.signal(s, self._handler)

    def _handler(self, signum, frame):
        self.received = signum

    def on_step_end(self, args, state, control, **kwargs):
        if self.received is not None:
            control.should_save = True
            control.should_training_stop = True

    def on_save(self, args, state, control, **kwargs):
        if self.received is not None and self.exit_code is not None:
            raise SystemExit(self.exit_code)

    def on_train_end(self, args, state, control, **kwargs):
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous.clear()
