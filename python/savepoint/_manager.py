"""savepoint.CheckpointManager: the C++ CheckpointManager for a Python training loop.

The direct API (save / restore / the index) is the C++ manager's, through savepoint._core.
Registered objects, the training-loop hooks, breakpoints and signal handling are implemented
here, in Python, over the C++ direct API with the same semantics as the C++ ones (manager.h):
the C++ registry holds C++ Stateful objects, which Python objects are not.
"""

from __future__ import annotations

import collections
import contextlib
import difflib
import functools
import inspect
import logging
import operator
import os
import re
import signal
import threading
from typing import Any, Callable, Iterator, Mapping

from . import _core, _cuda, _errors, _keys, _load, _registry, _sparse_io, _tree, _write, mindspore
from ._types import Categories, Key, Metrics, Names, Records, StrPath

StepInfo = collections.namedtuple("StepInfo", "step epoch step_in_epoch")
StepInfo.__doc__ = """Where training is when a checkpoint is named (passed to prefix_fn and
directory_fn): global step (1-based), epoch (1-based), step within the epoch."""

_logger = logging.getLogger("savepoint")

# The async_options dict's keys (C++ CheckpointerOptions fields) and their types.
_ASYNC_OPTIONS = {
    "staging_bytes": int,
    "slab_bytes": int,
    "persist_during_snapshot": bool,
    "allow_concurrent_saves": bool,
    "snapshot_threads": int,
}


def _set_async(async_save, async_, staging_bytes, async_options):
    """Fills the binding's AsyncSavePolicy from CheckpointManager(async_=, staging_bytes=,
    async_options=)."""
    async_save.enabled = bool(async_)
    for key, value in (async_options or {}).items():
        if key not in _ASYNC_OPTIONS:
            raise _unknown_keyword("CheckpointManager async_options", key, list(_ASYNC_OPTIONS))
        kind = _ASYNC_OPTIONS[key]
        setattr(async_save.checkpointer, key, bool(value) if kind is bool else _int(key, value))
    if staging_bytes is not None:
        async_save.checkpointer.staging_bytes = _int("staging_bytes", staging_bytes)


def _set_compaction(sparse, compaction):
    """Fills the binding's SparsePolicy from CheckpointManager(compaction=...)."""
    sparse.compact = compaction is not False
    if compaction is None or isinstance(compaction, bool):
        return
    if not isinstance(compaction, dict):
        raise TypeError(f"CheckpointManager: compaction must be a dict, True, False or None, not "
                        f"{type(compaction).__name__}")  # fmt: skip
    for key, value in compaction.items():
        if key not in ("max_depth", "max_delta_ratio"):
            raise _unknown_keyword("CheckpointManager compaction", key,
                                   ["max_depth", "max_delta_ratio"])  # fmt: skip
        setattr(sparse.compaction, key, _int(key, value) if key == "max_depth" else float(value))


_RETENTION_KEYS = ("keep_last_n", "keep_per_n_minutes", "keep_all", "keep_every_n_steps",
                   "keep_best_n", "best_metric", "best_mode")  # fmt: skip
_REMOTE_KEYS = _RETENTION_KEYS + ("upload_every_n_steps", "threads", "max_bytes_per_second")


def _set_remote(tier, remote, remote_options):
    """Fills the binding's RemoteTier from CheckpointManager(remote=..., remote_options=...)."""
    if remote is None:
        if remote_options:
            raise _errors.InvalidArgumentError(
                "CheckpointManager: remote_options are given but remote is None (no remote tier)")
        return
    tier.location = os.fspath(remote)
    if remote_options is None:
        return
    if not isinstance(remote_options, dict):
        raise TypeError(f"CheckpointManager: remote_options must be a dict, not "
                        f"{type(remote_options).__name__}")  # fmt: skip
    for key, value in remote_options.items():
        if key not in _REMOTE_KEYS:
            raise _unknown_keyword("CheckpointManager remote_options", key, list(_REMOTE_KEYS))
        if key == "best_mode":
            tier.retention.best_mode = _choice("remote_options['best_mode']", value, _MODES)
        elif key == "best_metric":
            tier.retention.best_metric = _str("remote_options['best_metric']", value)
        elif key == "keep_all":
            tier.retention.keep_all = bool(value)
        elif key in _RETENTION_KEYS:
            setattr(tier.retention, key, _int(f"remote_options['{key}']", value))
        else:
            setattr(tier, key, _int(f"remote_options['{key}']", value))


def _choice(name, value, choices):
    """choices[value], or InvalidArgumentError naming the keyword and the valid values."""
    _str(name, value)
    if value not in choices:
        valid = ", ".join(repr(c) for c in choices)
        raise _errors.InvalidArgumentError(f"CheckpointManager: {name}={value!r}: use {valid}")
    return choices[value]


_SERIES = {"continue": _core.SeriesRule.kContinue, "new": _core.SeriesRule.kNew}
_MODES = {"min": _core.MetricMode.kMin, "max": _core.MetricMode.kMax}
_FORMATS = {"native": _core.Format.kNative, "ckpt": _core.Format.kMindSporeCkpt,
            "safetensors": _core.Format.kSafetensors}  # fmt: skip


# C++ option paths (ManagerOptions' groups) in the manager's error messages -> CheckpointManager's
# keywords.
_KEYWORDS = {
    "naming.directory_fn": "directory_fn", "naming.directory": "directory",
    "naming.prefix_fn": "prefix_fn", "naming.prefix": "prefix", "naming.series": "series",
    "save_policy.interval_steps": "save_interval_steps",
    "save_policy.interval_seconds": "save_interval_seconds",
    "save_policy.steps_per_epoch": "steps_per_epoch",
    **{f"retention.{k}": k for k in ("keep_last_n", "keep_per_n_minutes", "keep_all",
                                     "keep_every_n_steps", "keep_best_n", "best_metric",
                                     "best_mode")},
    "async_save.enabled": "async_", "async_save.checkpointer": "async_options",
    "async_save.prefault_staging": "reserve",
    "storage.format": "format", "storage.verify_checksums": "checksum", "storage.key": "key",
    "storage.file_checksum": "crc_check", "storage.cipher": "enc_mode",
    "storage.append_info": "append_info", "storage.append_dict": "append_dict",
    "breakpoints.on_exception": "exception_save", "breakpoints.handle_signals": "handle_signals",
    "sparse.compaction": "compaction", "sparse.compact": "compaction",
    "remote.location": "remote", "remote.retention": "remote_options",
    "remote.upload_every_n_steps": "remote_options['upload_every_n_steps']",
    "remote.threads": "remote_options['threads']",
    "remote.max_bytes_per_second": "remote_options['max_bytes_per_second']",
}  # fmt: skip
# A group path, after the struct's name or as a whole word (not inside a path or a name the user
# gave).
_GROUP = r"(?:naming|save_policy|retention|async_save|storage|breakpoints|sparse|remote)\.[a-z_]+"
_PATH = re.compile(rf"ManagerOptions\.({_GROUP})(?![\w])|(?<![\w./'\"\[-])({_GROUP})(?![\w\"'])")


def _keywords(message):
    """`message` with the C++ option paths it names spelled as CheckpointManager's keywords."""

    def keyword(m):
        kw = _KEYWORDS.get(m.group(1) or m.group(2))
        if kw is None:
            return m.group(0)
        return ("CheckpointManager: " if m.group(1) else "") + kw

    message = _PATH.sub(keyword, message)
    return message.replace("ManagerOptions: ", "CheckpointManager: ").replace(
        "ManagerOptions.", "CheckpointManager: ")


@contextlib.contextmanager
def _in_keywords():
    """Raises an InvalidArgumentError of the block again, naming CheckpointManager's keywords."""
    try:
        yield
    except _errors.InvalidArgumentError as e:
        raise _errors.InvalidArgumentError(_keywords(str(e))) from e


def _cuda_device(cuda, async_, format):
    """The binding's cuda_device from CheckpointManager(cuda=...): -1 for no snapshot copier."""
    staged = async_ and format == "native"
    device = _cuda.checkpointer_device(cuda, "CheckpointManager")  # (checks the value first)
    if cuda is True and not staged:
        raise _errors.InvalidArgumentError(
            f"CheckpointManager: cuda=True applies to async_=True with format='native' (here "
            f"async_={bool(async_)}, format={format!r}): those saves copy CUDA tensors to the "
            "host first")  # fmt: skip
    return device if staged else -1


def _unknown_keyword(what, key, valid):
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else f" (valid: {', '.join(sorted(valid))})"
    return TypeError(f"{what}: unknown keyword argument {key!r}{hint}")


def _suggest_keywords(func):
    """Makes an unexpected keyword argument raise a TypeError that names it and suggests the
    closest valid one (difflib), instead of Python's plain message."""
    params = inspect.signature(func).parameters.values()
    valid = [p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)][1:]
    what = func.__qualname__.replace(".__init__", "")

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        for key in kwargs:
            if key not in valid:
                raise _unknown_keyword(what, key, valid)
        return func(*args, **kwargs)

    return wrapper


def _int(name, value):
    try:
        return operator.index(value)
    except TypeError:
        t = type(value).__name__
        raise TypeError(f"CheckpointManager: {name} must be an int, not {t}") from None


def _str(name, value):
    if not isinstance(value, str):
        raise TypeError(f"CheckpointManager: {name} must be a str, not {type(value).__name__}")
    return value


def _str_keys(name, d):
    if not isinstance(d, dict) or any(type(k) is not str for k in d):
        raise TypeError(f"CheckpointManager: {name} must be a dict with str keys")
    return d


def _metrics(metrics):
    return {str(k): float(v) for k, v in (metrics or {}).items()}


def _name_callable(fn, what):
    """fn(StepInfo) -> str as the binding's f(step, epoch, step_in_epoch) -> str."""
    if not callable(fn):
        raise TypeError(f"CheckpointManager: {what} must be callable")

    def call(step, epoch, step_in_epoch):
        out = fn(StepInfo(step, epoch, step_in_epoch))
        if what == "directory_fn":
            out = os.fspath(out)
        if not isinstance(out, str):
            raise TypeError(f"CheckpointManager: {what} returned a {type(out).__name__}, not a str")
        return out

    return call


# The file suffix of each format's checkpoints (record names include it).
_SUFFIX = {"native": "", "ckpt": ".ckpt", "safetensors": ".safetensors"}

class _Signals:
    """The process's SIGTERM / SIGINT handlers of one manager (Python's signal module: main
    thread only). The handler only records the signal; the manager acts on it at its next hook.
    A second signal before that re-raises at once with the previous handler."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)
    owner = None  # the manager whose handlers are installed
    lock = threading.Lock()

    def __init__(self, manager):
        if threading.current_thread() is not threading.main_thread():
            raise _errors.FailedPreconditionError(
                "CheckpointManager(handle_signals=True): signal handlers can only be installed "
                "from the main thread (Python's signal module); open the manager there, or pass "
                "handle_signals=False")
        with _Signals.lock:
            if _Signals.owner is not None:
                raise _errors.FailedPreconditionError(
                    "handle_signals: another CheckpointManager in this process already handles "
                    "signals")
            _Signals.owner = self
        self.pending = 0
        self.previous = {}
        try:
            for sig in self.SIGNALS:
                self.previous[sig] = signal.signal(sig, self._handler)
        except BaseException:
            self.uninstall()
            raise

    def _handler(self, signum, frame):
        if self.pending:  # a second signal: give up waiting for a hook
            self.reraise(signum)
            return
        self.pending = signum

    def uninstall(self):
        """Puts the previous handlers back (SIG_DFL where they were not Python's). Idempotent."""
        previous, self.previous = self.previous, {}
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        with _Signals.lock:
            if _Signals.owner is self:
                _Signals.owner = None

    def reraise(self, signum):
        """Uninstalls, then raises `signum` again for the previous handler (which, by default,
        ends the process for SIGTERM and raises KeyboardInterrupt for SIGINT)."""
        self.uninstall()
        signal.raise_signal(signum)


class CheckpointManager:
    """Owns one checkpoint directory: decides when to save, names checkpoints
    "{prefix}-{epoch}_{step_in_epoch}", keeps an index, deletes old checkpoints by a retention
    policy, restores the latest (or a chosen) one, and saves a "_breakpoint" checkpoint when
    training dies. A second manager on the same directory fails (the directory is locked).

    Direct use: save a structure you build each time.

        with savepoint.CheckpointManager("ckpt", save_interval_steps=100, keep_last_n=3) as mgr:
            start = mgr.latest_step() or 0
            if start:
                state = mgr.restore()
            for step in range(start + 1, steps + 1):
                ...
                mgr.save(step, {"model": model.state_dict(), "optim": opt.state_dict()},
                         metrics={"loss": loss})

    Registered use: register the objects once (anything with state_dict() / load_state_dict(),
    or a dict holding state), then call the hooks.

        mgr = savepoint.CheckpointManager("ckpt", steps_per_epoch=1000, exception_save=True,
                                          handle_signals=True)
        mgr.register("model", model)                      # category "dense" (alias "model")
        mgr.register("optim", opt, category="optimizer")
        mgr.register("counters", {"seen": 0}, category="extra")
        if mgr.latest_step() is not None:
            mgr.restore_registered()
        with mgr.exception_guard():                       # a breakpoint if train() raises
            for epoch ...:
                for step ...:
                    ...
                    mgr.on_step_end(step, epoch, {"loss": loss})
                mgr.on_epoch_end(epoch)
        mgr.on_train_end()

    The direct API may be called from any thread (the C++ manager serialises calls); register,
    the hooks, the breakpoints and restore_registered belong to the training thread, and the
    registered objects are only touched from the thread that calls them.

    Options (keyword-only; an unknown one raises TypeError suggesting the closest valid name; a
    bad value raises InvalidArgumentError, a ValueError, naming it):
      Where:
        directory: the checkpoint directory (created if missing). Required unless directory_fn.
        directory_fn (None): f(StepInfo) -> path, evaluated at open (step 0) and before every
            save; when it changes, pending saves finish and the manager moves to the new
            directory (lock, index). An exception it raises propagates to the caller.
        prefix ("ckpt"): name prefix (no '/', not starting with '.', at most 200 bytes).
        series ("continue"): which series of names new checkpoints join when the directory
            already holds "{prefix}-..." or "{prefix}_{n}-..." checkpoints. "continue": a manager
            that restores (restore / restore_registered / resume_from) a checkpoint of its
            directory before its first save continues that checkpoint's series; one that saves
            without restoring starts a new series "{prefix}_{n}" (MindSpore's conflict rule), so
            it never overwrites another run. "new": always the conflict rule.
        prefix_fn (None): f(StepInfo) -> the whole checkpoint name (no "-{epoch}_{step}" suffix;
            the series rule does not apply).
      When:
        save_interval_steps (1): save when step >= last saved step + this; 0 = not by steps.
        save_interval_seconds (0): save when more than this many seconds passed since the last
            save (ignored when save_interval_steps > 0); 0 = not by time.
        steps_per_epoch (0): derives epoch and step_in_epoch for names when a save does not give
            them; 0 = every step is in epoch 1 (the hooks then track epochs themselves).
      How many to keep (a checkpoint is kept if any rule keeps it; the newest never goes):
        keep_last_n (5): the newest N.
        keep_per_n_minutes (0): one per N-minute window (when keep_last_n is 0; both 0 = 1).
        keep_all (False): everything.
        keep_every_n_steps (0): also every checkpoint whose step is a multiple of N.
        keep_best_n (0), best_metric (None), best_mode ("min" | "max"): also the best N by
            metrics[best_metric].
      How:
        async_ (False): save() returns after the snapshot copy; the write continues in the
            background (True), or once the checkpoint is durable (False).
        staging_bytes (None): async staging memory cap (default a quarter of RAM, <= 16 GiB).
        async_options (None): more of the async Checkpointer's options, a dict with keys
            staging_bytes, slab_bytes (8 MiB), persist_during_snapshot (False),
            allow_concurrent_saves (False), snapshot_threads (0 = up to 4; up to 8 with cuda).
        cuda (None): async native saves of CUDA tensors. True: copied straight from GPU memory
            into the staging slabs, page-locked once (as AsyncCheckpointer(cuda=True): the host
            link's speed, no pageable copy; save() first waits for the current stream of each
            device holding such a tensor); FailedPreconditionError without a CUDA driver, and
            InvalidArgumentError unless async_=True and format="native". False: CUDA tensors
            are copied to host memory (tensor.to("cpu")) first. None: True where async_=True,
            format="native", and torch is imported with CUDA available.
        reserve (None): async native saves: a state (anything save() takes) or a byte count;
            staging memory for that much is allocated (page-locked with cuda) in the background
            right away, so that the first save blocks for the copy alone (see reserve()).
        checksum (True): verify every chunk's CRC32C when restoring.
        format ("native"): how each checkpoint is stored: "native" (a checkpoint directory
            "{name}"), "ckpt" (a MindSpore file "{name}.ckpt", as ModelCheckpoint names them, so
            a MindSpore training loop keeps its file layout) or "safetensors" (a file
            "{name}.safetensors"). With a file format, restore() returns a flat dict {entry name:
            numpy array, or torch tensor with framework="pt"} as savepoint.mindspore.
            load_checkpoint does (int/float/bool values of a .ckpt file are 0-d arrays), and
            restore_registered / load_from are not available (UnimplementedError); record names
            include the suffix ("ckpt-1_5.ckpt"). A .ckpt file MindSpore wrote in the directory is
            indexed by its name (its step derived from steps_per_epoch).
        crc_check (False): file formats: write MindSpore's checksum (a .ckpt CRC-32 trailer, or
            the MindSpore safetensors flavour with crc_num).
        enc_mode ("AES-GCM"): format="ckpt" with a key: "AES-GCM", "AES-CBC" or "SM4-CBC".
        io_threads (4), direct_io (True): I/O of every save (synchronous, or the async
            Checkpointer's writer threads) and of restores.
        gc_on_open (True): remove debris of crashed saves when opening.
      Sparse tables (savepoint.SparseTable leaves; format="native"; docs/SPARSE.md):
        compaction ({"max_depth": 8, "max_delta_ratio": 0.5}): after a delta save
            (save(..., delta=True)) commits, when its chain holds more than max_depth deltas or
            its deltas hold more than max_delta_ratio x the bytes of its full checkpoint, the
            chain is folded into a full checkpoint under the same name, atomically, on a
            background thread (the next save, restore, wait or close waits for it). False: never
            compact. Retention never deletes a checkpoint that a kept checkpoint's chain needs.
      What else goes into every checkpoint:
        append_info (()): "epoch_num" and/or "step_num", stored as values.
        append_dict (None): {name: int | float | bool | str}, stored as values.
      Registered objects:
        shard_id (0), num_shards (1): this process's data shard: io_state objects are saved as
            "<name>.shard-<shard_id>" and restoring checks num_shards.
        exception_save (False): allow breakpoints: save_breakpoint(), exception_guard(), leaving
            the manager's `with` block by an exception, and signals (handle_signals) save
            "{prefix}-{epoch}_{step}_breakpoint" of the registered objects.
        handle_signals (False): install SIGTERM and SIGINT handlers (main thread only; at most
            one manager per process) that only record the signal; the next hook (on_step_end,
            on_epoch_end, step) then saves a breakpoint (if exception_save), waits for every
            save, closes the manager and re-raises the signal with the previous handler (SIGTERM
            then ends the process, SIGINT raises KeyboardInterrupt). A second signal before that
            re-raises at once.
      Remote tier (docs/OBJECT_STORAGE.md; format="native"):
        remote (None): a second location ("s3://bucket/run", or any directory) every committed
            checkpoint is copied to in the background, while training goes on. A checkpoint
            being uploaded is never deleted locally; restore() and the listings see both tiers
            (the local copy first), so a node that lost its disk resumes from the remote. wait()
            and close() wait for the uploads; a failed upload is logged and raised by the next
            save, wait or hook (the checkpoint stays local).
        remote_options (None): a dict: the remote retention (keep_last_n (5),
            keep_per_n_minutes, keep_all, keep_every_n_steps, keep_best_n, best_metric,
            best_mode: as above, applied to the remote checkpoints), upload_every_n_steps (1:
            upload the checkpoints whose step is a multiple of it, and breakpoints), threads
            (4: blocks uploaded at once), max_bytes_per_second (0: no bound).
      Encryption:
        key (None): encrypt every checkpoint saved and decrypt every one restored (bytes, a key
            file path or a callable returning bytes, as savepoint.save takes it; a provider is
            called once per save and per restore). Restoring an unencrypted checkpoint with a key
            set raises InvalidArgumentError; listing and retention need no key. format="native"
            or "ckpt" (as its enc_key, with enc_mode).
    """

    @_suggest_keywords
    def __init__(self, directory: StrPath | None = None, *, prefix: str = "ckpt",
                 series: str = "continue", prefix_fn: Callable[[StepInfo], str] | None = None,
                 directory_fn: Callable[[StepInfo], StrPath] | None = None,
                 save_interval_steps: int = 1, save_interval_seconds: int = 0,
                 steps_per_epoch: int = 0, keep_last_n: int = 5, keep_per_n_minutes: int = 0,
                 keep_all: bool = False, keep_every_n_steps: int = 0, keep_best_n: int = 0,
                 best_metric: str | None = None, best_mode: str = "min", async_: bool = False,
                 staging_bytes: int | None = None, async_options: dict[str, Any] | None = None,
                 checksum: bool = True, format: str = "native", io_threads: int = 4,
                 direct_io: bool = True, gc_on_open: bool = True,
                 append_info: Names = (), append_dict: dict[str, Any] | None = None,
                 shard_id: int = 0, num_shards: int = 1, exception_save: bool = False,
                 handle_signals: bool = False, key: Key | None = None, crc_check: bool = False,
                 enc_mode: str = "AES-GCM", compaction: dict[str, Any] | bool | None = None,
                 cuda: bool | None = None, reserve: Any = None, remote: StrPath | None = None,
                 remote_options: dict[str, Any] | None = None) -> None:  # fmt: skip
        self._m = None
        self._signals = None
        self._closed = False
        if directory is None and directory_fn is None:
            raise TypeError("CheckpointManager: pass a directory (or directory_fn)")
        with _in_keywords():  # (the C++ fields named by their keywords)
            o = _core.ManagerOptions()
            if directory is not None:
                o.naming.directory = os.fspath(directory)
            if directory_fn is not None:
                o.naming.directory_fn = _name_callable(directory_fn, "directory_fn")
            o.naming.prefix = _str("prefix", prefix)
            if prefix_fn is not None:
                o.naming.prefix_fn = _name_callable(prefix_fn, "prefix_fn")
            o.naming.series = _choice("series", series, _SERIES)
            o.save_policy.interval_steps = _int("save_interval_steps", save_interval_steps)
            o.save_policy.interval_seconds = _int("save_interval_seconds", save_interval_seconds)
            o.save_policy.steps_per_epoch = _int("steps_per_epoch", steps_per_epoch)
            o.retention.keep_last_n = _int("keep_last_n", keep_last_n)
            o.retention.keep_per_n_minutes = _int("keep_per_n_minutes", keep_per_n_minutes)
            o.retention.keep_all = bool(keep_all)
            o.retention.keep_every_n_steps = _int("keep_every_n_steps", keep_every_n_steps)
            o.retention.keep_best_n = _int("keep_best_n", keep_best_n)
            if best_metric is not None:
                o.retention.best_metric = _str("best_metric", best_metric)
            o.retention.best_mode = _choice("best_mode", best_mode, _MODES)
            _set_async(o.async_save, async_, staging_bytes, async_options)
            o.storage.format = _choice("format", format, _FORMATS)
            o.storage.verify_checksums = bool(checksum)
            self._key = _keys.normalize(key, "CheckpointManager: key")
            o.storage.key = self._key
            o.storage.file_checksum = bool(crc_check)
            o.storage.cipher = _str("enc_mode", enc_mode)
            if isinstance(append_info, str):
                append_info = [append_info]
            o.storage.append_info = [_str("append_info item", a) for a in append_info]
            if append_dict is not None:
                o.storage.append_dict = _str_keys("append_dict", append_dict)
            # The C++ handlers are not installed: the Python front end installs its own (_Signals),
            # since the C++ ones would only be acted on by the C++ hooks.
            o.breakpoints.on_exception = bool(exception_save)
            _set_compaction(o.sparse, compaction)
            _set_remote(o.remote, remote, remote_options)
            o.shard_id, o.num_shards = _int("shard_id", shard_id), _int("num_shards", num_shards)
            o.gc_on_open = bool(gc_on_open)
            o.io.io_threads, o.io.direct_io = _int("io_threads", io_threads), bool(direct_io)
            cuda_device = _cuda_device(cuda, async_, format)
            self._exception_save = bool(exception_save)
            self._save_steps = o.save_policy.interval_steps
            self._steps_per_epoch = o.save_policy.steps_per_epoch
            self._shard_id, self._num_shards = o.shard_id, o.num_shards
            self._checksum, self._io_threads = bool(checksum), o.io.io_threads
            self._direct_io = o.io.direct_io
            self._format, self._enc_mode = format, enc_mode
            self._objects = {}  # name -> _registry.Registered
            # Hook bookkeeping, as in the C++ manager.
            self._global_step = 0
            self._last_step = 0
            self._cur_epoch = 0
            self._epoch_first_step = 1
            self._last_saved_step = None
            self._m = _core.CheckpointManager.open(o, cuda_device)
        if reserve is not None:
            try:
                self.reserve(reserve)
            except BaseException:
                self._m.close()
                raise
        if handle_signals:
            try:
                self._signals = _Signals(self)
            except BaseException:
                self._m.close()
                raise

    # ------------------------------------------------------------------ direct API

    def save(self, step: int, state: Any, metrics: Metrics | None = None, force: bool = False, *,
             epoch: int | None = None, step_in_epoch: int | None = None, epoch_end: bool = False,
             delta: bool = False) -> bool:  # fmt: skip
        """Saves `state` (see savepoint.save) as the checkpoint of `step` if the interval says it
        is due, or if `force`; never saves one step twice. Returns whether a save started.

        metrics ({str: float}) go into the index (keep_best_n ranks by them). epoch and
        step_in_epoch name the checkpoint "{prefix}-{epoch}_{step_in_epoch}" (default: derived
        from steps_per_epoch); epoch_end marks it as saved at the end of its epoch. Synchronous
        managers return once it is committed; async ones after the snapshot (the state may then
        be modified).

        `state` may hold savepoint.SparseTable leaves (format="native"; an async manager copies
        their rows into its staging memory before returning, like the tensors).
        delta=True saves them incrementally: each table holds only the rows touched since the
        newest committed checkpoint plus SparseTable(deleted=ids) (savepoint.DirtyTracker
        records both), and the checkpoint is a delta on that one; restore() applies the chain.
        Compaction and retention of chains: see `compaction`."""
        return self._save(step, state, None, metrics, force, epoch, step_in_epoch, epoch_end,
                          delta=delta)  # fmt: skip

    def should_save(self, step: int) -> bool:
        """Whether save(step) would save now (without force)."""
        return self._m.should_save(step)

    def restore(self, step: int | None = None, *, name: str | None = None, like: Any = None,
                map_location: Any = None, mmap: bool = False,
                framework: str | None = None) -> Any:  # fmt: skip
        """Loads the newest checkpoint (or the newest at `step`, or the one named `name`) after
        waiting for saves in flight, and continues from it (the step counters, and the series of
        names: see `series`). Returns the saved structure (keyword arguments as for
        savepoint.load). NotFoundError when there is none."""
        rec = self._find(step, name)
        if self._format != "native":
            state = self._load_file(rec["path"], framework)
            self._resume(rec)
            return state
        state = _load.load(rec["path"], like=like, map_location=map_location, mmap=mmap,
                           verify=self._checksum, io_threads=self._io_threads,
                           direct_io=self._direct_io, framework=framework,
                           key=self._key)  # fmt: skip
        self._resume(rec)
        return state

    def resume_from(self, step: int | None = None, *, name: str | None = None) -> dict[str, Any]:
        """Continues from a checkpoint without loading anything (for state restored by other
        means): sets the step counters and the series of names as restore() does. Returns its
        record. NotFoundError when there is none."""
        return self._resume(self._find(step, name))

    def latest_step(self) -> int | None:
        """Step of the newest committed checkpoint, or None."""
        return self._m.latest_step()

    def all_steps(self) -> list[int]:
        """Steps of the committed checkpoints, oldest first."""
        return self._m.all_steps()

    def checkpoints(self) -> Records:
        """The index: dicts (name, path, step, epoch, step_in_epoch, created_ns, bytes, breakpoint,
        epoch_end, metrics), oldest first."""
        return self._m.all()

    def remote_checkpoints(self) -> Records:
        """The remote tier's committed checkpoints, as checkpoints() gives them (path: the remote
        one), oldest first; empty without remote. Uploads finished by now are included."""
        return self._m.remote()

    def stats(self) -> Records:
        """Every save / load / delete so far: dicts (action, name, step, bytes, seconds,
        blocked_seconds)."""
        return self._m.stats()

    def reserve(self, state_or_bytes: Any) -> None:
        """Async native saves: allocates and pre-touches staging memory (page-locked with cuda)
        for `state_or_bytes` (a state as save() takes it, or a byte count; at most the staging
        cap) in a background thread and returns at once, so that a later save of that size
        blocks only for the copy (without it the first save allocates: ~0.7 s per GiB with
        cuda). FailedPreconditionError for other managers."""
        self._check_open()
        self._m.reserve(_write.staged_bytes(state_or_bytes))

    def wait(self) -> None:
        """Waits for every save in flight (indexes them, applies retention); raises the first
        error."""
        self._m.wait()

    def close(self) -> None:
        """wait(), writes the index, releases the directory lock and the signal handlers.
        Idempotent."""
        if self._m is None:
            return
        self._closed = True
        if self._signals is not None:
            self._signals.uninstall()
            self._signals = None
        self._m.close()

    @property
    def directory(self) -> str:
        return self._m.directory

    @property
    def cuda(self) -> bool:
        """Whether async saves copy CUDA tensors straight from GPU memory (see `cuda`)."""
        return self._m.device_copies

    @property
    def prefix(self) -> str:
        """The prefix of the series new checkpoints join (see `series`); "" with prefix_fn."""
        return self._m.prefix

    # ------------------------------------------------------------------ registered objects

    def register(self, name: str, obj: Any, category: str = "dense") -> None:
        """Registers `obj` under `name` (no '.'), to be saved by save_registered and the hooks and
        restored by restore_registered: anything with state_dict() and load_state_dict() (torch
        modules, optimizers, LR schedulers, your own class) or a dict holding the state itself
        (updated in place on restore). Its entries are named "<name>.<key path>".

        category: what it holds, for include/exclude on restore: "dense" (model parameters;
        alias "model"), "sparse" (embedding tables; "embedding"), "optimizer", "extra"
        (counters, RNG state, schedules; "rng", "other") or "io_state" (data-loader position,
        one per shard; "data", "dataloader")."""
        _registry.Registered.check(name, obj)
        category = _registry.parse_category(category)
        if name in self._objects:
            raise _errors.AlreadyExistsError(f"register {name!r}: the name is already registered")
        self._objects[name] = _registry.Registered(name, obj, category)

    def unregister(self, name: str) -> None:
        """Forgets a registered object. NotFoundError if `name` is not registered."""
        if self._objects.pop(name, None) is None:
            raise _errors.NotFoundError(f"unregister {name!r}: not registered")

    @property
    def registered(self) -> dict[str, str]:
        """{name: category} of the registered objects."""
        return {n: r.category for n, r in sorted(self._objects.items())}

    def save_registered(self, step: int, metrics: Metrics | None = None, force: bool = False, *,
                        epoch: int | None = None, step_in_epoch: int | None = None,
                        epoch_end: bool = False) -> bool:  # fmt: skip
        """save(step, <the state_dict() of every registered object>, ...): same rules and
        arguments. The categories are recorded in the checkpoint. FailedPreconditionError when
        nothing is registered."""
        return self._save_registered(step, metrics, force, epoch, step_in_epoch, epoch_end)

    @_suggest_keywords
    def restore_registered(self, step: int | None = None, *, name: str | None = None,
                           include: Categories = ("*",), exclude: Categories = (),
                           strict: bool = True, renames: Mapping[str, str] | None = None,
                           only: Names = ()) -> dict[str, Any]:  # fmt: skip
        """Loads the newest checkpoint (or the newest at `step`, or the one named `name`) into the
        registered objects and continues from it (step counters, series of names). Returns its
        record (see checkpoints()).

        include / exclude: categories (or aliases, or "*") to load / to skip (after include).
        strict (True): every entry of every included object's current state_dict() must be in
            the checkpoint with the same dtype and shape (else NotFoundError / InvalidArgument-
            Error naming it); torch modules also reject unexpected keys. False: load what
            matches, skip the rest.
        renames: {checkpoint entry name: registered entry name}, full names ("old.w": "model.w").
        only: globs of registered entry names (after renaming): load only those.

        Tensors are read straight into the objects' own tensors where dtype and shape match;
        then each object's load_state_dict() gets its state (structure as saved)."""
        rec = self._find(step, name)
        self._load_registered(rec["path"], include, exclude, strict, renames, only)
        return self._resume(rec)

    @_suggest_keywords
    def load_from(self, path: StrPath, *, include: Categories = ("*",), exclude: Categories = (),
                  strict: bool = True, renames: Mapping[str, str] | None = None,
                  only: Names = ()) -> None:  # fmt: skip
        """Loads the checkpoint at any `path` into the registered objects (no counters change),
        with the arguments of restore_registered. A model-bank warm start is several calls with
        strict=False, `only` filters and renames."""
        self._check_open()
        self._load_registered(os.fspath(path), include, exclude, strict, renames, only)

    # ------------------------------------------------------------------ training-loop hooks

    def on_step_end(self, step: int, epoch: int, metrics: Metrics | None = None) -> bool:
        """After a training step: remembers it as the last consistent point, saves the
        registered objects if due, acts on a pending signal. Returns whether it saved."""
        self._check_open()
        self._note_step(step, epoch)
        self._act_on_signal()
        return self._save_registered(step, **self._hook_args(metrics))

    def on_epoch_end(self, epoch: int, metrics: Metrics | None = None) -> bool:
        """After an epoch: forces an epoch-end save at the last step (unless that step was just
        saved). Returns whether it saved."""
        self._check_open()
        if epoch != self._cur_epoch:
            self._note_step(self._last_step, epoch)
        self._act_on_signal()
        if self._last_saved_step == self._last_step:
            # Already saved at this step: the C++ manager marks that checkpoint as the epoch's
            # end (a save of a step saved already only does that), as its own OnEpochEnd does.
            self._m.save(_int("step", self._last_step), [], [], "{}", {}, True, None, None, True,
                         False, [], False)  # fmt: skip
            return False
        args = self._hook_args(metrics)
        return self._save_registered(self._last_step, force=True, epoch_end=True, **args)

    def on_train_end(self, metrics: Metrics | None = None) -> bool:
        """After training: forces a final save at the last step and waits for every save."""
        self._check_open()
        saved = self._save_registered(self._last_step, force=True, **self._hook_args(metrics))
        self._m.wait()
        return saved

    def step(self, metrics: Metrics | None = None) -> bool:
        """RecIS style: counts the global step (+1) and saves when it is a multiple of
        save_interval_steps. Returns whether it saved."""
        self._check_open()
        self._note_step(self._global_step + 1, self._cur_epoch if self._cur_epoch > 0 else 1)
        self._act_on_signal()
        if self._save_steps <= 0 or self._global_step % self._save_steps != 0:
            return False
        return self._save_registered(self._global_step, force=True, **self._hook_args(metrics))

    @property
    def global_step(self) -> int:
        """The last step a hook saw (or the restored checkpoint's step)."""
        return self._global_step

    # ------------------------------------------------------------------ breakpoints

    def save_breakpoint(self) -> dict[str, Any] | None:
        """Saves "{prefix}-{epoch}_{step}_breakpoint" of the registered objects at the last step a
        hook saw, and waits for it. Returns its record. FailedPreconditionError unless
        exception_save=True."""
        if not self._exception_save:
            raise _errors.FailedPreconditionError(
                "save_breakpoint: the manager was opened with exception_save=False")
        self._check_open()
        self._save_registered(self._last_step, breakpoint=True, **self._hook_args(None))
        self._m.wait()
        records = [r for r in self._m.all() if r["breakpoint"] and r["step"] == self._last_step]
        return records[-1] if records else None

    @contextlib.contextmanager
    def exception_guard(self) -> Iterator[CheckpointManager]:
        """A `with` block that saves a breakpoint when an exception leaves it (the exception
        keeps propagating). The breakpoint holds the registered objects as they are then,
        labelled with the last step a hook saw: update state only at the end of a step for it
        to be consistent. Errors of the breakpoint save are logged. Needs exception_save=True
        (FailedPreconditionError at entry otherwise)."""
        if not self._exception_save:
            raise _errors.FailedPreconditionError(
                "exception_guard: the manager was opened with exception_save=False")
        try:
            yield self
        except (Exception, KeyboardInterrupt):
            self._breakpoint_on_exception()
            raise

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            if exc_type is not None and issubclass(exc_type, (Exception, KeyboardInterrupt)):
                if self._exception_save and self._objects and not self._closed:
                    self._breakpoint_on_exception()
        finally:
            self.close()

    def __del__(self):
        signals = getattr(self, "_signals", None)
        if signals is not None:
            signals.uninstall()

    # ------------------------------------------------------------------ internals

    def _check_open(self):
        if self._closed:
            raise _errors.FailedPreconditionError(
                f"checkpoint manager of {self._m.directory} is closed")

    def _save(self, step, state, metadata, metrics, force, epoch=None, step_in_epoch=None,
              epoch_end=False, breakpoint=False, delta=False):  # fmt: skip
        flat, meta_json = self._flatten(state, metadata, self._m.device_copies)
        _cuda.settle(flat.cuda_devices)
        specs = [t.spec() for t in flat.tensors]
        tables, owners = _sparse_io.table_specs(flat.tables)
        epoch = None if epoch is None else _int("epoch", epoch)
        step_in_epoch = None if step_in_epoch is None else _int("step_in_epoch", step_in_epoch)
        saved = self._m.save(_int("step", step), specs, flat.values, meta_json, _metrics(metrics),
                             bool(force), epoch, step_in_epoch, bool(epoch_end),
                             bool(breakpoint), tables, bool(delta))  # fmt: skip
        del owners
        if saved:
            self._last_saved_step = step
        return saved

    @staticmethod
    def _flatten(state, metadata, cuda_in_place):
        """_write.flatten of a manager save: tables allowed; CUDA tensors passed by device address
        (cuda_in_place: the async Checkpointer's copier takes them) or copied to the host."""
        flattener = _tree.Flattener()
        flattener.allow_tables = True
        flattener.cuda_in_place = cuda_in_place
        return _write.flatten(state, metadata, flattener)

    def _save_registered(self, step, metrics=None, force=False, epoch=None, step_in_epoch=None,
                         epoch_end=False, breakpoint=False):  # fmt: skip
        if not self._objects:
            raise _errors.FailedPreconditionError(
                f"save step {step} to {self._m.directory}: no objects are registered")
        if not breakpoint and not force and not self._m.should_save(step):
            return False  # (should_save is also False for the step saved last)
        if not breakpoint and self._last_saved_step == step:
            return False
        state, metadata = _registry.gather(self._objects, self._shard_id, self._num_shards)
        return self._save(step, state, metadata, metrics, force, epoch, step_in_epoch, epoch_end,
                          breakpoint)  # fmt: skip

    def _find(self, step, name):
        """The record restore(step, name) means (the newest match), after waiting for saves."""
        self._check_open()
        self._m.wait()
        records = self._m.all()
        for r in reversed(records):
            named = r["name"] in (name, f"{name}{_SUFFIX[self._format]}")
            if named if name is not None else (step is None or r["step"] == step):
                return r
        what = (f"named {name!r}" if name is not None else
                "at all" if step is None else f"at step {step}")  # fmt: skip
        raise _errors.NotFoundError(f"checkpoint manager {self._m.directory}: no checkpoint {what} "
                                    f"({len(records)} committed)")  # fmt: skip

    def _resume(self, rec):
        """Tells the C++ manager that training continues from `rec`; the same bookkeeping here."""
        rec = self._m.resume_from(None, rec["name"])
        self._last_saved_step = self._global_step = self._last_step = rec["step"]
        self._cur_epoch = rec["epoch"]
        self._epoch_first_step = rec["step"] - rec["step_in_epoch"] + 1
        return rec

    def _load_file(self, path, framework):
        """A checkpoint of a file format, as savepoint.mindspore.load_checkpoint reads it."""
        if framework not in (None, "np", "numpy", "pt", "torch"):
            raise _errors.InvalidArgumentError(
                f"restore: framework={framework!r}: use None, 'pt' or 'np'")
        return mindspore.load_checkpoint(path, dec_key=self._key, dec_mode=self._enc_mode,
                                         crc_check=None if self._checksum else False,
                                         format=self._format,
                                         framework="np" if framework in (None, "numpy") else "pt",
                                         io_threads=self._io_threads)  # fmt: skip

    def _load_registered(self, path, include, exclude, strict, renames, only):
        if self._format != "native":
            raise _errors.UnimplementedError(
                f"load {path} into the registered objects: not available with format="
                f"{self._format!r}; use restore() and load each object's state, or format='native'")
        if not self._objects:
            raise _errors.FailedPreconditionError(f"load {path}: no objects are registered")
        _registry.load_into(path, self._objects, include=include, exclude=exclude,
                            strict=bool(strict), renames=renames, only=only,
                            shard_id=self._shard_id, num_shards=self._num_shards,
                            verify=self._checksum, io_threads=self._io_threads,
                            direct_io=self._direct_io, key=self._key)  # fmt: skip

    def _note_step(self, step, epoch):
        step, epoch = _int("step", step), _int("epoch", epoch)
        if epoch != self._cur_epoch:
            self._cur_epoch = epoch
            self._epoch_first_step = step
        self._last_step = self._global_step = step

    def _hook_args(self, metrics):
        args = {"metrics": metrics}
        if self._steps_per_epoch == 0:
            started = self._cur_epoch > 0
            args["epoch"] = self._cur_epoch if started else 1
            args["step_in_epoch"] = (self._last_step - self._epoch_first_step + 1 if started
                                     else self._last_step)  # fmt: skip
        return args

    def _act_on_signal(self):
        """At a hook: a recorded signal saves a breakpoint (if exception_save), waits, closes the
        manager and re-raises the signal with the previous handler."""
        signals = self._signals
        if signals is None or not signals.pending:
            return
        sig = signals.pending
        problem = None
        try:
            if self._exception_save and self._objects:
                self.save_breakpoint()
            else:
                self._m.wait()
        except Exception as e:  # still close and re-raise: the signal asked to stop
            problem = e
        records = self._m.all()
        latest = records[-1]["path"] if records else "none"
        try:
            self.close()
        except Exception as e:
            problem = problem or e
        _logger.warning("savepoint: signal %d: saved (%s), latest checkpoint %s; re-raising", sig,
                        problem or "OK", latest)  # fmt: skip
        signals.reraise(sig)
        raise _errors.FailedPreconditionError(
            f"training stopped by signal {sig}; latest checkpoint {latest} ({problem or 'OK'})")

    def _breakpoint_on_exception(self):
        try:
            if self._objects and not self._closed:
                self.save_breakpoint()
        except Exception as e:
            _logger.error("savepoint: exception save failed: %s", e)
