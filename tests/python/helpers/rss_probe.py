"""Prints how much the peak RSS grows during a save of an N MiB tensor and during its load.
Usage: rss_probe.py CHECKPOINT_PATH MIB"""

import resource
import sys

import torch

import savepoint


def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


path, mib = sys.argv[1], int(sys.argv[2])
t = torch.ones(mib << 20, dtype=torch.uint8)  # touched: resident before measuring
r0 = peak()
savepoint.save({"t": t}, path)
r1 = peak()
back = savepoint.load(path)
r2 = peak()
assert torch.equal(back["t"], t)
print(r1 - r0, r2 - r1)
