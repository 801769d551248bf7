"""savepoint: fast, crash-consistent checkpoints of PyTorch / NumPy training state.

    import savepoint
    savepoint.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": step},
                   "ckpt/step-100")
    state = savepoint.load("ckpt/step-100")               # the same structure back
    state = savepoint.load("ckpt/step-100", framework="pt")   # every tensor as torch
    fut = savepoint.save(state, "ckpt/step-200", async_=True)   # returns after a memory copy
    fut.wait()                                            # committed and durable

savepoint.CheckpointManager runs a training loop's checkpoints: intervals, retention, an index,
registered objects (anything with state_dict / load_state_dict), epoch-aware names and hooks,
breakpoints on exceptions and SIGTERM.

savepoint.SparseTable(ids=..., slots={"embedding": e, ...}) leaves save sparse embedding tables
(sharded by id, delta saves with base=, loads into any number of shards, savepoint.compact of a
delta chain; docs/SPARSE.md). The sparse names live in savepoint.sparse (SparseTable,
DirtyTracker, gen_slice, chain, compact, load_tables, should_compact); the top-level ones are the
same objects.

The C++ core (savepoint._core) does all I/O with the GIL released. Errors are SavepointError
subclasses carrying the C++ message (e.g. CorruptCheckpointError names tensor and chunk).
"""

from . import _core
from ._errors import (
    AlreadyExistsError,
    AuthenticationError,
    CorruptCheckpointError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    InvalidConfigError,
    NoSpaceError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    ResourceExhaustedError,
    SavepointError,
    SavepointIOError,
    UnimplementedError,
)
from ._convert import convert
from ._distributed import DistributedSaveFuture, PerRank
from ._load import delete, gc, info, list_checkpoints, load, verify
from ._manager import CheckpointManager, StepInfo
from ._safetensors import SafetensorsDict, load_safetensors, safetensors_info, save_safetensors
from ._save import AsyncCheckpointer, SaveFuture, default_checkpointer, save
from . import sparse as sparse  # savepoint.sparse: sparse embedding tables
from .sparse import DirtyTracker, SparseTable, compact, gen_slice, load_tables, should_compact
from .sparse import chain as sparse_chain
from . import failover as failover  # savepoint.failover: failure-time checkpoints

__version__ = _core.__version__


def set_log_level(level: str) -> None:
    """Library log level: "trace", "debug", "info", "warn" (default), "error" or "off"."""
    _core.set_log_level(level)


__all__ = [
    "AlreadyExistsError",
    "AsyncCheckpointer",
    "AuthenticationError",
    "CheckpointManager",
    "convert",
    "CorruptCheckpointError",
    "DeadlineExceededError",
    "DirtyTracker",
    "DistributedSaveFuture",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "InvalidConfigError",
    "NoSpaceError",
    "NotFoundError",
    "OutOfRangeError",
    "PerRank",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "SafetensorsDict",
    "SaveFuture",
    "SavepointError",
    "SavepointIOError",
    "SparseTable",
    "StepInfo",
    "UnimplementedError",
    "compact",
    "default_checkpointer",
    "delete",
    "gc",
    "gen_slice",
    "info",
    "list_checkpoints",
    "load",
    "load_tables",
    "load_safetensors",
    "safetensors_info",
    "save",
    "save_safetensors",
    "set_log_level",
    "should_compact",
    "sparse_chain",
    "verify",
]
