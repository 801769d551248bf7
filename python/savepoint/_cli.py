"""The `savepoint` console script of an installed package (pyproject.toml, [project.scripts]):
runs the C++ command-line tool shipped inside the package (savepoint/_bin/savepoint) with the same
arguments, replacing this process, so its exit status and signals are the tool's own. One
subcommand is Python's: `savepoint launch` (savepoint.launch: torchrun with a failover controller),
since torchrun is."""

from __future__ import annotations

import os
import sys

from . import launch


def executable() -> str:
    """The path of the packaged CLI (it exists in an installed package, not in a build tree)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "savepoint")


def main() -> int:
    if sys.argv[1:2] == ["launch"]:
        return launch.main(sys.argv[2:])
    exe = executable()
    if not os.access(exe, os.X_OK):
        print(f"savepoint: the command-line tool is not in this installation ({exe}); build it "
              "with `scripts/build` (build/tools/savepoint) or reinstall the package",
              file=sys.stderr)  # fmt: skip
        return 2
    os.execv(exe, [exe, *sys.argv[1:]])
    return 0  # (not reached)


if __name__ == "__main__":
    sys.exit(main())
