"""savepoint.load, plus info / verify / list_checkpoints: entry points, over _read.py (the
manifest and the tensor reads), _distributed.py (process_group=) and _sparse_io.py (checkpoints
with sparse tables)."""

from __future__ import annotations

import os
from typing import Any

from . import _core, _distributed, _errors, _keys, _read, _sparse_io, _tree
from ._types import Key, Names, Records, Stats, StrPath


# The old name of _read.Info (tests/python/test_cuda.py reads a manifest with it).
_Info = _read.Info


def load(path: StrPath, *, names: Names | None = None, mmap: bool = False, map_location: Any = None,
         like: Any = None, verify: bool = True, io_threads: int = 4, direct_io: bool = True,
         framework: str | None = None, key: Key | None = None, strict: bool = True,
         process_group: Any = None, timeout: float = 600.0, per_rank: str = "strict",
         tables: Names | None = None, slots: Names | None = None, shard_id: int = 0,
         shard_num: int = 1) -> Any:  # fmt: skip
    """Loads a checkpoint written by savepoint.save; returns the saved structure.

    Tensors come back as chosen by `framework`; scalars as the same Python types, and
    dicts/OrderedDicts/lists/tuples as saved. A checkpoint written by the C++ API or the CLI (e.g.
    `savepoint convert` of a safetensors file) has no Python structure: it loads as a flat dict
    {entry name: tensor or value}.

    framework: what tensors come back as.
        None (default): as saved: torch tensors saved from torch, numpy arrays saved from numpy.
            Checkpoints of the C++ API or CLI give numpy arrays (bf16/fp8 as ml_dtypes types).
            Never fails on a dtype one of them can hold: without ml_dtypes, bf16/fp8 tensors come
            back as torch tensors (if torch is installed); without torch, torch-saved tensors come
            back as numpy arrays.
        "pt" (or "torch"): every tensor, array and numpy scalar as a torch tensor (bf16 and fp8
            need no ml_dtypes). Needs torch.
        "np" (or "numpy"): every tensor as a numpy array on the CPU (bf16/fp8 need ml_dtypes;
            map_location, Parameter and requires_grad do not apply).
        `like` targets are returned as they are, whatever the framework.
    names: optional list of tensor entry names or glob patterns ("model.*"); only those tensors
        are read (non-tensor values always are). Unselected tensors are left out of dicts and
        become None in lists/tuples. A name matching nothing raises NotFoundError.
    mmap: map the data files copy-on-write instead of reading them (like torch.load(mmap=True)):
        tensors are zero-copy, writable views whose pages are read on first touch; writes stay
        private to this process. Each data file is mapped once, by the C++ reader, after its header
        and size are checked. With verify=True every chunk's CRC32C is checked first (which reads
        everything once). Tensors stored in several shards, or compressed, are read as usual.
    map_location: device for torch tensors (e.g. "cpu", "cuda:0", torch.device). Default: the
        device each tensor was saved from (like torch.load); an unavailable device raises.
    like: a structure with the same key paths (e.g. model.state_dict()); each of its tensors or
        arrays that the checkpoint has at the same path is filled in place (dtype and shape must
        match, else InvalidArgumentError, a ValueError) and returned in the result. Contiguous
        CPU ones receive the bytes directly; others are filled by a copy. A tensor in `like` missing from the checkpoint
        raises NotFoundError.
    verify: check every chunk's CRC32C (default True); a mismatch raises CorruptCheckpointError
        naming checkpoint, tensor, chunk, file and offset.
    key: the key of an encrypted checkpoint (as savepoint.save takes it: bytes, a key file path or
        a callable, called once per load). Required for an encrypted checkpoint (without it:
        InvalidArgumentError "... is encrypted: pass LoadOptions::key"); refused for one that is not
        encrypted (InvalidArgumentError). A wrong key, or a modified checkpoint, raises
        AuthenticationError naming the manifest or the tensor and chunk (every chunk is
        authenticated, also with verify=False). mmap=True is refused for encrypted checkpoints.
    strict: with False, tensors of `like` that the checkpoint lacks are skipped (left as they
        are) instead of raising NotFoundError.
    process_group: a torch.distributed process group (or group.WORLD): every rank calls load()
        with its own `like` (required), whose DTensors (any mesh and placements, any world size:
        not necessarily the saving job's) receive their local boxes in place, reading only the
        byte ranges they need; other tensors of `like` are read whole. Checkpoint tensors that
        are not in `like` are not read (left out of the result); values come from the
        checkpoint. If any rank fails, every rank raises (naming it). names, mmap,
        map_location and framework do not apply. timeout: seconds to wait for the other ranks.
        Parts saved as savepoint.PerRank come back to each rank as its own (read whole, into
        the `like` tensor at that position when there is one, PerRank-wrapped or not, else into
        new CPU tensors). Without process_group they load as the list of every saving rank's.
    per_rank: with process_group, what a rank gets of a PerRank part saved by a job of another
        world size: "strict" (default; the same world size gives rank r the entry of rank r, any
        other raises InvalidArgumentError naming the key and both world sizes), "modulo" (rank r
        gets the entry of saved rank r % saved world size), "all" (every rank gets the list of
        all saved ranks' entries, whatever the world sizes).

    Sparse tables (docs/SPARSE.md): a checkpoint holding savepoint.SparseTables (a full one or
    the head of a delta chain) loads with the chain applied, each table as a SparseTable (ids and
    slots as numpy arrays, torch tensors if saved from torch or with framework="pt"; rows in
    storage order), dense tensors whole (like's tensors are filled by a copy; mmap is refused).
    tables, slots: table / slot names or glob patterns to load (default all; e.g.
        slots="embedding" leaves the optimizer slots out); unselected tables are left out.
    shard_id, shard_num: give only the rows whose slice (id mod 65536) lies in
        savepoint.gen_slice(shard_id, shard_num), whatever number of ranks saved them.
    process_group: every rank gets the rows it owns under the group's size (shard_id = group
        rank, shard_num = group size), dense tensors whole (like= optional: its DTensors get
        their local boxes), its PerRank parts as per_rank says; every rank raises if one fails.
    savepoint.load_tables loads only the tables (with rename= and slot_dtypes=).
    """
    sparse_args = tables is not None or slots is not None or (shard_id, shard_num) != (0, 1)
    if process_group is not None:
        key = _read.load_key(key, "savepoint.load: key")  # (a provider is called once)
    if process_group is not None and (like is None or sparse_args or _has_tables(path, key)):
        if names is not None or mmap or map_location is not None:
            raise _errors.InvalidArgumentError(
                "savepoint.load: a load of sparse tables with process_group takes none of names, "
                "mmap, map_location")  # fmt: skip
        if (shard_id, shard_num) != (0, 1):
            raise _errors.InvalidArgumentError(
                "savepoint.load: pass process_group or shard_id/shard_num")
        return _sparse_io.load_distributed(path, process_group, framework=framework,
                                           tables=tables, slots=slots, verify=verify,
                                           io_threads=io_threads, direct_io=direct_io, key=key,
                                           timeout=timeout, per_rank=per_rank, like=like,
                                           strict=strict)  # fmt: skip
    if process_group is not None:
        if like is None or names is not None or mmap or map_location is not None or framework:
            raise _errors.InvalidArgumentError(
                "savepoint.load: with process_group, pass like= and none of names, mmap, "
                "map_location, framework")  # fmt: skip
        return _distributed.load(path, like, process_group, strict=strict, verify=verify,
                                 io_threads=io_threads, direct_io=direct_io, key=key,
                                 timeout=timeout, per_rank=per_rank)  # fmt: skip
    if framework not in _read.FRAMEWORKS:
        raise _errors.InvalidArgumentError(
            f"savepoint.load: framework={framework!r}: use None, 'pt' or 'np'")
    path = os.fspath(path)
    info = _read.Info(path, io_threads, direct_io, _read.load_key(key, "savepoint.load: key"))
    if _sparse_io.has_tables(info):
        if mmap:
            raise _errors.UnimplementedError(
                f"savepoint.load({path!r}): the checkpoint holds sparse tables: mmap=True is not "
                "supported for it")  # fmt: skip
        return _sparse_io.load(path, info, framework=framework, names=names,
                               map_location=map_location, tables=tables, slots=slots,
                               shard_id=shard_id, shard_num=shard_num, verify=verify,
                               io_threads=io_threads, direct_io=direct_io, like=like,
                               strict=strict)  # fmt: skip
    if sparse_args:
        raise _errors.InvalidArgumentError(
            f"savepoint.load({path!r}): tables=, slots=, shard_id= and shard_num= apply to "
            "checkpoints with sparse tables; this one has none")  # fmt: skip
    info.tree = _read.for_framework(info, _read.FRAMEWORKS[framework])
    leaves = _tree.tensor_leaves(info.tree)
    plan = _read.Plan(path, info, _read.like_targets(like), mmap, map_location)
    selected = _read.select(info, leaves, names, path)
    for p, node in leaves:
        if _tree.leaf_name(node) in selected:
            plan.add(p, node)
    if strict:
        plan.check_like_covered({p for p, _ in leaves})
    plan.run(verify, io_threads, direct_io)
    finish = _read.finisher(plan.loaded, selected, map_location, plan.like_names)
    return _tree.rebuild(info.tree, finish, info.values)


def _has_tables(path, key):
    """Whether the checkpoint at `path` holds sparse tables; False when it cannot be opened (the
    load then reports that on every rank)."""
    try:
        return _sparse_io.has_tables(_read.Info(os.fspath(path), 1, False, key))
    except Exception:  # noqa: BLE001 (reported by the load itself)
        return False


def info(path: StrPath, *, key: Key | None = None) -> dict[str, Any]:
    """What a checkpoint holds without reading tensor data: {"tensors": [{name, dtype, shape,
    nbytes}], "values": {name: value}, "metadata": the user metadata passed to save(),
    "encrypted": bool}. An encrypted checkpoint is listed without its key too, but then nothing
    of it is authenticated; with `key` its manifest is (AuthenticationError when it fails)."""
    i = _read.Info(os.fspath(path), 1, True, _read.load_key(key, "savepoint.info: key"))
    tensors = [{"name": n, "dtype": d, "shape": list(s), "nbytes": b} for n, d, s, b, _ in i.tensors.values()]
    return {"tensors": tensors, "values": dict(i.values), "metadata": i.metadata,
            "encrypted": i.reader.encrypted}  # fmt: skip


def verify(path: StrPath, *, io_threads: int = 4, direct_io: bool = True,
           key: Key | None = None) -> Stats:
    """Re-reads every chunk and checks its CRC32C (and, for an encrypted checkpoint, which needs
    `key`, authenticates it); raises CorruptCheckpointError on a mismatch, AuthenticationError
    on a wrong key or a modified chunk. Returns a dict of statistics. A safetensors or MindSpore
    .ckpt file is verified too: read through, its MindSpore CRC checked when it has one."""
    return _core.verify(os.fspath(path), io_threads=io_threads, direct_io=direct_io,
                        key=_keys.normalize(key, "savepoint.verify: key"))  # fmt: skip


def list_checkpoints(root: StrPath) -> Records:
    """Checkpoint directories under `root`: list of dicts (name, path, committed, problem, step,
    bytes, created_ns, num_tensors), oldest first. Debris of crashed saves has committed=False."""
    return _core.list_checkpoints(os.fspath(root))


def delete(path: StrPath) -> None:
    """Deletes the checkpoint at `path`: its MANIFEST first (from then on it is no checkpoint),
    then its own data files, then the directory if nothing else is in it. Files that are not the
    checkpoint's (a user's notes beside it) stay. A directory without a MANIFEST is NotFoundError,
    and nothing is deleted. A file is removed when its first bytes are a safetensors or (named
    *.ckpt) a MindSpore .ckpt file's; any other file is FailedPreconditionError, not deleted."""
    _core.delete_checkpoint(os.fspath(path))


def gc(root: StrPath, *, min_age_seconds: int = 0, dry_run: bool = False) -> list[str]:
    """Removes debris of crashed saves under `root` (temporaries of unfinished saves of processes
    that are gone, leftovers of an overwrite) and restores a checkpoint that a crash left set aside
    in the middle of an overwrite. Committed checkpoints are never touched. Returns the paths
    removed or restored (dry_run: that would be). min_age_seconds: only debris at least this old
    (default 0). The CLI's `savepoint gc`. A temporary named with this process's id counts as
    debris (after a restart in a container the id is often the same), so this process's own saves
    into `root` must have finished first."""
    return _core.gc(os.fspath(root), min_age_seconds=int(min_age_seconds), dry_run=bool(dry_run))
