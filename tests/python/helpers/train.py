"""A small, deterministic training run that checkpoints with savepoint (test_training.py).

    train.py ROOT STEPS SAVE_EVERY [--resume] [--final PATH]

Trains an MLP with dropout and AdamW on synthetic batches drawn from torch's, numpy's and Python's
RNGs (so all three must be restored for a bit-exact resume). Every SAVE_EVERY steps it starts an
asynchronous save of model + optimizer + RNG states + step into ROOT/step-NNNNNN and keeps training.
With --resume it first restores the newest committed checkpoint under ROOT. Prints one line per
step, "loss STEP HEX" (float.hex, exact), flushing so the parent can SIGKILL it at any moment;
--final saves the final model and optimizer (synchronously) to PATH.
"""

import argparse
import os
import random

import numpy as np
import torch

import savepoint


def make_model():
    return torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Dropout(0.1), torch.nn.Linear(64, 4))


def batch(w_true):
    x = torch.randn(32, 16)
    noise = torch.from_numpy(np.random.standard_normal((32, 4)).astype(np.float32))
    return x, x @ w_true + noise * random.uniform(0.05, 0.2)


def rng_state():
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def restore(root, model, opt):
    ckpts = [c for c in savepoint.list_checkpoints(root) if c["committed"]]
    latest = max(ckpts, key=lambda c: c["step"])
    state = savepoint.load(latest["path"], like={"model": model.state_dict()})  # model in place
    opt.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"]["torch"])
    np.random.set_state(state["rng"]["numpy"])
    random.setstate(state["rng"]["python"])
    print(f"resumed {latest['name']}", flush=True)
    return state["step"], state["w_true"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("steps", type=int)
    ap.add_argument("save_every", type=int)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--final")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(1234)
    np.random.seed(5678)
    random.seed(91011)
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    w_true = torch.randn(16, 4)
    start = 0
    if args.resume:
        start, w_true = restore(args.root, model, opt)
    model.train()
    pending = None
    for step in range(start, args.steps):
        x, y = batch(w_true)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"loss {step} {loss.item().hex()}", flush=True)
        if (step + 1) % args.save_every == 0:
            state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "rng": rng_state(),
                     "step": step + 1, "w_true": w_true}  # fmt: skip
            path = os.path.join(args.root, f"step-{step + 1:06d}")
            pending = savepoint.save(state, path, async_=True)
    if pending is not None:
        pending.wait()
    if args.final:
        savepoint.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, args.final)


if __name__ == "__main__":
    main()
