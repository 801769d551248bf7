"""`savepoint launch`: torchrun with a failover controller beside it (docs/FAILOVER.md,
"Launchers and signals").

    savepoint launch [--dump-dir DIR] [--snapshot-dir DIR] [--controller HOST:PORT]
                     [--controller-port PORT] [--heartbeat-timeout-ms MS]
                     TORCHRUN_ARGUMENTS... train.py [TRAIN_ARGUMENTS...]
    python -m savepoint.launch ...   (the same)

It starts `savepoint controller` for the job (world = nnodes x nproc-per-node, --max-restarts as
torchrun's, dumps into --dump-dir), then torchrun's elastic agent with the same arguments and
SAVEPOINT_CONTROLLER / SAVEPOINT_JOB_TOKEN in the ranks' environment, so every rank's
savepoint.failover.Agent() finds it. A SIGTERM or SIGINT to this process goes to torchrun (which
passes it to the ranks: with signals="checkpoint" they commit the current step first); the
controller and torchrun run in sessions of their own, so a Ctrl-C at the terminal reaches them
only through this process. It exits with torchrun's status (128 + N when torchrun ended by
signal N) once torchrun and the controller are done; a controller still waiting 10 s after
torchrun ended (torchrun gave up first) is ended.

The options of savepoint launch come first; everything from the first other argument on is
torchrun's. --dump-dir defaults to $SAVEPOINT_DUMP_DIR, else ./checkpoints.

Several nodes: the controller runs on one node (the first, by convention) listening on
0.0.0.0:--controller-port (default 29600); every other node names it with --controller
HOST:PORT. The job token must then be the same everywhere: set SAVEPOINT_JOB_TOKEN (at least 16
characters) on every node; on one node a random token is made when it is not set.

torchrun 2.13's restarts over gloo reuse the rendezvous store of the first generation, whose
stale addresses make the restarted process group fail to connect; savepoint launch sets
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (a store per generation) unless it is set already.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

__all__ = ["main"]

_OPTIONS = {"--dump-dir", "--snapshot-dir", "--controller", "--controller-port",
            "--heartbeat-timeout-ms"}  # fmt: skip


class LaunchError(Exception):
    """A bad command line or setting of savepoint launch (printed, exit status 2)."""


def split_arguments(argv):
    """(savepoint launch's options as a dict, torchrun's arguments): ours come first."""
    ours, i = {}, 0
    while i < len(argv):
        name, eq, value = argv[i].partition("=")
        if name not in _OPTIONS:
            break
        if not eq:
            if i + 1 >= len(argv):
                raise LaunchError(f"{name} needs a value")
            value, i = argv[i + 1], i + 1
        ours[name[2:].replace("-", "_")] = value
        i += 1
    return ours, argv[i:]


def job_shape(torchrun_args):
    """(world size, max restarts, nnodes) from torchrun's own parser."""
    from torch.distributed import run

    args = run.get_args_parser().parse_args(torchrun_args)
    low, _, high = str(args.nnodes).partition(":")
    if high and high != low:
        raise LaunchError(f"--nnodes {args.nnodes}: the controller needs a fixed number of "
                          "nodes (an elastic range changes the world size)")  # fmt: skip
    nnodes = int(low)
    nproc = run.determine_local_world_size(args.nproc_per_node)
    return nnodes * nproc, int(args.max_restarts), nnodes


def controller_command():
    """The savepoint CLI: the package's own (savepoint/_bin/savepoint), else $SAVEPOINT_CLI, else
    `savepoint` on PATH."""
    packaged = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "savepoint")
    for exe in (packaged, os.environ.get("SAVEPOINT_CLI"), shutil.which("savepoint")):
        if exe and os.access(exe, os.X_OK):
            return exe
    raise LaunchError("no savepoint command-line tool (savepoint/_bin/savepoint, $SAVEPOINT_CLI "
                      "or `savepoint` on PATH): install the package or build it")  # fmt: skip


def start_controller(opts, world, max_restarts, nnodes, env):
    """Starts `savepoint controller`; returns (process, its address)."""
    listen = f"0.0.0.0:{opts.get('controller_port', '29600')}" if nnodes > 1 else "127.0.0.1:0"
    port_file = os.path.join(tempfile.mkdtemp(prefix="savepoint-launch."), "port")
    cmd = [controller_command(), "controller", "--world", str(world), "--dir",
           opts.get("dump_dir") or os.environ.get("SAVEPOINT_DUMP_DIR", "checkpoints"),
           "--max-restarts", str(max_restarts), "--listen", listen, "--port-file", port_file]
    if "snapshot_dir" in opts:
        cmd += ["--snapshot-dir", opts["snapshot_dir"]]
    if "heartbeat_timeout_ms" in opts:
        cmd += ["--heartbeat-timeout-ms", opts["heartbeat_timeout_ms"]]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    deadline = time.monotonic() + 30
    while not (os.path.exists(port_file) and open(port_file).read().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise LaunchError("the failover controller did not start")
        time.sleep(0.01)
    port = open(port_file).read().strip()
    shutil.rmtree(os.path.dirname(port_file), ignore_errors=True)
    host = "127.0.0.1" if nnodes == 1 else _this_host()
    return proc, f"{host}:{port}"


def _this_host():
    import socket

    return socket.getfqdn()


def run(argv):
    opts, torchrun_args = split_arguments(argv)
    if not torchrun_args:
        raise LaunchError("no training script: savepoint launch [options] [torchrun arguments] "
                          "train.py [arguments]")  # fmt: skip
    world, max_restarts, nnodes = job_shape(torchrun_args)
    env = dict(os.environ)
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    if not env.get("SAVEPOINT_JOB_TOKEN"):
        if nnodes > 1:
            raise LaunchError("several nodes: set the same SAVEPOINT_JOB_TOKEN (16+ characters) "
                              "on every node")  # fmt: skip
        env["SAVEPOINT_JOB_TOKEN"] = "launch-" + secrets.token_hex(16)
    # The controller and torchrun run in sessions of their own, so that a Ctrl-C at the terminal
    # reaches this process only: it passes SIGINT / SIGTERM to torchrun (which passes them to the
    # ranks), and ends the controller itself once torchrun is done.
    procs = {"controller": None, "torchrun": None}
    caught = []

    def forward(sig, _frame):
        caught.append(sig)
        if procs["torchrun"] is not None:
            procs["torchrun"].send_signal(sig)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        if "controller" in opts:
            env["SAVEPOINT_CONTROLLER"] = opts["controller"]
        else:
            procs["controller"], env["SAVEPOINT_CONTROLLER"] = start_controller(
                opts, world, max_restarts, nnodes, env)
        if caught:
            return 128 + caught[0]
        procs["torchrun"] = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", *torchrun_args], env=env,
            start_new_session=True)  # fmt: skip
        if caught:  # a signal while torchrun started
            procs["torchrun"].send_signal(caught[0])
        code = procs["torchrun"].wait()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        end(procs["torchrun"], 0)
        end(procs["controller"], 10)  # it ends with the job; else torchrun gave up first
    return 128 - code if code < 0 else code


def end(proc, wait_s):
    """Waits up to `wait_s` for `proc` to end, then ends it (SIGTERM, then SIGKILL)."""
    if proc is None:
        return
    for stop in (None, proc.terminate, proc.kill):
        if stop is not None:
            stop()
        try:
            proc.wait(timeout=wait_s if stop is None else 5)
            return
        except subprocess.TimeoutExpired:
            pass


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    try:
        return run(argv)
    except LaunchError as e:
        print(f"savepoint launch: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
