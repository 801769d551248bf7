"""A small, deterministic Accelerate training loop (test_accelerate.py).

    accelerate_train.py PROJECT LOSSES --io savepoint|accelerate [--async] [--kill-at STEP]
                        [--resume]

An MLP with dropout, AdamW and a StepLR schedule, on a shuffled data set (Accelerate's seedable
sampler), 8 steps an epoch for 3 epochs. At the end of every epoch it calls
`accelerator.save_state()` (automatic checkpoint naming under PROJECT, total_limit=2), which goes
through savepoint (--io savepoint: savepoint.accelerate.install, --async for asynchronous saves) or
Accelerate's own files. A registered counter holds the step. After every step it appends
"STEP HEX" (the loss, float.hex) to LOSSES; --kill-at sends itself SIGKILL after that step;
--resume first calls `accelerator.load_state()` (the newest checkpoint).
"""

import argparse
import os
import signal

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration, set_seed

import savepoint.accelerate

EPOCHS, BATCHES, BATCH = 3, 8, 8


class Counter:
    def __init__(self):
        self.step = 0

    def state_dict(self):
        return {"step": self.step}

    def load_state_dict(self, state):
        self.step = state["step"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("project")
    p.add_argument("losses")
    p.add_argument("--io", choices=("savepoint", "accelerate"), required=True)
    p.add_argument("--async", dest="async_", action="store_true")
    p.add_argument("--kill-at", type=int, default=-1)
    p.add_argument("--resume", action="store_true")
    a = p.parse_args()
    acc = Accelerator(
        cpu=True,
        project_config=ProjectConfiguration(project_dir=a.project, automatic_checkpoint_naming=True,
                                            total_limit=2),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))  # fmt: skip
    set_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCHES * BATCH, 8, generator=g)
    y = torch.stack([x[:, :4].sum(1), x[:, 4:].prod(1)], 1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Dropout(0.2), torch.nn.Tanh(),
                                torch.nn.Linear(32, 2))  # fmt: skip
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.7)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH,
                                       shuffle=True)  # fmt: skip
    model, opt, data, sched = acc.prepare(model, opt, data, sched)
    counter = Counter()
    acc.register_for_checkpointing(counter)
    if a.io == "savepoint":
        savepoint.accelerate.install(acc, async_=a.async_)
    if a.resume:
        acc.load_state()
    out = open(a.losses, "a")
    for _ in range(counter.step // BATCHES, EPOCHS):
        for xb, yb in data:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            acc.backward(loss)
            opt.step()
            sched.step()
            opt.zero_grad()
            counter.step += 1
            out.write(f"{counter.step} {loss.item().hex()}\n")
            out.flush()
            if counter.step == a.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        acc.save_state()
    if a.io == "savepoint":
        savepoint.accelerate.wait(acc)


if __name__ == "__main__":
    main()
