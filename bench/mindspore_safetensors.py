#!/usr/bin/env python3
"""MindSpore's safetensors flavour: what crc_num costs savepoint (save with crc_check, load that
verifies it) against the same files without it, next to MindSpore's own save_checkpoint /
load_checkpoint(format="safetensors") and `dd` of as many bytes.

    build/ms-venv/bin/python bench/mindspore_safetensors.py [--gib 2] [--dir build/bench-st]
        [--trials 3] [--warm]   (PYTHONPATH=build/python; the MindSpore venv: scripts/msvenv)

The state is bench/mindspore_ckpt.py's. Saves are durable when their time stops; loads are cold
(bench_util.evict) unless --warm (the file stays in the page cache: the CPU cost of the CRC
shows). Each trial runs the contenders in a rotated order; loads are checked, untimed.
"""

import os

import mindspore as ms
from bench_util import COLD, dd
from mindspore_ckpt import MIB, arg_parser, make_state, ms_load, ms_save, print_table, run_trials

from savepoint import mindspore as spms

ST = {"format": "safetensors"}


def main():
    ap = arg_parser("build/bench-st")
    ap.add_argument("--warm", action="store_true", help="loads from the page cache")
    args = ap.parse_args()
    ms.set_context(device_target="CPU")
    os.makedirs(args.dir, exist_ok=True)
    arrays, nbytes = make_state(int(args.gib * (1 << 30)))
    contenders = {
        "dd direct": (lambda p: dd(["if=/dev/zero", f"of={p}", "bs=1M", f"count={nbytes // MIB}",
                                    "oflag=direct", "conv=fsync"]),
                      lambda p: dd([f"if={p}", "of=/dev/null", "bs=1M", "iflag=direct"])),
        "sp": (lambda p: spms.save_checkpoint(arrays, p, **ST),
               lambda p: spms.load_checkpoint(p, crc_check=False, **ST)),
        "sp crc": (lambda p: spms.save_checkpoint(arrays, p, crc_check=True, **ST),
                   lambda p: spms.load_checkpoint(p, crc_check=True, **ST)),
        "MS": (lambda p: ms_save(arrays, p, **ST), lambda p: ms_load(p, **ST)),
        "MS crc": (lambda p: ms_save(arrays, p, crc_check=True, **ST),
                   lambda p: ms_load(p, crc_check=True, **ST)),
    }  # fmt: skip
    if args.no_mindspore:
        del contenders["MS"], contenders["MS crc"]
    def path_of(name):
        return os.path.join(args.dir, name.replace(" ", "-") + ".safetensors")

    res = run_trials(contenders, arrays, args.trials, path_of, cold=not args.warm)
    reads = "warm (page cache)" if args.warm else f"cold ({COLD['method']})"
    print(f"{nbytes / 2**30:.2f} GiB in {len(arrays)} arrays; median of {args.trials} trials; "
          f"reads {reads}")  # fmt: skip
    print_table(res, nbytes, "sp")

if __name__ == "__main__":
    main()
