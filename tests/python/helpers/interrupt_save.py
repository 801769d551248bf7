"""Saves in a loop until interrupted (test_interrupt.py).

    interrupt_save.py ROOT MIB MODE      MODE: async | sync

Each checkpoint ROOT/ckpt-N holds {"t": uint8 tensor of MIB MiB filled with N % 251, "n": N}.
Prints "saving N" before each save (flushed) so the parent can send SIGINT during one. The
KeyboardInterrupt is not caught: the interpreter exits as it would for a user's Ctrl-C (the
default AsyncCheckpointer finishes its save in flight at exit).
"""

import os
import sys

import torch

import savepoint

root, mib, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
t = torch.empty(mib << 20, dtype=torch.uint8)
n = 0
while True:
    t.fill_(n % 251)
    print(f"saving {n}", flush=True)
    path = os.path.join(root, f"ckpt-{n}")
    if mode == "async":
        savepoint.save({"t": t, "n": n}, path, async_=True).wait()
    else:
        savepoint.save({"t": t, "n": n}, path)
    n += 1
