"""A training loop whose checkpoints a manager uploads to a bucket in the background (the remote
tier), for the kill test of tests/python/test_s3.py: saves step after step forever, printing each
step once its save returned; the parent kills it with SIGKILL at a random point.

    tier_trainer.py LOCAL_DIR REMOTE_URI
"""

import sys

import numpy as np

import savepoint


def main():
    local, remote = sys.argv[1], sys.argv[2]
    # 24 MiB: a multipart upload of two parts per checkpoint, so kills land inside uploads.
    state = {"w": np.random.default_rng(0).standard_normal(6 << 20, dtype=np.float32), "step": 0}
    with savepoint.CheckpointManager(local, keep_last_n=1, async_=True, remote=remote,
                                     remote_options={"keep_last_n": 3}) as mgr:
        for step in range(1, 100000):
            state["w"][0] = step
            state["step"] = step
            mgr.save(step, state)
            print(step, flush=True)


if __name__ == "__main__":
    main()
