"""torchtitan's CheckpointManager writing and reading savepoint checkpoints (test_torchtitan.py).

    torchtitan_ckpt.py ROOT ASYNC_MODE

One gloo rank. Trains a small MLP 6 steps with torchtitan's OptimizersContainer (AdamW) and
LRSchedulersContainer, letting savepoint.torchtitan.CheckpointManager (torchtitan's) save every
2 steps (ASYNC_MODE: torchtitan's "disabled" or "async"), then builds everything again, loads the
newest checkpoint through a new CheckpointManager and checks that the model, the optimizer state
and the schedule came back equal. Prints "ok" and the checkpoint folders.
"""

import os
import sys
import tempfile

import torch
import torch.distributed as dist
from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer
from torchtitan.components.optimizer.optimizer import OptimizersContainer, ParamGroupConfig

from savepoint.torchtitan import CheckpointManager


def build(root, async_mode):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    groups = [ParamGroupConfig(pattern=".*", optimizer_name="AdamW",
                               optimizer_kwargs={"lr": 1e-2})]  # fmt: skip
    opt = OptimizersContainer(OptimizersContainer.Config(param_groups=groups,
                                                         implementation="for-loop"),
                              model_parts=[model])  # fmt: skip
    sched = LRSchedulersContainer(opt, lambda step: 1.0 / (1 + step))
    config = CheckpointManager.Config(enable=True, folder="ckpt", interval=2, keep_latest_k=0,
                                      last_save_model_only=False,
                                      async_mode=async_mode)  # fmt: skip
    manager = CheckpointManager(config, dataloader=None, model_parts=[model], optimizers=opt,
                                lr_schedulers=sched, states={}, sd_adapter=None,
                                base_folder=root)  # fmt: skip
    return model, opt, sched, manager


def main():
    root, async_mode = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0,
                            world_size=1)  # fmt: skip
    model, opt, sched, manager = build(root, async_mode)
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
    for step in range(1, 7):
        model(x).square().mean().backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        manager.save(step, last_step=step == 6)
    manager.maybe_wait_for_saving()
    want_model = {k: v.clone() for k, v in model.state_dict().items()}
    want_opt = opt.state_dict()
    want_lr = sched.schedulers[0].last_epoch
    manager.close()

    model2, opt2, sched2, manager2 = build(root, async_mode)
    assert manager2.load(step=-1), "torchtitan found no checkpoint to load"
    for k, v in model2.state_dict().items():
        assert torch.equal(v, want_model[k]), k
    got = opt2.state_dict()
    assert got.keys() == want_opt.keys()
    for k in got:
        a, b = got[k], want_opt[k]
        assert (torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b), k
    assert sched2.schedulers[0].last_epoch == want_lr
    manager2.close()
    dist.destroy_process_group()
    print("ok", sorted(os.listdir(os.path.join(root, "ckpt"))))


if __name__ == "__main__":
    main()
