"""Flattening nested Python objects into checkpoint entries, and rebuilding them.

A saved object is a tree of containers (dict, OrderedDict, list, tuple) whose leaves are torch
tensors, numpy arrays, numpy scalars and Python scalars (bool, int, float, str, bytes, None).
Each tensor-like leaf becomes one tensor entry and each scalar one value entry of the checkpoint,
named by its key path joined with "." ("model.layer1.weight", "optimizer.state.0.exp_avg"), so
the C++ API and the CLI see ordinary hierarchical names. The shape of the tree, the exact keys and
where each leaf came from are recorded as JSON in the checkpoint's metadata under the key
"savepoint.python" (see ENCODING below), so load() rebuilds exactly the saved structure.

ENCODING (version 1). metadata["savepoint.python"] = {"version": 1, "root": NODE}, where NODE is
one of
    {"dict": [[KEY, NODE], ...]}             a dict, items in order
    {"odict": [[KEY, NODE], ...], "meta": J} an OrderedDict; "meta" (optional) is the JSON of its
                                             `_metadata` attribute (torch state_dict versions)
    {"list": [NODE, ...]} / {"tuple": [NODE, ...]}
    {"torch": NAME, ...}                     a torch tensor stored as tensor entry NAME; optional
                                             "device" (when not "cpu"), "grad": true
                                             (requires_grad), "param": true (nn.Parameter)
    {"numpy": NAME}                          a numpy array (tensor entry NAME)
    {"npscalar": NAME}                       a numpy scalar (0-d tensor entry NAME)
    {"value": NAME}                          a Python bool/int/float/str/bytes (value entry NAME)
    {"bigint": NAME}                         a Python int outside int64 (string value, decimal)
    {"none": null}                           None
    {"sparse": NAME, "pt": true}             a savepoint.SparseTable (or an object with
                                             __savepoint_table__) stored as sparse table NAME;
                                             "device" when its torch ids were not on the CPU
                                             (docs/FORMAT.md §11); "pt" (optional): its ids were
                                             a torch tensor
and KEY is a JSON string (a str key) or {"int": N} (an int key, e.g. optimizer state ids).
Names are unique: a path whose joined name is taken (keys containing ".") gets "~N" appended;
control characters in keys are escaped in the name (never in the recorded key).
"""

import collections
import math
import re

import numpy as np

from . import _dtypes, _errors, _sparse

TREE_KEY = "savepoint.python"
TREE_VERSION = 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_MAX_NAME_BYTES = 4096
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # control characters, escaped in entry names


def describe_path(path):
    """'obj["model"]["w"][0]' for error messages."""
    return "obj" + "".join(f"[{k!r}]" for k in path)


def unsupported(path, what, hint=""):
    msg = f"savepoint.save: cannot save {what} at {describe_path(path)}"
    return TypeError(msg + (f": {hint}" if hint else ""))


def per_rank_name(base, rank):
    """The entry name of rank `rank`'s leaf at key path name `base`: "<base>@rank<rank>"."""
    return f"{base}@rank{rank}"


class EveryRank:
    """Every rank's value of a per-rank part, held by one process (rank r's is values[r]): a
    single-process save stores it as a distributed save stores savepoint.PerRank(value) of each
    rank (entries "<key>@rank<r>", one node per rank), so that load(..., process_group=) gives
    each rank its own. For imports of checkpoints that several workers wrote
    (savepoint.recis.import_checkpoint); a distributed save refuses it."""

    __slots__ = ("values",)

    def __init__(self, values):
        self.values = list(values)


class TensorLeaf:
    """A tensor to save: borrowed memory at `address`, kept alive by `owner` during the save."""

    __slots__ = ("name", "address", "dtype", "shape", "owner")

    def __init__(self, name, address, dtype, shape, owner):
        self.name, self.address, self.dtype, self.shape, self.owner = (
            name, address, dtype, shape, owner)  # fmt: skip

    def spec(self):
        return (self.name, self.address, self.dtype, list(self.shape))


class Flattener:
    """Walks an object; collects tensor leaves, value entries and the tree JSON. Sparse tables
    are collected only where the caller saves them (allow_tables; else TypeError), so that no
    other writer drops them silently."""

    allow_tables = False
    # CUDA tensors are passed by device address (the checkpointer has a CUDA snapshot copier);
    # else they are first copied to host memory. cuda_devices collects the devices they are on.
    cuda_in_place = False

    def __init__(self):
        self.cuda_devices = set()  # torch.device of the CUDA tensors passed in place
        self.tensors = []  # TensorLeaf
        self.values = []  # (name, kind, value)
        self.tables = []  # (name, savepoint.SparseTable)
        self._names = set()

    def flatten(self, obj):
        return {"version": TREE_VERSION, "root": self._node(obj, ())}

    def _node(self, obj, path):
        t = type(obj)
        if t is dict or t is collections.OrderedDict:
            return self._mapping(obj, path)
        if t is list or t is tuple:
            items = [self._node(v, path + (i,)) for i, v in enumerate(obj)]
            return {"list" if t is list else "tuple": items}
        if obj is None:
            return {"none": None}
        if t in (bool, int, float, str, bytes):
            return self._scalar(obj, path)
        if t is np.ndarray:
            return {"numpy": self._numpy(obj, path)}
        if isinstance(obj, np.generic):
            return {"npscalar": self._numpy(np.asarray(obj), path)}
        torch = _dtypes.torch_module()
        if torch is not None and isinstance(obj, torch.Tensor):
            return self._torch(torch, obj, path)
        table = _sparse.as_table(obj)
        if table is not None:
            return self._table(table, path)
        if t is EveryRank:
            return self._every_rank(obj, path)
        raise unsupported(
            path, f"an object of type {t.__module__}.{t.__qualname__}",
            "only dict, OrderedDict, list, tuple, torch.Tensor, numpy arrays and scalars, bool, "
            "int, float, str, bytes and None can be saved")  # fmt: skip

    def _every_rank(self, obj, path):
        if not path or getattr(self, "_every", False) or not obj.values:
            raise unsupported(path, "an EveryRank at the root, inside another or of no rank",
                              "wrap the per-rank part of at least one rank at its key")  # fmt: skip
        self._every = True
        try:
            nodes = [self._node(v, path[:-1] + (per_rank_name(path[-1], r),))
                     for r, v in enumerate(obj.values)]  # fmt: skip
        finally:
            self._every = False
        return {"list": nodes, "per_rank": True}

    def _mapping(self, obj, path):
        items = []
        for k, v in obj.items():
            if type(k) is str:
                key = k
            elif type(k) is int and _INT64_MIN <= k <= _INT64_MAX:
                key = {"int": k}
            else:
                raise unsupported(path, f"a dict key of type {type(k).__name__} ({k!r})",
                                  "keys must be str or int")  # fmt: skip
            items.append([key, self._node(v, path + (k,))])
        if type(obj) is dict:
            return {"dict": items}
        node = {"odict": items}
        meta = getattr(obj, "_metadata", None)
        if meta is not None:
            node["meta"] = _plain_json(meta, path + ("_metadata",))
        return node

    def _scalar(self, obj, path):
        name = self._name(path)
        if type(obj) is int and not _INT64_MIN <= obj <= _INT64_MAX:
            self.values.append((name, "string", str(obj)))
            return {"bigint": name}
        if type(obj) is str:
            _check_unicode(obj, path)
        kind = {bool: "bool", int: "int", float: "float", str: "string", bytes: "bytes"}[type(obj)]
        self.values.append((name, kind, obj))
        return {"value": name}

    def _numpy(self, a, path):
        if a.dtype.hasobject:
            raise unsupported(path, "a numpy array of Python objects (dtype=object)")
        dtype = _dtypes.from_numpy_dtype(a.dtype)
        if dtype is None:
            hint = "supported: bool, (u)int8-64, float16/32/64, complex64/128, ml_dtypes bfloat16/float8"
            if not a.dtype.isnative:
                hint = "convert to native byte order first: a.astype(a.dtype.newbyteorder('='))"
            raise unsupported(path, f"a numpy array of dtype {a.dtype}", hint)
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)  # documented copy
        name = self._name(path)
        self.tensors.append(TensorLeaf(name, a.__array_interface__["data"][0], dtype, a.shape, a))
        return name

    def _torch(self, torch, t, path):
        if type(t) not in (torch.Tensor, torch.nn.Parameter):
            raise unsupported(path, f"a tensor subclass {type(t).__qualname__}",
                              "save a plain tensor (e.g. DTensor.full_tensor())")  # fmt: skip
        if t.layout != torch.strided or t.is_quantized:
            raise unsupported(path, f"a {t.layout} / quantized tensor", "only dense tensors")
        if t.device.type == "meta":
            raise unsupported(path, "a tensor on the meta device", "it has no data")
        dtype = _dtypes.from_torch_dtype(t.dtype)
        if dtype is None:
            raise unsupported(path, f"a tensor of dtype {t.dtype}")
        src = t.detach()
        if src.is_conj():
            src = src.resolve_conj()
        if src.is_neg():
            src = src.resolve_neg()
        if src.device.type == "cuda" and self.cuda_in_place:
            self.cuda_devices.add(src.device)
        elif src.device.type != "cpu":
            src = src.to("cpu")  # documented copy to host
        if not src.is_contiguous():
            src = src.contiguous()  # documented copy (on the tensor's device)
        name = self._name(path)
        self.tensors.append(TensorLeaf(name, src.data_ptr(), dtype, tuple(src.shape), src))
        node = {"torch": name}
        if t.device.type != "cpu":
            node["device"] = str(t.device)
        if t.requires_grad:
            node["grad"] = True
        if type(t) is torch.nn.Parameter:
            node["param"] = True
        return node

    def _table(self, table, path):
        if not self.allow_tables:
            raise unsupported(path, "a savepoint.SparseTable",
                              "sparse tables are saved by savepoint.save, AsyncCheckpointer and "
                              "CheckpointManager in the native format (not to other formats)")
        if getattr(self, "_inside", None) is not None:  # (a PerRank of a distributed save)
            raise unsupported(path, "a SparseTable inside a savepoint.PerRank",
                              "each rank passes the rows it owns of one table: save it plainly")
        name = self._name(path)
        self.tables.append((name, table))
        node = {"sparse": name}
        if _sparse._kind(table.ids) == "pt":
            node["pt"] = True
            if table.ids.device.type != "cpu":
                node["device"] = str(table.ids.device)  # (loaded back there)
        return node

    def _name(self, path):
        parts = []
        for k in path:
            s = str(k)
            if _CONTROL.search(s):
                s = s.encode("unicode_escape").decode("ascii")
            parts.append(s)
        base = ".".join(parts) if parts else "_"
        if len(base.encode("utf-8", "surrogatepass")) > _MAX_NAME_BYTES - 16:
            base = base[: (_MAX_NAME_BYTES - 16) // 4]
        name, n = base, 0
        while name in self._names:
            n += 1
            name = f"{base}~{n}"
        self._names.add(name)
        return name


def _check_unicode(s, path):
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise unsupported(path, "a str that is not valid Unicode", str(e)) from None


def _plain_json(obj, path):
    """A JSON-able copy of plain data (dicts with str keys, lists, scalars), else TypeError."""
    if obj is None or type(obj) in (bool, int, str):
        return obj
    if type(obj) is float and math.isfinite(obj):
        return obj
    if isinstance(obj, dict) and all(type(k) is str for k in obj):
        return {k: _plain_json(v, path + (k,)) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return [_plain_json(v, path + (i,)) for i, v in enumerate(obj)]
    raise unsupported(path, f"metadata of type {type(obj).__name__}")


# ----------------------------------------------------------------------------- walking
#
# The one walker of recorded trees (walk, transform) and of live objects (object_leaves): the
# loaders, the registry and the distributed code all go through these.

_CONTAINERS = ("dict", "odict", "list", "tuple")
_TENSOR_KINDS = ("torch", "numpy", "npscalar")
_ENTRY_KINDS = _TENSOR_KINDS + ("value", "bigint")


def container_kind(node):
    """"dict", "odict", "list" or "tuple" for a container node; None for a leaf."""
    for kind in _CONTAINERS:
        if kind in node:
            return kind
    return None


def children(node):
    """[(key, child)] of a container node: decoded keys of a dict / odict, indices of a list /
    tuple."""
    kind = container_kind(node)
    if kind in ("dict", "odict"):
        return [(decode_key(k), child) for k, child in node[kind]]
    return list(enumerate(node[kind]))


def walk(node, path=()):
    """Yields (key path, node) of every leaf node below recorded node `node`, in order."""
    if container_kind(node) is None:
        yield path, node
        return
    for k, child in children(node):
        yield from walk(child, path + (k,))


class _Descend:
    def __repr__(self):
        return "DESCEND"


DESCEND = _Descend()


def transform(node, fn, path=()):
    """A copy of recorded node `node`: fn(path, node) is called on every node, top down, and
    returns its replacement, or DESCEND (a container is then rebuilt from its children, its other
    keys kept; a leaf is kept). A child replaced by None is left out of a dict and becomes a None
    leaf in a list or tuple."""
    out = fn(path, node)
    if out is not DESCEND:
        return out
    kind = container_kind(node)
    if kind is None:
        return node
    if kind in ("dict", "odict"):
        items = [[k, transform(child, fn, path + (decode_key(k),))] for k, child in node[kind]]
        items = [kv for kv in items if kv[1] is not None]
    else:
        items = [transform(child, fn, path + (i,)) for i, child in enumerate(node[kind])]
        items = [{"none": None} if c is None else c for c in items]
    return {**node, kind: items}


def object_leaves(obj, path=()):
    """Yields (key path, leaf) of every leaf of a live object: what its dicts (any dict type),
    lists and tuples hold, in order (savepoint.save's key paths)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from object_leaves(v, path + (k,))
    elif type(obj) in (list, tuple):
        for i, v in enumerate(obj):
            yield from object_leaves(v, path + (i,))
    else:
        yield path, obj


def contains_table(obj):
    """Whether a state (nested dicts / lists / tuples) holds a sparse table anywhere."""
    return any(_sparse.is_table(leaf) for _, leaf in object_leaves(obj))


def is_tensor_leaf(node):
    return any(kind in node for kind in _TENSOR_KINDS)


def tensor_leaves(tree):
    """[(path, node)] of every tensor-like leaf of a recorded tree, in order."""
    return [(p, node) for p, node in walk(tree["root"]) if is_tensor_leaf(node)]


def leaf_name(node):
    """The tensor entry name of a tensor leaf (KeyError for any other node)."""
    for kind in _TENSOR_KINDS:
        if kind in node:
            return node[kind]
    raise KeyError("not a tensor leaf")


def entry_name(node):
    """The entry name of a tensor or value leaf; None for any other node."""
    for kind in _ENTRY_KINDS:
        if kind in node:
            return node[kind]
    return None


def decode_key(key):
    if isinstance(key, str):
        return key
    if isinstance(key, dict) and "int" in key:
        return int(key["int"])
    raise _errors.CorruptCheckpointError(
        f"savepoint.load: bad key {key!r} in the recorded structure")


# ----------------------------------------------------------------------------- rebuilding


def rebuild(tree, tensor_of, values):
    """The saved object: tensor leaves from tensor_of(path, node) (which returns MISSING for an
    unselected tensor), scalars from `values` ({name: python value})."""

    def build(node, path):
        kind = container_kind(node)
        if kind in ("dict", "odict"):
            out = {} if kind == "dict" else collections.OrderedDict()
            for k, child in children(node):
                v = build(child, path + (k,))
                if v is not MISSING:
                    out[k] = v
            if "meta" in node:
                out._metadata = _meta_from_json(node["meta"])
            return out
        if kind is not None:
            items = [build(c, path + (i,)) for i, c in children(node)]
            items = [None if v is MISSING else v for v in items]
            return items if kind == "list" else tuple(items)
        if "none" in node:
            return None
        if "value" in node:
            return values[node["value"]]
        if "bigint" in node:
            return int(values[node["bigint"]])
        return tensor_of(path, node)

    return build(tree["root"], ())


def _meta_from_json(j):
    # torch's state_dict _metadata is an OrderedDict of dicts.
    if isinstance(j, dict):
        return collections.OrderedDict((k, _meta_from_json(v)) for k, v in j.items())
    return j


class _Missing:
    def __repr__(self):
        return "MISSING"


MISSING = _Missing()
