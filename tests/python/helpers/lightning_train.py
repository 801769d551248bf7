"""A small, deterministic lightning.Trainer run (test_lightning.py, test_cuda.py).

    lightning_train.py ROOT LOSSES --io savepoint|torch [--kill-at STEP] [--resume]
                       [--accelerator cpu|gpu] [--epochs N]

Trains an MLP (AdamW, a StepLR schedule, hyper-parameters saved) on a fixed data set, 8 batches
per epoch, in order. A ModelCheckpoint saves every epoch into ROOT ("epoch=E-step=S.ckpt", the
newest kept, plus "last.ckpt") through savepoint's plug-in (--io savepoint) or Lightning's default
TorchCheckpointIO (--io torch). After every step it appends "STEP HEX" (the loss, float.hex) to
LOSSES, flushed; --kill-at sends itself SIGKILL after that step; --resume fits with
ckpt_path="last".
"""

import argparse
import os
import signal

import lightning as L
import torch

import savepoint.lightning

BATCHES, BATCH = 8, 16


class Net(L.LightningModule):
    def __init__(self, width=32, lr=0.01):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, width), torch.nn.Tanh(), torch.nn.Linear(width, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.8)]


class Recorder(L.Callback):
    def __init__(self, path, kill_at):
        self.out = open(path, "a")
        self.kill_at = kill_at

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.out.write(f"{trainer.global_step} {outputs['loss'].item().hex()}\n")
        self.out.flush()
        if trainer.global_step == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("losses")
    p.add_argument("--io", choices=("savepoint", "torch"), required=True)
    p.add_argument("--kill-at", type=int, default=-1)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--epochs", type=int, default=6)
    a = p.parse_args()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCHES * BATCH, 8, generator=g)
    y = torch.stack([x[:, :4].sum(1), x[:, 4:].prod(1)], 1)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH)
    ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=a.root, filename="{epoch}-{step}",
                                               every_n_epochs=1, save_last=True)
    plugins = [savepoint.lightning.CheckpointIO()] if a.io == "savepoint" else []
    trainer = L.Trainer(max_epochs=a.epochs, accelerator=a.accelerator, devices=1,
                        default_root_dir=a.root, callbacks=[ckpt, Recorder(a.losses, a.kill_at)],
                        plugins=plugins, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, deterministic=True)  # fmt: skip
    trainer.fit(Net(), data, ckpt_path="last" if a.resume else None)


if __name__ == "__main__":
    main()
