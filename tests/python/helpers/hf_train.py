"""A small, deterministic transformers.Trainer run (test_hf.py).

    hf_train.py OUT LOSSES --trainer savepoint|plain [--kill-at STEP] [--term-at STEP] [--resume]

Trains a tiny GPT-2 built from a config (2 layers, 32 wide, dropout on; no download) for 24 steps
on a fixed random data set (shuffled by the Trainer's seeded sampler), saving every 6 steps into
OUT (`save_total_limit=2`). After every step it appends "STEP HEX" (the loss, float.hex) to
LOSSES, flushed. --kill-at sends itself SIGKILL after that step; --term-at sends itself SIGTERM
(savepoint.hf.SaveOnSignal saves and stops); --resume trains with resume_from_checkpoint=True.
"""

import argparse
import os
import signal
import warnings

import torch
import transformers

import savepoint.hf


class Data(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, 128, (64, 16), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _recorder(base, losses, kill_at, term_at):
    class Recording(base):
        def compute_loss(self, model, inputs, *args, **kwargs):
            loss = super().compute_loss(model, inputs, *args, **kwargs)
            if model.training:
                step = self.state.global_step + 1
                with open(losses, "a") as f:
                    f.write(f"{step} {loss.item().hex()}\n")
                if step == term_at:
                    os.kill(os.getpid(), signal.SIGTERM)
            return loss

        def training_step(self, *args, **kwargs):
            out = super().training_step(*args, **kwargs)
            if self.state.global_step + 1 == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return out

    return Recording


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("losses")
    p.add_argument("--trainer", choices=("savepoint", "plain"), required=True)
    p.add_argument("--kill-at", type=int, default=-1)
    p.add_argument("--term-at", type=int, default=-1)
    p.add_argument("--resume", action="store_true")
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    transformers.set_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128,
                                     n_positions=16)  # fmt: skip
    model = transformers.GPT2LMHeadModel(config)
    args = transformers.TrainingArguments(
        output_dir=a.out, max_steps=24, per_device_train_batch_size=4, save_steps=6,
        save_total_limit=2, logging_steps=100, report_to=[], seed=0, use_cpu=True,
        dataloader_num_workers=0, disable_tqdm=True, learning_rate=1e-3)  # fmt: skip
    base = savepoint.hf.Trainer if a.trainer == "savepoint" else transformers.Trainer
    trainer = _recorder(base, a.losses, a.kill_at, a.term_at)(
        model=model, args=args, train_dataset=Data(), callbacks=[savepoint.hf.SaveOnSignal()])
    trainer.train(resume_from_checkpoint=True if a.resume else None)


if __name__ == "__main__":
    main()
