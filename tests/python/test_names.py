"""The one name-pattern rule (C++ savepoint::MatchesName), checked from Python on the case table
that the C++ unit test checks too, and through the Python entry points that filter by name."""

import os

import numpy as np
import pytest

import savepoint
from savepoint import _core

TABLE = os.path.join(os.path.dirname(__file__), "..", "testutil", "name_patterns.tsv")


def _cases():
    with open(TABLE, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line and not line.startswith("#"):
                pattern, name, match = line.split("\t")
                yield pattern, name, match == "1"


@pytest.mark.parametrize("pattern,name,match", list(_cases()))
def test_shared_table(pattern, name, match):
    assert _core.match_name(pattern, name) is match


def test_load_names_follow_the_rule(tmp_path):
    state = {"layer1": {"w": np.ones(2, np.float32)}, "layer3": {"w": np.zeros(2, np.float32)},
             "a\\b": np.ones(1, np.int8)}  # fmt: skip
    savepoint.save(state, tmp_path / "c")
    got = savepoint.load(tmp_path / "c", names=["layer[!0-2].w"])
    assert "w" in got["layer3"] and "w" not in got.get("layer1", {}) and "a\\b" not in got
    got = savepoint.load(tmp_path / "c", names=["a\\*"])  # no escapes: '\' is literal
    assert "a\\b" in got and "w" not in got.get("layer3", {})
    savepoint.save_safetensors(state, tmp_path / "m.safetensors")
    got = savepoint.load_safetensors(tmp_path / "m.safetensors", names=["layer[^0-2].w"])
    assert set(got) == {"layer3.w"}


@pytest.mark.parametrize("mmap", [False, True])
def test_a_name_with_glob_characters_selects_itself(tmp_path, mmap):
    state = {"w[0]": np.full(3, 7, np.float32), "w0": np.zeros(3, np.float32)}
    savepoint.save(state, tmp_path / "c")
    got = savepoint.load(tmp_path / "c", names=["w[0]"], mmap=mmap)
    assert (got["w[0]"] == 7).all()  # "[0]" is also a set matching "w0": both are selected
    savepoint.save_safetensors(state, tmp_path / "m.safetensors")
    got = savepoint.load_safetensors(tmp_path / "m.safetensors", names=["w[0]"], mmap=mmap,
                                     framework="np")  # fmt: skip
    assert (got["w[0]"] == 7).all()
