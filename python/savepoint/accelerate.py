"""savepoint for Hugging Face Accelerate: an Accelerator's whole state in one savepoint checkpoint.

    import savepoint.accelerate

    savepoint.accelerate.install(accelerator)      # keep calling accelerator.save_state / load_state
    accelerator.save_state("ckpt/step-100")
    accelerator.load_state("ckpt/step-100")

    fut = savepoint.accelerate.save_state(accelerator, "ckpt/step-200", async_=True)  # or explicit

What `Accelerator.save_state` writes as a dozen files (weights in safetensors, the rest pickled by
torch.save) goes into one checkpoint: the prepared models' weights, the optimizers, the schedulers,
the gradient scaler, the dataloaders' positions (the epoch a prepared dataloader is in, which
Accelerate's own files leave out, a seedable sampler's epoch and seed, a stateful dataloader's
state), the RNG states with `accelerator.step`, and the objects registered with
`register_for_checkpointing`. The model-state hooks registered with
`register_save_state_pre_hook` / `register_load_state_pre_hook` are called as Accelerate calls
them. With `async_=True` the call returns once the tensors are staged (savepoint's
AsyncCheckpointer; CUDA tensors by DMA) and the write goes on in the background.

`ProjectConfiguration(automatic_checkpoint_naming=True, total_limit=N)` is honoured: checkpoints go
to `<project_dir>/checkpoints/checkpoint_<iteration>`, loading without a path takes the newest
committed one, and older ones beyond `total_limit` are deleted (their own files only) only after
the new one has committed. One process only: several processes, FSDP, DeepSpeed and Megatron-LM
keep Accelerate's own `save_state` (UnimplementedError says so). Layout: docs/FORMAT.md §13.
"""

from __future__ import annotations

import functools
import os
import random
import re
from typing import Any

import numpy as np

from . import _errors, _load, _objects, _save
from ._types import StrPath

try:
    import torch
    from accelerate.data_loader import SeedableRandomSampler
except ImportError as e:  # pragma: no cover (the test venv has both)
    raise ImportError(f"savepoint.accelerate needs torch and accelerate (pip install accelerate): "
                      f"{e}") from e  # fmt: skip

_MARK = "savepoint.accelerate"  # top-level key of the saved tree: the layout's version
_LAYOUT = 1
_NUMBERED = re.compile(r"^checkpoint_(\d+)$")
_PENDING = "_savepoint_pending"  # accelerator attribute: (SaveFuture, directory to prune) or None


def install(accelerator: Any, **options: Any) -> None:
    """Makes `accelerator.save_state` and `accelerator.load_state` go through savepoint
    (save_state / load_state below, with `options` as their keywords: async_, checkpointer,
    io_threads, compression). Accelerate's `safe_serialization` and `load_kwargs` /
    `load_model_func_kwargs` are taken and have nothing to do: savepoint pickles no tensors."""
    save_keys = {"async_", "checkpointer", "io_threads", "compression"}
    unknown = set(options) - save_keys
    if unknown:
        raise _errors.InvalidArgumentError(
            f"savepoint.accelerate.install: unknown options {sorted(unknown)}; valid: "
            f"{sorted(save_keys)}")
    load_options = {k: v for k, v in options.items() if k == "io_threads"}

    def save(output_dir=None, safe_serialization=True, **save_model_func_kwargs):
        return save_state(accelerator, output_dir, **options)

    def load(input_dir=None, load_kwargs=None, **load_model_func_kwargs):
        return load_state(accelerator, input_dir, **load_options)

    accelerator.save_state = functools.wraps(type(accelerator).save_state)(save)
    accelerator.load_state = functools.wraps(type(accelerator).load_state)(load)


def save_state(accelerator: Any, output_dir: StrPath | None = None, *, async_: bool = False,
               checkpointer: Any = None, io_threads: int = 4,
               compression: Any = None) -> Any:  # fmt: skip
    """Saves `accelerator`'s state as a savepoint checkpoint at `output_dir` (replacing one
    there) and returns its path (async_=True: a SaveFuture, durable once it is done).
    output_dir None: the next automatically named checkpoint (ProjectConfiguration). A save
    first waits for the previous asynchronous one. checkpointer: the AsyncCheckpointer of
    asynchronous saves (default: savepoint.default_checkpointer()). io_threads: writer threads of
    a synchronous save. compression: savepoint.save's compression=."""
    _check_supported(accelerator, "save_state")
    wait(accelerator)
    config = accelerator.project_configuration
    path, prune = _output_dir(accelerator, output_dir)
    parts = _parts(accelerator, path)
    plain, objects = _objects.split(parts)
    tree = {_MARK: _LAYOUT, "checkpoint": plain, "objects": _objects.pickle_objects(objects)}
    if config.automatic_checkpoint_naming:
        config.iteration += 1
    if async_:
        c = checkpointer or _save.default_checkpointer()
        fut = c.save(tree, path, overwrite=True, create_parents=True, compression=compression)
        setattr(accelerator, _PENDING, (fut, prune))
        return fut
    _save.save(tree, path, overwrite=True, create_parents=True, io_threads=io_threads,
               compression=compression)  # fmt: skip
    _prune(accelerator, prune)
    return path


def wait(accelerator: Any) -> None:
    """Blocks until the accelerator's asynchronous save (if any) is durable, then deletes the
    automatically named checkpoints beyond total_limit; raises the save's failure."""
    pending = getattr(accelerator, _PENDING, None)
    if pending is None:
        return
    setattr(accelerator, _PENDING, None)
    fut, prune = pending
    fut.wait()
    _prune(accelerator, prune)


def load_state(accelerator: Any, input_dir: StrPath | None = None, *, io_threads: int = 4) -> str:
    """Loads a checkpoint written by save_state into `accelerator`'s prepared objects, RNG
    states and step; returns its path. input_dir None: the newest committed automatically named
    checkpoint. The registered objects must match those saved (InvalidArgumentError otherwise).
    A directory written by Accelerate's own save_state is loaded by Accelerate's load_state."""
    _check_supported(accelerator, "load_state")
    wait(accelerator)
    path = os.fspath(input_dir) if input_dir is not None else _newest(accelerator)
    if _written_by_accelerate(path):  # (a run that switched to savepoint resumes as before)
        type(accelerator).load_state(accelerator, path)
        return path
    for hook in accelerator._load_model_state_pre_hook.values():
        hook(accelerator._models, path)
    tree = _load.load(path, framework="pt", map_location="cpu", io_threads=io_threads)
    if type(tree) is not dict or tree.get(_MARK) != _LAYOUT:
        raise _errors.InvalidArgumentError(
            f"savepoint.accelerate: {path} is not an Accelerator state written by "
            f"savepoint.accelerate (load it with savepoint.load)")
    state = _objects.join(tree["checkpoint"], _objects.unpickle_objects(tree["objects"], True))
    _restore(accelerator, state, path)
    if accelerator.project_configuration.automatic_checkpoint_naming:
        m = _NUMBERED.match(os.path.basename(os.path.normpath(path)))
        if m:
            accelerator.project_configuration.iteration = int(m.group(1)) + 1
    return path


# ---------------------------------------------------------------------- what is saved


def _parts(accelerator, path):
    weights = [accelerator.get_state_dict(m, unwrap=False) for m in accelerator._models]
    for hook in accelerator._save_model_state_pre_hook.values():
        hook(accelerator._models, weights, path)
    rng = {"python": random.getstate(), "numpy": np.random.get_state(),
           "torch": torch.get_rng_state()}  # fmt: skip
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return {
        "models": weights,
        "optimizers": [o.state_dict() for o in accelerator._optimizers],
        "schedulers": [s.state_dict() for s in accelerator._schedulers],
        "dataloaders": [_dataloader_state(d) for d in accelerator._dataloaders],
        "scaler": accelerator.scaler.state_dict() if accelerator.scaler is not None else None,
        "rng": rng,
        "step": accelerator.step,
        "custom": [o.state_dict() for o in accelerator._custom_objects],
    }


def _dataloader_state(dataloader):
    state = {}
    if isinstance(getattr(dataloader, "iteration", None), int):  # the epoch its __iter__ sets
        state["iteration"] = dataloader.iteration
    sampler = dataloader.get_sampler() if hasattr(dataloader, "get_sampler") else None
    if isinstance(sampler, SeedableRandomSampler):
        state["sampler"] = {"epoch": sampler.epoch, "initial_seed": sampler.initial_seed}
    if getattr(dataloader, "use_stateful_dataloader", False):
        state["state"] = dataloader.state_dict()
    return state


def _restore(accelerator, state, path):
    counts = {"models": accelerator._models, "optimizers": accelerator._optimizers,
              "schedulers": accelerator._schedulers, "dataloaders": accelerator._dataloaders,
              "custom": accelerator._custom_objects}  # fmt: skip
    for key, live in counts.items():
        if len(state[key]) != len(live):
            raise _errors.InvalidArgumentError(
                f"savepoint.accelerate.load_state: {path} holds {len(state[key])} {key}, the "
                f"accelerator has {len(live)}: prepare and register the same objects as when it "
                f"was saved")
    for model, sd in zip(accelerator._models, state["models"]):
        model.load_state_dict(sd)
    for opt, sd in zip(accelerator._optimizers, state["optimizers"]):
        opt.load_state_dict(sd)
    for sched, sd in zip(accelerator._schedulers, state["schedulers"]):
        sched.load_state_dict(sd)
    for dl, sd in zip(accelerator._dataloaders, state["dataloaders"]):
        sampler = dl.get_sampler() if hasattr(dl, "get_sampler") else None
        if "sampler" in sd and isinstance(sampler, SeedableRandomSampler):
            sampler.epoch = sd["sampler"]["epoch"]
            sampler.initial_seed = sd["sampler"]["initial_seed"]
        if "iteration" in sd:
            dl.set_epoch(sd["iteration"])  # (Accelerate's own load_state starts over at 0)
        if "state" in sd:
            dl.load_state_dict(sd["state"])
    if accelerator.scaler is not None and state["scaler"] is not None:
        accelerator.scaler.load_state_dict(state["scaler"])
    for obj, sd in zip(accelerator._custom_objects, state["custom"]):
        obj.load_state_dict(sd)
    rng = state["rng"]
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available() and len(rng["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(rng["cuda"])
    accelerator.step = state["step"]


# ---------------------------------------------------------------------- where, and retention


def _check_supported(accelerator, what):
    kind = str(accelerator.distributed_type).split(".")[-1]
    if accelerator.num_processes != 1 or kind in ("FSDP", "DEEPSPEED", "MEGATRON_LM", "XLA"):
        raise _errors.UnimplementedError(
            f"savepoint.accelerate.{what}: {accelerator.num_processes} processes, "
            f"distributed type {kind}: only one process is taken over; use "
            f"Accelerator.{what} (or savepoint.save with process_group= for sharded state)")


def _output_dir(accelerator, output_dir):
    """(checkpoint path, directory whose numbered checkpoints are pruned after it or None)."""
    config = accelerator.project_configuration
    if not config.automatic_checkpoint_naming:
        if output_dir is None:
            raise _errors.InvalidArgumentError(
                "savepoint.accelerate.save_state: no output_dir, and automatic checkpoint naming "
                "is off (ProjectConfiguration(automatic_checkpoint_naming=True))")
        return os.fspath(output_dir), None
    root = os.path.join(accelerator.project_dir, "checkpoints")
    path = os.path.join(root, f"checkpoint_{config.iteration}")
    if os.path.exists(path):  # (Accelerate's rule: a numbered checkpoint is never replaced)
        raise _errors.AlreadyExistsError(
            f"savepoint.accelerate.save_state: {path} already exists: set "
            f"accelerator.project_configuration.iteration to the iteration to go on with")
    return path, root


def _written_by_accelerate(path):
    return not os.path.isfile(os.path.join(path, "MANIFEST")) and os.path.isfile(
        os.path.join(path, "random_states_0.pkl"))


def _numbered(root):
    found = []
    for name in os.listdir(root) if os.path.isdir(root) else ():
        m = _NUMBERED.match(name)
        if m and os.path.isfile(os.path.join(root, name, "MANIFEST")):
            found.append((int(m.group(1)), os.path.join(root, name)))
    return [p for _, p in sorted(found)]


def _prune(accelerator, root):
    limit = accelerator.project_configuration.total_limit
    if root is None or limit is None:
        return
    committed = _numbered(root)
    for path in committed[: max(0, len(committed) - limit)]:
        _load.delete(path)


def _newest(accelerator):
    if not accelerator.project_configuration.automatic_checkpoint_naming:
        raise _errors.InvalidArgumentError(
            "savepoint.accelerate.load_state: no input_dir, and automatic checkpoint naming is off")
    committed = _numbered(os.path.join(accelerator.project_dir, "checkpoints"))
    if not committed:
        raise _errors.NotFoundError(
            f"savepoint.accelerate.load_state: no committed checkpoint under "
            f"{os.path.join(accelerator.project_dir, 'checkpoints')}")
    return committed[-1]
