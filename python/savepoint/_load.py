"""savepoint.load, plus info / verify / list_checkpoints."""

import json
import os
import sys

import numpy as np

from . import _core, _cuda, _dtypes, _errors, _keys, _sparse_io, _tree

# Tensors at least this large are allocated 4 KiB-aligned so O_DIRECT reads land in them directly.
_ALIGN = 4096
_ALIGN_MIN_BYTES = 1 << 20


def _load_key(key, what):
    """`key` normalised (_keys.normalize) for the several core calls of one load: a provider is
    called at most once per load (its result is reused by the later calls)."""
    key = _keys.normalize(key, what)
    if not callable(key):
        return key
    got = []

    def once():
        if not got:
            got.append(key())
        return got[0]

    return once


class _Info:
    """The manifest side of a checkpoint: tensors, values, metadata, recorded structure. With
    `key` (an encrypted checkpoint's), the manifest is authenticated first."""

    def __init__(self, path, io_threads, direct_io, key=None):
        self.key = key
        self.reader = _core.Reader.open(path, io_threads=io_threads, direct_io=direct_io, key=key)
        self.tensors = {t[0]: t for t in self.reader.tensors()}  # name -> (name, dtype, shape, nbytes, shards)
        self.values = {n: json.loads(v) if k == "json" else v for n, k, v in self.reader.values()}
        meta = json.loads(self.reader.metadata_json())
        self.metadata = meta if isinstance(meta, dict) else {}
        self.tree = self.metadata.pop(_tree.TREE_KEY, None)
        self.flat = self.tree is None  # no Python structure: written by the C++ API or the CLI
        if self.tree is not None and self.tree.get("version") != _tree.TREE_VERSION:
            raise _errors.UnimplementedError(
                f"checkpoint {path}: Python structure version {self.tree.get('version')} is not "
                f"supported by this build (it reads version {_tree.TREE_VERSION})")
        if self.tree is None:  # written by the C++ API or the CLI: a flat dict by entry name
            items = [[n, {"numpy": n}] for n in self.tensors] + [[n, {"value": n}] for n in self.values]
            self.tree = {"version": 1, "root": {"dict": sorted(items, key=lambda kv: kv[0])}}


_FRAMEWORKS = {None: None, "pt": "pt", "torch": "pt", "np": "np", "numpy": "np"}


def load(path, *, names=None, mmap=False, map_location=None, like=None, verify=True, io_threads=4,
         direct_io=True, framework=None, key=None, strict=True, process_group=None,
         timeout=600.0, per_rank="strict", tables=None, slots=None, shard_id=0,
         shard_num=1):  # fmt: skip
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
        match, else ValueError) and returned in the result. Contiguous CPU ones receive the bytes
        directly; others are filled by a copy. A tensor in `like` missing from the checkpoint
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
        key = _load_key(key, "savepoint.load: key")  # (a provider is called once)
    if process_group is not None and (like is None or sparse_args or _has_tables(path, key)):
        if names is not None or mmap or map_location is not None:
            raise ValueError("savepoint.load: a load of sparse tables with process_group takes "
                             "none of names, mmap, map_location")  # fmt: skip
        if (shard_id, shard_num) != (0, 1):
            raise ValueError("savepoint.load: pass process_group or shard_id/shard_num")
        return _sparse_io.load_distributed(path, process_group, framework=framework,
                                           tables=tables, slots=slots, verify=verify,
                                           io_threads=io_threads, direct_io=direct_io, key=key,
                                           timeout=timeout, per_rank=per_rank, like=like,
                                           strict=strict)  # fmt: skip
    if process_group is not None:
        from . import _distributed

        if like is None or names is not None or mmap or map_location is not None or framework:
            raise ValueError("savepoint.load: with process_group, pass like= and none of names, "
                             "mmap, map_location, framework")  # fmt: skip
        return _distributed.load(path, like, process_group, strict=strict, verify=verify,
                                 io_threads=io_threads, direct_io=direct_io, key=key,
                                 timeout=timeout, per_rank=per_rank)  # fmt: skip
    if framework not in _FRAMEWORKS:
        raise ValueError(f"savepoint.load: framework={framework!r}: use None, 'pt' or 'np'")
    path = os.fspath(path)
    info = _Info(path, io_threads, direct_io, _load_key(key, "savepoint.load: key"))
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
    info.tree = _for_framework(info, _FRAMEWORKS[framework])
    leaves = _tree.tensor_leaves(info.tree)
    plan = _Plan(path, info, _like_targets(like), mmap, map_location)
    selected = _select(info, leaves, names, path)
    for p, node in leaves:
        if _tree.leaf_name(node) in selected:
            plan.add(p, node)
    if strict:
        plan.check_like_covered({p for p, _ in leaves})
    plan.run(verify, io_threads, direct_io)
    finish = _finisher(plan.loaded, selected, map_location, plan.like_names)
    return _tree.rebuild(info.tree, finish, info.values)


def _has_tables(path, key):
    """Whether the checkpoint at `path` holds sparse tables; False when it cannot be opened (the
    load then reports that on every rank)."""
    try:
        return _sparse_io.has_tables(_Info(os.fspath(path), 1, False, key))
    except Exception:  # noqa: BLE001 (reported by the load itself)
        return False


def _for_framework(info, framework):
    """info.tree with its tensor leaves rewritten to the kind `framework` asks for ("pt", "np" or
    None: as saved, falling back to the other kind where the saved one cannot be had)."""
    if framework == "pt" and _dtypes.torch_module() is None:
        raise ImportError("savepoint.load: framework='pt' needs torch (pip install torch)")

    def leaf(node):
        name = _tree.leaf_name(node)
        if framework == "pt":
            return node if "torch" in node else {"torch": name}
        if framework == "np":
            return node if "torch" not in node else {"numpy": name}
        if "torch" in node:  # as saved, unless torch is missing
            return node if _dtypes.torch_module() is not None else {"numpy": name}
        dtype = info.tensors[name][1] if name in info.tensors else None
        if not _dtypes.numpy_can_hold(dtype) and _dtypes.torch_module() is not None:
            return {"torch": name}  # bf16 / fp8 without ml_dtypes
        return node

    def walk(node):
        if "dict" in node or "odict" in node:
            kind = "dict" if "dict" in node else "odict"
            out = dict(node)
            out[kind] = [[k, walk(child)] for k, child in node[kind]]
            return out
        if "list" in node or "tuple" in node:
            kind = "list" if "list" in node else "tuple"
            return {kind: [walk(child) for child in node[kind]]}
        if "torch" in node or "numpy" in node or "npscalar" in node:
            return leaf(node)
        return node

    return {**info.tree, "root": walk(info.tree["root"])}


class _Plan:
    """Where each selected tensor goes (a `like` target, a mapping, or a new allocation), then the
    reads: with mmap, the core maps (copy-on-write) and checks the tensors not bound for `like`;
    the rest are read in one parallel load_into pass."""

    def __init__(self, path, info, targets, mmap, map_location=None):
        self.path, self.info, self.targets, self.mmap = path, info, targets, mmap
        self.map_location = map_location
        self.staged = []  # (name, CUDA tensor, entry): read through pinned buffers (_cuda.py)
        self.loaded = {}  # entry name -> tensor or array
        self.like_names = set()  # entries filled into `like` tensors (returned as they are)
        self.fixups = []  # (like target, temporary): targets that cannot take the bytes directly
        self.reads = []  # (name, address, dtype, shape) for load_into
        self.mapped = {}  # entry name -> node: loaded by the core with mmap

    def add(self, p, node):
        name = _tree.leaf_name(node)
        entry = self.info.tensors.get(name)
        if entry is None:
            raise _errors.CorruptCheckpointError(
                f"checkpoint {self.path}: the recorded structure names tensor {name!r}, which is missing")
        target = self.targets.pop(p, None)
        if target is not None:
            dest, direct = _check_like(target, entry, p)
            self.loaded[name] = target
            self.like_names.add(name)
            if dest is None:
                self.staged.append((name, target, entry))
                return
            if not direct:
                self.fixups.append((target, dest))
        elif self.mmap:
            self.mapped[name] = node
            return
        else:
            dest = self.loaded[name] = _allocate(node, entry, self.map_location)
            if getattr(dest, "is_cuda", False):
                self.staged.append((name, dest, entry))
                return
        self.reads.append(_spec(name, dest, entry))

    def check_like_covered(self, leaf_paths):
        missing = [p for p in self.targets if p not in leaf_paths]  # (unselected ones are skipped)
        if missing:
            where = ", ".join(_tree.describe_path(p).replace("obj", "like", 1) for p in missing[:5])
            raise _errors.NotFoundError(f"checkpoint {self.path}: no tensor for {where}")

    def run(self, verify, io_threads, direct_io):
        key = self.info.key
        if self.mapped:
            tensors, _ = _core.load_mapped(self.path, list(self.mapped), verify=verify,
                                           io_threads=io_threads, key=key)  # fmt: skip
            for name, dtype, shape, raw in tensors:
                node = self.mapped.get(name)
                if node is not None:  # (a name with glob characters may select others too)
                    self.loaded[name] = _dtypes.view_bytes(raw, dtype, shape, "torch" in node)
        if self.reads:
            _core.load_into(self.path, self.reads, verify=verify, io_threads=io_threads,
                            direct_io=direct_io, key=key)  # fmt: skip
        _cuda.load_staged(self.path, self.staged, verify=verify, io_threads=io_threads,
                          direct_io=direct_io, key=key)  # fmt: skip
        for target, tmp in self.fixups:
            _copy_into(target, tmp)


def _select(info, leaves, names, path):
    all_names = {_tree.leaf_name(node) for _, node in leaves}
    if names is None:
        return all_names
    if isinstance(names, (str, bytes)):
        names = [names]
    chosen = set()
    for pattern in names:
        hits = {n for n in all_names if _matches(pattern, n)}
        if not hits and not any(_matches(pattern, v) for v in info.values):
            raise _errors.NotFoundError(f"checkpoint {path}: nothing matches {pattern!r}")
        chosen |= hits
    return chosen


def _matches(pattern, name):
    """The one name rule of savepoint (C++ savepoint::MatchesName): exact names, or globs where
    '*' also matches '.', no escapes."""
    return _core.match_name(pattern, name)


def _like_targets(like):
    """{key path: tensor or array} of `like`'s tensor leaves."""
    if like is None:
        return {}
    out = {}
    torch = sys.modules.get("torch")  # a torch tensor in `like` means torch is imported

    def walk(obj, p):
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, p + (k,))
        elif type(obj) in (list, tuple):
            for i, v in enumerate(obj):
                walk(v, p + (i,))
        elif isinstance(obj, np.ndarray) or (torch is not None and isinstance(obj, torch.Tensor)):
            out[p] = obj

    walk(like, ())
    return out


def _check_like(target, entry, p):
    """(destination to read into, whether it is `target` itself); (None, False) for a contiguous
    CUDA tensor, filled through pinned buffers (_cuda.load_staged)."""
    name, dtype, shape, nbytes, _ = entry
    where = _tree.describe_path(p).replace("obj", "like", 1)
    if isinstance(target, np.ndarray):
        got, direct = _dtypes.from_numpy_dtype(target.dtype), target.flags.c_contiguous and target.flags.writeable
        alloc = {"numpy": name}
    else:
        got = _dtypes.from_torch_dtype(target.dtype)
        direct = (target.device.type == "cpu" and target.is_contiguous() and not target.is_conj()
                  and not target.is_neg())  # fmt: skip
        alloc = {"torch": name}
    if got != dtype or tuple(target.shape) != tuple(shape):
        raise ValueError(
            f"savepoint.load: {where} is {got} {list(target.shape)} but checkpoint tensor {name!r} "
            f"is {dtype} {list(shape)}")
    if not direct and _cuda.is_staged_target(target):
        return None, False
    return (target if direct else _allocate(alloc, entry)), direct


def _copy_into(target, tmp):
    if isinstance(target, np.ndarray):
        np.copyto(target, tmp)
    else:
        with _dtypes.torch_module().no_grad():
            target.copy_(tmp if not isinstance(tmp, np.ndarray) else _dtypes.torch_module().from_numpy(tmp))


def _spec(name, dest, entry):
    if isinstance(dest, np.ndarray):
        address = dest.__array_interface__["data"][0]
    else:
        address = dest.data_ptr()
        _bump_version(dest)
    return (name, address, entry[1], list(entry[2]))


def _bump_version(t):
    # The bytes are written behind autograd's back: tell it, so stale saved tensors are detected.
    graph = getattr(_dtypes.torch_module().autograd, "graph", None)
    if graph is not None and hasattr(graph, "increment_version"):
        graph.increment_version(t)


def _allocate(node, entry, map_location=None):
    """A new tensor or array for `entry`: in host memory, or directly on the CUDA device the tensor
    goes to (map_location, else the one it was saved from) when CUDA is available."""
    _, dtype, shape, nbytes, _ = entry
    torch = _dtypes.torch_module() if "torch" in node else None
    if torch is not None:
        tdt = _dtypes.to_torch_dtype(dtype)
        on_device = _on_cuda(torch, map_location if map_location is not None else node.get("device"),
                             tuple(shape), tdt)  # fmt: skip
        if on_device is not None:
            return on_device
        if nbytes < _ALIGN_MIN_BYTES:
            return torch.empty(tuple(shape), dtype=tdt)
        raw = torch.empty(nbytes + _ALIGN, dtype=torch.uint8)
        off = -raw.data_ptr() % _ALIGN
        return raw[off : off + nbytes].view(tdt).view(tuple(shape))
    npdt = _dtypes.to_numpy_dtype(dtype)
    if nbytes < _ALIGN_MIN_BYTES:
        return np.empty(tuple(shape), npdt)
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    off = -raw.__array_interface__["data"][0] % _ALIGN
    return raw[off : off + nbytes].view(npdt).reshape(tuple(shape))


def _on_cuda(torch, device, shape, dtype):
    """An empty tensor on `device` if it is an available CUDA device, else None (the tensor is
    read into host memory; _place then moves it, or reports why it cannot)."""
    if device is None or not torch.cuda.is_available():
        return None
    try:
        if torch.device(device).type != "cuda":
            return None
        return torch.empty(shape, dtype=dtype, device=device)
    except (RuntimeError, AssertionError, TypeError):
        return None


def _finisher(loaded, selected, map_location, like_names):
    def finish(p, node):
        name = _tree.leaf_name(node)
        if name not in selected:
            return _tree.MISSING
        value = loaded[name]
        if name in like_names:
            return value
        if "npscalar" in node:
            return value[()] if isinstance(value, np.ndarray) else value.item()
        if "torch" not in node or isinstance(value, np.ndarray):
            return value
        return _place(value, node, p, map_location)

    return finish


def _place(t, node, p, map_location):
    torch = _dtypes.torch_module()
    device = map_location if map_location is not None else node.get("device")
    if device is not None:
        try:
            t = t.to(device)
        except (RuntimeError, AssertionError) as e:
            raise ValueError(
                f"savepoint.load: cannot place {_tree.describe_path(p)} on device {device!r} ({e}); "
                "pass map_location='cpu' (or another available device)") from None
    if node.get("param"):
        return torch.nn.Parameter(t, requires_grad=bool(node.get("grad")))
    if node.get("grad"):
        t.requires_grad_(True)
    return t


def info(path, *, key=None):
    """What a checkpoint holds without reading tensor data: {"tensors": [{name, dtype, shape,
    nbytes}], "values": {name: value}, "metadata": the user metadata passed to save(),
    "encrypted": bool}. An encrypted checkpoint is listed without its key too, but then nothing
    of it is authenticated; with `key` its manifest is (AuthenticationError when it fails)."""
    i = _Info(os.fspath(path), 1, True, _load_key(key, "savepoint.info: key"))
    tensors = [{"name": n, "dtype": d, "shape": list(s), "nbytes": b} for n, d, s, b, _ in i.tensors.values()]
    return {"tensors": tensors, "values": dict(i.values), "metadata": i.metadata,
            "encrypted": i.reader.encrypted}  # fmt: skip


def verify(path, *, io_threads=4, direct_io=True, key=None):
    """Re-reads every chunk and checks its CRC32C (and, for an encrypted checkpoint, which needs
    `key`, authenticates it); raises CorruptCheckpointError on a mismatch, AuthenticationError
    on a wrong key or a modified chunk. Returns a dict of statistics."""
    return _core.verify(os.fspath(path), io_threads=io_threads, direct_io=direct_io,
                        key=_keys.normalize(key, "savepoint.verify: key"))  # fmt: skip


def list_checkpoints(root):
    """Checkpoint directories under `root`: list of dicts (name, path, committed, problem, step,
    bytes, created_ns, num_tensors), oldest first. Debris of crashed saves has committed=False."""
    return _core.list_checkpoints(os.fspath(root))
