"""Framework checkpoints hold more than savepoint's tree can: Lightning's hyper-parameters (an
AttributeDict, a Namespace, a dataclass), a callback's state keyed by tuples, an enum. The
framework plug-ins (savepoint.lightning, savepoint.hf) split such a checkpoint in two:

- `split(obj)` returns a copy of its containers in which every leaf that savepoint.save cannot
  store (see _tree.Flattener) is replaced by None, and the list of (key path, object) it took out;
- `pickle_objects` serialises that list with torch.save into one bytes leaf, and
  `unpickle_objects` reads it back with torch.load and the caller's `weights_only` (so the plug-in
  trusts the file exactly as much as the framework's own torch.load would);
- `join(tree, objects)` puts the objects back at their paths.

Tensors, arrays and scalars stay ordinary checkpoint entries (read in parallel, CRC-checked,
resharded); only what the framework itself would have pickled is pickled.
"""

import collections
import io

import numpy as np

from . import _dtypes, _errors, _sparse

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def split(obj):
    """(copy of `obj` with unsavable leaves replaced by None, [(path tuple, leaf), ...])."""
    taken = []
    return _copy(obj, (), taken), taken


def join(tree, objects):
    """Puts each (path, leaf) of `objects` back into `tree` (modified in place; returned)."""
    for path, leaf in objects:
        if not path:
            return leaf
        node = tree
        for k in path[:-1]:
            node = node[k]
        if type(node) is tuple:  # (tuples are rebuilt: their parents hold the new one)
            raise _errors.CorruptCheckpointError(
                f"savepoint: the pickled objects name a place inside a tuple: {path!r}")
        node[path[-1]] = leaf
    return tree


def pickle_objects(objects):
    """torch.save of the (path, leaf) list, as bytes (None when there is nothing)."""
    if not objects:
        return None
    import torch

    buf = io.BytesIO()
    torch.save(list(objects), buf)
    return buf.getvalue()


def unpickle_objects(blob, weights_only):
    """The list pickle_objects wrote; torch.load with `weights_only` (None: torch's default)."""
    if blob is None:
        return []
    import torch

    objects = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=weights_only)
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
