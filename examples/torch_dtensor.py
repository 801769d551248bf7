"""FSDP2/TP-style training with DTensor parameters and savepoint's sharded checkpoints: killed,
then resumed with another world size and another layout, bit for bit.

    python examples/torch_dtensor.py [RUN_DIR]

With 4 ranks the parameters (and so Adam's state) are DTensors on a 2 x 2 mesh ("dp" x "tp"):
weights sharded on both mesh dims (Shard(0), Shard(1)), biases replicated on "dp" and sharded on
"tp" (so each bias shard has two replicas: savepoint writes it once). The resumed run has 2 ranks
and a 1-D mesh with weights sharded on the other dim: savepoint.load(..., process_group=...) reads
each rank's new box straight from the shards that overlap it (only those byte ranges). Phases
and check: examples/torch_job.py.

Bit-for-bit across world sizes needs arithmetic that does not depend on the layout. Each step
gathers the full parameters (DTensor.full_tensor(), a copy), computes the gradients of fixed
micro-batches and sums them in micro-batch order (as torch_ddp.py does), then gives every rank
its shard of the gradient; Adam's update is elementwise, so sharding does not change it.
"""

import os

import torch
import torch.distributed as dist
import torch_job
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch_ddp import MICRO, batch

import savepoint

SHAPES = {"w1": (16, 64), "b1": (64,), "w2": (64, 4), "b2": (4,)}


def placements(world, name):
    """The layout: 4 ranks, 2 x 2 mesh; 2 ranks, 1-D mesh with weights split on their other dim."""
    if world == 4:
        return (Shard(0), Shard(1)) if name.startswith("w") else (Replicate(), Shard(0))
    return (Shard(1),) if name.startswith("w") else (Shard(0),)


class Model(torch.nn.Module):
    def __init__(self, mesh, world):
        super().__init__()
        torch.manual_seed(0)
        full = {"w1": torch.randn(16, 64) * 0.25, "b1": torch.zeros(64),
                "w2": torch.randn(64, 4) * 0.125, "b2": torch.zeros(4)}  # fmt: skip
        for name, t in full.items():  # every rank has the same `full`: no data moves
            p = distribute_tensor(t, mesh, placements(world, name), src_data_rank=None)
            self.register_parameter(name, torch.nn.Parameter(p))

    def full(self):
        return {n: p.full_tensor() for n, p in self.named_parameters()}


def forward(p, x):
    return torch.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


def train_step(model, opt, step, world, rank):
    full = {n: t.detach().requires_grad_() for n, t in model.full().items()}
    mine = []
    for m in range(rank, MICRO, world):
        x, y = batch(step, m)
        loss = torch.nn.functional.mse_loss(forward(full, x), y)
        grads = torch.autograd.grad(loss, list(full.values()))
        mine.append(torch.cat([g.flatten() for g in grads] + [loss.detach()[None]]))
    mine = torch.stack(mine)
    everyone = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine)
    total = everyone[0][0].clone()
    for m in range(1, MICRO):
        total += everyone[m % world][m // world]
    total /= MICRO
    offset = 0
    for name, p in model.named_parameters():
        g = total[offset : offset + p.numel()].view(p.shape)
        p.grad = distribute_tensor(g, p.device_mesh, p.placements, src_data_rank=None)
        offset += p.numel()
    opt.step()
    return float(total[-1])


def train(rank, world, run_dir, phase):
    mesh = init_device_mesh("cpu", (2, 2) if world == 4 else (world,))
    model = Model(mesh, world)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, foreach=False)
    pg = dist.group.WORLD
    start = 0
    if phase == "resume":
        start, path = torch_job.latest_checkpoint(os.path.join(run_dir, "ckpt"))
        model_sd, optim_sd = get_state_dict(model, opt)
        state = savepoint.load(path, like={"model": model_sd, "optim": optim_sd}, process_group=pg)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    losses, pending = [], None
    for step in range(start + 1, torch_job.STEPS + 1):
        losses.append(train_step(model, opt, step, world, rank))
        if phase == "crash":
            torch_job.maybe_die(step)
            if step % torch_job.CKPT_EVERY == 0:
                model_sd, optim_sd = get_state_dict(model, opt)
                if pending is not None:
                    pending.wait()
                pending = savepoint.save({"model": model_sd, "optim": optim_sd, "step": step},
                                         torch_job.checkpoint_path(run_dir, step),
                                         process_group=pg, async_=True)  # fmt: skip
    digest = torch_job.digest(model.full().values())  # (a collective: every rank takes part)
    if rank == 0:
        torch_job.report(run_dir, phase, losses, digest, start)


if __name__ == "__main__":
    torch_job.main(train, "torch_dtensor")
