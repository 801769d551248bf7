"""The layering of the pure-Python package (issue 30): entry points on top of helper modules that
never import them back, no import circle, no plain ValueError for a bad argument, py.typed.

These tests read python/savepoint/*.py with the ast module only: they import nothing of
savepoint, so they need no built extension.
"""

import ast
import os

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
PACKAGE_DIR = os.path.join(REPO, "python", "savepoint")
PACKAGE = "savepoint"
EXTENSIONS = {"_core"}  # compiled modules of the package (python/ext/*.cc): no source here

# The layers, top first. A module imports modules of its own layer or of lower ones, never of a
# higher one (at module level or inside a function); with no circle, that is the whole rule.
LAYERS = [
    # The framework plug-ins over the entry points: savepoint.lightning (a Lightning CheckpointIO),
    # savepoint.accelerate, savepoint.hf (the Transformers Trainer) and savepoint.torchtitan.
    ("framework plug-ins", {"lightning", "hf", "accelerate", "torchtitan"}),
    # What users import and call: savepoint.save / load / info / verify / convert /
    # CheckpointManager / save_safetensors ..., and the submodules savepoint.sparse / torch / mindspore / recis /
    # failover; _cli, the `savepoint` console script of an installed package, and launch (its
    # `savepoint launch`, torchrun with a failover controller).
    ("entry points", {"__init__", "_save", "_load", "_convert", "_manager", "_safetensors",
                      "_recis_import", "failover", "mindspore", "recis", "sparse", "torch",
                      "_cli", "launch"}),
    # What save / load hand a process group or sparse tables to (PerRank, DistributedSaveFuture,
    # load_tables, compact, ... live here and are re-exported above).
    ("distributed and sparse I/O", {"_distributed", "_sparse_io"}),
    # What the savers and loaders share: writing, reading, the manager's registered objects, the
    # plug-ins' split of what the tree cannot hold.
    ("shared", {"_write", "_read", "_registry", "_objects"}),
    # Helpers: the tree walker, sparse tables, dtypes, keys, errors, CUDA, the torch transport.
    ("helpers", {"_tree", "_sparse", "_cuda", "_torch_comm", "_dtypes", "_keys", "_errors",
                 "_types"}),
]  # fmt: skip

# Function-local imports of the package's own modules that are allowed (module -> imported
# modules). None: the package's modules import each other at module level.
LOCAL_IMPORTS_ALLOWED = {}


def _modules():
    return sorted(f[:-3] for f in os.listdir(PACKAGE_DIR) if f.endswith(".py"))


def _parse(module):
    path = os.path.join(PACKAGE_DIR, module + ".py")
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read(), path)


class _Imports(ast.NodeVisitor):
    """The package's own modules one module imports: [(module, line, inside a function)]."""

    def __init__(self, modules):
        self.modules = set(modules)
        self.found = []
        self._depth = 0  # nesting of functions (and classes inside them)

    def _function(self, node):
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def _add(self, target, node):
        if target in EXTENSIONS:
            return
        # A name that is not a module of the package comes from its __init__.
        self.found.append((target if target in self.modules else "__init__", node.lineno,
                           self._depth > 0))  # fmt: skip

    def visit_Import(self, node):  # import savepoint, import savepoint.x
        for alias in node.names:
            parts = alias.name.split(".")
            if parts[0] == PACKAGE:
                self._add(parts[1] if len(parts) > 1 else "__init__", node)

    def visit_ImportFrom(self, node):
        parts = node.module.split(".") if node.module else []
        if node.level == 0:  # from savepoint import x / from savepoint.x import y
            if not parts or parts[0] != PACKAGE:
                return
            parts = parts[1:]
        elif node.level > 1:
            raise AssertionError(f"line {node.lineno}: the package has no parent package")
        if parts:  # from .x import y (from .x.y import z: x is a module, not a package)
            self._add(parts[0], node)
        else:  # from . import x, y
            for alias in node.names:
                self._add(alias.name, node)


def _graph():
    """{module: [(imported module, line, inside a function)]} of every module of the package."""
    modules = _modules()
    graph = {}
    for m in modules:
        visitor = _Imports(modules)
        visitor.visit(_parse(m))
        graph[m] = visitor.found
    return graph


def _find_cycle(graph):
    """One import circle as [(module, imported module, line, inside a function)], or None."""
    state = {}  # module -> "open" while on the DFS path, "done" after
    path = []

    def visit(m):
        state[m] = "open"
        for target, line, local in graph.get(m, []):
            path.append((m, target, line, local))
            if state.get(target) == "open":
                start = next(i for i, step in enumerate(path) if step[0] == target)
                return path[start:]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
            path.pop()
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state:
            cycle = visit(m)
            if cycle:
                return cycle
    return None


def _describe(steps):
    return "\n".join(f"  {a}.py:{line} imports {b}{' (inside a function)' if local else ''}"
                     for a, b, line, local in steps)  # fmt: skip


def _layer_of():
    return {m: i for i, (_, members) in enumerate(LAYERS) for m in members}


def test_every_module_has_one_layer():
    modules = _modules()
    assert "__init__" in modules and "_save" in modules and "_tree" in modules, PACKAGE_DIR
    listed = [m for _, members in LAYERS for m in members]
    assert len(listed) == len(set(listed)), "a module is in two layers"
    assert sorted(listed) == modules, (
        f"not in LAYERS: {sorted(set(modules) - set(listed))}; "
        f"listed but missing: {sorted(set(listed) - set(modules))}")


def test_no_import_circle():
    cycle = _find_cycle(_graph())
    assert cycle is None, "modules import each other in a circle:\n" + _describe(cycle)


def test_the_cycle_finder_finds_circles():
    graph = {"a": [("b", 1, False)], "b": [("c", 2, True)], "c": [("a", 3, False)], "d": []}
    assert [step[:2] for step in _find_cycle(graph)] == [("a", "b"), ("b", "c"), ("c", "a")]
    assert _find_cycle({"a": [("b", 1, False)], "b": [], "c": [("b", 1, False)]}) is None


def test_the_import_finder_sees_every_form():
    source = (
        "from . import _a, _b as b\n"
        "from ._c import x\n"
        "import savepoint._d\n"
        "from savepoint import _e\n"
        "from savepoint._f import y\n"
        "from . import _core, __version__\n"
        "import numpy, os.path\n"
        "def f():\n"
        "    from . import _g\n"
        "    import savepoint\n"
    )  # fmt: skip
    visitor = _Imports(["__init__", "_a", "_b", "_c", "_d", "_e", "_f", "_g"])
    visitor.visit(ast.parse(source))
    assert visitor.found == [("_a", 1, False), ("_b", 1, False), ("_c", 2, False),
                             ("_d", 3, False), ("_e", 4, False), ("_f", 5, False),
                             ("__init__", 6, False), ("_g", 9, True),
                             ("__init__", 10, True)]  # fmt: skip


def test_lower_layers_never_import_higher_ones():
    layer = _layer_of()
    wrong = [(m, target, line, local) for m, imports in _graph().items()
             for target, line, local in imports
             if layer.get(target, len(LAYERS)) < layer.get(m, len(LAYERS))]  # fmt: skip
    names = {m: LAYERS[i][0] for m, i in layer.items()}
    assert not wrong, "modules import a higher layer:\n" + "\n".join(
        f"  {a}.py:{line} ({names.get(a)}) imports {b} ({names.get(b)})"
        for a, b, line, _ in wrong)  # fmt: skip


def test_no_function_local_imports_of_the_package():
    local = [(m, target, line, True) for m, imports in _graph().items()
             for target, line, inside in imports
             if inside and target not in LOCAL_IMPORTS_ALLOWED.get(m, ())]  # fmt: skip
    assert not local, "imports of the package's modules inside functions:\n" + _describe(local)


def _raises_plain_value_error(node):
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    return isinstance(exc, ast.Name) and exc.id == "ValueError"


def test_argument_errors_are_invalid_argument_errors():
    """A bad argument raises InvalidArgumentError (savepoint._errors; a ValueError too), never a
    plain ValueError."""
    wrong = []
    for m in _modules():
        path = os.path.join(PACKAGE_DIR, m + ".py")
        with open(path, encoding="utf-8") as f:
            source = f.read()
        wrong += [f"{m}.py:{i}" for i, line in enumerate(source.splitlines(), 1)
                  if "raise ValueError(" in line]  # fmt: skip
        wrong += [f"{m}.py:{node.lineno}" for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.Raise) and node.exc is not None
                  and _raises_plain_value_error(node)]  # fmt: skip
    assert not wrong, f"plain ValueError raised at {sorted(set(wrong))}: raise InvalidArgumentError"


def test_py_typed_marker():
    assert os.path.isfile(os.path.join(PACKAGE_DIR, "py.typed"))


def test_annotations_are_not_evaluated_at_import():
    """Every module that annotates defers its annotations (from __future__ import annotations),
    but the package's __init__: there the import would add a name `annotations` to the package
    (its one annotated function, set_log_level, takes builtins)."""
    lacking = []
    for m in _modules():
        if m == "__init__":
            continue
        tree = _parse(m)
        annotated = any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                        and (n.returns is not None or any(a.annotation is not None for a in
                                                          n.args.args + n.args.kwonlyargs))
                        for n in ast.walk(tree))  # fmt: skip
        future = any(isinstance(n, ast.ImportFrom) and n.module == "__future__"
                     and any(a.name == "annotations" for a in n.names)
                     for n in tree.body)  # fmt: skip
        if annotated and not future:
            lacking.append(m)
    assert not lacking, f"annotated without `from __future__ import annotations`: {lacking}"
