"""Shared fixtures of the Python suites (run by ctest with label "python", see python/CMakeLists.txt).

The suites import `savepoint` from PYTHONPATH (the build tree's package, built once with the C++
library by scripts/test); SAVEPOINT_EXPECT_BUILD_TREE makes sure no installed copy shadows it.
Randomised tests print their seed; SAVEPOINT_TEST_SEED replays one.
"""

import os
import random
import shutil
import subprocess
import sys

import pytest

import savepoint

_expected = os.environ.get("SAVEPOINT_EXPECT_BUILD_TREE")
if _expected:
    assert os.path.dirname(os.path.abspath(savepoint.__file__)) == os.path.abspath(_expected), (
        f"imported {savepoint.__file__}, expected the build tree's {_expected}")

HERE = os.path.dirname(os.path.abspath(__file__))


def assert_same(a, b):
    """Asserts that two states (nested dicts of tensors, arrays and values) hold the same keys,
    dtypes and values, naming the first key that differs."""
    import numpy as np
    import torch

    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    for k in a:
        if isinstance(a[k], dict):
            assert_same(a[k], b[k])
        elif isinstance(a[k], torch.Tensor):
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
        elif isinstance(a[k], np.ndarray):
            np.testing.assert_array_equal(a[k], b[k], err_msg=str(k))
        else:
            assert a[k] == b[k], k


@pytest.fixture
def seed():
    s = int(os.environ.get("SAVEPOINT_TEST_SEED", random.SystemRandom().randrange(2**31)))
    print(f"seed = {s} (replay with SAVEPOINT_TEST_SEED={s})")
    return s


def run_python(script, *args, check=True, timeout=300, **kwargs):
    """Runs tests/python/helpers/<script> in a fresh interpreter with the same savepoint."""
    cmd = [sys.executable, os.path.join(HERE, "helpers", script), *map(str, args)]
    return subprocess.run(cmd, check=check, timeout=timeout, capture_output=True, text=True, **kwargs)


def run_training(script, *args, rc=0):
    """Runs the training helper tests/python/helpers/<script> (which appends "STEP HEX-LOSS" lines
    to a file) and asserts its exit status: 0, or -signal.SIGKILL for a run that kills itself."""
    r = run_python(script, *args, check=False, timeout=600)
    assert r.returncode == rc, (script, r.returncode, r.stderr[-3000:])


def reference_losses(tmp_path_factory, script, *args, steps=24):
    """The losses of one uninterrupted run of a training helper (steps 1..steps, asserted)."""
    d = tmp_path_factory.mktemp("reference")
    run_training(script, d / "out", d / "losses.txt", *args)
    ref = read_losses(d / "losses.txt")
    assert [int(s) for s, _ in ref] == list(range(1, steps + 1))
    return ref


def read_losses(path):
    """[(step, loss as float.hex)] from a training helper's losses file."""
    with open(path) as f:
        return [tuple(line.split()) for line in f]


def find_cli():
    """The `savepoint` CLI of the same build: $SAVEPOINT_CLI, else <build>/tools/savepoint beside
    the build tree's package (<build>/python/savepoint), else one on PATH; None if there is none."""
    env = os.environ.get("SAVEPOINT_CLI")
    if env:
        return env
    build = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(savepoint.__file__))))
    candidate = os.path.join(build, "tools", "savepoint")
    if os.access(candidate, os.X_OK):
        return candidate
    return shutil.which("savepoint")


@pytest.fixture
def savepoint_cli():
    """Path of the CLI; the test is skipped when it was not built (SAVEPOINT_BUILD_TOOLS=OFF)."""
    cli = find_cli()
    if cli is None:
        pytest.skip("the savepoint CLI is not built (set SAVEPOINT_CLI)")
    return cli
