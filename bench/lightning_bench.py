"""Lightning checkpoints of a GPT-2-sized model: how long training is blocked per checkpoint and
how long until it is durable, for Lightning's default TorchCheckpointIO, its AsyncCheckpointIO
wrapper around it, and savepoint.lightning.CheckpointIO, in one run, with dd write (O_DIRECT,
fsync) of as many bytes as the physical reference (docs/PERFORMANCE.md, "Lightning").

The model is transformers' GPT2LMHeadModel built from GPT2Config() (124M parameters; no download)
trained with AdamW for two steps, so that a checkpoint holds the weights and both moments. Each
contender gets its own Trainer over the same module; each save is `trainer.save_checkpoint(path)`
(what ModelCheckpoint calls): "blocked" is that call, "durable" adds waiting for the plug-in
(AsyncCheckpointIO: teardown, savepoint: wait) and an fsync of every file written (savepoint's
files are durable already; the fsync is applied to all alike).

Usage: PYTHONPATH=build/python python bench/lightning_bench.py [--dir DIR] [--saves 3]
       [--accelerator cpu|gpu] [--layers 12]
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

import lightning as L  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

import savepoint.lightning  # noqa: E402


class Gpt2(L.LightningModule):
    def __init__(self, layers):
        super().__init__()
        self.model = GPT2LMHeadModel(GPT2Config(n_layer=layers))

    def training_step(self, batch, batch_idx):
        return self.model(input_ids=batch, labels=batch).loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


def _bytes(path):
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def _contender(name, module, data, args, root):
    io = {"torch": TorchCheckpointIO, "async": lambda: AsyncCheckpointIO(TorchCheckpointIO()),
          "savepoint": savepoint.lightning.CheckpointIO}[name]()  # fmt: skip
    trainer = L.Trainer(max_steps=2, accelerator=args.accelerator, devices=1, plugins=[io],
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)  # fmt: skip
    trainer.fit(module, data)
    rows = []
    for i in range(args.saves):
        path = os.path.join(root, f"{name}-{i}.ckpt")
        t0 = time.perf_counter()
        trainer.save_checkpoint(path)
        blocked = time.perf_counter() - t0
        if name == "async":
            io.teardown()
        elif name == "savepoint":
            io.wait()
        fsync_tree(path)
        rows.append({"blocked": blocked, "durable": time.perf_counter() - t0,
                     "bytes": _bytes(path)})  # fmt: skip
        remove(path)
    io.teardown()
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default=None)
    p.add_argument("--saves", type=int, default=3)
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--layers", type=int, default=12)
    args = p.parse_args()
    warnings.filterwarnings("ignore")
    root = args.dir or tempfile.mkdtemp(prefix="sp_lightning_")
    os.makedirs(root, exist_ok=True)
    torch.manual_seed(0)
    module = Gpt2(args.layers)
    params = sum(t.numel() for t in module.parameters())
    data = torch.utils.data.DataLoader(torch.randint(0, 50257, (4, 64)), batch_size=2)
    out = {"parameters": params, "accelerator": args.accelerator, "dir": root,
           "device": torch.cuda.get_device_name() if args.accelerator == "gpu" else "cpu"}  # fmt: skip
    for name in ("torch", "async", "savepoint"):
        out[name] = _contender(name, module, data, args, root)
    size = out["savepoint"][0]["bytes"]
    ref = os.path.join(root, "dd.bin")
    t0 = time.perf_counter()
    dd(["if=/dev/zero", f"of={ref}", "bs=8M", f"count={max(1, size >> 23)}", "oflag=direct",
        "conv=fsync"])  # fmt: skip
    out["dd_write"] = time.perf_counter() - t0
    remove(ref)
    print(json.dumps(out, indent=1))
    base = min(r["blocked"] for r in out["torch"][1:] or out["torch"])
    base_d = min(r["durable"] for r in out["torch"][1:] or out["torch"])
    print(f"\n{params / 1e6:.0f}M parameters, checkpoint {size / 1e9:.2f} GB, {out['device']}; "
          f"dd write {out['dd_write']:.2f} s")
    print("| plug-in | blocked: first, best of rest (s) | x default | durable: first, best (s) | "
          "x default's speed |")
    for name in ("torch", "async", "savepoint"):
        rows = out[name]
        rest = rows[1:] or rows
        b, d = min(r["blocked"] for r in rest), min(r["durable"] for r in rest)
        print(f"| {name} | {rows[0]['blocked']:.3f}, {b:.3f} | {b / base:.3f} | "
              f"{rows[0]['durable']:.3f}, {d:.3f} | {base_d / d:.2f} |")


if __name__ == "__main__":
    main()
