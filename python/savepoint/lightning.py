"""savepoint as Lightning's checkpoint plug-in.

    import lightning as L
    import savepoint.lightning

    trainer = L.Trainer(plugins=[savepoint.lightning.CheckpointIO()])
    trainer.fit(model, ckpt_path="last")          # resumes from a savepoint checkpoint

Every checkpoint Lightning writes (`Trainer.save_checkpoint`, `ModelCheckpoint`, `Fabric.save`)
becomes a savepoint checkpoint directory at the path Lightning names ("epoch=3-step=400.ckpt",
"last.ckpt"): weights and optimizer states as checksummed tensor entries, loops and counters as
values, and whatever savepoint's tree cannot hold (hyper-parameters as an AttributeDict, a
Namespace) pickled by torch.save into one entry (savepoint._objects; docs/FORMAT.md §13).

Saves are asynchronous by default, through savepoint's own AsyncCheckpointer (not Lightning's
AsyncCheckpointIO, which clones every tensor on the training thread and writes on one thread with
unbounded memory): save_checkpoint returns once the tensors are copied into the checkpointer's
staging memory (CUDA tensors by DMA into page-locked slabs), and the write, fsync and commit go on
in the background. A checkpoint is never torn: an overwritten "last.ckpt" stays intact until the new
one commits. Debris of saves that a crash interrupted is removed (savepoint.gc) when the plug-in
first saves into a directory and before it loads. load_checkpoint and remove_checkpoint first wait
for the saves they depend on; teardown waits for all and raises the first failure. Files written by
Lightning's default TorchCheckpointIO still load (and are removed) as before, so a project can
switch plug-ins.

`CheckpointIO` derives from the `lightning` package's CheckpointIO; with only the standalone
`pytorch_lightning` / `lightning_fabric` packages installed, from theirs.
`checkpoint_io_class("pytorch_lightning")` gives the standalone package's where both are
installed.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import zipfile
from typing import Any

from . import _errors, _load, _objects
from ._save import AsyncCheckpointer
from ._types import StrPath

_MARK = "savepoint.lightning"  # top-level key of the saved tree (docs/FORMAT.md §13)
_BASES = {"lightning": "lightning.fabric.plugins.io.checkpoint_io",
          "pytorch_lightning": "lightning_fabric.plugins.io.checkpoint_io"}  # fmt: skip
_STORAGE_OPTIONS = ("compression", "metadata")


class _SavepointCheckpointIO:
    """The plug-in's behaviour; `checkpoint_io_class` mixes it into a Lightning CheckpointIO.

    async_: save in the background (default True); False: save_checkpoint returns once the
        checkpoint is durable.
    cuda: how CUDA tensors are snapshotted (AsyncCheckpointer's cuda=; default None: by DMA into
        page-locked staging when CUDA is available).
    staging_bytes: the checkpointer's staging memory cap (default None: AsyncCheckpointer's).
    io_threads: writer threads of saves and reader threads of loads (default 4).
    compression: per-chunk compression of every save (savepoint.save's compression=; default
        None). storage_options={"compression": ...} overrides it for one save.
    verify: check every chunk's CRC32C on load (default True).
    checkpointer: an AsyncCheckpointer to use instead of one of the plug-in's own (then cuda and
        staging_bytes must be left unset, and io_threads applies to loads only; the caller closes
        it).
    """

    def __init__(self, *, async_: bool = True, cuda: bool | None = None,
                 staging_bytes: int | None = None, io_threads: int = 4, compression: Any = None,
                 verify: bool = True,
                 checkpointer: AsyncCheckpointer | None = None) -> None:  # fmt: skip
        super().__init__()
        if checkpointer is not None and (cuda is not None or staging_bytes is not None):
            raise _errors.InvalidArgumentError(
                "savepoint.lightning.CheckpointIO: cuda and staging_bytes belong to the "
                "checkpointer: set them there, or pass no checkpointer")
        if type(async_) is not bool:
            raise _errors.InvalidArgumentError(
                f"savepoint.lightning.CheckpointIO: async_={async_!r}: use True or False")
        self._async, self._cuda, self._staging = async_, cuda, staging_bytes
        self._io_threads, self._compression, self._verify = io_threads, compression, bool(verify)
        self._given = checkpointer
        self._own = None
        self._pending = {}  # normalised path -> SaveFuture
        self._failed = []  # failures of background saves not raised yet
        self._collected = set()  # directories whose debris this plug-in removed (savepoint.gc)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ Lightning's interface

    def save_checkpoint(self, checkpoint: dict[str, Any], path: StrPath,
                        storage_options: Any = None) -> None:  # fmt: skip
        """Starts saving Lightning's checkpoint dict as a savepoint checkpoint at `path`
        (replacing one there) and returns once its tensors are staged (async_=False: once it is
        durable). Raises the failure of an earlier save, if one failed since the last call.
        storage_options: None, or a dict with "compression" and/or "metadata" (JSON-able, stored
        with the checkpoint; savepoint.info shows it)."""
        options = _storage_options(storage_options)
        key = _key(path)
        self._wait_for(key)  # (Lightning saves "last.ckpt" again and again)
        self._collect(_parent(key))
        self._raise_finished()
        tree = _objects.pack(_MARK, checkpoint)
        aside = _set_aside_torch_file(key)
        try:
            fut = self._checkpointer().save(
                tree, path, overwrite=True, metadata=options.get("metadata"),
                compression=options.get("compression", self._compression))  # fmt: skip
            if not self._async or aside is not None:
                fut.wait()  # (a file set aside goes once its replacement is durable)
        except BaseException:
            if aside is not None and not os.path.lexists(key):
                os.rename(aside, key)  # the save failed: the file is the checkpoint again
            raise
        if aside is not None:
            os.remove(aside)
        if self._async and aside is None:
            with self._lock:
                self._pending[key] = fut

    def load_checkpoint(self, path: StrPath, map_location: Any = None,
                        weights_only: bool | None = None) -> dict[str, Any]:  # fmt: skip
        """Lightning's checkpoint dict from `path`: a savepoint checkpoint (after the saves in
        flight have finished), or a file of Lightning's default TorchCheckpointIO.
        map_location: None (the CPU, as TorchCheckpointIO loads), a device string or a
        torch.device. weights_only: passed to torch.load for the pickled part (None: torch's
        default)."""
        self.wait()
        device = _device(map_location)
        if _rank() == 0:  # (every rank loads; one collects)
            self._collect(_parent(_key(path)), again=True)
        if not _is_uri(path) and os.path.isfile(path):
            return self._torch_load(path, map_location=device, weights_only=weights_only)
        tree = _load.load(path, map_location=device, verify=self._verify,
                          io_threads=self._io_threads)  # fmt: skip
        return _objects.unpack(tree, _MARK, weights_only, os.fspath(path),
                               writer="savepoint.lightning.CheckpointIO")  # fmt: skip

    def remove_checkpoint(self, path: StrPath) -> None:
        """Removes the checkpoint at `path` once every save in flight is durable (Lightning removes
        the previous checkpoint right after starting the next one: that one must have committed
        first): a savepoint checkpoint's own files (savepoint.delete), or a TorchCheckpointIO
        file. Nothing there: nothing to do."""
        self.wait()
        if _is_uri(path):
            _load.delete(path)
        elif os.path.islink(path) or _is_torch_file(path):
            os.remove(path)  # (a link ModelCheckpoint made, or a TorchCheckpointIO file)
        elif os.path.isfile(path):
            raise _errors.NotFoundError(
                f"savepoint.lightning.CheckpointIO.remove_checkpoint: {os.fspath(path)} is a file "
                f"but not a checkpoint of Lightning's (torch.save) or savepoint's: not removed")
        elif os.path.isdir(path):
            _load.delete(path)

    def teardown(self) -> None:
        """Waits for every save in flight, releases the staging memory, and raises the first
        failure. The plug-in stays usable: a later save creates the checkpointer again."""
        try:
            self.wait()
        finally:
            c, self._own = self._own, None
            if c is not None:
                c.close()

    # ------------------------------------------------------------------ savepoint's additions

    def wait(self) -> None:
        """Blocks until every save started so far is durable; raises the first failure not raised
        yet (the others at the next calls)."""
        with self._lock:
            pending, self._pending = self._pending, {}
        for fut in pending.values():
            self._settle(fut)
        self._raise_failed()

    # ------------------------------------------------------------------ internals

    def _checkpointer(self):
        if self._given is not None:
            return self._given
        if self._own is None:
            self._own = AsyncCheckpointer(staging_bytes=self._staging, cuda=self._cuda,
                                          io_threads=self._io_threads)  # fmt: skip
        return self._own

    def _collect(self, directory, again=False):
        """savepoint.gc of `directory` (first use, or `again`): debris of saves a crash
        interrupted goes, and a checkpoint set aside by an interrupted overwrite comes back."""
        if not again and directory in self._collected:
            return
        self._collected.add(directory)  # (one that does not exist yet holds no debris)
        with self._lock:  # gc takes this process's temporaries for debris: none may be in flight
            busy = [k for k in self._pending if os.path.dirname(k) == directory]
        for k in busy:
            self._wait_for(k)
        if self._given is not None:
            self._given.wait()  # (a shared checkpointer: other code's saves may be in there)
        if not _is_uri(directory) and os.path.isdir(directory):
            _load.gc(directory)

    def _wait_for(self, key):
        with self._lock:
            fut = self._pending.pop(key, None)
        if fut is not None:
            self._settle(fut)
            self._raise_failed()

    def _raise_finished(self):
        with self._lock:
            done = [k for k, f in self._pending.items() if f.done()]
            finished = [self._pending.pop(k) for k in done]
        for fut in finished:
            self._settle(fut)
        self._raise_failed()

    def _settle(self, fut):
        try:
            fut.wait()
        except BaseException as e:  # noqa: BLE001 (kept, raised by _raise_failed)
            self._failed.append(e)

    def _raise_failed(self):
        if self._failed:
            raise self._failed.pop(0)


def _is_uri(path):
    return "://" in os.fspath(path)


def _key(path):
    return os.fspath(path) if _is_uri(path) else os.path.abspath(os.fspath(path))


def _parent(key):
    return key.rsplit("/", 1)[0] if _is_uri(key) else os.path.dirname(key)


def _rank():
    dist = sys.modules.get("torch.distributed")
    return dist.get_rank() if dist is not None and dist.is_initialized() else 0


def _is_torch_file(path):
    """Whether `path` is a regular file in torch.save's format (a zip archive), as Lightning's
    TorchCheckpointIO writes: the only files the plug-in replaces or removes."""
    return os.path.isfile(path) and not os.path.islink(path) and zipfile.is_zipfile(path)


def _set_aside_torch_file(key):
    """A file at `key` (Lightning's default plug-in wrote "last.ckpt" before the run switched to
    savepoint): renamed to savepoint's set-aside name, so that the save can put a directory there
    and a crash before it commits leaves the file to `savepoint.gc`, which puts it back. Returns
    the new name (None: no such file there; a file that is not torch.save's is left for the save
    to refuse)."""
    if _is_uri(key) or not _is_torch_file(key):
        return None
    aside = os.path.join(os.path.dirname(key),
                         f".{os.path.basename(key)}.savepoint-old.{os.urandom(8).hex()}")
    os.rename(key, aside)
    fd = os.open(os.path.dirname(key), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return aside


def _storage_options(options):
    if options is None:
        return {}
    if not isinstance(options, dict) or set(options) - set(_STORAGE_OPTIONS):
        raise _errors.InvalidArgumentError(
            f"savepoint.lightning.CheckpointIO.save_checkpoint: storage_options={options!r}: use "
            f"None or a dict with keys among {list(_STORAGE_OPTIONS)}")
    return options


def _device(map_location):
    if map_location is None:
        return "cpu"
    if isinstance(map_location, str) or type(map_location).__name__ == "device":
        return map_location
    raise _errors.InvalidArgumentError(
        f"savepoint.lightning.CheckpointIO.load_checkpoint: map_location={map_location!r}: use "
        f"None (the CPU), a device string or a torch.device (callables and dicts are "
        f"torch.load's, not savepoint's)")


_classes = {}
_TORCH_LOADERS = {"lightning": "lightning.fabric.utilities.cloud_io",
                  "pytorch_lightning": "lightning_fabric.utilities.cloud_io"}  # fmt: skip


def checkpoint_io_class(package: str = "lightning") -> type:
    """The plug-in class deriving from `package`'s CheckpointIO: "lightning" (the `lightning`
    package, default) or "pytorch_lightning" (the standalone `pytorch_lightning` /
    `lightning_fabric` packages). ImportError naming the package when it is not installed."""
    if package not in _BASES:
        raise _errors.InvalidArgumentError(
            f"savepoint.lightning.checkpoint_io_class: package={package!r}: use one of "
            f"{sorted(_BASES)}")
    if package not in _classes:
        try:
            base = importlib.import_module(_BASES[package]).CheckpointIO
        except ImportError as e:
            raise ImportError(
                f"savepoint.lightning needs the '{package}' package (pip install {package}): "
                f"{e}") from e
        torch_load = staticmethod(importlib.import_module(_TORCH_LOADERS[package])._load)
        _classes[package] = type("CheckpointIO", (_SavepointCheckpointIO, base),
                                 {"__module__": __name__, "_torch_load": torch_load,
                                  "__doc__": _SavepointCheckpointIO.__doc__})  # fmt: skip
    return _classes[package]


def _default_class():
    try:
        return checkpoint_io_class("lightning")
    except ImportError:
        try:
            return checkpoint_io_class("pytorch_lightning")
        except ImportError:
            raise ImportError(
                "savepoint.lightning needs Lightning: pip install lightning (or "
                "pytorch_lightning)") from None


CheckpointIO = _default_class()
