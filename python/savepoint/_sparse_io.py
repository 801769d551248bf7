"""Saving and loading states that hold sparse tables (savepoint.save / load route here when a
state holds a SparseTable, a delta `base` is given, or the checkpoint has tables; docs/SPARSE.md,
"Python"), and the table-only entry points savepoint.sparse offers: load_tables, chain,
should_compact, compact.

A layer below savepoint.save / load (_save.py, _load.py), which call it; over _distributed.py
(process_group=) and the shared _read.py / _write.py. It imports neither _save nor _load.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from . import _core, _cuda, _distributed, _dtypes, _errors, _keys, _read, _sparse, _torch_comm
from . import _tree, _write
from ._types import Compression, Key, Names, Records, Stats, StrPath


_RESERVED = "savepoint.sparse"  # the description value and the prefix of table tensors


def has_tables(info):
    """Whether the checkpoint behind `info` (_read.Info) holds sparse tables."""
    return _RESERVED in info.values


def _view(x, what, devices, copy=False):
    """(spec (name, address, dtype, shape), owner keeping the memory alive) of a CPU-contiguous
    view of tensor or array `x` (non-contiguous ones are copied; CUDA ones into page-locked host
    memory without blocking, their devices added to `devices` to wait for). `copy`: host memory
    is copied too (an asynchronous save: the caller may change `x` once it returns)."""
    if _sparse._kind(x) == "np":
        a = np.array(x, order="C", copy=True) if copy else np.ascontiguousarray(x)
        return (what, a.__array_interface__["data"][0], _dtypes.from_numpy_dtype(a.dtype),
                list(a.shape)), a  # fmt: skip
    t = x.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if t.is_cuda:
        t = _cuda.to_pinned(t, devices)
    else:
        cpu = t.to("cpu").contiguous()
        t = cpu.clone() if copy and cpu.data_ptr() == x.data_ptr() else cpu
    return (what, t.data_ptr(), _dtypes.from_torch_dtype(t.dtype), list(t.shape)), t


def table_specs(tables, copy=False):
    """([(name, ids, [slots], deleted or None)] for the core, owners to keep alive). Tables on a
    GPU are copied into page-locked host memory (the host link's speed), all copies queued before
    the one wait; with `copy`, tables in host memory are copied too."""
    specs, owners, devices = [], [], set()
    for name, t in tables:
        ids, o = _view(t.ids, "ids", devices, copy)
        owners.append(o)
        slots = []
        for slot, x in t.slots.items():
            spec, o = _view(x, slot, devices, copy)
            slots.append(spec)
            owners.append(o)
        deleted = None
        if t.deleted is not None:
            deleted, o = _view(t.deleted, "deleted", devices, copy)
            owners.append(o)
        specs.append((name, ids, slots, deleted))
    _cuda.settle(devices)
    return specs, owners


def save(flat, meta_json, path, *, base, concurrency, overwrite, create_parents, direct_io,
         io_threads, chunk_bytes, codec, key):  # fmt: skip
    """SaveSparse of a flattened state (_tree.Flattener with its tables)."""
    specs = [t.spec() for t in flat.tensors]
    tables, owners = table_specs(flat.tables)
    stats = _core.save_sparse(os.fspath(path), specs, flat.values, meta_json, tables,
                              overwrite=overwrite, create_parents=create_parents,
                              direct_io=direct_io, io_threads=io_threads, chunk_bytes=chunk_bytes,
                              compression=codec, key=key, base=_base(base),
                              concurrency=int(concurrency))  # fmt: skip
    del owners
    return stats


def _base(base):
    return "" if base is None else os.fspath(base)


def save_distributed(obj, path, process_group, *, async_, base, concurrency, metadata, timeout,
                     verify_replicas, key, overwrite, create_parents, chunk_bytes, io_threads,
                     direct_io):  # fmt: skip
    """savepoint.save(state, path, process_group=pg) of a state with tables (or a delta): every
    rank passes the rows it owns; SaveSparseDistributed over the group's TorchCommunicator. With
    `async_`, the dense tensors and the tables are copied, then the save runs as the dense
    distributed saves' do (a DistributedSaveFuture, one at a time in call order)."""
    class Job(_distributed._SaveJob):
        copied = None  # (table specs, owners) of an async save's copies

        def run(self):
            comm = self.group.comm()
            try:
                self._agree(comm)
                specs = [t.spec() for t in self.flat.tensors]
                tables, owners = self.copied or table_specs(self.flat.tables)
                self.copied = None
                stats = _core.save_sparse_distributed(
                    comm, self.path, specs, self.flat.boxes, self.flat.values, self.meta_json,
                    tables, base=_base(base), concurrency=int(concurrency), **self.options)
                del owners
                return stats
            except _errors.SavepointError:
                if comm.broken:  # the control group's messages may be out of step now
                    _torch_comm.forget_control_group(self.group.ranks, self.group.purpose)
                raise

    group = _distributed._Group(process_group, "async" if async_ else "sync")
    job = Job(group, os.fspath(path), float(timeout), bool(verify_replicas), dict(
        overwrite=overwrite, create_parents=create_parents, chunk_bytes=chunk_bytes,
        io_threads=io_threads, direct_io=direct_io, timeout_s=float(timeout),
        key=_keys.normalize(key, "savepoint.save: key")))  # fmt: skip
    try:
        flattener = _distributed._ShardFlattener(group)
        flattener.allow_tables = True
        job.flat, job.meta_json = _write.flatten(obj, metadata, flattener)
        if async_:
            job.snapshot(copy_host=True)
            job.copied = table_specs(job.flat.tables, copy=True)
    except Exception as e:  # noqa: BLE001 (told to the other ranks first, then raised)
        job.error = e
    if async_:
        return _distributed.DistributedSaveFuture(job)
    return job.run()


# ---------------------------------------------------------------------- load


def _names(x, what):
    if x is None:
        return []
    if isinstance(x, str):
        return [x]
    if not all(isinstance(n, str) for n in x):
        raise TypeError(f"savepoint.load: {what} must be a str or a list of str")
    return list(x)


def _core_load(path, *, shard_id, shard_num, tables, slots, rename, slot_dtypes, dense, verify,
               io_threads, direct_io, key):  # fmt: skip
    rename = dict(rename or {})
    slot_dtypes = {k: v if isinstance(v, str) else _dtype_of(v)
                   for k, v in (slot_dtypes or {}).items()}  # fmt: skip
    return _core.load_sparse(os.fspath(path), int(shard_id), int(shard_num),
                             _names(tables, "tables"), _names(slots, "slots"), rename,
                             slot_dtypes, dense, verify, io_threads, direct_io, key)  # fmt: skip


def _dtype_of(d):
    """A savepoint dtype name from a numpy or torch dtype."""
    try:
        got = _dtypes.from_numpy_dtype(np.dtype(d))
    except TypeError:
        got = _dtypes.from_torch_dtype(d)
    if got is None:
        raise TypeError(f"savepoint.load: slot_dtypes: {d!r} is not a dtype")
    return got


def _to_table(ids, slots, as_torch, device=None):
    """A SparseTable of loaded ids and slots; torch ones moved to `device` (None: kept on the
    CPU), e.g. the GPU the table was saved from."""
    _, dtype, shape, raw = ids

    def tensor(raw, dtype, shape):
        t = _dtypes.view_bytes(raw, dtype, shape, as_torch)
        return t.to(device) if as_torch and device is not None else t

    table_ids = tensor(raw, dtype, shape)
    return _sparse.SparseTable(table_ids, {n: tensor(r, d, s) for n, d, s, r in slots})


def _wants_torch(framework, node):
    if framework == "pt":
        return True
    if framework == "np":
        return False
    return bool(node.get("pt")) and _dtypes.torch_module() is not None


def _fill(target, value, entry, p, group):
    """Copies loaded tensor `value` (checkpoint entry (name, dtype, shape, raw)) into `like`
    target `target` (a tensor, an array, or with `group` a DTensor: its local box)."""
    where = _tree.describe_path(p).replace("obj", "like", 1)
    got = _sparse._dtype_name(target)
    if got != entry[1] or tuple(target.shape) != tuple(entry[2]):
        raise _errors.InvalidArgumentError(
            f"savepoint.load: {where} is {got} {list(target.shape)} but checkpoint tensor "
            f"{entry[0]!r} is {entry[1]} {list(entry[2])}")  # fmt: skip
    dtensor = _distributed._dtensor_class() if group is not None else None
    if dtensor is not None and isinstance(target, dtensor):
        box = _distributed._box(target, group, where)
        if box is not None and 0 not in box[2]:
            index = tuple(slice(o, o + s) for o, s in zip(box[1], box[2]))
            _read.copy_into(_distributed._local(target), value[index])
        return target
    _read.copy_into(target, value)
    return target


def load(path, info, *, framework, names, map_location, tables, slots, shard_id, shard_num,
         verify, io_threads, direct_io, per_rank=None, like=None, strict=True,
         group=None):  # fmt: skip
    """savepoint.load of a checkpoint with tables: the saved structure, tables as SparseTables
    (this shard's rows, chain applied), dense tensors whole (copied into `like`'s tensors, arrays
    and, with `group`, DTensors, which are then returned)."""
    tensors, values, meta_json, loaded = _core_load(
        path, shard_id=shard_id, shard_num=shard_num, tables=tables, slots=slots, rename=None,
        slot_dtypes=None, dense=True, verify=verify, io_threads=io_threads, direct_io=direct_io,
        key=info.key)  # fmt: skip
    values = {n: json.loads(v) if k == "json" else v for n, k, v in values}
    by_name = {t[0]: t for t in tensors}
    tables_by_name = {t[0]: t for t in loaded}
    meta = json.loads(meta_json)
    tree = meta.get(_tree.TREE_KEY) if isinstance(meta, dict) else None
    if tree is None:  # written by the C++ API or the CLI: a flat dict by entry name
        items = [[n, {"numpy": n}] for n in by_name]
        items += [[n, {"value": n}] for n in values if n != _RESERVED]
        items += [[n, {"sparse": n}] for n in tables_by_name]
        tree = {"version": 1, "root": {"dict": sorted(items, key=lambda kv: kv[0])}}
    info.tree = tree
    if per_rank is not None:  # (rank, world size, mode): a distributed load's PerRank parts
        _distributed._pick_per_rank(info, os.fspath(path), *per_rank)
    info.tensors = {n: (n, d, s, 0, 1) for n, d, s, _ in tensors}
    info.tree = _read.for_framework(info, _read.FRAMEWORKS[framework])
    leaves = _tree.tensor_leaves(info.tree)
    selected = _read.select(info, leaves, names, os.fspath(path))
    framework = _read.FRAMEWORKS[framework]
    targets = _read.like_targets(like)
    if strict:
        missing = set(targets) - {p for p, _ in leaves}
        if missing:
            where = ", ".join(_tree.describe_path(p).replace("obj", "like", 1)
                              for p in sorted(missing, key=str)[:5])  # fmt: skip
            raise _errors.NotFoundError(f"checkpoint {path}: no tensor for {where}")

    def finish(p, node):
        if "sparse" in node:
            t = tables_by_name.get(node["sparse"])
            if t is None:
                return _tree.MISSING  # not selected by tables=
            device = map_location if map_location is not None else node.get("device")
            try:
                return _to_table(t[1], t[2], _wants_torch(framework, node), device)
            except (RuntimeError, AssertionError) as e:
                raise _errors.InvalidArgumentError(
                    f"savepoint.load: cannot place table {node['sparse']!r} on device {device!r} "
                    f"({e}); pass map_location='cpu' (or another available device)") from None
        name = _tree.leaf_name(node)
        if name not in selected:
            return _tree.MISSING
        entry = by_name.get(name)
        if entry is None:
            raise _errors.CorruptCheckpointError(
                f"checkpoint {path}: the recorded structure names tensor {name!r}, which is "
                "missing")  # fmt: skip
        target = targets.get(p)
        if target is not None:
            value = _dtypes.view_bytes(entry[3], entry[1], entry[2], _sparse._kind(target) == "pt")
            return _fill(target, value, entry, p, group)
        value = _dtypes.view_bytes(entry[3], entry[1], entry[2], "torch" in node)
        if "npscalar" in node:
            return value[()] if isinstance(value, np.ndarray) else value.item()
        if "torch" not in node or isinstance(value, np.ndarray):
            return value
        return _read.place(value, node, p, map_location)

    return _tree.rebuild(info.tree, finish, values)


def load_distributed(path, process_group, *, framework, tables, slots, verify, io_threads,
                     direct_io, key, timeout, per_rank, like=None, strict=True):  # fmt: skip
    """savepoint.load(path, process_group=pg) of a checkpoint with tables: each rank gets the
    rows it owns under the group's size (shard rank of size), dense tensors and values whole,
    its own PerRank parts (per_rank as savepoint.load takes it). If any rank fails, every rank
    raises (naming it)."""
    if per_rank not in _distributed.PER_RANK_MODES:
        raise _errors.InvalidArgumentError(
            f"savepoint.load: per_rank={per_rank!r}: use one of {_distributed.PER_RANK_MODES}")

    group = _distributed._Group(process_group)
    comm = group.comm()
    out, error = None, None
    try:
        info = _read.Info(os.fspath(path), io_threads, direct_io,
                          _read.load_key(key, "savepoint.load: key"))  # fmt: skip
        if not has_tables(info):
            raise _errors.InvalidArgumentError(
                f"savepoint.load({os.fspath(path)!r}): with process_group, pass like= (only a "
                "checkpoint with sparse tables loads without it)")  # fmt: skip
        out = load(path, info, framework=framework, names=None, map_location="cpu", tables=tables,
                   slots=slots, shard_id=comm.rank, shard_num=comm.size, verify=verify,
                   io_threads=io_threads, direct_io=direct_io,
                   per_rank=(comm.rank, comm.size, per_rank), group=group, strict=strict,
                   like=None if like is None else _distributed._without_markers(like))  # fmt: skip
    except Exception as e:  # noqa: BLE001 (told to the other ranks first, then raised)
        error = e
    try:
        _distributed._agree_on_outcome(comm, error, float(timeout))
    finally:
        if comm.broken:
            _torch_comm.forget_control_group(group.ranks, group.purpose)
    return out


def _shard(process_group, shard_id, shard_num, what):
    """(shard_id, shard_num) of a load: the group's rank and size with `process_group`."""
    if process_group is None:
        return shard_id, shard_num
    if (shard_id, shard_num) != (0, 1):
        raise _errors.InvalidArgumentError(f"{what}: pass process_group or shard_id/shard_num")
    dist = _distributed._torch()[1]
    return dist.get_rank(process_group), dist.get_world_size(process_group)


def load_tables(path: StrPath, *, tables: Names | None = None, slots: Names | None = None,
                rename: dict[str, str] | None = None, slot_dtypes: dict[str, Any] | None = None,
                shard_id: int = 0, shard_num: int = 1, process_group: Any = None,
                framework: str | None = None, verify: bool = True, io_threads: int = 4,
                direct_io: bool = True,
                key: Key | None = None) -> dict[str, _sparse.SparseTable]:  # fmt: skip
    """Only the sparse tables of a checkpoint (delta chain applied), as {name: SparseTable}: the
    RecIS model-bank load (several checkpoints' tables into one model).

    tables: table names or glob patterns to load (default: all; a pattern matching none is
        NotFoundError). slots: slot names or patterns to load in every table (e.g. "embedding"
        for a warm start without optimizer slots). rename: {saved table name: returned name}.
    slot_dtypes: {slot name: dtype} required of the loaded slots (InvalidArgumentError naming
        table, slot and both dtypes otherwise); numpy/torch dtypes or names such as "F32".
    shard_id, shard_num: this loader's shard: the rows whose slice (id mod 65536) lies in
        gen_slice(shard_id, shard_num), whatever number of shards saved them. With
        process_group: the group rank and size (shard_id/shard_num must be left alone).
    framework: "np" (default) or "pt" (torch tensors)."""
    if framework not in (None, "np", "numpy", "pt", "torch"):
        raise _errors.InvalidArgumentError(
            f"savepoint.load_tables: framework={framework!r}: use 'np' or 'pt'")
    shard_id, shard_num = _shard(process_group, shard_id, shard_num, "savepoint.load_tables")
    _, _, _, loaded = _core_load(
        path, shard_id=shard_id, shard_num=shard_num, tables=tables, slots=slots, rename=rename,
        slot_dtypes=slot_dtypes, dense=False, verify=verify, io_threads=io_threads,
        direct_io=direct_io, key=_read.load_key(key, "savepoint.load_tables: key"))  # fmt: skip
    as_torch = framework in ("pt", "torch")
    return {name: _to_table(ids, slots_, as_torch) for name, ids, slots_ in loaded}


def load_into(path: StrPath, targets: dict[str, Any], *, slots: Names | None = None,
              shard_id: int = 0, shard_num: int = 1, process_group: Any = None,
              batch_bytes: int = 256 << 20, framework: str | None = None, verify: bool = True,
              io_threads: int = 4, direct_io: bool = True,
              key: Key | None = None) -> dict[str, int]:  # fmt: skip
    """Loads the sparse tables of a checkpoint (delta chain applied) into the caller's own
    structures, without building them first: {table name: target}, where each target has a
    method `__savepoint_set_table__(self, batch)` that stores the rows of `batch`, a SparseTable
    (ids and the slots; numpy arrays, or torch tensors with framework="pt") (e.g. a RecIS-style
    hash table inserting them into its id map and slot storage). Each table arrives in batches of
    about `batch_bytes` of rows, in storage order; the batch's arrays view memory that is freed
    after the call unless the target keeps them, so memory beyond the targets' own is about two
    batches. A table with no rows in this shard gets one empty batch.

    slots, shard_id, shard_num, process_group, framework, verify, key: as load_tables. A name
    of `targets` that is not a table of the checkpoint is NotFoundError; a target without
    __savepoint_set_table__ is TypeError; what a target raises stops the load and propagates.
    Returns {table name: rows loaded}."""
    if framework not in (None, "np", "numpy", "pt", "torch"):
        raise _errors.InvalidArgumentError(
            f"savepoint.sparse.load_into: framework={framework!r}: use 'np' or 'pt'")
    for name, target in targets.items():
        if not callable(getattr(target, "__savepoint_set_table__", None)):
            raise TypeError(f"savepoint.sparse.load_into: the target of table {name!r} "
                            f"({type(target).__qualname__}) has no __savepoint_set_table__")
    if int(batch_bytes) < 0:
        raise _errors.InvalidArgumentError(
            f"savepoint.sparse.load_into: batch_bytes={batch_bytes}: use 0 (whole tables) or more")
    shard_id, shard_num = _shard(process_group, shard_id, shard_num, "savepoint.sparse.load_into")
    as_torch = framework in ("pt", "torch")
    rows = dict.fromkeys(targets, 0)
    if not targets:
        return rows
    handed = set()

    def sink(name, ids, slots_):
        if name not in targets:  # another table a target's name matches as a glob
            return
        batch = _to_table(ids, slots_, as_torch)
        targets[name].__savepoint_set_table__(batch)
        rows[name] += len(batch.ids)
        handed.add(name)

    _core.load_sparse_batches(
        os.fspath(path), int(shard_id), int(shard_num), list(targets),
        _names(slots, "slots"), int(batch_bytes), verify, io_threads, direct_io,
        _read.load_key(key, "savepoint.sparse.load_into: key"), sink)  # fmt: skip
    missing = sorted(set(targets) - handed)  # every table gets a batch: a glob that named others
    if missing:
        raise _errors.NotFoundError(
            f"savepoint.sparse.load_into({os.fspath(path)!r}): no table {missing[0]!r}")
    return rows


def chain(path: StrPath) -> Records:
    """The delta chain ending at `path`, newest first: [{"path", "checkpoint_id", "depth",
    "table_bytes"}] (depth 0: the full checkpoint; table_bytes: the bytes of the link's table
    data, its ids, slot rows and deleted ids, without the slice index). Reads manifests only
    (no key needed)."""
    links = _core.sparse_chain(os.fspath(path))
    return [{"path": p, "checkpoint_id": c, "depth": d, "table_bytes": _table_bytes(p)}
            for p, c, d in links]  # fmt: skip


# The slice index tensors of a table (docs/FORMAT.md §11): format 2's, then format 1's.
_INDEX_TENSORS = ("slices", "deleted_slices", "ranks", "slice_rows", "deleted_slice_rows")


def _table_bytes(path):
    """Bytes of the table data (ids, slots, deleted ids) of the checkpoint at `path` (its
    manifest only)."""
    tensors = _read.Info(os.fspath(path), 1, True).tensors.values()
    return sum(nbytes for name, _, _, nbytes, _ in tensors
               if name.startswith(_RESERVED + "/") and not _is_index(name))  # fmt: skip


def _is_index(name):
    """Whether table tensor `name` is a slice index tensor (not a slot: ".../slot/<name>")."""
    parts = name.rsplit("/", 2)
    return parts[-1] in _INDEX_TENSORS and parts[-2] != "slot"


def chain_is_due(links, max_depth, max_delta_ratio, depth=None):
    """ShouldCompact of a chain (chain()'s links, newest first): more than max_depth deltas
    (`depth`, default the newest link's), or deltas holding more table bytes than
    max_delta_ratio x the full checkpoint's."""
    depth = links[0]["depth"] if depth is None else depth
    deltas = sum(link["table_bytes"] for link in links[:-1])
    return _core.should_compact(int(depth), deltas, links[-1]["table_bytes"], int(max_depth),
                                float(max_delta_ratio))  # fmt: skip


def should_compact(path: StrPath, *, max_depth: int = 8, max_delta_ratio: float = 0.5) -> bool:
    """Whether the delta chain ending at `path` should be compacted (savepoint.compact): it has
    more than `max_depth` deltas (default 8), or its deltas hold more table data than
    `max_delta_ratio` (default 0.5) x its full checkpoint's (C++ ShouldCompact; byte sizes as
    sparse_chain's table_bytes). Reads manifests only. A full checkpoint (depth 0) never is."""
    return chain_is_due(chain(path), max_depth, max_delta_ratio)


_SAME_KEY = object()


def compact(src: StrPath, dst: StrPath, *, overwrite: bool = False, key: Key | None = None,
            dst_key: Key | None = _SAME_KEY, concurrency: int = 0,
            compression: Compression | None = None, chunk_bytes: int = 8 << 20,
            io_threads: int = 4, direct_io: bool = True, create_parents: bool = True,
            verify: bool = True, batch_bytes: int = 256 << 20) -> Stats:  # fmt: skip
    """Folds the delta chain ending at checkpoint `src` into a full checkpoint at `dst` (C++
    CompactSparse): every table whole with the chain applied, and src's dense tensors, values and
    metadata, so savepoint.load(dst) returns what savepoint.load(src) does. dst is committed
    atomically like any save (a crash leaves no dst or a complete one) and the chain is never
    modified: once dst is committed the chain may be deleted. A full `src` is copied.

    overwrite: replace an existing dst (it stays intact until the new one commits). Default
        False: AlreadyExistsError. dst must not be a link of src's chain (InvalidArgumentError).
    key: the chain's encryption key (every link takes the same one; bytes, a key file path or a
        provider, as savepoint.load). Default None. dst_key: the key encrypting dst (None: not
        encrypted). Default: `key`.
    concurrency: threads sorting each table's rows (0: io_threads). compression, chunk_bytes,
        io_threads, direct_io, create_parents: as savepoint.save. verify: check every chunk's
        checksum while reading the chain (default True).
    batch_bytes: the compaction streams, merging and writing the tables in parts of about this
        many bytes (slice ranges, each its own data file), so it holds about two parts plus src's
        dense tensors however large the chain is; 0 = one part. A compressed dst loads the chain
        whole instead (distributed writes do not compress). Default 256 MiB.

    Errors, each naming src and dst: NotFoundError (no src, or a missing link),
    CorruptCheckpointError (a broken chain, a bad chunk), AlreadyExistsError (dst exists),
    InvalidArgumentError (src holds no sparse tables; dst in src's chain); an unknown option is
    TypeError. Returns the save's statistics (as savepoint.save)."""
    src, dst = os.fspath(src), os.fspath(dst)
    what = f"savepoint.compact({src!r} -> {dst!r})"
    if int(batch_bytes) < 0:
        raise _errors.InvalidArgumentError(
            f"{what}: batch_bytes={batch_bytes}: use 0 (one part) or more")
    codec = _write.compression(compression)
    key = _read.load_key(key, "savepoint.compact: key")
    if dst_key is not _SAME_KEY:
        dst_key = _keys.normalize(dst_key, "savepoint.compact: dst_key")
    else:
        dst_key = key
    try:
        if not has_tables(_read.Info(src, 1, True, None)):
            raise _errors.InvalidArgumentError(
                f"{what}: {src} holds no sparse tables (a dense checkpoint has no chain to fold)")
        if os.path.exists(dst):
            links = {os.path.realpath(p) for p, _, _ in _core.sparse_chain(src)}
            if os.path.realpath(dst) in links:
                raise _errors.InvalidArgumentError(
                    f"{what}: dst is a link of src's chain; compact into a new path (then "
                    "replace or delete the chain)")  # fmt: skip
        return _core.compact_sparse(
            src, dst, overwrite=bool(overwrite), create_parents=bool(create_parents),
            chunk_bytes=int(chunk_bytes), compression=codec, key=key, dst_key=dst_key,
            concurrency=int(concurrency), io_threads=int(io_threads), direct_io=bool(direct_io),
            verify=bool(verify), batch_bytes=int(batch_bytes))  # fmt: skip
    except _errors.SavepointError as e:
        if str(e).startswith(what):
            raise
        raise type(e)(f"{what}: {e}") from None
