"""A storage plug-in for torch.distributed.checkpoint (DCP): savepoint checkpoints through DCP.

    import torch.distributed.checkpoint as dcp
    import savepoint.torch

    dcp.save(state_dict, storage_writer=savepoint.torch.StorageWriter("ckpt/step-100"))
    dcp.load(state_dict, storage_reader=savepoint.torch.StorageReader("ckpt/step-100"))

What lands on disk is a native savepoint checkpoint (docs/FORMAT.md): a CRC32C per chunk, committed
atomically by the coordinator (hidden temporary directory, rename), readable by savepoint.load,
the C++ API and the CLI (`savepoint verify`, `inspect`). DCP runs the collectives; the plug-in
maps the steps of savepoint's distributed save onto DCP's phases (docs/INTEROP.md, "PyTorch DCP"):

  prepare_global_plan (coordinator)  plans every rank's data file from the items DCP's planner
                                     gave it, checks they tile every tensor, creates the
                                     temporary directory: the verdict goes in SavePlan.storage_data
  write_data (every rank)            writes and syncs its data file; its report (CRC32Cs) and its
                                     BYTE_IO values go back in a WriteResult's storage_data
  finish (coordinator)               writes the manifest and commits

A tensor write item is a shard (a box of the global tensor); a BYTE_IO item (DCP's torch.save of
a non-tensor value) becomes a bytes value of the same name. read_metadata describes the stored
shards as DCP's chunks; read_data reads each ReadItem's box straight into its destination,
reading only the chunks that overlap it, each verified against its CRC32C.

dcp.save(..., use_collectives=False) saves without rank coordination, as DCP's own writer does
then: every rank commits a checkpoint of its own items at `path`/rank-<r> (its boxes stored as
local tensors; where they lie in the global tensors goes in its metadata), and dcp.load finds
no checkpoint at `path` and reads rank r's own (the same layout only, as with DCP's).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os

import torch
from torch.distributed.checkpoint import metadata as _md
from torch.distributed.checkpoint import planner as _planner
from torch.distributed.checkpoint import staging as _staging
from torch.distributed.checkpoint import storage as _storage
from torch.futures import Future

from . import _core, _cuda, _dtypes, _errors

__all__ = ["StorageReader", "StorageWriter", "install", "uninstall"]

_DEFAULT_CHUNK_BYTES = 8 << 20
# The fqn of the WriteResult that carries a rank's report to the coordinator (not a state key).
_REPORT_FQN = "\0savepoint.report"
# DCP's default serialization format (FileSystemWriter's serialization_format), where it has one.
try:
    from torch.distributed.checkpoint.filesystem import SerializationFormat as _Formats

    _TORCH_SAVE = _Formats.TORCH_SAVE
except ImportError:  # (a torch without it: only the default, None, is accepted)
    _TORCH_SAVE = None
# Key of the user metadata holding what DCP needs back on load.
_META_KEY = "torch.distributed.checkpoint"


def _rank_path(path, rank):
    """Where rank `rank` of a save without collectives commits its own checkpoint."""
    return f"{path.rstrip('/')}/rank-{rank}"


def _local_names(items):
    """{item index: local name} of a rank's tensor items: the first box of a tensor takes its
    fqn, later boxes of it fqn#boxK (K = 2, 3, ...; skipping names other fqns have). A save with
    collectives stores them all as shards of the fqn (ShardSpec::tensor); one without stores each
    box as a whole tensor under its local name (docs/FORMAT.md §14)."""
    names, used, fqns = {}, set(), {i.index.fqn for i in items}
    for item in items:
        fqn = item.index.fqn
        name, k = fqn, 2
        while name in used or (name != fqn and name in fqns):
            name, k = f"{fqn}#box{k}", k + 1
        used.add(name)
        names[item.index] = name
    return names


@dataclasses.dataclass(frozen=True)
class _SaveVerdict:
    """SavePlan.storage_data: the coordinator's verdict and the plan it made for this rank."""

    verdict: bytes
    plan: bytes
    world: int


@dataclasses.dataclass(frozen=True)
class _RankReport:
    """WriteResult.storage_data of a rank's report item."""

    rank: int
    report: bytes
    values: dict


def _dtype_name(dtype, fqn):
    name = _dtypes.from_torch_dtype(dtype)
    if name is None:
        raise _errors.InvalidArgumentError(f"tensor {fqn!r}: dtype {dtype} is not supported")
    return name


def _is_tensor(item):
    return item.type != _planner.WriteItemType.BYTE_IO


def _io_threads(what, thread_count, io_threads):
    """The I/O threads from DCP's thread_count and savepoint's io_threads (one of them, or both
    equal); default 4."""
    if thread_count is not None and io_threads is not None and thread_count != io_threads:
        raise _errors.InvalidArgumentError(
            f"{what}: thread_count={thread_count} and io_threads={io_threads} are the same "
            "setting (the I/O threads): give one")
    n = thread_count if thread_count is not None else io_threads if io_threads is not None else 4
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise _errors.InvalidArgumentError(f"{what}: thread_count must be an int >= 1, not {n!r}")
    return n


class StorageWriter(_storage.StorageWriter, _staging.BlockingAsyncStager):
    """Writes DCP saves (dcp.save, dcp.async_save) as a savepoint checkpoint at `path`.

    Takes FileSystemWriter's arguments, in its order, with their meaning:
      single_file_per_rank (True): savepoint writes one data file per rank either way (the
          files are its format's, not DCP's); False is accepted and writes the same files.
      sync_files (True): every file is synced before the checkpoint is committed, whatever
          the value (savepoint's commit protocol needs it: a checkpoint is durable or absent).
      thread_count (None): the I/O threads of each rank (io_threads is savepoint's name for
          it; give one). Default 4.
      per_thread_copy_ahead: DCP's GPU copy-ahead budget; savepoint copies CUDA tensors into
          page-locked memory before writing, so no budget applies (accepted, any int >= 0).
      cache_staged_state_dict (False): dcp.async_save stages into one copy kept and reused
          across saves, as FileSystemWriter does (this writer is the stager; the copy is
          page-locked where a GPU is).
      overwrite (True, as DCP): replace an existing checkpoint at `path` atomically, and only
          its own files: a directory holding anything else is refused, naming it.
      _extensions: stream transforms are not supported (InvalidArgumentError unless empty).
      serialization_format: TORCH_SAVE (the default) only; what is written is a savepoint
          checkpoint (docs/FORMAT.md) whatever DCP's format would have been.
    Savepoint's own: chunk_bytes (the unit of the checksums; default 8 MiB; the same on every
    rank), io_threads, direct_io (as savepoint.save).
    """

    def __init__(self, path, single_file_per_rank=True, sync_files=True, thread_count=None,
                 per_thread_copy_ahead=10_000_000, cache_staged_state_dict=False, overwrite=True,
                 _extensions=None, serialization_format=None, *,
                 chunk_bytes=_DEFAULT_CHUNK_BYTES, io_threads=None, direct_io=True):  # fmt: skip
        super().__init__()
        what = "savepoint.torch.StorageWriter"
        if _extensions:
            raise _errors.InvalidArgumentError(
                f"{what}: _extensions={_extensions!r}: stream extensions are not supported "
                "(savepoint checksums and, with savepoint.save, compresses in its own format)")
        if serialization_format is not None and serialization_format != _TORCH_SAVE:
            raise _errors.InvalidArgumentError(
                f"{what}: serialization_format={serialization_format}: savepoint writes its own "
                "format (docs/FORMAT.md); convert to safetensors with savepoint.convert")
        if isinstance(per_thread_copy_ahead, bool) or not isinstance(per_thread_copy_ahead, int) \
                or per_thread_copy_ahead < 0:  # fmt: skip
            raise _errors.InvalidArgumentError(
                f"{what}: per_thread_copy_ahead must be an int >= 0, not {per_thread_copy_ahead!r}")
        _staging.BlockingAsyncStager.__init__(
            self, cache_staged_state_dict=bool(cache_staged_state_dict))
        self.path = os.fspath(path)
        self.single_file_per_rank = bool(single_file_per_rank)
        self.sync_files = bool(sync_files)
        self.per_thread_copy_ahead = per_thread_copy_ahead
        self.overwrite = overwrite
        self.chunk_bytes = chunk_bytes
        self.io_threads = _io_threads(what, thread_count, io_threads)
        self.thread_count = self.io_threads
        self.direct_io = direct_io
        self._rank = 0
        self._is_coordinator = True
        self._coordinator = None
        self._own = None
        self._solo = False  # use_collectives=False: this rank saves alone
        self._chunks = {}  # (without collectives) stored name -> [fqn, global size, offsets]

    def stage(self, state_dict):
        """dcp.async_save's copy of the state (FileSystemWriter's; with cache_staged_state_dict
        the copy is kept and reused, page-locked where a GPU is, in plain memory where none is:
        DCP's own would fail there)."""
        if self.cache_staged_state_dict and self.state_dict_cache is None \
                and not torch.cuda.is_available():  # fmt: skip
            from torch.distributed._state_dict_utils import _create_cpu_state_dict

            self.state_dict_cache = _create_cpu_state_dict(state_dict, pin_memory=False)
        return super().stage(state_dict)

    def reset(self, checkpoint_id=None):
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)
        self._abandon()

    def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
        self._is_coordinator = is_coordinator
        self._rank = kwargs.get("rank", _default_rank())
        self._solo = not kwargs.get("use_collectives", True)

    def _specs(self, items, tensors=None):
        """(local name, address, dtype, shape, global shape, offsets, stored tensor or "") of
        every tensor item: its box of the global tensor, named as _local_names says; without
        collectives, the box as a whole tensor. `tensors` (the items' data, for a write) gives
        the addresses; without it (planning on shapes) they are 0."""
        items = [i for i in items if _is_tensor(i)]
        names = _local_names(items)
        out = []
        for k, item in enumerate(items):
            td, fqn, local = item.tensor_data, item.index.fqn, names[item.index]
            t = tensors[k] if tensors is not None else None
            address = t.data_ptr() if t is not None and t.numel() else 0
            sizes = list(t.shape) if t is not None else list(td.chunk.sizes)
            dtype = _dtype_name(td.properties.dtype, fqn)
            if self._solo:
                out.append((local, address, dtype, sizes, sizes, [0] * len(sizes), ""))
            else:
                out.append((local, address, dtype, sizes, list(td.size), list(td.chunk.offsets),
                            "" if local == fqn else fqn))
        return out

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        """Coordinator: plans every rank's file and decides; the verdict goes to every rank.
        Without collectives every rank does this for its own plan and its own checkpoint."""
        world = len(plans)
        path = self.path
        if self._solo:
            tensors = [i for i in plans[0].items if _is_tensor(i)]
            names = _local_names(tensors)
            self._chunks = {names[i.index]: [i.index.fqn, list(i.tensor_data.size),
                                             list(i.tensor_data.chunk.offsets)] for i in tensors}
            path = _rank_path(self.path, self._rank)
        shapes = [_core.dcp_plan_shapes(r, world, self._specs(p.items), self.chunk_bytes)
                  for r, p in enumerate(plans)]
        self._abandon()
        self._coordinator = _core.DcpCoordinator(path, world, self.overwrite)
        try:
            verdict = self._coordinator.decide(shapes)
        except _errors.AlreadyExistsError as e:  # in DCP's words, which its users match on
            raise _errors.AlreadyExistsError(
                f"Checkpoint already exists and self.overwrite={self.overwrite}: {e}") from None
        return [dataclasses.replace(p, storage_data=_SaveVerdict(verdict, shapes[r], world))
                for r, p in enumerate(plans)]

    def write_data(self, plan, planner):
        """Every rank: writes its data file; returns its report for the coordinator."""
        sd = plan.storage_data
        tensors, values, results, devices = [], {}, [], set()
        for item in plan.items:
            data = planner.resolve_data(item)
            if not _is_tensor(item):
                values[item.index.fqn] = bytes(data.getbuffer())
                results.append(_storage.WriteResult(item.index, len(values[item.index.fqn]), None))
                continue
            t = data.detach()
            t = _cuda.to_pinned(t, devices) if t.is_cuda else t.to("cpu").contiguous()
            tensors.append(t)  # alive until the write returns
            results.append(_storage.WriteResult(item.index, t.numel() * t.element_size(), None))
        _cuda.settle(devices)  # the copies into page-locked memory, queued above, are done
        specs = self._specs(plan.items, tensors)
        rank = 0 if self._solo else self._rank
        mine = _core.DcpRankSave(rank, sd.world, self.chunk_bytes, self.io_threads,
                                 self.direct_io)
        if mine.plan(specs) != sd.plan:
            raise _errors.InternalError(
                f"DCP save {self.path}: rank {self._rank} planned other writes than the "
                "coordinator planned for it")
        report = mine.write(sd.verdict)
        if self._is_coordinator or self._solo:
            self._own = mine
        index = _md.MetadataIndex(_REPORT_FQN)
        results.append(_storage.WriteResult(index, 0, _RankReport(rank, report, values)))
        fut = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata, results):
        """Coordinator: checks every rank's report, writes the manifest and commits."""
        reports = [None] * len(results)
        values = {}
        for rank_results in results:
            for r in rank_results:
                if r.index.fqn == _REPORT_FQN:
                    reports[r.storage_data.rank] = r.storage_data.report
                    values.update(r.storage_data.values)
        if any(r is None for r in reports) or self._own is None or self._coordinator is None:
            raise _errors.InternalError(f"DCP save {self.path}: a rank's report is missing")
        meta = {_META_KEY: {"byte_io": sorted(values), "planner_data": _jsonable(metadata)}}
        if self._solo:  # where each stored box lies: {stored name: [fqn, size, offsets]}
            meta[_META_KEY]["boxes"] = self._chunks
        self._own.add_values([(k, "bytes", v) for k, v in values.items()], json.dumps(meta))
        coordinator, self._coordinator = self._coordinator, None
        own, self._own = self._own, None
        coordinator.commit(reports, own)

    def storage_meta(self):
        return _md.StorageMeta(checkpoint_id=self.path)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return isinstance(checkpoint_id, (str, os.PathLike))

    def _abandon(self):
        """Drops a save that did not finish (its temporary directory goes)."""
        if self._coordinator is not None:
            self._coordinator.abandon()
        self._coordinator = None
        self._own = None


# ---------------------------------------------------------------------- checkpoint_id= alone

_MODULES = ("torch.distributed.checkpoint.state_dict_saver",
            "torch.distributed.checkpoint.state_dict_loader")  # fmt: skip
_original_setup = None  # DCP's _storage_setup while install() is in effect


def install() -> None:
    """Makes DCP's calls that name only a checkpoint_id use savepoint:
    `dcp.save(state, checkpoint_id=path)` and `dcp.async_save(...)` write a savepoint checkpoint
    (StorageWriter(path)), and `dcp.load(state, checkpoint_id=path)` reads one through
    StorageReader(path) when `path` holds a savepoint checkpoint (a MANIFEST) and through DCP's
    own reader otherwise, so DCP's own directories still load. Paths are local or `s3://` URIs;
    other URIs (fsspec's) and calls that pass a storage writer or reader are left to DCP.
    Idempotent; uninstall() undoes it. It replaces the `_storage_setup` that DCP's saver and
    loader modules call (an internal of DCP: InternalError naming it where this torch lacks it)."""
    global _original_setup
    if _original_setup is not None:
        return
    import importlib  # noqa: PLC0415

    modules = [importlib.import_module(m) for m in _MODULES]
    original = getattr(modules[0], "_storage_setup", None)
    if original is None or getattr(modules[1], "_storage_setup", None) is not original:
        raise _errors.InternalError(
            f"savepoint.torch.install: torch {torch.__version__} has no _storage_setup in "
            f"{list(_MODULES)}: pass storage_writer= / storage_reader= instead")
    _original_setup = original

    def setup(storage, checkpoint_id, reader=False):
        if storage or not _savepoint_path(checkpoint_id, reader):
            return original(storage, checkpoint_id, reader=reader)
        made = StorageReader(checkpoint_id) if reader else StorageWriter(checkpoint_id)
        made.reset(checkpoint_id)
        return made

    for m in modules:
        m._storage_setup = setup


def uninstall() -> None:
    """Puts DCP's own `_storage_setup` back (after install(); otherwise nothing to do)."""
    global _original_setup
    if _original_setup is None:
        return
    import importlib  # noqa: PLC0415

    for name in _MODULES:
        importlib.import_module(name)._storage_setup = _original_setup
    _original_setup = None


def _savepoint_path(checkpoint_id, reader):
    if not isinstance(checkpoint_id, (str, os.PathLike)):
        return False
    path = os.fspath(checkpoint_id)
    if "://" in path:
        return path.startswith("s3://")
    return not reader or any(os.path.isfile(os.path.join(p, "MANIFEST"))
                             for p in (path, _rank_path(path, 0)))


def _is_box(where, dims):
    """Whether `where` is [fqn, global shape, offsets] of a box of `dims` dims."""
    def ints(v):
        return isinstance(v, list) and len(v) == dims and all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)
    return (isinstance(where, list) and len(where) == 3 and isinstance(where[0], str)
            and ints(where[1]) and ints(where[2]))


def _is_extension_registry(obj):
    try:
        from torch.distributed.checkpoint._extension import ExtensionRegistry  # noqa: PLC0415
    except ImportError:  # (a torch without stream extensions)
        return False
    return isinstance(obj, ExtensionRegistry)


def _default_rank():
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _jsonable(metadata):
    """DCP's planner_data (the default planner's fqn -> key path) as JSON, or None."""
    data = getattr(metadata, "planner_data", None)
    try:
        json.dumps(data)
    except (TypeError, ValueError):
        return None
    return data


def _from_json_planner_data(data):
    if not isinstance(data, dict):
        return data
    return {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}


class StorageReader(_storage.StorageReader):
    """Reads a savepoint checkpoint at `path` for dcp.load, in any sharding (resharding).

    Takes FileSystemReader's arguments (path, _extension_registry: None or DCP's
    ExtensionRegistry, which has nothing to resolve: savepoint checkpoints hold no stream
    transforms).

    Any savepoint checkpoint loads, not only those written through DCP: values that DCP did not
    write are handed to DCP as torch.save bytes of their Python value. verify: check every chunk
    read against its CRC32C (default). io_threads, direct_io: as savepoint.load.
    """

    def __init__(self, path, _extension_registry=None, *, verify=True, io_threads=4,
                 direct_io=False):  # fmt: skip
        super().__init__()
        if _extension_registry is not None and not _is_extension_registry(_extension_registry):
            raise _errors.InvalidArgumentError(
                f"savepoint.torch.StorageReader: _extension_registry={_extension_registry!r}: "
                f"None or DCP's ExtensionRegistry (savepoint checkpoints hold no stream "
                f"transforms for it to resolve)")
        self.path = os.fspath(path)
        self.verify = verify
        self.io_threads = io_threads
        self.direct_io = direct_io
        self._dtypes = {}
        self._values = {}
        self._byte_io = set()
        self._loaded = False
        self._read_path = self.path  # path, or a rank's own checkpoint under it
        self._boxes = {}  # (fqn, chunk offsets) -> stored name, for a rank's own checkpoint

    def reset(self, checkpoint_id=None):
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)
            self._read_path = self.path
            self._boxes = {}
            self._loaded = False

    def read_metadata(self, *args, **kwargs):
        """The checkpoint at `path`; with rank=r (DCP asks when there is none: a save without
        collectives), rank r's own checkpoint under it."""
        rank = kwargs.get("rank")
        self._read_path = self.path if rank is None else _rank_path(self.path, rank)
        self._boxes = {}
        reader = _core.Reader.open(self._read_path, self.io_threads, False)
        manifest = json.loads(reader.manifest_json())
        meta = json.loads(reader.metadata_json() or "null") or {}
        dcp_meta = meta.get(_META_KEY, {}) if isinstance(meta, dict) else {}
        self._byte_io = set(dcp_meta.get("byte_io", []))
        self._values = {name: (kind, v) for name, kind, v in reader.values()}
        entries = {}
        boxes = dcp_meta.get("boxes") if rank is not None else None
        if boxes is not None:
            entries = self._rank_boxes_metadata(manifest, boxes)
        for t in manifest["tensors"] if boxes is None else ():
            entries[t["name"]] = self._tensor_metadata(t)
            self._dtypes[t["name"]] = t["dtype"]
        for name in self._values:
            entries[name] = _md.BytesStorageMetadata()
        self._loaded = True
        return _md.Metadata(state_dict_metadata=entries,
                            planner_data=_from_json_planner_data(dcp_meta.get("planner_data")),
                            storage_meta=_md.StorageMeta(checkpoint_id=self.path))

    def _rank_boxes_metadata(self, manifest, boxes):
        """DCP's metadata of a rank's own checkpoint: each stored tensor is a chunk (a box) of
        the global tensor its metadata names."""
        entries, stored = {}, {t["name"]: t for t in manifest["tensors"]}
        if not isinstance(boxes, dict):
            raise _errors.CorruptCheckpointError(
                f"checkpoint {self._read_path}: DCP boxes are not a mapping: {boxes!r}")
        for name, where in sorted(boxes.items()):
            t = stored.get(name)
            if t is None or not _is_box(where, len(t["shape"])):
                raise _errors.CorruptCheckpointError(
                    f"checkpoint {self._read_path}: DCP box {name!r} = {where!r} does not fit "
                    f"its stored tensors (want [fqn, global shape, offsets] of a stored tensor)")
            fqn, size, offsets = where
            chunk = _md.ChunkStorageMetadata(offsets=torch.Size(offsets),
                                             sizes=torch.Size(t["shape"]))
            if fqn not in entries:
                props = _md.TensorProperties(dtype=_dtypes.to_torch_dtype(t["dtype"]))
                entries[fqn] = _md.TensorStorageMetadata(properties=props, size=torch.Size(size),
                                                         chunks=[])
            entries[fqn].chunks.append(chunk)
            self._dtypes[fqn] = t["dtype"]
            self._boxes[(fqn, tuple(offsets))] = name
        return entries

    @staticmethod
    def _tensor_metadata(t):
        chunks = [_md.ChunkStorageMetadata(offsets=torch.Size(s["offsets"]),
                                           sizes=torch.Size(s["sizes"])) for s in t["shards"]]
        props = _md.TensorProperties(dtype=_dtypes.to_torch_dtype(t["dtype"]))
        return _md.TensorStorageMetadata(properties=props, size=torch.Size(t["shape"]),
                                         chunks=chunks)

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
        if not self._loaded:  # DCP handed this reader metadata it read elsewhere
            self.read_metadata()

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def read_data(self, plan, planner):
        """Reads every ReadItem's box (verified chunks only) and hands it to the planner."""
        boxes, done = [], []
        for req in plan.items:
            if req.type == _planner.LoadItemType.BYTE_IO:
                planner.load_bytes(req, io.BytesIO(self._value_bytes(req.storage_index.fqn)))
                continue
            dest = planner.resolve_tensor(req).detach()
            tmp = self._box_buffer(req, dest)
            if tmp.numel():
                fqn = req.storage_index.fqn
                name = self._boxes.get((fqn, tuple(req.storage_index.offset)))
                offsets = list(req.storage_offsets) if name is not None else [
                    a + b for a, b in zip(req.storage_index.offset, req.storage_offsets)]
                boxes.append((name or fqn, offsets, tmp.data_ptr(), self._dtypes[fqn],
                              list(req.lengths)))
            done.append((req, dest, tmp))
        _core.load_boxes(self._read_path, boxes, self.verify, self.io_threads, self.direct_io)
        devices = set()
        for req, dest, tmp in done:
            if tmp is not dest:
                pinned = dest.is_cuda and tmp.dtype == dest.dtype  # (as _box_buffer pinned it)
                dest.copy_(tmp, non_blocking=pinned)
                if dest.is_cuda:
                    devices.add(dest.device)
        _cuda.settle(devices)
        for req, dest, tmp in done:
            planner.commit_tensor(req, dest)
        fut = Future()
        fut.set_result(None)
        return fut

    def _box_buffer(self, req, dest):
        """`dest` when the box can be read straight into it, else a buffer of the stored dtype."""
        dtype = _dtypes.to_torch_dtype(self._dtypes[req.storage_index.fqn])
        if (dest.device.type == "cpu" and dest.dtype == dtype and dest.is_contiguous()
                and list(dest.shape) == list(req.lengths)):
            return dest
        pin = dest.is_cuda and dest.dtype == dtype  # (a dtype change copies on the host first)
        return torch.empty(tuple(req.lengths), dtype=dtype, pin_memory=pin)

    def _value_bytes(self, name):
        kind, value = self._values[name]
        if name in self._byte_io and kind == "bytes":
            return value  # DCP's own torch.save bytes
        buf = io.BytesIO()
        torch.save(json.loads(value) if kind == "json" else value, buf)
        return buf.getvalue()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return isinstance(checkpoint_id, (str, os.PathLike))
