"""The layers are folders, and data flows one way (docs/ARCHITECTURE.md): each folder of src/ may
include headers of the folders below it only. This test reads every non-test source of src/ and
fails, naming the file and the include, when a folder includes one that is not in its allowed set
below. Public headers (savepoint/...) are the API's types and may be included anywhere, but the
public entry points defined in src/api/ (Save, Load, ...) sit above engine/, distributed/ and
sparse/: the folders below api/ must not call them (that would be a call up through a public
header), which the test checks too.

    python3 tests/layering_test.py [SRC_DIR]     (default: the src/ beside this file's parent)
"""

import os
import re
import sys

# Folder -> the folders it may include (besides itself). Lower layers first.
ALLOWED = {
    "util": set(),
    "core": {"util"},
    "crypto": {"util", "core"},
    "codec": {"util", "core"},
    "device": {"util", "core"},
    "io": {"util", "core"},
    "format": {"util", "core", "crypto", "codec"},
    "engine": {"util", "core", "crypto", "codec", "device", "io", "format"},
    "distributed": {"util", "core", "crypto", "codec", "io", "format", "engine"},
    "sparse": {"util", "core", "io", "format", "engine"},
    "interop": {"util", "core", "crypto", "codec", "io", "format", "engine"},
    # The store seam: one interface for every container format (native, safetensors, .ckpt, DCP,
    # RecIS) over the engine, the distributed writer, the tables and the interop codecs.
    "store": {"util", "core", "crypto", "codec", "io", "format", "engine", "distributed", "sparse",
              "interop"},
    "failover": {"util", "core", "io", "format", "engine", "distributed", "interop"},
    "mindspore_strategy": {"util", "core", "io", "format", "engine", "distributed", "interop",
                           "store"},
    "manager": {"util", "core", "crypto", "io", "format", "engine", "sparse", "interop", "store"},
    # The public entry points (src/api/): the verbs over the store seam.
    "api": {"util", "core", "io", "format", "engine", "distributed", "sparse", "store"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+[<"]([a-z_]+)/', re.M)
# The folders that api/ builds on, directly or through another folder: they must not call api/'s
# public entry points.
def _below(folder):
    seen, todo = set(), list(ALLOWED[folder])
    while todo:
        f = todo.pop()
        if f not in seen:
            seen.add(f)
            todo.extend(ALLOWED.get(f, ()))
    return seen


BELOW_API = _below("api")
# A public entry point defined in src/api/: "Status Save(" / "Result<State> Load(" at column 0.
API_DEFINITION = re.compile(r"^(?:Status|Result<[\w:<>]+>)\s+(\w+)\(", re.M)


def sources(top):
    for d, _, files in os.walk(top):
        for f in sorted(files):
            if f.endswith((".cc", ".h")) and not f.endswith("_test.cc") and "testutil" not in f:
                yield os.path.join(d, f)


def strip_comments(text):
    return re.sub(r"//[^\n]*", "", text)


def _is_call(text, pos):
    """Whether the name at `pos` is called rather than declared: a declaration has a type (a word,
    or a `>`, `&` or `*` ending one) right before the name, as in "Status Verify(" or
    "Result<State> Load(" (a method of a class, say)."""
    before = text[text.rfind("\n", 0, pos) + 1:pos]
    m = re.search(r"(\w+|[>&*])\s+$", before)
    return m is None or m.group(1) in ("return", "co_return", "throw", "else", "case")


def upward_calls(src):
    """Calls of api/'s entry points from the folders below api/ (a file that defines a function of
    the same name, like codec's SIMD Load, is not calling the entry point)."""
    names = set()
    for path in sources(os.path.join(src, "api")):
        with open(path, encoding="utf-8") as fh:
            names.update(API_DEFINITION.findall(fh.read()))
    out = []
    for folder in sorted(BELOW_API):
        for path in sources(os.path.join(src, folder)):
            with open(path, encoding="utf-8") as fh:
                text = strip_comments(fh.read())
            for name in sorted(names):
                if re.search(rf"^\w[\w:<>,*& ]*[\w>&*]\s+{name}\(", text, re.M):
                    continue  # defines its own free function of that name (at column 0)
                if any(_is_call(text, m.start()) for m in
                       re.finditer(rf"(?<![\w.:>])(?:savepoint::)?{name}\(", text)):
                    rel = os.path.relpath(path, os.path.dirname(src))
                    out.append(f"{rel} calls {name}(), an entry point of src/api/ above {folder}/")
    return out


def violations(src):
    out = upward_calls(src)
    for folder in sorted(os.listdir(src)):
        top = os.path.join(src, folder)
        if not os.path.isdir(top):
            continue
        if folder not in ALLOWED:
            out.append(f"src/{folder}/: a folder without a layer in tests/layering_test.py")
            continue
        for path in sources(top):
            with open(path, encoding="utf-8") as fh:
                for dep in INCLUDE.findall(fh.read()):
                    if dep in ("savepoint", folder) or dep in ALLOWED[folder]:
                        continue
                    if dep not in ALLOWED:  # a system header such as <sys/mman.h>
                        continue
                    rel = os.path.relpath(path, os.path.dirname(src))
                    out.append(f"{rel} includes {dep}/: not below {folder}/")
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(here), "src")
    bad = violations(src)
    for line in bad:
        print(line)
    print(f"layering: {len(ALLOWED)} folders checked, {len(bad)} includes against the layers")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
