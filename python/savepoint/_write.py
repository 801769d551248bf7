"""Writing a checkpoint: the pieces savepoint.save, the distributed and sparse saves, the manager
and failover share (the flattened state and its metadata JSON, the compression option, the
future of an asynchronous save).

A layer below the entry points (_save.py, _distributed.py, _sparse_io.py, _manager.py,
failover.py): it imports none of them.
"""

from __future__ import annotations

import json

from . import _errors, _tree
from ._types import Stats

DEFAULT_CHUNK = 8 << 20

_CODECS = ("none", "zstd", "lz4")
_SHUFFLES = ("auto", "on", "off")


def staged_bytes(state_or_bytes):
    """The bytes reserve() stages for a state (its tensors, CUDA ones counted where they are) or
    a byte count; InvalidArgumentError for a negative count."""
    if isinstance(state_or_bytes, bool):
        raise TypeError(f"reserve: {state_or_bytes!r} is neither a state nor a byte count")
    if isinstance(state_or_bytes, int):
        nbytes = state_or_bytes
    else:
        counter = _tree.Flattener()
        counter.allow_tables = True
        counter.cuda_in_place = True  # counted where they are, not copied to the host
        f, _ = flatten(state_or_bytes, None, counter)
        nbytes = sum(int(getattr(t.owner, "nbytes", 0)) for t in f.tensors)
    if nbytes < 0:
        raise _errors.InvalidArgumentError(f"reserve: {nbytes} bytes is negative")
    return nbytes


def flatten(obj, metadata, flattener=None):
    """(flattener, metadata JSON) of `obj` walked by `flattener` (default a _tree.Flattener),
    with the recorded structure added to the user `metadata` under _tree.TREE_KEY."""
    f = flattener if flattener is not None else _tree.Flattener()
    tree = f.flatten(obj)
    meta = {}
    if metadata is not None:
        if not isinstance(metadata, dict) or not all(type(k) is str for k in metadata):
            raise TypeError("savepoint.save: metadata must be a dict with str keys")
        if _tree.TREE_KEY in metadata:
            raise _errors.InvalidArgumentError(
                f"savepoint.save: metadata key {_tree.TREE_KEY!r} is reserved")
        meta.update(metadata)
    meta[_tree.TREE_KEY] = tree
    try:
        meta_json = json.dumps(meta, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as e:
        raise TypeError(f"savepoint.save: metadata is not JSON-serialisable: {e}") from None
    return f, meta_json


def compression(option):
    """(codec, shuffle, zstd level) for the core from None, a codec name, or a dict
    {"codec": "zstd" | "lz4" | "none", "shuffle": "auto" | "on" | "off", "level": int}."""
    if option is None:
        return ("none", "auto", 1)
    spec = {"codec": option} if isinstance(option, str) else option
    unknown = set(spec) - {"codec", "shuffle", "level"} if isinstance(spec, dict) else {None}
    codec, shuffle = (spec.get("codec", "zstd"), spec.get("shuffle", "auto")) if not unknown else (0, 0)
    if unknown or codec not in _CODECS or shuffle not in _SHUFFLES:
        raise _errors.InvalidArgumentError(
            f"savepoint.save: compression={option!r}: use None, 'zstd', 'lz4' or a dict with "
            f"codec {_CODECS}, shuffle {_SHUFFLES} and level (zstd, default 1)")
    return (codec, shuffle, int(spec.get("level", 1)))


class Future:
    """result(), exception() and repr of a save future, from its done(), wait(timeout), path and
    stats (savepoint.SaveFuture, savepoint.DistributedSaveFuture)."""

    def result(self, timeout: float | None = None) -> Stats:
        """The save's stats once committed; raises its error, or TimeoutError."""
        if not self.wait(timeout):
            raise TimeoutError(f"savepoint: save to {self.path} still running after {timeout} s")
        return self.stats

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The save's error (None if it committed); TimeoutError if it is still running."""
        try:
            self.result(timeout)
        except _errors.SavepointError as e:
            return e
        return None

    def __repr__(self):
        return f"{type(self).__name__}({self.path!r}, done={self.done()})"
