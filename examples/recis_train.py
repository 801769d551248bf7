"""A RecIS-style recommendation model checkpointed by savepoint.recis: trained by 2 workers,
killed, resumed by 3 workers, and bit-exact with a run that was never interrupted.

The model: a torch-side hash embedding (user id -> 8 floats, with a momentum slot) sharded over
the workers by RecIS's id partition (id mod 65536 in contiguous slice ranges), and a dense logistic
layer replicated on every worker. Training is written so that the numbers do not depend on the
number of workers: every worker sees the whole global batch; the owner of each example's id
computes that example's gradients; per-example dense gradients are exchanged with an all-reduce
in which each position has exactly one non-zero contributor (so the sum is exact), and every
worker adds them up in example order. Any difference in the final state is a checkpoint bug.

Checkpoints are incremental (recis.Saver(..., incremental=True)): the embedding records the ids
whose rows it created or updated in a savepoint.DirtyTracker (__savepoint_dirty__), so each
checkpoint after the first holds only the rows touched since the previous one, on a chain that a
full save restarts every few checkpoints; a resumed run loads through the chain.

    python examples/recis_train.py [--dir DIR] [--steps 60] [--interval 10] [--kill-at 35]

Runs A (2 workers, uninterrupted), B (2 workers; worker 1 SIGKILLs itself at --kill-at, after
the checkpoint at the last multiple of --interval) and C (3 workers: CheckpointManager.restore()
of B's newest checkpoint, resharded 2 -> 3, then training to the end), and compares A's and C's
final checkpoints bit for bit. Exit status 0 when they are equal.
"""

import argparse
import datetime
import os
import shutil
import signal
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import savepoint
from savepoint import recis

DIM, BATCH, LR = 8, 64, 0.05


class HashEmbedding(torch.nn.Module):
    """The rows of the ids this worker owns: ids, embedding and momentum in tensors of its own."""

    def __init__(self, rank, world):
        super().__init__()
        self.rank, self.world = rank, world
        self.ids = torch.zeros(0, dtype=torch.int64)
        self.emb = torch.zeros(0, DIM)
        self.mom = torch.zeros(0, DIM)
        self.where = {}  # id -> row
        self.dirty = savepoint.DirtyTracker()  # ids whose rows changed since the last save

    def owns(self, i):
        begin, end = savepoint.gen_slice(self.rank, self.world)
        return begin <= (i & 0xFFFF) < end

    def row(self, i):
        """The row of id i, created with a deterministic function of the id on first use."""
        r = self.where.get(i)
        if r is None:
            init = torch.sin(torch.arange(DIM, dtype=torch.float32) * 0.37 + (i % 1000) * 0.11)
            self.ids = torch.cat([self.ids, torch.tensor([i])])
            self.emb = torch.cat([self.emb, init[None] * 0.1])
            self.mom = torch.cat([self.mom, torch.zeros(1, DIM)])
            r = self.where[i] = len(self.ids) - 1
        return r

    def __savepoint_table__(self):
        return savepoint.SparseTable(self.ids, {"embedding": self.emb, "momentum": self.mom})

    def __savepoint_dirty__(self):
        return self.dirty

    def __savepoint_set_table__(self, table):
        self.ids = table.ids.clone()
        self.emb = table.slots["embedding"].clone()
        self.mom = table.slots["momentum"].clone()
        self.where = {int(i): r for r, i in enumerate(self.ids.tolist())}


class Model(torch.nn.Module):
    def __init__(self, rank, world):
        super().__init__()
        self.users = HashEmbedding(rank, world)
        self.out = torch.nn.Linear(DIM, 1)
        with torch.no_grad():
            self.out.weight.copy_(torch.linspace(-0.5, 0.5, DIM)[None])
            self.out.bias.zero_()


def batch(step):
    """The global batch of a step: (user ids, labels), the same for any number of workers."""
    g = torch.Generator().manual_seed(1000 + step)
    users = torch.randint(0, 5000, (BATCH,), generator=g) * 104729 + 7
    return users, (users % 3 == 0).float()


def train_step(model, step):
    users, labels = batch(step)
    table, w, b = model.users, model.out.weight[0].detach(), model.out.bias.detach()
    per_example = torch.zeros(BATCH, DIM + 1)  # this worker's examples' dense gradients
    touched = []
    for k, (u, y) in enumerate(zip(users.tolist(), labels.tolist())):
        if not table.owns(u):
            continue
        touched.append(u)
        r = table.row(u)
        e = table.emb[r]
        g = torch.sigmoid(e @ w + b)[0] - y
        per_example[k, :DIM], per_example[k, DIM] = g * e, g
        table.mom[r] = 0.9 * table.mom[r] + g * w
        table.emb[r] = e - LR * table.mom[r]
    table.dirty.touch(torch.tensor(touched, dtype=torch.int64))
    dist.all_reduce(per_example)  # one non-zero contributor per row: exact
    grad = per_example.sum(0)  # the same additions in the same order on every worker
    with torch.no_grad():
        model.out.weight[0] -= LR * grad[:DIM] / BATCH
        model.out.bias -= LR * grad[DIM] / BATCH


def worker(rank, world, store, out_dir, steps, interval, kill_at, resume):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))  # fmt: skip
    model = Model(rank, world)
    saver = recis.Saver(model, output_dir=out_dir, max_keep=2, incremental=True, max_chain=3,
                        max_delta_ratio=4.0)  # fmt: skip
    manager = recis.CheckpointManager(saver, interval)
    start = 0
    if resume:  # another worker count: the data position comes from the global step
        saver.load(load_conf={"exclude": ["io_state"]}, shard_id=rank)
        start = manager.global_step
    for step in range(start, steps):
        if step == kill_at and rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)  # the crash: no clean-up, no final save
        train_step(model, step)
        manager.step()  # saves ckpt_<step> every `interval` steps
    saver.save("final", rank, world)
    dist.barrier()
    dist.destroy_process_group()


def run(world, out_dir, steps, interval, kill_at=-1, resume=False):
    store = tempfile.mktemp(prefix="recis-store-")
    ctx = mp.start_processes(worker, args=(world, store, out_dir, steps, interval, kill_at, resume),
                             nprocs=world, join=False, start_method="spawn")  # fmt: skip
    for p in ctx.processes:
        p.join(timeout=120 if kill_at < 0 else 20)
    codes = []
    for p in ctx.processes:
        if p.is_alive():
            p.kill()  # (a survivor of the crash, stuck in a collective)
            p.join()
        codes.append(p.exitcode)
    return codes


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--interval", type=int, default=10)
    ap.add_argument("--kill-at", type=int, default=35)
    a = ap.parse_args()
    root = a.dir or tempfile.mkdtemp(prefix="recis-train-")
    a_dir, b_dir = os.path.join(root, "A"), os.path.join(root, "B")
    for d in (a_dir, b_dir):
        shutil.rmtree(d, ignore_errors=True)
    print(f"A: 2 workers, {a.steps} steps, checkpoint every {a.interval}")
    assert run(2, a_dir, a.steps, a.interval) == [0, 0], "run A failed"
    print(f"B: 2 workers, worker 1 SIGKILLed at step {a.kill_at}: exit codes", end=" ")
    print(run(2, b_dir, a.steps, a.interval, kill_at=a.kill_at))
    left = recis.read_checkpoint_ids(b_dir)
    depth = savepoint.sparse_chain(os.path.join(b_dir, left[-1]))[0]["depth"]
    print(f"   checkpoints left: {left} (the newest a delta chain of depth {depth})")
    print("C: 3 workers restore B's newest checkpoint (resharded 2 -> 3) and finish")
    assert run(3, b_dir, a.steps, a.interval, resume=True) == [0, 0, 0], "run C failed"
    ref = savepoint.load(os.path.join(a_dir, "final"))
    got = savepoint.load(os.path.join(b_dir, "final"))
    rows_a, rows_c = ref["sparse"]["users"], got["sparse"]["users"]
    same = (torch.equal(rows_a.ids, rows_c.ids)
            and all(torch.equal(rows_a.slots[s], rows_c.slots[s]) for s in rows_a.slots)
            and all(torch.equal(ref["dense"][k], got["dense"][k]) for k in ref["dense"])
            and int(ref["extra"]["global_step"]) == int(got["extra"]["global_step"]) == a.steps)
    print(f"{len(rows_a.ids)} embedding rows and the dense layer after {a.steps} steps: "
          f"A (never interrupted, 2 workers) vs C (killed, resumed on 3): bit-exact: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
