"""Data-parallel (DDP-style) training with savepoint's sharded checkpoints: killed, then resumed
with another world size, bit for bit.

    python examples/torch_ddp.py [RUN_DIR]

Every rank holds the whole model and optimizer (plain tensors, replicated): savepoint.save(...,
process_group=...) writes each byte once, spread over the ranks by bytes, and rank 0 commits one
manifest. Loading needs no layout: every rank reads the whole state. Phases and check:
examples/torch_job.py.

Bit-for-bit across world sizes needs gradients summed in an order that does not depend on the
world size, which DistributedDataParallel's all-reduce does not promise. So each step's global
batch is MICRO fixed micro-batches; rank r computes the gradients of micro-batches r, r+world,
...; an all-gather (which copies, never adds) gives every rank all of them, and each rank adds
them up in micro-batch order. The checkpointing is what a DDP job does.
"""

import os

import torch
import torch.distributed as dist
import torch_job
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import savepoint

MICRO = 4  # micro-batches per step (a multiple of every world size used)


def batch(step, m):
    g = torch.Generator().manual_seed(1000 * step + m)
    x = torch.randn(8, 16, generator=g)
    return x, torch.sin(x[:, :4] * 2)


def micro_batch_grads(model, step, world, rank):
    """[(micro-batch, flat gradient, loss)] of this rank's micro-batches."""
    out = []
    for m in range(rank, MICRO, world):
        model.zero_grad()
        x, y = batch(step, m)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        flat = torch.cat([p.grad.flatten() for p in model.parameters()] + [loss.detach()[None]])
        out.append(flat)
    return torch.stack(out)


def train_step(model, opt, step, world, rank):
    mine = micro_batch_grads(model, step, world, rank)
    everyone = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine)
    total = everyone[0][0].clone()
    for m in range(1, MICRO):  # micro-batch m was computed by rank m % world
        total += everyone[m % world][m // world]
    total /= MICRO
    offset = 0
    for p in model.parameters():
        p.grad = total[offset : offset + p.numel()].view_as(p).clone()
        offset += p.numel()
    opt.step()
    return float(total[-1])


def train(rank, world, run_dir, phase):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2, foreach=False)
    pg = dist.group.WORLD
    start = 0
    if phase == "resume":
        start, path = torch_job.latest_checkpoint(os.path.join(run_dir, "ckpt"))
        model_sd, optim_sd = get_state_dict(model, opt)  # (creates the optimizer's state)
        state = savepoint.load(path, like={"model": model_sd, "optim": optim_sd}, process_group=pg)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        assert state["step"] == start
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
    if rank == 0:
        digest = torch_job.digest(model.state_dict().values())
        torch_job.report(run_dir, phase, losses, digest, start)


if __name__ == "__main__":
    torch_job.main(train, "torch_ddp")
