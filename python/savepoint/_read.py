"""Reading a checkpoint: its manifest (Info) and its tensors (Plan), the machinery under
savepoint.load that the registry, the distributed and the sparse loads share.

A layer below the entry points (_load.py, _distributed.py, _sparse_io.py, _registry.py): it
imports none of them.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from . import _core, _cuda, _dtypes, _errors, _keys, _tree

# Tensors at least this large are allocated 4 KiB-aligned so O_DIRECT reads land in them directly.
_ALIGN = 4096
_ALIGN_MIN_BYTES = 1 << 20

# savepoint.load's framework= spellings -> "pt", "np" or None (as saved).
FRAMEWORKS = {None: None, "pt": "pt", "torch": "pt", "np": "np", "numpy": "np"}


def load_key(key, what):
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


class Info:
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


def for_framework(info, framework):
    """info.tree with its tensor leaves rewritten to the kind `framework` asks for ("pt", "np" or
    None: as saved, falling back to the other kind where the saved one cannot be had)."""
    if framework == "pt" and _dtypes.torch_module() is None:
        raise ImportError("savepoint.load: framework='pt' needs torch (pip install torch)")

    def leaf(_, node):
        if not _tree.is_tensor_leaf(node):
            return _tree.DESCEND
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

    return {**info.tree, "root": _tree.transform(info.tree["root"], leaf)}


class Plan:
    """Where each selected tensor goes (a `like` target, a mapping, or a new allocation), then the
    reads: with mmap, the core maps (copy-on-write) and checks the tensors not bound for `like`;
    the rest are read in one parallel load_into pass."""

    def __init__(self, path, info, targets, mmap, map_location=None):
        self.path, self.info, self.targets, self.mmap = path, info, targets, mmap
        self.map_location = map_location
        self.staged = []  # (name, CUDA tensor, dtype): read through pinned buffers (_cuda.py)
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
            dest, direct = check_like(target, entry, p)
            self.loaded[name] = target
            self.like_names.add(name)
            if dest is None:
                self.staged.append((name, target, entry[1]))
                return
            if not direct:
                self.fixups.append((target, dest))
        elif self.mmap:
            self.mapped[name] = node
            return
        else:
            dest = self.loaded[name] = allocate(node, entry, self.map_location)
            if getattr(dest, "is_cuda", False):
                self.staged.append((name, dest, entry[1]))
                return
        self.reads.append(spec(name, dest, entry))

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
        _cuda.load_staged(self.staged, lambda specs: _core.load_into(
            self.path, specs, verify=verify, io_threads=io_threads, direct_io=direct_io, key=key))
        for target, tmp in self.fixups:
            copy_into(target, tmp)


def select(info, leaves, names, path):
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


def like_targets(like):
    """{key path: tensor or array} of `like`'s tensor leaves."""
    torch = sys.modules.get("torch")  # a torch tensor in `like` means torch is imported
    return {p: obj for p, obj in _tree.object_leaves(like)
            if isinstance(obj, np.ndarray) or (torch is not None and isinstance(obj, torch.Tensor))}


def check_like(target, entry, p):
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
        raise _errors.InvalidArgumentError(
            f"savepoint.load: {where} is {got} {list(target.shape)} but checkpoint tensor {name!r} "
            f"is {dtype} {list(shape)}")
    if not direct and _cuda.is_staged_target(target):
        return None, False
    return (target if direct else allocate(alloc, entry)), direct


def copy_into(target, tmp):
    if isinstance(target, np.ndarray):
        np.copyto(target, tmp)
    else:
        with _dtypes.torch_module().no_grad():
            target.copy_(tmp if not isinstance(tmp, np.ndarray) else _dtypes.torch_module().from_numpy(tmp))


def spec(name, dest, entry):
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


def allocate(node, entry, map_location=None):
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
    read into host memory; place then moves it, or reports why it cannot)."""
    if device is None or not torch.cuda.is_available():
        return None
    try:
        if torch.device(device).type != "cuda":
            return None
        return torch.empty(shape, dtype=dtype, device=device)
    except (RuntimeError, AssertionError, TypeError):
        return None


def finisher(loaded, selected, map_location, like_names):
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
        return place(value, node, p, map_location)

    return finish


def place(t, node, p, map_location):
    torch = _dtypes.torch_module()
    device = map_location if map_location is not None else node.get("device")
    if device is not None:
        try:
            t = t.to(device)
        except (RuntimeError, AssertionError) as e:
            raise _errors.InvalidArgumentError(
                f"savepoint.load: cannot place {_tree.describe_path(p)} on device {device!r} ({e}); "
                "pass map_location='cpu' (or another available device)") from None
    if node.get("param"):
        return torch.nn.Parameter(t, requires_grad=bool(node.get("grad")))
    if node.get("grad"):
        t.requires_grad_(True)
    return t
