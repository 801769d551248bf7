"""Registered objects of a CheckpointManager: gathering their state for a save, and loading a
checkpoint back into them under include/exclude categories, strictness, renames and only-filters.

The checkpoint layout is the C++ manager's (src/manager/registry.cc), so the C++ and Python
managers read each other's registered checkpoints:
  - the object registered as NAME is saved as the entries "NAME.<key path>" (its state_dict()
    flattened with "." like savepoint.save does); an io_state object as
    "NAME.shard-<shard_id>.<key path>";
  - metadata["savepoint.manager"]["objects"][NAME] = {"category": CATEGORY, "num_shards": N}.
A Python-saved checkpoint also records the exact structure (savepoint.save's tree), so an
optimizer's nested state_dict comes back as it was; a C++-saved one (flat entries) is handed to
load_state_dict as a flat dict {key path: value}, nested where the object's current state_dict
has the same key path.

Difference from the C++ registry: C++ matches the checkpoint against the object's current state
(its template) and, when strict, rejects checkpoint entries the template lacks. A Python object's
current state_dict() may legitimately lack entries (a fresh torch optimizer has no moments yet),
so here such entries are handed on to load_state_dict, which judges them (torch modules reject
unexpected keys when strict).
"""

import collections.abc
import copy
import logging
import sys

import numpy as np

from . import _core, _dtypes, _errors, _read, _tree

META_KEY = "savepoint.manager"

# The C++ Category names (savepoint/stateful.h; stable: written into checkpoints).
CATEGORIES = ("dense", "sparse", "extra", "optimizer", "io_state")
# Friendlier spellings accepted wherever a category is.
CATEGORY_ALIASES = {
    "model": "dense",
    "embedding": "sparse",
    "rng": "extra",
    "other": "extra",
    "data": "io_state",
    "dataloader": "io_state",
}

_logger = logging.getLogger("savepoint")


def parse_category(category, what="category"):
    """The C++ name of a category or alias; InvalidArgumentError otherwise."""
    if isinstance(category, str):
        c = CATEGORY_ALIASES.get(category, category)
        if c in CATEGORIES:
            return c
    aliases = ", ".join(f"{a}={c}" for a, c in CATEGORY_ALIASES.items())
    raise _errors.InvalidArgumentError(
        f"unknown {what} {category!r}: use one of {', '.join(CATEGORIES)} (aliases: {aliases})")


def selected_categories(include, exclude):
    """The set of categories chosen by include / exclude (names, aliases or "*")."""
    chosen = set()
    for names, add, what in ((include, True, "include"), (exclude, False, "exclude")):
        if isinstance(names, str):
            names = [names]
        for n in names:
            cats = set(CATEGORIES) if n == "*" else {parse_category(n, f"{what} category")}
            chosen = chosen | cats if add else chosen - cats
    return chosen


class Registered:
    """One registered object: anything with state_dict() / load_state_dict(), or a mutable
    mapping holding the state itself (a dict of counters, RNG states, tensors)."""

    __slots__ = ("name", "obj", "category")

    def __init__(self, name, obj, category):
        self.name, self.obj, self.category = name, obj, category

    @staticmethod
    def check(name, obj):
        if not isinstance(name, str) or not name or "." in name:
            raise _errors.InvalidArgumentError(
                f"register {name!r}: the name must be a non-empty str without '.'")
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
            raise _errors.InvalidArgumentError(
                f"register {name!r}: the name has a control character")
        stateful = callable(getattr(obj, "state_dict", None)) and callable(
            getattr(obj, "load_state_dict", None))
        if not stateful and not isinstance(obj, collections.abc.MutableMapping):
            t = type(obj)
            raise TypeError(
                f"register {name!r}: a {t.__module__}.{t.__qualname__} has no state_dict() and "
                "load_state_dict(), and is not a dict holding the state")

    def state_dict(self):
        if isinstance(self.obj, collections.abc.MutableMapping) and not callable(
                getattr(self.obj, "state_dict", None)):  # fmt: skip
            return dict(self.obj)
        return self.obj.state_dict()

    def load_state_dict(self, state, strict):
        obj = self.obj
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.nn.Module):
            obj.load_state_dict(state, strict=strict)
        elif callable(getattr(obj, "load_state_dict", None)):
            obj.load_state_dict(state)
        else:
            obj.update(state)

    def entry_prefix(self, shard_id):
        if self.category == "io_state":
            return f"{self.name}.shard-{shard_id}."
        return self.name + "."


def gather(objects, shard_id, num_shards):
    """(state, metadata) of a save of every registered object, in the C++ layout."""
    state, recorded = {}, {}
    for name in sorted(objects):
        reg = objects[name]
        sd = reg.state_dict()
        state[name] = {f"shard-{shard_id}": sd} if reg.category == "io_state" else sd
        recorded[name] = {"category": reg.category, "num_shards": num_shards}
    return state, {META_KEY: {"objects": recorded}}


# ----------------------------------------------------------------------------- loading


def _is_tensor(obj):
    if isinstance(obj, (np.ndarray, np.generic)):
        return True
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _tensor_info(obj):
    """(savepoint dtype name, shape) of a tensor-like leaf."""
    if isinstance(obj, (np.ndarray, np.generic)):
        a = np.asarray(obj)
        return _dtypes.from_numpy_dtype(a.dtype), tuple(a.shape)
    return _dtypes.from_torch_dtype(obj.dtype), tuple(obj.shape)


def template_leaves(obj):
    """{entry name relative to the object: (key path, leaf)} of a state_dict, named exactly as
    savepoint.save names them (same walk, same collision rule)."""
    namer = _tree.Flattener()
    return {namer._name(path): (path, o) for path, o in _tree.object_leaves(obj)
            if type(o) in (bool, int, float, str, bytes) or _is_tensor(o)}


def _leaf_nodes(tree):
    """{entry name: node} of every tensor and value leaf of a recorded tree."""
    return {_tree.entry_name(node): node for _, node in _tree.walk(tree["root"])
            if _tree.entry_name(node) is not None}


def _child(node, key):
    """The child of a dict node at `key`, or None."""
    for k, child in node.get("dict", node.get("odict", [])):
        if _tree.decode_key(k) == key:
            return child
    return None


def _encode_key(k):
    return {"int": k} if type(k) is int else k


def _insert(node, path, leaf):
    """Puts `leaf` at `path` below the dict node `node`, creating dict nodes on the way."""
    *head, last = path
    for k in head:
        child = _child(node, k)
        if child is None or not ("dict" in child or "odict" in child):
            child = {"dict": []}
            _remove(node, k)
            node.setdefault("dict", node.get("odict", [])).append([_encode_key(k), child])
        node = child
    _remove(node, last)
    items = node["dict"] if "dict" in node else node.setdefault("odict", [])
    items.append([_encode_key(last), leaf])


def _remove(node, key):
    kind = "dict" if "dict" in node else "odict"
    if kind in node:
        node[kind] = [kv for kv in node[kind] if _tree.decode_key(kv[0]) != key]


def _prune(node, keep):
    """`node` without the leaves whose entry name `keep` rejects (lists keep a None in place)."""

    def visit(_, n):
        name = _tree.entry_name(n)
        return _tree.DESCEND if name is None or keep(name) else None

    return _tree.transform(node, visit)


def _has_leaves(node):
    return any(_tree.entry_name(n) is not None for _, n in _tree.walk(node))


def _matches_any(globs, name):
    """The C++ registry's rule: savepoint's one name rule (_core.match_name), empty = all."""
    return not globs or any(_core.match_name(g, name) for g in globs)


class _Target:
    """One object to load: the tree (nodes) it is given, and whether its load is strict."""

    def __init__(self, reg, node, strict):
        self.reg, self.node, self.strict = reg, node, strict


def load_into(path, objects, *, include=("*",), exclude=(), strict=True, renames=None, only=(),
              shard_id=0, num_shards=1, verify=True, io_threads=4, direct_io=True,
              key=None):  # fmt: skip
    """Loads the checkpoint at `path` into the registered `objects` ({name: Registered}).

    Two passes, as in C++: every selected object is planned first (its template matched against
    the checkpoint, strictness enforced), then, only if every plan succeeded, the tensors are read
    (into the template's own tensors where dtype and shape match) and each object's
    load_state_dict is called."""
    cats = selected_categories(include, exclude)
    renames = dict(renames or {})
    if isinstance(only, str):
        only = [only]
    only = list(only)
    info = _read.Info(path, io_threads, direct_io, _read.load_key(key, f"load {path}: key"))
    leaves = _leaf_nodes(info.tree)
    recorded = info.metadata.get(META_KEY)
    recorded = recorded.get("objects", {}) if isinstance(recorded, dict) else {}
    source_of = {dst: src for src, dst in renames.items()}
    torch = sys.modules.get("torch")
    targets, fills = [], {}  # fills: checkpoint entry name -> template tensor to read into
    for name in sorted(objects):
        reg = objects[name]
        if reg.category not in cats:
            continue
        where = f"load {name!r} ({reg.category}) from {path}"
        rec = recorded.get(name) if isinstance(recorded, dict) else None
        if reg.category == "io_state" and isinstance(rec, dict) and "num_shards" in rec:
            if rec["num_shards"] != num_shards:
                raise _errors.InvalidArgumentError(
                    f"{where}: saved with {rec['num_shards']} shards, this run has {num_shards}")
        prefix = reg.entry_prefix(shard_id)
        template = template_leaves(reg.state_dict())
        skipped, renamed_in = set(), []
        for rel, (rpath, leaf) in template.items():
            target = prefix + rel
            if not _matches_any(only, target):
                continue
            src = source_of.get(target, target)
            problem = _check_entry(info, leaves, where, src, target, leaf)
            if problem is not None:
                if strict:
                    raise problem
                _logger.info("savepoint: skipped: %s", problem)
                skipped.add(target)
                continue
            if _is_tensor(leaf) and not isinstance(leaf, np.generic):
                fills.setdefault(src, leaf)
            if src != target:
                renamed_in.append((rpath, target, src))
        # Renames into this object whose target the template does not have: a flat key.
        for dst, src in source_of.items():
            if dst.startswith(prefix) and dst[len(prefix):] not in template and src in leaves:
                if _matches_any(only, dst):
                    renamed_in.append(((dst[len(prefix):],), dst, src))
        node = _object_node(info, leaves, reg, prefix, template)

        def keep(entry, skipped=skipped):
            # Own entries: not skipped, wanted by `only`, not replaced by a renamed entry.
            return entry not in skipped and _matches_any(only, entry) and entry not in source_of

        node = _prune(node, keep) if node is not None else None
        node = node if node is not None else {"dict": []}
        if renamed_in and "dict" not in node and "odict" not in node:
            raise _errors.InvalidArgumentError(
                f"{where}: renames into it need a dict state, the checkpoint holds a "
                f"{next(iter(node))}")
        for rpath, target, src in renamed_in:
            _insert(node, rpath, copy.deepcopy(leaves[src]))
        if not _has_leaves(node):
            continue  # nothing of it in the checkpoint (lenient, or an empty state)
        partial = bool(only) or bool(skipped)
        is_module = torch is not None and isinstance(reg.obj, torch.nn.Module)
        targets.append(_Target(reg, node, strict and not (partial and is_module)))
    _read_and_load(path, info, targets, fills, verify, io_threads, direct_io)


def _check_entry(info, leaves, where, src, target, leaf):
    """None if checkpoint entry `src` can fill template leaf `leaf`; else the error."""
    node = leaves.get(src)
    if _is_tensor(leaf):
        entry = info.tensors.get(src) if node is not None else None
        if entry is None or "value" in node or "bigint" in node:
            return _errors.NotFoundError(f"{where}: no tensor {src!r}")
        dtype, shape = _tensor_info(leaf)
        if entry[1] != dtype or tuple(entry[2]) != shape:
            return _errors.InvalidArgumentError(
                f"{where}: tensor {src!r} is {entry[1]} {list(entry[2])} in the checkpoint, "
                f"{target!r} is {dtype} {list(shape)} here")
        return None
    if node is None or not ("value" in node or "bigint" in node):
        return _errors.NotFoundError(f"{where}: no value {src!r}")
    return None


def _object_node(info, leaves, reg, prefix, template):
    """The checkpoint's tree node of one object (a copy), or None when it has none."""
    if not info.flat:
        root = info.tree["root"]
        node = _child(root, reg.name) if ("dict" in root or "odict" in root) else None
        if node is not None and reg.category == "io_state":  # below "shard-<id>"
            shard = prefix[len(reg.name) + 1 : -1]
            node = _child(node, shard) if "dict" in node or "odict" in node else None
        return copy.deepcopy(node) if node is not None else None
    # A flat checkpoint (C++ API / CLI): the object's entries, placed where the template has
    # them, else under their relative name.
    node = {"dict": []}
    torch_default = sys.modules.get("torch") is not None  # torch objects are registered
    found = False
    for name in sorted(n for n in leaves if n.startswith(prefix)):
        rel = name[len(prefix):]
        rpath, leaf = template.get(rel, ((rel,), None))
        if name in info.tensors:
            as_torch = _is_torch(leaf) if leaf is not None else torch_default
            new = {"torch": name} if as_torch else {"numpy": name}
        else:
            new = dict(leaves[name])
        _insert(node, rpath, new)
        found = True
    return node if found else None


def _is_torch(leaf):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(leaf, torch.Tensor)


def _read_and_load(path, info, targets, fills, verify, io_threads, direct_io):
    """Reads every tensor the targets need (template tensors filled in place), then calls each
    object's load_state_dict with its rebuilt state."""
    plan = _read.Plan(path, info, {(name,): t for name, t in fills.items()}, None)
    added = set()
    for t in targets:
        for name, node in _leaf_nodes({"root": t.node}).items():
            if name in info.tensors and name not in added:
                added.add(name)
                plan.add((name,), node)
    plan.run(verify, io_threads, direct_io)
    finish = _read.finisher(plan.loaded, added, None, plan.like_names)
    for t in targets:
        state = _tree.rebuild({"root": t.node}, finish, info.values)
        try:
            t.reg.load_state_dict(state, t.strict)
        except Exception as e:
            if hasattr(e, "add_note"):  # Python 3.11+
                e.add_note(f"savepoint: loading {t.reg.name!r} ({t.reg.category}) from {path}")
            raise
