"""Trains with a CheckpointManager handling signals until one arrives (test_manager_registered.py).

    manager_signal.py ROOT [twice]

Registers a tensor holder "model" (w filled with the step number) and a counter dict "counters"
with exception_save=True and handle_signals=True, saving every 1000 steps (so only a breakpoint
saves), epoch 1. Each step updates the state first, then calls on_step_end, then prints
"step N" (flushed), so the parent can send SIGTERM or SIGINT; the next hook must save the
breakpoint "ckpt-1_N_breakpoint" of step N (or N+1), close the manager and re-raise the signal.
With "twice", the script sends itself the signal twice in a row from inside a step: the second
one must re-raise at once, without a breakpoint.
"""

import os
import signal
import sys
import time

import torch

import savepoint

root = sys.argv[1]
twice = len(sys.argv) > 2 and sys.argv[2] == "twice"
model = {"w": torch.zeros(256, 256)}
counters = {"step": 0}
mgr = savepoint.CheckpointManager(root, save_interval_steps=1000, exception_save=True,
                                  handle_signals=True)  # fmt: skip
mgr.register("model", model)
mgr.register("counters", counters, category="extra")
step = 0
while True:
    step += 1
    model["w"].fill_(step)
    counters["step"] = step
    if twice and step == 3:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)
        print("survived a second signal", flush=True)
    mgr.on_step_end(step, 1)
    print(f"step {step}", flush=True)
    time.sleep(0.02)
