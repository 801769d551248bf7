"""CUDA tensors in saves and loads: which device pins the staging slabs, waiting for the
streams that wrote the tensors, and loads into GPU memory through reusable pinned buffers."""

import sys

from . import _core, _errors

_BATCH_BYTES = 256 << 20  # one pinned buffer's size (or the largest tensor's, if larger)
_ALIGN = 4096  # each tensor's place in a buffer (the reads may use direct I/O)


def checkpointer_device(cuda, who="AsyncCheckpointer"):
    """`who`(cuda=): the device whose context pins the staging slabs, or -1 for no CUDA snapshot
    copier."""
    if cuda is not None and type(cuda) is not bool:  # (not 0 or 1, which compare equal)
        raise _errors.InvalidArgumentError(f"{who}: cuda={cuda!r}: use None, True or False")
    torch = sys.modules.get("torch")
    available = torch is not None and torch.cuda.is_available()
    if cuda is False or (cuda is None and not available):
        return -1
    return torch.cuda.current_device() if available else 0  # (the core says if a driver is there)


def settle(devices):
    """Waits for the work queued on the current stream of each device: the tensors' final bytes
    before a copy on streams of its own (the snapshot copier), or the to_pinned copies queued
    there before their host bytes are read."""
    if devices:
        torch = sys.modules["torch"]
        for d in devices:
            torch.cuda.current_stream(d).synchronize()


def to_pinned(t, devices):
    """A copy of CUDA tensor `t` in page-locked host memory (torch's caching host allocator:
    reused by later copies), queued without blocking on the current stream of its device (so
    after the work queued there); the device is added to `devices`, for settle(devices) before
    the copy is read."""
    host = sys.modules["torch"].empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    devices.add(t.device)
    return host


def snapshot_to_pinned(leaves):
    """Replaces each leaf's CUDA tensor (leaf.owner) by its to_pinned copy, then waits for those
    copies once."""
    devices = set()
    for leaf in leaves:
        leaf.owner = to_pinned(leaf.owner, devices)
        leaf.address = leaf.owner.data_ptr()
    settle(devices)


def is_staged_target(target):
    """Whether a `like` target is filled through the pinned buffers: a contiguous CUDA tensor."""
    return (getattr(target, "is_cuda", False) and target.is_contiguous()
            and not target.is_conj() and not target.is_neg())  # fmt: skip


def _batches(staged, capacity):
    """(batch, bytes) of at most `capacity` bytes each; a larger tensor is a batch of its own."""
    batch, used = [], 0
    for item in staged:
        n = -(-item[1].nbytes // _ALIGN) * _ALIGN
        if batch and used + n > capacity:
            yield batch, used
            batch, used = [], 0
        batch.append(item)
        used += n
    if batch:
        yield batch, used


def load_staged(staged, read, *, batch_bytes=_BATCH_BYTES):
    """Fills the targets of `staged` [(entry name, target tensor, savepoint dtype name)] through
    two reusable host buffers (page-locked when CUDA is available) of batch_bytes each, or of the
    tensor a buffer holds when larger (a buffer grows only for such a tensor): read(specs) fills a
    batch's specs [(name, host address, dtype, target shape)] (the core's load_into or
    load_distributed), and batch k+1 is read while batch k is copied to the device on a side
    stream. Host memory stays bounded by the two buffers, not the state."""
    if not staged:
        return
    torch = sys.modules["torch"]
    pin = torch.cuda.is_available()
    buffers, pending = [None, None], [[], []]  # pending: events of the copies out of each buffer
    streams = {}
    with torch.no_grad():
        for i, (batch, used) in enumerate(_batches(staged, batch_bytes)):
            b = i % 2
            for ev in pending[b]:
                ev.synchronize()  # its previous batch has left for the device
            if buffers[b] is None or buffers[b].numel() < used:
                size = max(batch_bytes, used)
                buffers[b] = None  # (the old one goes back to torch's host cache first)
                raw = torch.empty(size + _ALIGN, dtype=torch.uint8, pin_memory=pin)
                off = -raw.data_ptr() % _ALIGN
                buffers[b] = raw[off : off + size]
            buf, specs, views, at = buffers[b], [], [], 0
            for name, target, dtype in batch:
                n = target.nbytes
                views.append((target, buf[at : at + n].view(target.dtype).view(target.shape)))
                specs.append((name, buf.data_ptr() + at, dtype, list(target.shape)))
                at += -(-n // _ALIGN) * _ALIGN
            read(specs)
            pending[b] = _copy_out(torch, views, streams)
    for s in streams.values():
        s.synchronize()


def _copy_out(torch, views, streams):
    """Copies each (target, host view) on a side stream of the target's device (non-blocking from
    page-locked memory); returns the events that mark the copies' end. CPU targets (the tests'
    stand-in for a device) are copied at once."""
    used = []
    for target, view in views:
        if not target.is_cuda:
            target.copy_(view)
            continue
        d = target.device
        s = streams.get(d)
        if s is None:
            s = streams[d] = torch.cuda.Stream(device=d)
            s.wait_stream(torch.cuda.current_stream(d))  # after the caller's work on the target
        with torch.cuda.stream(s):
            target.copy_(view, non_blocking=True)
        if s not in used:
            used.append(s)
    return [s.record_event() for s in used]
