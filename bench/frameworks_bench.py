"""Framework checkpoints of a GPT-2-sized model: how long training is blocked per checkpoint and
how long until it is durable, in one run, with dd write (O_DIRECT, fsync) of as many bytes as the
physical reference (docs/PERFORMANCE.md, "Lightning and Accelerate"):

- Lightning: its default TorchCheckpointIO, its AsyncCheckpointIO wrapper around it, and
  savepoint.lightning.CheckpointIO, each in a Trainer of its own over the same module; a save is
  `trainer.save_checkpoint(path)` (what ModelCheckpoint calls);
- Accelerate: `Accelerator.save_state(dir)`, and savepoint.accelerate.save_state synchronous and
  asynchronous (`async_=True`, then savepoint.accelerate.wait).

The model is transformers' GPT2LMHeadModel built from GPT2Config() (124M parameters; no download)
trained with AdamW for two steps, so that a checkpoint holds the weights and both moments.
"blocked" is the save call; "durable" adds waiting for the plug-in (AsyncCheckpointIO: teardown;
savepoint: wait) and an fsync of every file written (savepoint's are durable already; applied to
all alike). The first save of each contender is reported apart (savepoint's allocates staging).

Usage: PYTHONPATH=build/python python bench/frameworks_bench.py [--dir DIR] [--saves 3]
       [--accelerator cpu|gpu] [--layers 12] [--frameworks lightning,accelerate]
"""

import argparse
import json
import os
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import dd, fsync_tree, remove  # noqa: E402

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402


def _bytes(path):
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def _timed_saves(name, root, saves, save, settle, suffix=""):
    rows = []
    for i in range(saves):
        path = os.path.join(root, f"{name}-{i}{suffix}")
        t0 = time.perf_counter()
        save(path)
        blocked = time.perf_counter() - t0
        settle()
        fsync_tree(path)
        rows.append({"blocked": blocked, "durable": time.perf_counter() - t0,
                     "bytes": _bytes(path)})  # fmt: skip
        remove(path)
    return rows


def _lightning(args, root):
    import lightning as L  # noqa: PLC0415
    from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO  # noqa: PLC0415

    import savepoint.lightning  # noqa: PLC0415

    class Gpt2(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = GPT2LMHeadModel(GPT2Config(n_layer=args.layers))

        def training_step(self, batch, batch_idx):
            return self.model(input_ids=batch, labels=batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    torch.manual_seed(0)
    module = Gpt2()
    data = torch.utils.data.DataLoader(torch.randint(0, 50257, (4, 64)), batch_size=2)
    out = {}
    makers = {"torch": TorchCheckpointIO, "async": lambda: AsyncCheckpointIO(TorchCheckpointIO()),
              "savepoint": savepoint.lightning.CheckpointIO}  # fmt: skip
    for name, make in makers.items():
        io = make()
        trainer = L.Trainer(max_steps=2, accelerator=args.accelerator, devices=1, plugins=[io],
                            logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False)  # fmt: skip
        trainer.fit(module, data)
        settle = io.teardown if name == "async" else getattr(io, "wait", lambda: None)
        out[name] = _timed_saves(f"lightning-{name}", root, args.saves, trainer.save_checkpoint,
                                 settle, suffix=".ckpt")  # fmt: skip
        io.teardown()
    return out, module


def _accelerate(args, root):
    from accelerate import Accelerator  # noqa: PLC0415

    import savepoint.accelerate  # noqa: PLC0415

    torch.manual_seed(0)
    acc = Accelerator(cpu=args.accelerator == "cpu")
    model = GPT2LMHeadModel(GPT2Config(n_layer=args.layers))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, opt = acc.prepare(model, opt)
    batch = torch.randint(0, 50257, (2, 64), device=acc.device)
    for _ in range(2):
        acc.backward(model(input_ids=batch, labels=batch).loss)
        opt.step()
        opt.zero_grad()
    contenders = {
        "accelerate": (lambda p: acc.save_state(p), lambda: None),
        "savepoint": (lambda p: savepoint.accelerate.save_state(acc, p), lambda: None),
        "savepoint-async": (lambda p: savepoint.accelerate.save_state(acc, p, async_=True),
                            lambda: savepoint.accelerate.wait(acc)),
    }  # fmt: skip
    return {n: _timed_saves(f"accelerate-{n}", root, args.saves, s, w)
            for n, (s, w) in contenders.items()}  # fmt: skip


def _table(title, rows, base):
    print(f"\n{title}")
    print("| contender | blocked: first, best of rest (s) | x default | durable: first, best (s) "
          "| x default's speed | GB |")
    ref = rows[base][1:] or rows[base]
    b0, d0 = min(r["blocked"] for r in ref), min(r["durable"] for r in ref)
    for name, rs in rows.items():
        rest = rs[1:] or rs
        b, d = min(r["blocked"] for r in rest), min(r["durable"] for r in rest)
        print(f"| {name} | {rs[0]['blocked']:.3f}, {b:.3f} | {b / b0:.3f} | "
              f"{rs[0]['durable']:.3f}, {d:.3f} | {d0 / d:.2f} | {rs[0]['bytes'] / 1e9:.2f} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default=None)
    p.add_argument("--saves", type=int, default=3)
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--frameworks", default="lightning,accelerate")
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    root = args.dir or tempfile.mkdtemp(prefix="sp_frameworks_")
    os.makedirs(root, exist_ok=True)
    device = torch.cuda.get_device_name() if args.accelerator == "gpu" else "cpu"
    out = {"accelerator": args.accelerator, "device": device, "dir": root}
    frameworks = args.frameworks.split(",")
    if "lightning" in frameworks:
        out["lightning"], module = _lightning(args, root)
        out["parameters"] = sum(t.numel() for t in module.parameters())
        del module
    if "accelerate" in frameworks:
        out["accelerate"] = _accelerate(args, root)
    size = max(r[0]["bytes"] for f in frameworks for r in out[f].values())
    ref = os.path.join(root, "dd.bin")
    t0 = time.perf_counter()
    dd(["if=/dev/zero", f"of={ref}", "bs=8M", f"count={max(1, size >> 23)}", "oflag=direct",
        "conv=fsync"])  # fmt: skip
    out["dd_write"] = time.perf_counter() - t0
    remove(ref)
    print(json.dumps(out, indent=1))
    print(f"\nGPT-2 ({args.layers} layers), {device}; dd write of {size / 1e9:.2f} GB: "
          f"{out['dd_write']:.2f} s")
    if "lightning" in frameworks:
        _table("Lightning (default: TorchCheckpointIO)", out["lightning"], "torch")
    if "accelerate" in frameworks:
        _table("Accelerate (default: Accelerator.save_state)", out["accelerate"], "accelerate")


if __name__ == "__main__":
    main()
