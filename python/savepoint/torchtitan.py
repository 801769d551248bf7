"""savepoint as torchtitan's checkpoint backend.

    import savepoint.torchtitan

    checkpointer = savepoint.torchtitan.CheckpointManager(
        config, dataloader=..., model_parts=..., optimizers=..., lr_schedulers=..., states=...,
        sd_adapter=..., base_folder=...)            # where the trainer builds torchtitan's

`CheckpointManager` is torchtitan's DCP checkpoint manager (torchtitan.components.checkpointer.dcp)
with its checkpoints written as savepoint checkpoints: torchtitan calls `dcp.save` /
`dcp.async_save` / `dcp.load` with only a `checkpoint_id`, which savepoint.torch.install() routes to
savepoint's DCP StorageWriter and StorageReader; `step-N` folders holding a savepoint checkpoint
(a MANIFEST) count as checkpoints when the newest step is looked for. Everything else (intervals,
`keep_latest_k`, async modes, exports to Hugging Face safetensors, the folders it purges) stays
torchtitan's. DCP's own `step-N` folders of an earlier run still load.

Tested with torchtitan 0.3.0 on the CPU (tests/python/test_torchtitan.py); docs/INTEROP.md.
"""

from __future__ import annotations

import os
import re

from . import torch as _sp_torch

try:
    from torchtitan.components.checkpointer import dcp as _tt_dcp
except ImportError as e:  # pragma: no cover (the test venv has it)
    raise ImportError(f"savepoint.torchtitan needs torchtitan (pip install torchtitan): {e}") from e

_STEP = re.compile(r"^step-(\d+)$")


class CheckpointManager(_tt_dcp.CheckpointManager):
    """torchtitan's CheckpointManager, its checkpoints in savepoint (see the module's text).
    Takes torchtitan's arguments unchanged. Creating one calls savepoint.torch.install(), which
    routes every DCP call of the process that names only a checkpoint_id to savepoint."""

    def __init__(self, *args, **kwargs) -> None:
        _sp_torch.install()
        super().__init__(*args, **kwargs)

    def _find_load_step(self, folder: str = "") -> int:
        found = super()._find_load_step(folder)
        folder = folder or self.folder
        if "://" in folder or not os.path.isdir(folder):
            return found
        ours = [int(m.group(1)) for m in map(_STEP.match, os.listdir(folder))
                if m and os.path.isfile(os.path.join(folder, m.group(0), "MANIFEST"))]  # fmt: skip
        return max([found, *ours])
