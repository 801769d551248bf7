"""A savepoint Communicator (include/savepoint/comm.h) over a torch process group.

The C++ distributed save calls it (python/ext/torch_distributed.cc) for its few control messages:
plan descriptors, verdicts, checksums. They travel on a gloo group of their own (control_group),
on the CPU, even when training uses NCCL, and never on the training group, so they cannot
interleave with training collectives.

Every collective is made of point-to-point messages to or from a root, so that a rank that is
missing or dead can be named (gloo's own collectives only say that something timed out):
Gather = every rank sends to the root; Broadcast = the root sends to every rank; AllGather =
Gather to rank 0 + Broadcast of the packed result; Barrier = AllGather of nothing. A message is a
frame: a header int64[4] (kind, sequence number, payload bytes, status code) on _HEADER_TAG, then
the payload on _PAYLOAD_TAG. gloo delivers the messages of one tag between two ranks in order.

Timeouts: each receive and send is waited for with what is left of the collective's timeout (on
a helper thread: see _wait). When it passes, the rank waited for is named: the root of a gather
names every rank whose message has not arrived; the others name the root. A peer whose
process died closes its connection: the error names it at once. After any error the group is
broken: this rank sends an ABORT frame carrying the error (the root to every rank, the others to
the root, which forwards it), later collectives fail at once, and a rank receiving an ABORT frame
fails with the message of the rank that sent it. A rank that never reads its messages again
(hung, or killed) is caught by the others' timeouts: nobody waits longer than its timeout.
"""

import atexit
import datetime
import re
import struct
import sys
import threading
import time

from . import _core, _errors

_HEADER_TAG = 0x5350
_PAYLOAD_TAG = 0x5351
_DATA, _ABORT = 1, 2
_ABORT_LINGER = 1.0  # seconds a failing rank waits for its ABORT frames to leave
_INTERNAL = _core.STATUS_CODES["internal"]

_ERROR_CLASS = {number: _errors._BY_CODE[name] for name, number in _core.STATUS_CODES.items()
                if name != "ok"}  # fmt: skip

# Test-only fault injection: {"op": sequence number, "action": "exit" | "hang" | "abort"}; the
# collective with that number on this rank exits the process, sleeps for an hour or aborts.
_test_fault = None


def _torch():
    import torch
    import torch.distributed as dist

    return torch, dist


class _Timeout(Exception):
    pass


class _PeerGone(Exception):
    pass


class TorchCommunicator:
    """rank, size and the four collectives over bytes with timeouts (seconds), raising
    DeadlineExceededError or another SavepointError naming the ranks; abort(). `group` is a gloo
    process group (see control_group). One thread at a time."""

    def __init__(self, group):
        torch, dist = _torch()
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self._seq = 0
        self._what = "torch communicator"
        self._broken = None  # the SavepointError that broke the group
        self._pending = []  # sends not yet waited for: (work, destination, tensor)

    @property
    def broken(self):
        """Whether a collective failed (the group's messages may then be out of step)."""
        return self._broken is not None

    # ------------------------------------------------------------------ collectives

    def barrier(self, timeout):
        self.all_gather(b"", timeout)

    def broadcast(self, data, root, timeout):
        seq, deadline = self._begin("Broadcast", root, timeout)
        if self.rank != root:
            return self._receive(root, seq, deadline)
        self._send_all([r for r in range(self.size) if r != root], data, seq, deadline)
        return bytes(data)

    def gather(self, data, root, timeout):
        """On the root, the list of every rank's bytes; elsewhere None (this rank's bytes are
        then on their way: the next collective waits for them to leave)."""
        seq, deadline = self._begin("Gather", root, timeout)
        return self._gather(data, root, seq, deadline)

    def all_gather(self, data, timeout):
        seq, deadline = self._begin("AllGather", 0, timeout)
        parts = self._gather(data, 0, seq, deadline)
        if self.rank == 0:
            packed = _pack(parts)
            self._send_all(range(1, self.size), packed, seq, deadline)
        else:
            packed = self._receive(0, seq, deadline)
            self._flush(deadline)
        return _unpack(packed, self.size, self._what)

    def close(self, timeout):
        """Waits up to `timeout` seconds for this rank's last messages to leave."""
        if self._broken is None:
            self._flush(time.monotonic() + timeout)

    def abort(self, code, message):
        """Breaks the group (never blocks): the other ranks' collectives fail with `message`."""
        cls = _ERROR_CLASS.get(code, _errors.InternalError)
        self._break(cls(f"rank {self.rank} aborted the group: {message}"), True, linger=0)

    def call(self, op, data, root, timeout):
        """The C++ side's entry point (python/ext/torch_distributed.cc): (0, "", [bytes]) or
        (status code, message, None); never raises."""
        try:
            if op == "barrier":
                self.barrier(timeout)
                return (0, "", [])
            if op == "broadcast":
                return (0, "", [self.broadcast(data, root, timeout)])
            if op == "gather":
                return (0, "", self.gather(data, root, timeout) or [])
            if op == "all_gather":
                return (0, "", self.all_gather(data, timeout))
            return (_INTERNAL, f"torch communicator: unknown operation {op!r}", None)
        except _errors.SavepointError as e:
            return (_core.STATUS_CODES.get(e.code, _INTERNAL), str(e), None)
        except BaseException as e:  # noqa: BLE001 (reported to C++, which returns it as Status)
            self._break(_errors.InternalError(f"{self._what}: {type(e).__name__}: {e}"), True)
            return (_INTERNAL, str(self._broken), None)

    # ------------------------------------------------------------------ steps

    def _begin(self, op, root, timeout):
        seq = self._seq
        self._seq += 1
        self._what = f"torch {op} #{seq} on rank {self.rank}"
        if not 0 <= root < self.size:
            raise _errors.InvalidArgumentError(f"{self._what}: root {root} of {self.size} ranks")
        if self._broken is not None:
            raise type(self._broken)(f"{self._what}: {self._broken}")
        _inject_fault(seq, self)
        deadline = time.monotonic() + timeout
        self._flush(deadline)
        return seq, deadline

    def _gather(self, data, root, seq, deadline):
        if self.rank != root:
            try:
                self._pending = self._send(root, _DATA, seq, data)
            except _PeerGone as e:
                self._fail_peer(root, e)
            return None
        others = [r for r in range(self.size) if r != root]
        frames, missing, gone, drain = {}, [], {}, None
        for r in others:
            # After a failure, the others' messages are still read for a moment (they have
            # usually been sent): their sends then complete, so they go on to their next receive
            # and get this rank's ABORT frame. (A gloo wait that times out closes the connection.)
            if (missing or gone) and drain is None:
                drain = time.monotonic() + _ABORT_LINGER
            try:
                frames[r] = self._read(r, deadline if drain is None else drain)
            except _Timeout:
                missing.append(r)
            except _PeerGone as e:
                gone[r] = e
        if gone:
            r = min(gone)
            self._fail_peer(r, gone[r])
        if missing:
            self._fail_timeout(f"timed out waiting for ranks {missing}")
        out = [b""] * self.size
        out[root] = bytes(data)
        for r in others:
            out[r] = self._check(r, frames[r], seq)
        return out

    def _send_all(self, ranks, data, seq, deadline):
        works = []
        for r in ranks:
            try:
                works += self._send(r, _DATA, seq, data)
            except _PeerGone as e:
                _abandoned.extend(works)
                self._fail_peer(r, e)
        self._wait_sends(works, deadline)

    def _flush(self, deadline):
        pending, self._pending = self._pending, []
        self._wait_sends(pending, deadline)

    def _wait_sends(self, works, deadline):
        for i, (work, dst, _) in enumerate(works):
            try:
                _wait(work, deadline)
            except (_Timeout, _PeerGone) as e:
                _abandoned.extend(works[i:])
                if isinstance(e, _Timeout):
                    self._fail_timeout(f"timed out sending to rank {dst}")
                self._fail_peer(dst, e)

    def _send(self, dst, kind, seq, payload, code=0):
        """Posts a frame to `dst`: [(work, dst, tensor)] (the tensors must outlive the works)."""
        torch, dist = _torch()
        header = torch.tensor([kind, seq, len(payload), code], dtype=torch.int64)
        tensors = [header]
        if payload:
            tensors.append(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
        works = []
        for t, tag in zip(tensors, (_HEADER_TAG, _PAYLOAD_TAG)):
            try:
                works.append((dist.isend(t, group=self.group, group_dst=dst, tag=tag), dst, t))
            except RuntimeError as e:  # gloo refuses to post on a closed connection
                raise _PeerGone(str(e)) from None
        return works

    def _read(self, src, deadline):
        """(kind, sequence number, code, payload) of the next frame from `src`; _Timeout or
        _PeerGone. Once the header is in, the payload is waited for at least _ABORT_LINGER
        seconds (it is on its way)."""
        torch, dist = _torch()
        header = torch.empty(4, dtype=torch.int64)
        _wait(_irecv(dist, header, self.group, src, _HEADER_TAG), deadline)
        kind, seq, n, code = header.tolist()
        payload = torch.empty(n, dtype=torch.uint8)
        if n:
            work = _irecv(dist, payload, self.group, src, _PAYLOAD_TAG)
            _wait(work, max(deadline, time.monotonic() + _ABORT_LINGER))
        return kind, seq, code, payload.numpy().tobytes()

    def _receive(self, src, seq, deadline):
        """The payload of data frame `seq` from `src`; failures name `src`."""
        try:
            frame = self._read(src, deadline)
        except _Timeout:
            self._fail_timeout(f"timed out waiting for rank {src}")
        except _PeerGone as e:
            self._fail_peer(src, e)
        return self._check(src, frame, seq)

    def _check(self, src, frame, seq):
        """The payload of a data frame; raises the error an ABORT frame carries (the root
        forwards it to every rank), or on a frame of another collective."""
        kind, got_seq, code, data = frame
        if kind == _ABORT:
            cls = _ERROR_CLASS.get(code, _errors.InternalError)
            self._break(cls(data.decode("utf-8", "replace")), notify=self.rank == 0)
            raise type(self._broken)(f"{self._what}: {self._broken}")
        if kind != _DATA or got_seq != seq:
            self._break(_errors.InternalError(
                f"{self._what}: rank {src} sent message #{got_seq} (kind {kind}): the ranks do "
                f"not call the same collectives in the same order"), notify=True)  # fmt: skip
            raise self._broken
        return data

    # ------------------------------------------------------------------ failures

    def _fail_timeout(self, what):
        self._break(_errors.DeadlineExceededError(f"{self._what}: {what}"), notify=True)
        raise self._broken

    def _fail_peer(self, peer, e):
        self._break(_errors.SavepointIOError(
            f"{self._what}: rank {peer} is gone (its connection closed: did the process die?): "
            f"{_first_line(e)}"), notify=True, skip=peer)  # fmt: skip
        raise self._broken

    def _break(self, error, notify, skip=None, linger=_ABORT_LINGER):
        """Marks the group broken (the first error wins); with `notify`, sends an ABORT frame
        with it to the ranks that listen to this one (the root: all; others: the root), and waits
        up to `linger` seconds for the frames to leave (a process that exits right after the
        error would otherwise take them with it)."""
        if self._broken is not None:
            return
        self._broken = error
        if not notify or self.size == 1:
            return
        peers = range(1, self.size) if self.rank == 0 else [0]
        code = _core.STATUS_CODES.get(error.code, _INTERNAL)
        works = []
        for r in peers:
            if r == skip:
                continue
            try:
                works += self._send(r, _ABORT, self._seq, str(error).encode(), code)
            except _PeerGone:
                pass  # that peer is gone too
        _abandoned.extend(works)
        if linger == 0:
            _unsent.extend(works)  # (flushed at interpreter exit: flush_aborts)
        else:
            _wait_quietly(works, time.monotonic() + linger)


_unsent = []  # ABORT frames of abort() calls, which do not wait for them: (work, dst, tensor)
# The sends of broken groups (ABORT frames, and data sends not waited for), kept for the life of
# the process: gloo may still be sending them after the waits gave up (a few per failed save).
_abandoned = []


def _wait_quietly(works, deadline):
    for work, _, _ in works:
        try:
            _wait(work, deadline)
        except (_Timeout, _PeerGone):
            pass  # that peer is gone or not listening: it will time out


@atexit.register
def flush_aborts():
    """Waits up to _ABORT_LINGER seconds for the ABORT frames of abort() calls to leave (a
    process that exits right after aborting would otherwise take them with it)."""
    works, _unsent[:] = list(_unsent), []
    _wait_quietly(works, time.monotonic() + _ABORT_LINGER)


def _wait(work, deadline):
    """Waits for a gloo send or receive until `deadline`; _Timeout or _PeerGone.

    gloo's own per-operation timeout is not used: when it fires, gloo closes every connection
    of the group on this rank, so this rank could no longer tell the others why it fails. The
    wait runs on a helper thread instead; one that outlives its deadline stays blocked (a daemon
    thread, on a group that is broken and no longer used) until the message comes or the
    process exits."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise _Timeout()
    done, failure = threading.Event(), []

    def run():
        try:
            work.wait()
        except BaseException as e:  # noqa: BLE001 (handed to the waiting thread)
            failure.append(e)
        finally:
            done.set()

    threading.Thread(target=run, name="savepoint-gloo-wait", daemon=True).start()
    if not done.wait(min(left, 1e7)):
        raise _Timeout()
    if failure:
        if "timed out" in str(failure[0]).lower():  # (the group's own timeout: 30 days)
            raise _Timeout()
        raise _PeerGone(str(failure[0]))


def _irecv(dist, tensor, group, src, tag):
    try:
        return dist.irecv(tensor, group=group, group_src=src, tag=tag)
    except RuntimeError as e:  # gloo refuses to post on a closed connection
        raise _PeerGone(str(e)) from None


def _first_line(e):
    """gloo's message without its source location and advice."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    text = re.sub(r"^\[[^\]]*\] ", "", text)
    return text.split(". This is typically")[0]


def _pack(parts):
    return b"".join(struct.pack("<Q", len(p)) + p for p in parts)


def _unpack(packed, n, what):
    out, pos = [], 0
    for _ in range(n):
        if pos + 8 > len(packed):
            raise _errors.InternalError(f"{what}: truncated all-gather result")
        (size,) = struct.unpack_from("<Q", packed, pos)
        out.append(bytes(packed[pos + 8 : pos + 8 + size]))
        pos += 8 + size
    return out


def _inject_fault(seq, comm):
    fault = _test_fault
    if fault is None or fault.get("op") != seq:
        return
    if fault["action"] == "exit":
        import os

        os._exit(17)
    if fault["action"] == "hang":
        time.sleep(3600)
    if fault["action"] == "abort":
        comm.abort(_INTERNAL, "injected abort")


# ---------------------------------------------------------------------- control groups

_groups = {}  # (ranks of the process group, purpose) -> gloo group
_GROUP_TIMEOUT = datetime.timedelta(days=30)  # gloo's own timeout: never the one that fires


def control_group(process_group, purpose="sync"):
    """The gloo group carrying savepoint's control messages for `process_group` (None: the
    default group), created on first use by every rank of it (a collective call: every member
    must reach it in the same order) and cached. `purpose` keeps separate groups apart: "sync"
    for saves on the caller's thread, "async" for background saves, so that they never
    interleave with each other (nor, being groups of their own, with training collectives)."""
    torch, dist = _torch()
    if not dist.is_available() or not dist.is_initialized():
        raise _errors.FailedPreconditionError(
            "savepoint: process_group given but torch.distributed is not initialized "
            "(call torch.distributed.init_process_group first)")  # fmt: skip
    pg = dist.group.WORLD if process_group is None else process_group
    key = (tuple(dist.get_process_group_ranks(pg)), purpose)
    g = _groups.get(key)
    if g is None:
        if not dist.is_gloo_available():
            raise _errors.UnimplementedError("savepoint: torch was built without gloo")
        # Only the members of a subgroup call this (local synchronization); for the whole world,
        # every rank does, and the group is then named as torch names groups of all ranks.
        local = len(key[0]) != dist.get_world_size()
        g = dist.new_group(ranks=list(key[0]), backend="gloo", use_local_synchronization=local,
                           group_desc=f"savepoint_{purpose}", timeout=_GROUP_TIMEOUT,
                           **_keep_order(dist, key[0]))  # fmt: skip
        _groups[key] = g
    return g


def _keep_order(dist, ranks):
    """new_group's argument keeping the group ranks in the order of `ranks` (sort_ranks=False,
    where torch has it); a torch without it sorts them, which is the same for sorted ranks."""
    import inspect

    if "sort_ranks" in inspect.signature(dist.new_group).parameters:
        return {"sort_ranks": False}
    if list(ranks) != sorted(ranks):
        raise _errors.UnimplementedError(
            f"savepoint: a process group of ranks {list(ranks)} (not in ascending order) needs "
            "a torch whose new_group takes sort_ranks; this is torch "
            f"{sys.modules['torch'].__version__}")  # fmt: skip
    return {}


def forget_control_group(ranks, purpose):
    """Drops a cached control group (after a failed collective its messages may be out of step:
    the next save creates a new one)."""
    _groups.pop((tuple(ranks), purpose), None)
