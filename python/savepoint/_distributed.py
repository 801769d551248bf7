"""savepoint.save / savepoint.load with process_group=: one sharded checkpoint written and read by
every rank of a torch process group (the C++ SaveDistributed / LoadDistributed, docs/DISTRIBUTED.md
"PyTorch distributed").

What each leaf of the state dict becomes:
  - a DTensor (any DeviceMesh; placements Shard(d) and Replicate, uneven shards included): its
    local tensor is this rank's box of the global tensor (torch's own
    compute_local_shape_and_global_offset), and the ranks that hold the same box (the mesh dims
    placed Replicate) are its replica group: the box is written once, by one member. Partial
    placements are refused (reduce first); _StridedShard ones too (their local data is not one box).
  - any other tensor or array: the whole tensor, replicated on every rank of the group (DDP); it
    must be identical on every rank, and is written once, by whichever rank the byte balancing
    picks. With verify_replicas=True (the default) every rank hashes each such tensor (every
    byte, by CRC32C: _replica_digests) before anything is written; ranks holding
    different bytes make the save fail on every rank with InvalidArgumentError naming the
    tensor and which ranks hold which bytes (the classic mistake: each rank's RNG state saved
    as a plain tensor). Mark per-rank state PerRank instead.
  - a non-tensor value (int, float, str, ...) and the metadata: taken from rank 0.
  - PerRank(obj) (obj: any savable subtree: a tensor, an int, a dict of them, ...): each rank's
    own obj, saved under names carrying the rank: the leaf at key path "loader" of group rank r
    becomes entry "loader@rank<r>" (nested leaves "loader@rank<r>.offset", ...). Each rank's
    tensors are written by that rank alone (a box covering the whole tensor, replica group
    itself); its non-tensor values travel to rank 0 with the agreement check and are stored as
    ordinary typed values (int, float (its exact bits), str, bytes, bool: they round-trip
    exactly, and the CLI and C++ API read them as values, not as opaque bytes). Ranks may hold
    different dtypes, shapes or structures inside a PerRank. The recorded structure holds
    {"list": [NODE of rank 0, NODE of rank 1, ...], "per_rank": true} at that position, so
    savepoint.load(path) in one process gives the list of every rank's obj, indexed by rank.
    load(..., process_group=pg, per_rank=...) gives each rank its own (see load).
The checkpoint is an ordinary one: savepoint.load(path) in one process gives whole tensors.

A layer below the entry points savepoint.save / load (_save.py, _load.py) and the sparse saves and
loads (_sparse_io.py), which call it; it imports none of them (what it shares with them is in
_read.py and _write.py).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import struct
import threading
from typing import Any

from . import _core, _cuda, _dtypes, _errors, _keys, _read, _torch_comm, _tree, _write


def _torch():
    import torch
    import torch.distributed as dist

    return torch, dist


def _dtensor_class():
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover (torch without distributed)
        return None
    return DTensor


class PerRank:
    """Marks a part of the state as this rank's own (savepoint.save / load with process_group):
    PerRank(torch.get_rng_state()), PerRank({"epoch": e, "offset": i}), PerRank(counter).

    Each rank's value is saved under names carrying its group rank ("rng@rank3"), written by that
    rank, and given back to the same rank by load(..., process_group=pg) (per_rank= says what
    happens in a job of another world size). Without the marker a plain tensor is taken as
    replicated (and checked to be) and a non-tensor value is rank 0's. In a `like` structure the
    marker may be left out or kept: PerRank(t) and t are both filled with this rank's tensor.
    Only with process_group= (a save without one raises TypeError).
    """

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        if type(value) is PerRank:
            value = value.value
        self.value = value

    def __repr__(self):
        return f"savepoint.PerRank({self.value!r})"


PER_RANK_MODES = ("strict", "modulo", "all")


per_rank_name = _tree.per_rank_name


# ---------------------------------------------------------------------- boxes


class _Group:
    """The process group being saved or loaded by, and its control communicator."""

    def __init__(self, process_group, purpose="sync"):
        torch, dist = _torch()
        self.pg = dist.group.WORLD if process_group is None else process_group
        self.ranks = dist.get_process_group_ranks(self.pg)
        self._group_rank = {g: i for i, g in enumerate(self.ranks)}
        self.control = _torch_comm.control_group(self.pg, purpose)
        self.purpose = purpose

    def comm(self):
        return _torch_comm.TorchCommunicator(self.control)

    def group_rank(self, global_rank, where):
        r = self._group_rank.get(global_rank)
        if r is None:
            raise _errors.InvalidArgumentError(
                f"{where}: its DeviceMesh holds global rank {global_rank}, which is not in the "
                f"process group (ranks {self.ranks})")  # fmt: skip
        return r


def _box(t, group, where):
    """(global_shape, offsets, sizes, replicas) of this rank's part of DTensor `t`, or None when
    this rank is not in its mesh. Replicas are group ranks."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    try:
        from torch.distributed.tensor.placement_types import _StridedShard
    except ImportError:  # pragma: no cover
        _StridedShard = ()
    mesh, placements = t.device_mesh, t.placements
    for p in placements:
        if isinstance(p, _StridedShard):
            raise _errors.UnimplementedError(
                f"{where}: placement {p} (strided sharding) is not supported: its local data is "
                "not one box of the tensor; redistribute to Shard/Replicate first")  # fmt: skip
        if not isinstance(p, (Shard, Replicate)):
            raise _errors.InvalidArgumentError(
                f"{where}: placement {p} cannot be saved or loaded (only Shard and Replicate: "
                "reduce a Partial DTensor first, e.g. dt.redistribute(placements=[Replicate()]))")
    coord = mesh.get_coordinate()
    if coord is None:
        return None
    sizes, offsets = compute_local_shape_and_global_offset(t.shape, mesh, placements)
    index = tuple(slice(None) if isinstance(p, Replicate) else c for p, c in zip(placements, coord))
    members = mesh.mesh[index].flatten().tolist()
    replicas = sorted(group.group_rank(g, where) for g in members)
    return (list(t.shape), list(offsets), list(sizes), replicas)


def _local(t):
    """The local tensor of DTensor `t` itself (not an autograd view): loads write into it."""
    torch, _ = _torch()
    with torch.no_grad():
        return t.to_local()


class _ShardFlattener(_tree.Flattener):
    """The Flattener (savepoint/_tree.py) taking DTensors too: each becomes its local tensor, with
    its box in `boxes`. `signature` lists every tensor leaf as (name, dtype, global shape), also
    those of which this rank holds nothing, to check that the ranks agree."""

    def __init__(self, group):
        super().__init__()
        self.group = group
        self.rank = _torch()[1].get_rank(group.pg)  # (its rank in the group)
        self.boxes = {}
        self.signature = []
        self.per_rank = []  # [(placeholder node, this rank's node)] in the order of the tree
        self.rank_values = []  # this rank's PerRank values: (name, kind, value)
        self.per_rank_names = set()  # this rank's PerRank entry names
        self._inside = None  # the key path of the PerRank being flattened

    def flatten(self, obj):
        self.tree = super().flatten(obj)
        return self.tree

    def _node(self, obj, path):
        if type(obj) is _tree.EveryRank:
            raise _errors.InvalidArgumentError(
                f"savepoint.save: {_tree.describe_path(path)}: EveryRank is for one process; "
                "ranks saving together mark their own part PerRank")  # fmt: skip
        if type(obj) is not PerRank:
            return super()._node(obj, path)
        where = _tree.describe_path(path)
        if self._inside is not None:
            raise _errors.InvalidArgumentError(
                f"savepoint.save: {where}: a PerRank inside the PerRank at "
                f"{_tree.describe_path(self._inside)}")  # fmt: skip
        if not path:
            raise _errors.InvalidArgumentError(
                "savepoint.save: the whole state cannot be PerRank: wrap its per-rank parts "
                "(e.g. {'model': sd, 'rng': savepoint.PerRank(torch.get_rng_state())})")
        self._inside = path
        try:
            own = path[:-1] + (per_rank_name(path[-1], self.rank),)
            values_before = len(self.values)
            node = super()._node(obj.value, own)
            self.rank_values.extend(self.values[values_before:])  # (rank 0 adds everyone's)
            del self.values[values_before:]
        finally:
            self._inside = None
        placeholder = {"list": [], "per_rank": True}  # filled with every rank's node before saving
        self.per_rank.append((placeholder, node))
        return placeholder

    def _name(self, path):
        name = super()._name(path)
        if self._inside is not None:
            self.per_rank_names.add(name)
        return name

    def _per_rank_box(self, name):
        leaf = self.tensors[-1]
        shape = list(leaf.shape)
        self.boxes[name] = (shape, [0] * len(shape), shape, [self.rank])

    def _numpy(self, a, path):
        name = super()._numpy(a, path)
        if self._inside is not None:
            self._per_rank_box(name)
        else:
            self.signature.append((name, self.tensors[-1].dtype, list(a.shape)))
        return name

    def _torch(self, torch, t, path):
        dtensor = _dtensor_class()
        if dtensor is None or not isinstance(t, dtensor):
            node = super()._torch(torch, t, path)
            if self._inside is not None:
                self._per_rank_box(node["torch"])
            else:
                self.signature.append((node["torch"], self.tensors[-1].dtype, list(t.shape)))
            return node
        if self._inside is not None:
            raise _errors.InvalidArgumentError(
                f"savepoint.save: {_tree.describe_path(path)} is a DTensor inside a PerRank: a "
                "DTensor is already one tensor of the whole group; save it without the marker "
                "(or its to_local() inside the PerRank)")  # fmt: skip
        box = _box(t, self.group, _tree.describe_path(path))
        node = super()._torch(torch, _local(t), path)
        name = node["torch"]
        self.signature.append((name, self.tensors[-1].dtype, list(t.shape)))
        node.pop("grad", None)  # (the flags of the DTensor, not of its local tensor)
        node.pop("param", None)
        if t.requires_grad:
            node["grad"] = True
        if isinstance(t, torch.nn.Parameter):
            node["param"] = True
        if box is None or 0 in box[2]:
            self.tensors.pop()  # nothing of it here (an empty box, or not in the mesh)
        else:
            self.boxes[name] = box
        return node


# ---------------------------------------------------------------------- agreement


def _without_devices(node):
    if isinstance(node, dict):
        return {k: _without_devices(v) for k, v in node.items() if k != "device"}
    if isinstance(node, list):
        return [_without_devices(v) for v in node]
    return node


def _describe_difference(signatures):
    by_rank = [{n: (d, s) for n, d, s in sig} for sig in signatures]
    problems = []
    names = sorted(set().union(*by_rank))
    for n in names:
        have = [r for r, m in enumerate(by_rank) if n in m]
        if len(have) != len(by_rank):
            lacking = [r for r in range(len(by_rank)) if r not in have]
            problems.append(f"{n!r} is on ranks {have} but not on ranks {lacking}")
            continue
        kinds = {}
        for r, m in enumerate(by_rank):
            d, s = m[n]
            kinds.setdefault(f"{d} {s}", []).append(r)
        if len(kinds) > 1:
            problems.append(f"{n!r} is " + ", ".join(f"{k} on ranks {v}" for k, v in kinds.items()))
    if not problems:
        problems.append("their structure differs (containers or non-tensor values)")
    more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
    return "; ".join(problems[:5]) + more


# ---------------------------------------------------------------------- save


def save(obj, path, process_group, *, async_, overwrite, metadata, io_threads, chunk_bytes,
         direct_io, create_parents, key, timeout, verify_replicas=True,
         format_version=0):  # fmt: skip
    """savepoint.save(..., process_group=pg): see savepoint.save."""
    group = _Group(process_group, "async" if async_ else "sync")
    job = _SaveJob(group, os.fspath(path), float(timeout), bool(verify_replicas), dict(
        overwrite=overwrite, create_parents=create_parents, chunk_bytes=chunk_bytes,
        io_threads=io_threads, direct_io=direct_io, timeout_s=float(timeout),
        key=_keys.normalize(key, "savepoint.save: key"),
        format_version=int(format_version)))  # fmt: skip
    try:
        flattener = _ShardFlattener(group)
        flattener.cuda_in_place = True  # CUDA shards: copied through pinned memory (snapshot)
        job.flat, job.meta_json = _write.flatten(obj, metadata, flattener)
        job.snapshot(copy_host=async_)
    except Exception as e:  # noqa: BLE001 (told to the other ranks first, then raised)
        job.error = e
    if not async_:
        return job.run()
    return DistributedSaveFuture(job)


class _SaveJob:
    """One rank's part of a distributed save: the agreement check, then SaveDistributed."""

    def __init__(self, group, path, timeout, verify_replicas, options):
        self.group, self.path, self.timeout, self.options = group, path, timeout, options
        self.verify_replicas = verify_replicas
        self.flat = self.meta_json = self.error = None

    def snapshot(self, copy_host):
        """Copies the CUDA tensors into page-locked host memory (_cuda.snapshot_to_pinned: the
        host link's speed, where a pageable copy is tens of times slower) and, with `copy_host`
        (async saves), the host ones too, so that training may change them while the save runs."""
        on_gpu = []
        for leaf in self.flat.tensors:
            if getattr(leaf.owner, "is_cuda", False):
                on_gpu.append(leaf)
            elif not copy_host:
                continue
            elif hasattr(leaf.owner, "__array_interface__"):
                leaf.owner = leaf.owner.copy()
                leaf.address = leaf.owner.__array_interface__["data"][0]
            else:
                leaf.owner = leaf.owner.clone()
                leaf.address = leaf.owner.data_ptr()
        _cuda.snapshot_to_pinned(on_gpu)

    def run(self):
        comm = self.group.comm()
        try:
            self._agree(comm)
            specs = [t.spec() for t in self.flat.tensors]
            return _core.save_distributed(comm, self.path, specs, self.flat.boxes, self.flat.values,
                                          self.meta_json, **self.options)  # fmt: skip
        except _errors.SavepointError:
            if comm.broken:  # the control group's messages may be out of step now
                _torch_comm.forget_control_group(self.group.ranks, self.group.purpose)
            raise

    def _agree(self, comm):
        """Raises on every rank, before anything is written, when a rank failed to flatten its
        state, the ranks' state dicts differ in keys, structure, dtypes or global shapes, or
        (verify_replicas) their replicated plain tensors differ in bytes: one all-gather of two
        digests; the full descriptions travel only when the digests differ. Then, when the state
        has PerRank parts, one all-gather of every rank's PerRank nodes and values, which rank 0
        adds to what it saves."""
        replicas = []
        if self.error is None:
            try:
                tree = json.loads(self.meta_json)[_tree.TREE_KEY]
                mine = json.dumps([self.flat.signature, _without_devices(tree),
                                   self.verify_replicas], sort_keys=True)  # fmt: skip
                if self.verify_replicas:
                    replicas = _replica_digests(self.flat)
            except Exception as e:  # noqa: BLE001 (told to the other ranks first, then raised)
                self.error = e
        if self.error is not None:
            mine = json.dumps({"error": f"{type(self.error).__name__}: {self.error}"})
        contents = hashlib.sha256(json.dumps(replicas).encode()).digest()
        digests = comm.all_gather(hashlib.sha256(mine.encode()).digest() + contents, self.timeout)
        if len({d[:32] for d in digests}) == 1 and self.error is None:
            if len({d[32:] for d in digests}) != 1:
                everyone = comm.all_gather(json.dumps(replicas).encode(), self.timeout)
                raise _errors.InvalidArgumentError(
                    "savepoint.save: nothing was written: "
                    + _describe_replica_difference([json.loads(s) for s in everyone]))  # fmt: skip
            if self.flat.per_rank:
                self._gather_per_rank(comm)
            return
        everyone = [json.loads(s) for s in comm.all_gather(mine.encode(), self.timeout)]
        if self.error is not None:
            raise self.error
        failed = [(r, d["error"]) for r, d in enumerate(everyone) if isinstance(d, dict)]
        if failed:
            raise _errors.InvalidArgumentError(
                "savepoint.save: nothing was written: "
                + "; ".join(f"rank {r} failed: {e}" for r, e in failed))  # fmt: skip
        raise _errors.InvalidArgumentError(
            "savepoint.save: the ranks' state dicts differ (nothing was written): "
            + _describe_difference([d[0] for d in everyone]))  # fmt: skip

    def _gather_per_rank(self, comm):
        """Every rank's PerRank nodes (into the recorded structure) and values (rank 0 saves them),
        checking on every rank that their names clash with no other entry."""
        flat = self.flat
        mine = {"nodes": [node for _, node in flat.per_rank],
                "values": [[n, k, _encode_value(k, v)] for n, k, v in flat.rank_values],
                "names": sorted(flat.per_rank_names)}  # fmt: skip
        everyone = [json.loads(s) for s in comm.all_gather(json.dumps(mine).encode(), self.timeout)]
        taken = {t.name for t in flat.tensors} | {n for n, _, _ in flat.values}
        taken -= flat.per_rank_names
        seen = {}
        for r, theirs in enumerate(everyone):
            for n in theirs["names"]:
                if n in taken or n in seen:
                    other = f"rank {seen[n]}'s PerRank entry" if n in seen else "another entry"
                    raise _errors.InvalidArgumentError(
                        f"savepoint.save: nothing was written: rank {r}'s PerRank entry {n!r} has "
                        f"the name of {other}: rename the key")  # fmt: skip
                seen[n] = r
        for i, (placeholder, _) in enumerate(flat.per_rank):
            placeholder["list"] = [theirs["nodes"][i] for theirs in everyone]
        meta = json.loads(self.meta_json)
        meta[_tree.TREE_KEY] = flat.tree
        self.meta_json = json.dumps(meta, allow_nan=False, ensure_ascii=False)
        if comm.rank == 0:
            flat.values.extend((n, k, _decode_value(k, v)) for theirs in everyone
                               for n, k, v in theirs["values"])  # fmt: skip


def _encode_value(kind, v):
    """A PerRank value as JSON, exactly: floats by their bits, bytes in hex."""
    if kind == "float":
        return struct.pack("<d", v).hex()
    if kind == "bytes":
        return v.hex()
    return v


def _decode_value(kind, v):
    if kind == "float":
        return struct.unpack("<d", bytes.fromhex(v))[0]
    if kind == "bytes":
        return bytes.fromhex(v)
    return v


# ---------------------------------------------------------------------- replica check

_PIECE = 16 << 20  # bytes hashed per task
_MAX_HASH_THREADS = 4


def _leaf_span(leaf):
    """(address, bytes) of a tensor leaf (contiguous CPU memory kept alive by leaf.owner)."""
    o = leaf.owner
    n = o.nbytes if hasattr(o, "__array_interface__") else o.numel() * o.element_size()
    return leaf.address, n


def _replica_digests(flat):
    """[[name, digest hex]] of the plain (replicated) tensors: every byte of each is hashed by
    _core.replica_digest (CRC32C by ISA-L, GIL released; see python/ext/torch_distributed.cc)
    in pieces of _PIECE bytes on up to _MAX_HASH_THREADS
    threads; a tensor's digest is the SHA-256 of its pieces' digests and its length."""
    own = flat.per_rank_names
    leaves = [t for t in flat.tensors if t.name not in flat.boxes and t.name not in own]
    pieces = []  # (leaf index, address, bytes)
    for i, leaf in enumerate(leaves):
        address, n = _leaf_span(leaf)
        pieces.extend((i, address + o, min(_PIECE, n - o)) for o in range(0, n, _PIECE))
    threads = min(_MAX_HASH_THREADS, os.cpu_count() or 1, len(pieces))
    if threads > 1 and sum(n for _, _, n in pieces) > 2 * _PIECE:
        with concurrent.futures.ThreadPoolExecutor(threads, "savepoint-hash") as pool:
            hashed = list(pool.map(lambda p: _core.replica_digest(p[1], p[2]), pieces))
    else:
        hashed = [_core.replica_digest(address, n) for _, address, n in pieces]
    per_leaf = [hashlib.sha256() for _ in leaves]
    for (i, _, _), d in zip(pieces, hashed):
        per_leaf[i].update(d)
    out = []
    for leaf, h in zip(leaves, per_leaf):
        h.update(struct.pack("<Q", _leaf_span(leaf)[1]))
        out.append([leaf.name, h.hexdigest()])
    return out


def _describe_replica_difference(everyone):
    """Which plain tensors differ across ranks, and which ranks hold which bytes."""
    by_rank = [dict(d) for d in everyone]
    problems = []
    for name, _ in everyone[0]:
        groups = {}
        for r, m in enumerate(by_rank):
            groups.setdefault(m.get(name), []).append(r)
        if len(groups) > 1:
            holders = "; ".join(f"ranks {v}" for v in sorted(groups.values()))
            problems.append(f"{name!r} ({len(groups)} different contents: {holders})")
    more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
    return (
        "plain tensors are saved once, as replicated on every rank, but the ranks hold different "
        "bytes for " + ", ".join(problems[:5]) + more + ": wrap per-rank state in "
        "savepoint.PerRank(...) (e.g. torch.get_rng_state()), or make the tensor identical on "
        "every rank (verify_replicas=False skips this check)")  # fmt: skip


_inflight = None  # the last asynchronous distributed save (one runs at a time, in call order)
_inflight_lock = threading.Lock()


class DistributedSaveFuture(_write.Future):
    """An asynchronous distributed save: done(), wait(timeout), result(timeout), exception(),
    path, stats (this rank's, once done), as savepoint.SaveFuture."""

    def __init__(self, job: _SaveJob) -> None:
        global _inflight
        self.path = job.path
        self.stats = None
        self._error = None
        self._done = threading.Event()
        with _inflight_lock:
            previous, _inflight = _inflight, self
        self._thread = threading.Thread(target=self._run, args=(job, previous),
                                        name="savepoint-dist-save", daemon=True)  # fmt: skip
        self._thread.start()

    def _run(self, job, previous):
        try:
            if previous is not None:
                previous._done.wait()
            self.stats = job.run()
        except BaseException as e:  # noqa: BLE001 (handed to the caller by wait())
            self._error = e
        finally:
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        if not self._done.wait(timeout):
            return False
        if self._error is not None:
            raise self._error
        return True


# ---------------------------------------------------------------------- load


def load(path, like, process_group, *, strict, verify, io_threads, direct_io, key, timeout,
         per_rank="strict"):  # fmt: skip
    """savepoint.load(..., like=..., process_group=pg): see savepoint.load."""
    path = os.fspath(path)
    if per_rank not in PER_RANK_MODES:
        raise _errors.InvalidArgumentError(
            f"savepoint.load: per_rank={per_rank!r}: use one of {PER_RANK_MODES}")
    group = _Group(process_group)
    comm = group.comm()
    try:
        info = _read.Info(path, io_threads, direct_io, _read.load_key(key, "savepoint.load: key"))
        own = _pick_per_rank(info, path, comm.rank, comm.size, per_rank)
        targets = _read.like_targets(_without_markers(like))
        if per_rank == "all":  # (a like tensor cannot take every rank's entry: read into new ones)
            for p in [p for p in targets if any(p[: len(q)] == q for q in own)]:
                del targets[p]
        plan = _LoadPlan(path, info, group)
        plan.bind(targets, strict)
        plan.bind_per_rank(own)
        plan.run(verify, io_threads, direct_io)
        error = None
    except Exception as e:  # noqa: BLE001 (told to the other ranks first, then raised)
        error = e
    try:
        _agree_on_outcome(comm, error, float(timeout))
    finally:
        if comm.broken:  # the control group's messages may be out of step now
            _torch_comm.forget_control_group(group.ranks, group.purpose)
    return _tree.rebuild(info.tree, plan.finish, info.values)


def _without_markers(like):
    """`like` with its PerRank markers replaced by what they hold (containers copied, not
    leaves)."""
    if type(like) is PerRank:
        return like.value
    if isinstance(like, dict):
        return {k: _without_markers(v) for k, v in like.items()}
    if type(like) in (list, tuple):
        return [_without_markers(v) for v in like]
    return like


def _pick_per_rank(info, path, rank, world, mode):
    """Rewrites info.tree so that each PerRank node ({"list": [...], "per_rank": true}) is this
    rank's entry (strict, modulo) or the list of all (all); returns the key paths of the PerRank
    parts."""
    found = []

    def pick(p, node):
        if "per_rank" not in node:
            return _tree.DESCEND
        found.append(p)
        saved = len(node["list"])
        if mode == "all":
            return {"list": node["list"]}
        if mode == "strict" and saved != world:
            name = ".".join(str(k) for k in p)
            raise _errors.InvalidArgumentError(
                f"checkpoint {path}: {_tree.describe_path(p)} was saved per rank by "
                f"{saved} ranks ({per_rank_name(name, 0)} .. "
                f"{per_rank_name(name, saved - 1)}) but this job has {world}: pass "
                f"per_rank='modulo' (rank r takes saved rank r % {saved}'s) or "
                f"per_rank='all' (every rank gets the list of all {saved})")  # fmt: skip
        return node["list"][rank % saved]

    info.tree = {**info.tree, "root": _tree.transform(info.tree["root"], pick)}
    return found


def _agree_on_outcome(comm, error, timeout):
    """Every rank raises if one failed (naming it), so no rank goes on training alone."""
    code = 0 if error is None else _core.STATUS_CODES.get(getattr(error, "code", None), 0)
    if error is not None and not code:
        code = _core.STATUS_CODES["invalid argument" if isinstance(error, (ValueError, TypeError))
                                  else "internal"]  # fmt: skip
    mine = json.dumps([code, str(error) if error is not None else ""]).encode()
    for r, report in enumerate(comm.all_gather(mine, timeout)):
        code, message = json.loads(report)
        if code:
            cls = _torch_comm._ERROR_CLASS.get(code, _errors.InternalError)
            raise cls(f"rank {r}: {message}") from (error if r == comm.rank else None)


_STAGED = object()  # _bind_dtensor: the local tensor is filled through pinned buffers


class _LoadPlan:
    """Which like targets receive which boxes, then one LoadDistributed call."""

    def __init__(self, path, info, group):
        self.path, self.info, self.group = path, info, group
        self.by_path = {p: node for p, node in _tree.tensor_leaves(info.tree)}
        self.loaded = {}  # entry name -> the like target
        self.specs, self.boxes, self.fixups = [], {}, []
        self.staged = []  # (name, CUDA tensor, dtype): read through pinned buffers (_cuda.py)

    def bind(self, targets, strict):
        missing = [p for p in targets if p not in self.by_path]
        if missing and strict:
            where = ", ".join(_tree.describe_path(p).replace("obj", "like", 1) for p in missing[:5])
            more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
            raise _errors.NotFoundError(
                f"checkpoint {self.path}: no tensor for {where}{more} (strict=False skips them)")
        for p, target in targets.items():
            if p in self.by_path:
                self._bind(p, target, self.info.tensors[_tree.leaf_name(self.by_path[p])])

    def _bind(self, p, target, entry):
        name = entry[0]
        self.loaded[name] = target
        dtensor = _dtensor_class()
        if dtensor is not None and isinstance(target, dtensor):
            dest, direct = self._bind_dtensor(p, target, entry)
            if dest is None:
                return  # nothing of it on this rank
            into = _local(target)
        else:
            dest, direct = _read.check_like(target, entry, p)
            into = target
        if dest is _STAGED or dest is None:  # a contiguous CUDA tensor (check_like: None)
            self.staged.append((name, into, entry[1]))
            return
        if not direct:
            self.fixups.append((into, dest))
        shape = self.boxes[name][2] if name in self.boxes else list(entry[2])
        self.specs.append(_read.spec(name, dest, entry)[:3] + (list(shape),))

    def bind_per_rank(self, roots):
        """Reads the PerRank tensors under key paths `roots` that no like target took into new
        CPU tensors or arrays: per-rank state is always given back."""
        for p, node in self.by_path.items():
            name = _tree.leaf_name(node)
            if name in self.loaded or not any(p[: len(q)] == q for q in roots):
                continue
            entry = self.info.tensors.get(name)
            if entry is None:
                raise _errors.CorruptCheckpointError(
                    f"checkpoint {self.path}: the recorded structure names tensor {name!r}, "
                    "which is missing")  # fmt: skip
            dest = self.loaded[name] = _read.allocate(node, entry)
            if getattr(dest, "is_cuda", False):  # (saved from a GPU: allocated there)
                self.staged.append((name, dest, entry[1]))
                continue
            self.specs.append(_read.spec(name, dest, entry)[:3] + (list(entry[2]),))

    def _bind_dtensor(self, p, target, entry):
        torch, _ = _torch()
        name, dtype, shape = entry[0], entry[1], list(entry[2])
        where = _tree.describe_path(p).replace("obj", "like", 1)
        got = _dtypes.from_torch_dtype(target.dtype)
        if got != dtype or list(target.shape) != shape:
            raise _errors.InvalidArgumentError(
                f"savepoint.load: {where} is a DTensor of {got} {list(target.shape)} but "
                f"checkpoint tensor {name!r} is {dtype} {shape}")  # fmt: skip
        box = _box(target, self.group, where)
        if box is None or 0 in box[2]:
            return None, False
        self.boxes[name] = box
        local = _local(target)
        if local.device.type == "cpu" and local.is_contiguous():
            return local, True
        if _cuda.is_staged_target(local):
            return _STAGED, False
        return torch.empty(box[2], dtype=target.dtype), False

    def run(self, verify, io_threads, direct_io):
        def read(specs):
            boxes = {s[0]: self.boxes[s[0]] for s in specs if s[0] in self.boxes}
            _core.load_distributed(self.path, specs, boxes, verify=verify,
                                   io_threads=io_threads, direct_io=direct_io,
                                   key=self.info.key)  # fmt: skip

        if self.specs:
            read(self.specs)
        _cuda.load_staged(self.staged, read)  # CUDA targets: batches through pinned buffers
        torch, _ = _torch()
        with torch.no_grad():
            for target, tmp in self.fixups:
                _read.copy_into(target, tmp)

    def finish(self, p, node):
        return self.loaded.get(_tree.leaf_name(node), _tree.MISSING)
