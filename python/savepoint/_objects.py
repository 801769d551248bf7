"""What the framework plug-ins (savepoint.lightning, savepoint.hf, savepoint.accelerate) share.

A framework checkpoint holds more than savepoint's tree can: Lightning's hyper-parameters (an
AttributeDict, a Namespace, a dataclass), a callback's state keyed by tuples, an enum.
`pack(mark, obj)` makes the tree a plug-in saves (docs/FORMAT.md §13):

    {mark: 1, "checkpoint": copy of obj, "objects": bytes or None}

where every leaf of `obj` that savepoint.save cannot store (see _tree.Flattener) is None in the
copy and, with its key path, in the list that torch.save pickled into "objects". `unpack(tree,
mark, weights_only, where)` checks the mark, reads the list back with torch.load and the
caller's `weights_only` (so a plug-in trusts the file exactly as much as the framework's own
torch.load would), checks every path, and puts the objects back. Tensors, arrays and scalars stay
ordinary checkpoint entries (read in parallel, CRC-checked, resharded); only what the framework
itself would have pickled is pickled.

`capture_rng()` / `restore_rng(state, where)`: the Python, NumPy, torch and CUDA generators, as
the Transformers and Accelerate plug-ins save them.
"""

import collections
import io
import random
import warnings

import numpy as np

from . import _dtypes, _errors, _sparse

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


LAYOUT = 1  # the version under a plug-in's mark


def pack(mark, obj):
    """The tree a plug-in saves for `obj` (see the module's text)."""
    taken = []
    plain = _copy(obj, (), taken)
    return {mark: LAYOUT, "checkpoint": plain, "objects": _pickle(taken)}


def unpack(tree, mark, weights_only, where, what="one", writer=None):
    """`obj` back from a loaded tree that pack(mark, obj) made. InvalidArgumentError when the
    tree is not one of `mark` (naming `where`, `what` it should be and its `writer`, default
    `mark`); CorruptCheckpointError when its objects do not fit it."""
    if type(tree) is not dict or tree.get(mark) != LAYOUT or "checkpoint" not in tree:
        writer = writer or mark
        raise _errors.InvalidArgumentError(
            f"{writer}: {where} is a savepoint checkpoint but not {what} written by {writer} "
            f"(load it with savepoint.load)")
    blob = tree.get("objects")
    if blob is not None and type(blob) is not bytes:
        raise _errors.CorruptCheckpointError(f"{where}: its pickled objects are not bytes")
    return _join(tree["checkpoint"], _unpickle(blob, weights_only, where), where)


def capture_rng():
    """{"python", "numpy", "torch"[, "cuda"]}: the generators' states now."""
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}  # fmt: skip
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state, where):
    """Sets the generators from capture_rng()'s state as loaded. CUDA states of another device
    count than this process sees are not restored (a warning says so)."""
    import torch

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))  # (tuples come back as tuples)
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        if len(state["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(state["cuda"])
        else:
            warnings.warn(f"{where} holds the CUDA RNG states of {len(state['cuda'])} devices, "
                          f"this process sees {torch.cuda.device_count()}: not restored",
                          stacklevel=3)  # fmt: skip


def _join(tree, objects, where):
    """Puts each (path, leaf) of `objects` back into `tree` (modified in place; returned)."""
    for path, leaf in objects:
        if not path:
            return leaf
        try:
            node = tree
            for k in path[:-1]:
                node = node[k]
            if type(node) not in (dict, collections.OrderedDict, list):
                raise TypeError("not a container")
            if node[path[-1]] is not None:
                raise TypeError("not a place left for an object")
        except (KeyError, IndexError, TypeError):
            raise _errors.CorruptCheckpointError(
                f"{where}: its pickled objects name {list(path)!r}, which is not a place "
                f"left for an object in the checkpoint") from None
        node[path[-1]] = leaf
    return tree


def _pickle(objects):
    """torch.save of the (path, leaf) list, as bytes (None when there is nothing)."""
    if not objects:
        return None
    import torch

    buf = io.BytesIO()
    torch.save(list(objects), buf)
    return buf.getvalue()


def _unpickle(blob, weights_only, where):
    """The list _pickle wrote; torch.load with `weights_only` (None: torch's default)."""
    if blob is None:
        return []
    import torch

    objects = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=weights_only)
    if type(objects) is not list or not all(
            type(e) in (list, tuple) and len(e) == 2 and type(e[0]) in (list, tuple)
            for e in objects):  # fmt: skip
        raise _errors.CorruptCheckpointError(
            f"{where}: its pickled objects are not a list of (key path, object) pairs")
    return [(tuple(p), leaf) for p, leaf in objects]


def _copy(obj, path, taken):
    t = type(obj)
    if t is dict or t is collections.OrderedDict:
        if not all(_plain_key(k) for k in obj):
            taken.append((path, obj))
            return None
        out = t((k, _copy(v, path + (k,), taken)) for k, v in obj.items())
        if t is collections.OrderedDict and hasattr(obj, "_metadata"):
            out._metadata = obj._metadata
        return out
    if t is list:
        return [_copy(v, path + (i,), taken) for i, v in enumerate(obj)]
    if t is tuple:
        # A tuple holding an object is taken whole: join() cannot assign into a tuple.
        inner = []
        items = [_copy(v, path + (i,), inner) for i, v in enumerate(obj)]
        if inner:
            taken.append((path, obj))
            return None
        return tuple(items)
    if _savable_leaf(obj):
        return obj
    taken.append((path, obj))
    return None


def _plain_key(k):
    return type(k) is str or (type(k) is int and _INT64_MIN <= k <= _INT64_MAX)


def _savable_leaf(obj):
    """Whether _tree.Flattener stores `obj` as a leaf (same rules, without touching data)."""
    t = type(obj)
    if obj is None or t in (bool, int, float, bytes):
        return True
    if t is str:
        try:
            obj.encode("utf-8")
            return True
        except UnicodeEncodeError:
            return False
    if t is np.ndarray or isinstance(obj, np.generic):
        dtype = np.asarray(obj).dtype
        return not dtype.hasobject and _dtypes.from_numpy_dtype(dtype) is not None
    torch = _dtypes.torch_module()
    if torch is not None and isinstance(obj, torch.Tensor):
        return (type(obj) in (torch.Tensor, torch.nn.Parameter) and obj.layout == torch.strided
                and not obj.is_quantized and obj.device.type != "meta"
                and _dtypes.from_torch_dtype(obj.dtype) is not None)  # fmt: skip
    return _sparse.as_table(obj) is not None
