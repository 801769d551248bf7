"""AsyncCheckpointer.reserve / reserve=: staging memory is allocated in the background before the
first save (so that save blocks for the copy alone), capped, and used by the save."""

import time

import numpy as np
import pytest

import savepoint


def _wait_allocated(ckpt, at_least, timeout=60.0):
    deadline = time.monotonic() + timeout
    while ckpt.staging_allocated_bytes < at_least and time.monotonic() < deadline:
        time.sleep(0.01)
    return ckpt.staging_allocated_bytes


def test_reserve_a_state_then_save(tmp_path):
    state = {"w": np.arange(3 << 18, dtype=np.float32), "b": np.ones(7, np.float64)}
    nbytes = state["w"].nbytes + state["b"].nbytes
    with savepoint.AsyncCheckpointer(staging_bytes=64 << 20, slab_bytes=1 << 20,
                                     reserve=state) as ckpt:  # fmt: skip
        assert _wait_allocated(ckpt, nbytes) >= nbytes
        ckpt.save(state, tmp_path / "c").wait()
        assert ckpt.staging_allocated_bytes < 64 << 20  # reserved what the state needs, not the cap
    back = savepoint.load(tmp_path / "c")
    np.testing.assert_array_equal(back["w"], state["w"])


def test_reserve_is_capped_and_checked():
    with savepoint.AsyncCheckpointer(staging_bytes=4 << 20, slab_bytes=1 << 20) as ckpt:
        ckpt.reserve(1 << 40)
        assert _wait_allocated(ckpt, 4 << 20) == 4 << 20
        time.sleep(0.05)
        assert ckpt.staging_allocated_bytes == 4 << 20
        with pytest.raises(savepoint.InvalidArgumentError):
            ckpt.reserve(-1)
