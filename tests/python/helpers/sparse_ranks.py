"""Runs one multi-rank scenario of tests/python/test_sparse.py (scenario_<name>(tmp_dir)) in a
fresh interpreter, so that its gloo ranks are forked from a process that has run no torch op.
Usage: sparse_ranks.py TMP_DIR NAME. Prints OK when the scenario's assertions hold."""

import os
import pathlib
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import test_sparse  # noqa: E402

if __name__ == "__main__":
    tmp, name = pathlib.Path(sys.argv[1]), sys.argv[2]
    getattr(test_sparse, f"scenario_{name}")(tmp)
    print("OK")
