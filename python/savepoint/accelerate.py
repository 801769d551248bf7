"""savepoint for Hugging Face Accelerate: an Accelerator's whole state in one savepoint checkpoint.

    import savepoint.accelerate

    savepoint.accelerate.install(accelerator)   # accelerator.save_state / load_state as before
    accelerator.save_state("ckpt/step-100")
    accelerator.load_state("ckpt/step-100")

    fut = savepoint.accelerate.save_state(accelerator, "ckpt/step-200", async_=True)  # or explicit

What `Accelerator.save_state` writes as a dozen files (weights in safetensors, the rest pickled by
torch.save) goes into one savepoint checkpoint, `<output_dir>/savepoint/`: the prepared models'
weights, the optimizers, the schedulers, the gradient scaler, the dataloaders' positions (the epoch
a prepared dataloader is in, which Accelerate's own files leave out, a seedable sampler's epoch and
seed, a stateful dataloader's state), the RNG states with `accelerator.step`, and the objects
registered with `register_for_checkpointing`. The model-state hooks registered with
`register_save_state_pre_hook` / `register_load_state_pre_hook` are called as Accelerate calls them.
With `async_=True` the call returns once the tensors are staged (savepoint's AsyncCheckpointer; CUDA
tensors by DMA) and the write goes on in the background.

`ProjectConfiguration(automatic_checkpoint_naming=True, total_limit=N)` is honoured: checkpoints go
to `<project_dir>/checkpoints/checkpoint_<iteration>`, loading without a path takes the newest
committed one (or the newest Accelerate wrote), and older ones beyond `total_limit` are deleted
(savepoint's files only) only after the new one has committed. Debris of saves a crash interrupted
is removed (savepoint.gc) before a save or a load in that directory. One process only: several
processes, FSDP, DeepSpeed and Megatron-LM keep Accelerate's own `save_state` (UnimplementedError
says so). Layout: docs/FORMAT.md §13.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any

from . import _errors, _load, _objects, _save
from ._types import StrPath

try:
    import torch  # noqa: F401 (what it needs: its absence is the ImportError below)
    from accelerate.data_loader import SeedableRandomSampler
except ImportError as e:  # pragma: no cover (the test venv has both)
    raise ImportError(f"savepoint.accelerate needs torch and accelerate (pip install accelerate): "
                      f"{e}") from e  # fmt: skip

_MARK = "savepoint.accelerate"  # top-level key of the saved tree (docs/FORMAT.md §13)
SUBDIR = "savepoint"  # the savepoint checkpoint inside a save_state directory
_NUMBERED = re.compile(r"^checkpoint_(\d+)$")
_PENDING = "_savepoint_pending"  # accelerator attribute: (SaveFuture, directory to prune) or None
_MAP_LOCATIONS = (None, "cpu", "on_device")


def state_path(directory: StrPath) -> str:
    """The savepoint checkpoint of a save_state directory."""
    return os.path.join(os.fspath(directory), SUBDIR)


def install(accelerator: Any, **options: Any) -> None:
    """Makes `accelerator.save_state` and `accelerator.load_state` go through savepoint
    (save_state / load_state below, with `options` as their keywords: async_, checkpointer,
    io_threads, compression, weights_only). The installed save_state takes Accelerate's
    `safe_serialization` (savepoint pickles no tensors either way) and refuses DeepSpeed's
    `save_model_func_kwargs`; the installed load_state passes `load_kwargs` and
    `load_model_func_kwargs` to Accelerate for a directory Accelerate wrote, and for savepoint's
    takes `strict` and a `map_location` of None, "cpu" or "on_device" (the states are read into
    host memory and copied into the prepared objects on their devices either way)."""
    valid = {"async_", "checkpointer", "io_threads", "compression", "weights_only"}
    unknown = set(options) - valid
    if unknown:
        raise _errors.InvalidArgumentError(
            f"savepoint.accelerate.install: unknown options {sorted(unknown)}; valid: "
            f"{sorted(valid)}")
    save_options = {k: v for k, v in options.items() if k != "weights_only"}
    load_options = {k: v for k, v in options.items() if k in ("io_threads", "weights_only")}

    def save(output_dir=None, safe_serialization=True, **save_model_func_kwargs):
        if save_model_func_kwargs:
            raise _errors.InvalidArgumentError(
                f"savepoint.accelerate: save_state({sorted(save_model_func_kwargs)}=...) are "
                f"DeepSpeed's, which savepoint does not take over")
        return save_state(accelerator, output_dir, **save_options)

    def load(input_dir=None, load_kwargs=None, **load_model_func_kwargs):
        return load_state(accelerator, input_dir, load_kwargs=load_kwargs,
                          load_model_func_kwargs=load_model_func_kwargs,
                          **load_options)  # fmt: skip

    accelerator.save_state = functools.wraps(type(accelerator).save_state)(save)
    accelerator.load_state = functools.wraps(type(accelerator).load_state)(load)


def save_state(accelerator: Any, output_dir: StrPath | None = None, *, async_: bool = False,
               checkpointer: Any = None, io_threads: int = 4,
               compression: Any = None) -> Any:  # fmt: skip
    """Saves `accelerator`'s state as a savepoint checkpoint in `output_dir` (at
    `output_dir/savepoint/`, replacing one there; the model hooks may write files of their own
    beside it) and returns `output_dir` (async_=True: a SaveFuture, durable once it is done).
    output_dir None: the next automatically named checkpoint (ProjectConfiguration). A save
    first waits for the previous asynchronous one. checkpointer: the AsyncCheckpointer of an
    asynchronous save (default: savepoint.default_checkpointer()). io_threads: writer threads of
    a synchronous save. compression: savepoint.save's compression=."""
    if not async_ and checkpointer is not None:
        raise _errors.InvalidArgumentError(
            "savepoint.accelerate.save_state: checkpointer= is for async_=True saves")
    if async_ and io_threads != 4:
        raise _errors.InvalidArgumentError(
            "savepoint.accelerate.save_state: io_threads= is for synchronous saves (an "
            "asynchronous one writes with its checkpointer's threads)")
    _check_supported(accelerator, "save_state")
    wait(accelerator)
    config = accelerator.project_configuration
    directory, prune = _output_dir(accelerator, output_dir)
    if os.path.isdir(directory):
        _load.gc(directory)  # debris of a save here that a crash interrupted
        if prune is not None and os.listdir(directory):  # (Accelerate's rule: a numbered
            raise _errors.AlreadyExistsError(  # checkpoint is never replaced)
                f"savepoint.accelerate.save_state: {directory} already exists: set "
                f"accelerator.project_configuration.iteration to the iteration to go on with")
    os.makedirs(directory, exist_ok=True)
    parts = _parts(accelerator, directory)
    tree = _objects.pack(_MARK, parts)
    config.iteration += 1  # (as Accelerate counts its saves)
    path = state_path(directory)
    if async_:
        c = checkpointer or _save.default_checkpointer()
        fut = c.save(tree, path, overwrite=True, compression=compression)
        setattr(accelerator, _PENDING, (fut, prune))
        return fut
    _save.save(tree, path, overwrite=True, io_threads=io_threads, compression=compression)
    _prune(accelerator, prune)
    return directory


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


def load_state(accelerator: Any, input_dir: StrPath | None = None, *, io_threads: int = 4,
               weights_only: bool = True, load_kwargs: dict | None = None,
               load_model_func_kwargs: dict | None = None) -> str:  # fmt: skip
    """Loads a state written by save_state into `accelerator`'s prepared objects, RNG states
    and step; returns the directory. input_dir None: the newest automatically named checkpoint
    that committed (or that Accelerate wrote). The registered objects must match those saved
    (InvalidArgumentError otherwise). weights_only: torch.load's, for what the tree could not
    hold (registered objects' states of other types; default True; Accelerate itself loads
    those with False). A directory written by Accelerate's own save_state is loaded by
    Accelerate's load_state, with load_kwargs and load_model_func_kwargs."""
    _check_supported(accelerator, "load_state")
    wait(accelerator)
    directory = os.fspath(input_dir) if input_dir is not None else _newest(accelerator)
    if _written_by_accelerate(directory):  # (a run that switched to savepoint resumes as before)
        type(accelerator).load_state(accelerator, directory, load_kwargs=load_kwargs,
                                     **(load_model_func_kwargs or {}))  # fmt: skip
        return directory
    extra = dict(load_model_func_kwargs or {})
    strict = extra.pop("strict", True)
    if extra.pop("map_location", None) not in _MAP_LOCATIONS or extra or load_kwargs:
        raise _errors.InvalidArgumentError(
            f"savepoint.accelerate.load_state: {sorted(extra)}, load_kwargs={load_kwargs!r}: a "
            f"savepoint state takes strict and a map_location of {list(_MAP_LOCATIONS)}")
    _load.gc(directory)  # (restores a state that an interrupted overwrite set aside)
    if not os.path.isdir(state_path(directory)):
        raise _errors.NotFoundError(
            f"savepoint.accelerate.load_state: {directory} holds no savepoint state "
            f"({state_path(directory)}) and no files of Accelerate's save_state")
    models = list(accelerator._models)  # (the hooks may take some: they load those themselves)
    for hook in accelerator._load_model_state_pre_hook.values():
        hook(models, directory)
    tree = _load.load(state_path(directory), map_location="cpu", io_threads=io_threads)
    state = _objects.unpack(tree, _MARK, weights_only, state_path(directory),
                            "an Accelerator state")  # fmt: skip
    _restore(accelerator, state, models, strict, directory)
    if accelerator.project_configuration.automatic_checkpoint_naming:
        m = _NUMBERED.match(os.path.basename(os.path.normpath(directory)))
        if m:
            accelerator.project_configuration.iteration = int(m.group(1)) + 1
    return directory


# ---------------------------------------------------------------------- what is saved


def _parts(accelerator, directory):
    weights = [accelerator.get_state_dict(m, unwrap=False) for m in accelerator._models]
    models = list(accelerator._models)  # (hooks pop from these lists: Accelerate's are kept)
    for hook in accelerator._save_model_state_pre_hook.values():
        hook(models, weights, directory)
    return {
        "models": weights,
        "optimizers": [o.state_dict() for o in accelerator._optimizers],
        "schedulers": [s.state_dict() for s in accelerator._schedulers],
        "dataloaders": [_dataloader_state(d) for d in accelerator._dataloaders],
        "scaler": accelerator.scaler.state_dict() if accelerator.scaler is not None else None,
        "rng": _objects.capture_rng(),
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


def _restore(accelerator, state, models, strict, path):
    counts = {"models": models, "optimizers": accelerator._optimizers,
              "schedulers": accelerator._schedulers, "dataloaders": accelerator._dataloaders,
              "custom": accelerator._custom_objects}  # fmt: skip
    for key, live in counts.items():
        if len(state[key]) != len(live):
            raise _errors.InvalidArgumentError(
                f"savepoint.accelerate.load_state: {path} holds {len(state[key])} {key}, the "
                f"accelerator has {len(live)}: prepare and register the same objects as when it "
                f"was saved")
    for model, sd in zip(models, state["models"]):
        model.load_state_dict(sd, strict=strict)
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
    _objects.restore_rng(state["rng"], f"savepoint.accelerate: {path}")
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
    """(directory of the save, directory whose numbered checkpoints are pruned after it, or
    None)."""
    config = accelerator.project_configuration
    if not config.automatic_checkpoint_naming:
        if output_dir is None:
            raise _errors.InvalidArgumentError(
                "savepoint.accelerate.save_state: no output_dir, and automatic checkpoint naming "
                "is off (ProjectConfiguration(automatic_checkpoint_naming=True))")
        return os.fspath(output_dir), None
    root = os.path.join(accelerator.project_dir, "checkpoints")
    return os.path.join(root, f"checkpoint_{config.iteration}"), root


def _written_by_accelerate(directory):
    return not os.path.isdir(state_path(directory)) and os.path.isfile(
        os.path.join(directory, "random_states_0.pkl"))


def _numbered(root, accelerates_too=False):
    """[(iteration, directory)] of the numbered checkpoints under `root` whose savepoint state
    committed (and, with accelerates_too, those Accelerate wrote), oldest first."""
    found = []
    for name in os.listdir(root) if os.path.isdir(root) else ():
        m = _NUMBERED.match(name)
        path = os.path.join(root, name)
        if m and (os.path.isfile(os.path.join(state_path(path), "MANIFEST"))
                  or (accelerates_too and _written_by_accelerate(path))):  # fmt: skip
            found.append((int(m.group(1)), path))
    return sorted(found)


def _prune(accelerator, root):
    """Deletes the oldest committed numbered checkpoints beyond total_limit (at least the newest
    one stays): their savepoint states, and their directories once empty (files the model hooks
    wrote there are the user's and stay). Interrupted saves older than the newest committed one
    lose their debris."""
    limit = accelerator.project_configuration.total_limit
    if root is None or limit is None:
        return
    committed = _numbered(root)
    newest = committed[-1][0] if committed else -1
    for n, path in committed[: max(0, len(committed) - max(1, limit))]:
        _load.delete(state_path(path))
        _remove_if_empty(path)
    for name in os.listdir(root):
        m = _NUMBERED.match(name)
        path = os.path.join(root, name)
        if m and int(m.group(1)) < newest and not os.path.isdir(state_path(path)):
            _load.gc(path)
            _remove_if_empty(path)


def _remove_if_empty(path):
    try:
        os.rmdir(path)
    except OSError:
        pass  # (not empty: what is left is not savepoint's)


def _newest(accelerator):
    if not accelerator.project_configuration.automatic_checkpoint_naming:
        raise _errors.InvalidArgumentError(
            "savepoint.accelerate.load_state: no input_dir, and automatic checkpoint naming is off")
    root = os.path.join(accelerator.project_dir, "checkpoints")
    found = _numbered(root, accelerates_too=True)
    if not found:
        raise _errors.NotFoundError(
            f"savepoint.accelerate.load_state: no committed checkpoint under {root}")
    return found[-1][1]
