"""savepoint.CheckpointManager: the C++ CheckpointManager for a Python training loop."""

import os

from . import _core, _errors, _load
from ._save import _flatten


class CheckpointManager:
    """Owns one checkpoint directory: decides when to save, names checkpoints
    "{prefix}-{epoch}_{step_in_epoch}", keeps an index, deletes old checkpoints by a retention
    policy, and restores the latest (or a chosen) one. Usable as a context manager (close()).

        with savepoint.CheckpointManager("ckpt", save_interval_steps=100, keep_last_n=3) as mgr:
            start = mgr.latest_step() or 0
            if start:
                state = mgr.restore()
            for step in range(start + 1, steps + 1):
                ...
                mgr.save(step, {"model": model.state_dict(), "optim": opt.state_dict()},
                         metrics={"loss": loss})

    Options (C++ ManagerOptions; defaults in parentheses): prefix ("ckpt"), save_interval_steps (1;
    0 = not by steps), save_interval_seconds (0), steps_per_epoch (0), keep_last_n (5),
    keep_per_n_minutes (0), keep_all (False), keep_every_n_steps (0), keep_best_n (0) with
    best_metric and best_mode ("min" | "max"), async_ (False: save() returns when durable; True:
    after the snapshot copy), staging_bytes (async staging cap; default a quarter of RAM, at most
    16 GiB), checksum (True: verify CRC32C on restore), gc_on_open (True), io_threads (4), direct_io
    (True). A second manager on the same directory fails (the directory is locked).
    """

    def __init__(self, directory, *, async_=False, **options):
        options["directory"] = os.fspath(directory)
        options["async"] = bool(async_)
        if options.get("staging_bytes") is None:
            options.pop("staging_bytes", None)
        self._checksum = options.get("checksum", True)
        self._io_threads = options.get("io_threads", 4)
        self._m = _core.CheckpointManager.open(options)

    def save(self, step, state, metrics=None, force=False):
        """Saves `state` (see savepoint.save) as the checkpoint of `step` if the interval says it is
        due, or if `force`; never saves one step twice. `metrics` ({str: float}) go into the index
        (keep_best_n ranks by them). Returns whether a save started. Synchronous managers return
        once it is committed; async ones after the snapshot (the state may then be modified)."""
        flat, meta_json = _flatten(state, None)
        specs = [t.spec() for t in flat.tensors]
        metrics = {str(k): float(v) for k, v in (metrics or {}).items()}
        return self._m.save(step, specs, flat.values, meta_json, metrics, bool(force))

    def should_save(self, step):
        """Whether save(step) would save now (without force)."""
        return self._m.should_save(step)

    def restore(self, step=None, *, like=None, map_location=None, mmap=False):
        """Loads the newest checkpoint (or the newest one at `step`) after waiting for saves in
        flight; returns the saved structure (keyword arguments as for savepoint.load).
        NotFoundError when there is none."""
        self._m.wait()
        records = self._m.all()
        if step is not None:
            records = [r for r in records if r["step"] == step]
        if not records:
            at = "" if step is None else f" at step {step}"
            raise _errors.NotFoundError(f"checkpoint manager {self.directory}: no checkpoint{at}")
        return _load.load(records[-1]["path"], like=like, map_location=map_location, mmap=mmap,
                          verify=self._checksum, io_threads=self._io_threads)  # fmt: skip

    def latest_step(self):
        """Step of the newest committed checkpoint, or None."""
        return self._m.latest_step()

    def all_steps(self):
        """Steps of the committed checkpoints, oldest first."""
        return self._m.all_steps()

    def checkpoints(self):
        """The index: dicts (name, path, step, epoch, step_in_epoch, created_ns, bytes, breakpoint,
        epoch_end, metrics), oldest first."""
        return self._m.all()

    def stats(self):
        """Every save / load / delete so far: dicts (action, name, step, bytes, seconds,
        blocked_seconds)."""
        return self._m.stats()

    def wait(self):
        """Waits for every save in flight (indexes them, applies retention); raises the first error."""
        self._m.wait()

    def close(self):
        """wait(), writes the index, releases the directory lock. Idempotent."""
        self._m.close()

    @property
    def directory(self):
        return self._m.directory

    @property
    def prefix(self):
        return self._m.prefix

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
