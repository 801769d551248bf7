"""savepoint.save and asynchronous saves (AsyncCheckpointer, SaveFuture): an entry point, over
_write.py (what every save shares), _distributed.py (process_group=) and _sparse_io.py (sparse
tables, base=)."""

from __future__ import annotations

import atexit
import os
import threading
from typing import Any

from . import _core, _cuda, _distributed, _errors, _keys, _sparse_io, _tree, _write
from ._types import Compression, Key, Stats, StrPath

_DEFAULT_CHUNK = _write.DEFAULT_CHUNK


def save(obj: Any, path: StrPath, *, async_: bool = False, compression: Compression | None = None,
         overwrite: bool = False, metadata: dict[str, Any] | None = None, io_threads: int = 4,
         chunk_bytes: int = _DEFAULT_CHUNK, direct_io: bool = True, create_parents: bool = True,
         key: Key | None = None, process_group: Any = None, timeout: float = 600.0,
         verify_replicas: bool = True, base: StrPath | None = None, concurrency: int = 0,
         format_version: int = 0
         ) -> Stats | SaveFuture | _distributed.DistributedSaveFuture:  # fmt: skip
    """Saves `obj` as a checkpoint directory at `path`, like torch.save but crash-consistent.

    obj: a nested dict / OrderedDict / list / tuple of torch tensors, numpy arrays, numpy scalars
        and Python bool/int/float/str/bytes/None (model.state_dict(), optimizer.state_dict(), RNG
        states, counters). Contiguous CPU tensors are not copied: the C++ core reads their memory
        directly. Non-contiguous tensors/arrays and tensors on an accelerator are first copied to a
        contiguous host buffer (a documented conversion); anything else raises TypeError naming its
        key path. Storage sharing between tensors is not preserved (each is stored whole).
        Leaves may also be savepoint.SparseTable (or objects with __savepoint_table__()): sparse
        embedding tables, saved without a copy (see `base` and docs/SPARSE.md).
    async_: when True, return a SaveFuture as soon as the tensors are copied into the default
        AsyncCheckpointer's staging memory (the caller may then modify them); the write, fsync and
        commit continue in the background. Default False: return once the checkpoint is durable.
    compression: None (default), "zstd", "lz4", or {"codec": ..., "shuffle": "auto"|"on"|"off",
        "level": zstd level}: per-chunk compression (each chunk stored compressed only where that
        saves space). It costs CPU; worth it for slow storage or sparse data (docs/PERFORMANCE.md).
    overwrite: replace an existing checkpoint at `path` (the old one stays intact until the new one
        commits). Default False: AlreadyExistsError.
    metadata: optional dict of JSON-able user metadata stored with the checkpoint (see info()).
    io_threads, direct_io: the C++ IoOptions of a synchronous save (an asynchronous one uses those
        of default_checkpointer(): passing other values with async_=True is InvalidArgumentError;
        create an AsyncCheckpointer with them instead).
    chunk_bytes, create_parents: the C++ SaveOptions (an asynchronous save's chunks are its
        checkpointer's slabs: chunk_bytes must then be left at its default).
    key: encrypt the checkpoint (AES-256-GCM per chunk, authenticated manifest; docs/FORMAT.md
        §10): bytes (the raw key, 16 to 64 bytes; 32 random bytes recommended), a str or
        os.PathLike (a file holding the raw key bytes; a str is always a path, never the key) or a
        callable returning bytes (a provider, e.g. a KMS lookup, called once per save, possibly
        from another thread). Loading then needs the same key; tensor names, shapes, values and
        metadata stay readable without it. Default None: not encrypted.

    process_group: a torch.distributed process group (or torch.distributed.group.WORLD): every
        rank of it calls save() with its own state dict, and one sharded checkpoint is written
        (docs/DISTRIBUTED.md, "PyTorch distributed"). DTensor leaves are saved as their local
        shards (replicated boxes written once); other tensors are taken as replicated on every
        rank (DDP) and written once; non-tensor values and metadata come from rank 0. Per-rank
        state (RNG states, data-loader positions, counters) is marked savepoint.PerRank(obj):
        each rank's obj is saved under names carrying its rank ("rng@rank3") and loaded back by
        the same rank (savepoint.load, per_rank=). Ranks whose state dicts differ in keys, dtypes
        or shapes, or whose plain tensors differ in bytes (see verify_replicas), get
        InvalidArgumentError on every rank before anything is written. With async_=True, the local tensors are copied, then
        the save runs on a background thread (one at a time, in call order) and a
        DistributedSaveFuture is returned. compression is not supported with a process group.
    timeout: seconds each collective step of a distributed save may wait for the other ranks
        (default 600); a rank that died or hangs makes the others fail with an error naming it.
    verify_replicas: with a process_group, check that every plain (replicated) tensor holds the
        same bytes on every rank (each rank hashes every byte of them, CRC32C, before anything is
        written; InvalidArgumentError naming the tensor and the ranks that differ). Default True;
        False skips the hashing (it reads every replicated byte once on every rank, ~10 GB/s).

    base: sparse tables (savepoint.SparseTable leaves, docs/SPARSE.md): the path of the previous
        checkpoint of a delta chain; this save is then a delta in which each table holds only its
        rows touched since `base` plus SparseTable(deleted=ids) (tables of the chain absent here
        carry over unchanged; dense tensors and values are saved whole). Default None: a full
        save. concurrency: threads sorting the tables' rows (0: io_threads). With async_=True,
        the tables' rows are copied before the SaveFuture is returned (rows in storage order
        straight into the staging memory; a large hash-ordered table as its rows lie, sorted in
        the background), the rest in the background; with a process_group, each rank's tables
        are copied (numpy / torch copies) and the save runs as a distributed async save does
        (a DistributedSaveFuture).

    format_version: the on-disk format (docs/FORMAT.md): 0 (default) lets savepoint choose, 2
        (packed small tensors), 1 for readers older than version 2, 3 or 4 for the indexed
        manifest a loading rank reads in parts (4: compact, about a quarter of 3's bytes; what a
        job of thousands of ranks needs: version 2's JSON manifest exceeds its 256 MiB cap above
        about 12,000 ranks of a 70B model). The choice is 2, except for a save with a
        process_group of more than 65,536 shards or 2^20 chunks: 4. Taken by a synchronous save, with or without
        a process_group; an asynchronous single-process save and sparse tables write the
        default (another value than 0 or 2: InvalidArgumentError).

    Returns a dict of statistics (bytes, chunks, seconds, direct_io) for a synchronous save, a
    SaveFuture for an asynchronous one. Errors are SavepointError subclasses (the C++ message).
    """
    if isinstance(format_version, bool) or not isinstance(format_version, int) or \
            not 0 <= format_version < 2**32:
        raise _errors.InvalidArgumentError(
            f"savepoint.save: format_version must be an int (0 to 4), not {format_version!r}")
    sparse = base is not None or _tree.contains_table(obj)
    if format_version not in (0, 2) and (sparse or (async_ and process_group is None)):
        raise _errors.InvalidArgumentError(
            f"savepoint.save: format_version={format_version} is taken by a synchronous or "
            f"distributed save without sparse tables (this one takes savepoint's choice, 0, "
            f"or 2)")
    if process_group is not None and sparse:
        if compression is not None:
            raise _errors.UnimplementedError("savepoint.save: compression with a process_group")
        return _sparse_io.save_distributed(
            obj, path, process_group, async_=async_, base=base, concurrency=concurrency,
            metadata=metadata,
            timeout=timeout, verify_replicas=verify_replicas, key=key, overwrite=overwrite,
            create_parents=create_parents, chunk_bytes=chunk_bytes, io_threads=io_threads,
            direct_io=direct_io)  # fmt: skip
    if process_group is not None:
        if compression is not None:
            raise _errors.UnimplementedError("savepoint.save: compression with a process_group")
        return _distributed.save(obj, path, process_group, async_=async_, overwrite=overwrite,
                                 metadata=metadata, io_threads=io_threads,
                                 chunk_bytes=chunk_bytes, direct_io=direct_io,
                                 create_parents=create_parents, key=key,
                                 timeout=timeout, verify_replicas=verify_replicas,
                                 format_version=format_version)  # fmt: skip
    codec = _write.compression(compression)
    if async_:
        given = {k: v for k, v, d in (("io_threads", io_threads, 4), ("direct_io", direct_io, True),
                                      ("chunk_bytes", chunk_bytes, _DEFAULT_CHUNK)) if v != d}
        if given:
            raise _errors.InvalidArgumentError(
                f"savepoint.save(async_=True): {given} belong to the checkpointer, not to one "
                f"save: use AsyncCheckpointer(io_threads=..., direct_io=..., slab_bytes=...).save()")
        return default_checkpointer().save(obj, path, overwrite=overwrite, metadata=metadata,
                                           create_parents=create_parents,
                                           compression=compression, key=key, base=base,
                                           concurrency=concurrency)  # fmt: skip
    key = _keys.normalize(key, "savepoint.save: key")
    flattener = _tree.Flattener()
    flattener.allow_tables = True
    flat, meta_json = _write.flatten(obj, metadata, flattener)
    if flat.tables or base is not None:
        return _sparse_io.save(flat, meta_json, path, base=base, concurrency=concurrency,
                               overwrite=overwrite, create_parents=create_parents,
                               direct_io=direct_io, io_threads=io_threads,
                               chunk_bytes=chunk_bytes, codec=codec, key=key)  # fmt: skip
    specs = [t.spec() for t in flat.tensors]
    return _core.save(os.fspath(path), specs, flat.values, meta_json, overwrite=overwrite,
                      create_parents=create_parents, direct_io=direct_io, io_threads=io_threads,
                      chunk_bytes=chunk_bytes, compression=codec, key=key,
                      format_version=int(format_version))  # fmt: skip


class SaveFuture(_write.Future):
    """One asynchronous save. Like concurrent.futures.Future: done(), wait(), result(),
    exception(); plus `stats` and `path`. Thread-safe."""

    def __init__(self, handle: Any) -> None:
        self._h = handle

    @property
    def path(self) -> str:
        return self._h.path

    @property
    def stats(self) -> Stats:
        """dict, the same keys as a synchronous save's statistics: bytes, stored_bytes, chunks,
        seconds (start to commit; final once done()), blocked_seconds (how long save() blocked
        the caller), snapshot_seconds (the copy phase), direct_io."""
        return self._h.stats

    def done(self) -> bool:
        """True once the save committed or failed (never blocks)."""
        return self._h.poll()

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks until the save finishes or `timeout` seconds pass. Returns True if it finished
        (and committed: a failed save raises its SavepointError here), False on timeout.
        Ctrl-C raises KeyboardInterrupt promptly; the save itself goes on in the background."""
        if not self._h.wait_for(-1.0 if timeout is None else float(timeout)):
            return False
        self._h.check()
        return True


class AsyncCheckpointer:
    """Asynchronous two-phase saves with a capped, reusable staging pool (C++ Checkpointer).

    save() blocks only while the tensors are copied (and checksummed) into staging memory; the
    data is then written, synced and committed by background threads. By default a new save first
    waits for the previous one. Closing (or leaving the `with` block, or interpreter exit for the
    default instance) waits for every save in flight.

    staging_bytes: cap on staging memory (default: a quarter of RAM, at most 16 GiB).
    slab_bytes: staging slab = write unit = checksum chunk (default 8 MiB).
    io_threads: background writer threads (default 4).
    direct_io: write the data files with O_DIRECT where possible (default True).
    allow_concurrent_saves: let saves overlap (default False).
    reserve: a state (anything save() takes) or a byte count: staging memory for that much is
        allocated and pre-touched in the background right away, so the first save blocks for the
        copy alone (default None: the first save allocates, which costs it ~0.3 s per GiB).
    key: encrypt every save with this key (see savepoint.save; a provider is called once per
        save, on the caller's thread, before the copy). save(key=...) overrides it per save.
        Encryption happens during the copy, so it lengthens the time save() blocks (by roughly
        the tensor bytes / AES-GCM speed per snapshot thread). Default None: not encrypted.
    cuda: how CUDA tensors are snapshotted. True: straight from GPU memory into the staging
        slabs, which are page-locked once (CUDA driver copies on side streams; no full host copy
        first, and the memory stays within staging_bytes; docs/PERFORMANCE.md, "GPU"); save()
        first waits for the current CUDA stream of each device holding such a tensor, so that
        work queued on other streams must be synchronised by the caller. Raises
        FailedPreconditionError where the CUDA driver cannot be loaded. False: CUDA tensors are
        copied to pageable host memory (tensor.to("cpu")) and then staged. Default None: True
        when torch is imported and torch.cuda.is_available(), else False.
    snapshot_threads: threads copying the state into staging memory during save(), the caller's
        included (0..64). Default 0: the hardware threads, at most 4 (at most 8 with cuda: they
        wait for DMA between checksums).
    """

    def __init__(self, staging_bytes: int | None = None, slab_bytes: int = 8 << 20,
                 io_threads: int = 4, allow_concurrent_saves: bool = False, reserve: Any = None,
                 direct_io: bool = True, key: Key | None = None, cuda: bool | None = None,
                 snapshot_threads: int = 0) -> None:  # fmt: skip
        self._key = _keys.normalize(key, "AsyncCheckpointer: key")
        o = _core.CheckpointerOptions()
        o.staging_bytes, o.slab_bytes = staging_bytes or 0, slab_bytes
        o.allow_concurrent_saves, o.snapshot_threads = bool(allow_concurrent_saves), snapshot_threads
        io = _core.IoOptions()
        io.io_threads, io.direct_io = io_threads, bool(direct_io)
        self._c = _core.Checkpointer.create(o, io, _cuda.checkpointer_device(cuda))
        self._lock = threading.Lock()
        if reserve is not None:
            self.reserve(reserve)

    def reserve(self, state_or_bytes: Any) -> None:
        """Allocates and pre-touches staging memory for `state_or_bytes` (a state as save() takes
        it, or a byte count; at most staging_bytes) in a background thread and returns at once,
        so that a later save of that size blocks only for the copy. Raising the target is fine;
        memory already allocated stays until close()."""
        self._checkpointer().reserve(_write.staged_bytes(state_or_bytes))

    def save(self, obj: Any, path: StrPath, *, overwrite: bool = False,
             metadata: dict[str, Any] | None = None, create_parents: bool = True,
             compression: Compression | None = None, key: Key | None = None,
             base: StrPath | None = None, concurrency: int = 0) -> SaveFuture:  # fmt: skip
        """Starts saving `obj` (see savepoint.save) and returns a SaveFuture once the caller may
        modify its tensors and tables again. key: this save's key (None: the checkpointer's).
        base, concurrency: sparse tables' delta saves (savepoint.save); the base is read after
        the previous save of this checkpointer has finished (unless allow_concurrent_saves), so
        it may be that one."""
        codec = _write.compression(compression)
        key = self._key if key is None else _keys.normalize(key, "AsyncCheckpointer.save: key")
        c = self._checkpointer()
        flattener = _tree.Flattener()
        flattener.cuda_in_place = c.device_copies
        flattener.allow_tables = True
        flat, meta_json = _write.flatten(obj, metadata, flattener)
        _cuda.settle(flat.cuda_devices)
        specs = [t.spec() for t in flat.tensors]
        tables, owners = _sparse_io.table_specs(flat.tables)
        handle = c.save_async(os.fspath(path), specs, flat.values, meta_json, overwrite=overwrite,
                              create_parents=create_parents, compression=codec, key=key,
                              tables=tables, base="" if base is None else os.fspath(base),
                              concurrency=int(concurrency))  # fmt: skip
        del owners  # (the snapshot is done: the tables' memory is no longer read)
        return SaveFuture(handle)

    def wait(self) -> None:
        """Blocks until every save started so far has finished; raises the first error."""
        self._checkpointer().wait_all()

    def close(self) -> None:
        """Waits for the saves in flight, then releases the staging memory. Idempotent."""
        with self._lock:
            c, self._c = self._c, None
        if c is not None:
            try:
                c.wait_all()
            finally:
                del c

    @property
    def cuda(self) -> bool:
        """Whether CUDA tensors are snapshotted straight from GPU memory (see `cuda`)."""
        return self._checkpointer().device_copies

    @property
    def staging_allocated_bytes(self) -> int:
        return self._checkpointer().staging_allocated_bytes

    def _checkpointer(self):
        c = self._c
        if c is None:
            raise _errors.FailedPreconditionError("savepoint: AsyncCheckpointer is closed")
        return c

    def __enter__(self) -> AsyncCheckpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_default = None
_default_lock = threading.Lock()


def default_checkpointer() -> AsyncCheckpointer:
    """The AsyncCheckpointer that save(..., async_=True) uses (created on first use; closed at
    interpreter exit after its saves finish)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = AsyncCheckpointer()
            atexit.register(_close_default)
        return _default


def _close_default():
    global _default
    with _default_lock:
        c, _default = _default, None
    if c is not None:
        try:
            c.close()
        except _errors.SavepointError:
            pass  # already reported through its SaveFuture
