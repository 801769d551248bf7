#!/usr/bin/env python3
"""Failure dumps under a real launcher: the trials behind `scripts/demo-failure --launcher
torchrun` and tests/python/test_failover_torchrun.py (docs/FAILOVER.md, "Launchers and signals").

Each trial runs examples/failover_ddp.py (4 DDP ranks over gloo, CPU) beside a separately started
`savepoint controller --max-restarts R`, and compares every rank's loss curve bit for bit with
an uninterrupted run of the same launcher:

  failures  torchrun --max-restarts 2. SIGKILL a random rank (rank 0 included) after a random
            step: torchrun SIGTERMs the survivors at once, they hold the signal back until the
            controller's dump of the last step is committed, and torchrun's restart resumes from
            it at n+1. Then the same again in the restarted generation. The third generation
            runs to the end.
  preempt   SIGTERM to torchrun itself (as Slurm or Kubernetes end a job): the ranks, with
            --signals checkpoint, commit the current step and exit within the grace; a second
            torchrun resumes from it at n+1.
  grace     the dump source sleeps past the ranks' signal budget: the survivors give up and exit
            by SIGTERM, nothing is committed (every checkpoint still verifies), and torchrun's
            restart resumes from the newest periodic checkpoint.

  measure   one kill per trial, timed from the kill to the committed dump; no resume and no
            reference run (the table in docs/FAILOVER.md; use --save-every 0 for big states).

`--launcher plain` starts the ranks as plain processes instead (no restart: one failure, and the
job is resumed by starting it again). Every failure prints one line with the time from the kill
to the committed dump:
  kill: trial T generation G rank R at step S: dump of step N committed in M ms (state X MiB)
and the run ends with:
  trials N, dumps committed D, resumed bit-exact B, torn T
"""

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "failover_ddp.py")


class TrialError(Exception):
    pass


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def read_log(path):
    """{step: loss hex} of one rank's log (missing: empty)."""
    if not os.path.exists(path):
        return {}
    out = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 4:
                out[int(parts[1])] = parts[3]
    return out


def last_step(path):
    steps = read_log(path)
    return max(steps) if steps else 0


class Job:
    """One job: a controller and a launcher (torchrun or plain processes) in directory `work`,
    logging rank r of generation g to work/loss.g.r."""

    def __init__(self, opts, work, max_restarts, extra=()):
        self.o, self.work, self.max_restarts = opts, work, max_restarts
        self.extra = list(extra)
        os.makedirs(work, exist_ok=True)
        self.ckpt = os.path.join(work, "ckpt")
        self.outcomes_path = os.path.join(work, "outcomes.jsonl")
        self.env = dict(os.environ, SAVEPOINT_JOB_TOKEN=opts.token, OMP_NUM_THREADS="1",
                        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
        self.env["PYTHONPATH"] = os.pathsep.join(
            p for p in [opts.pythonpath, os.environ.get("PYTHONPATH", "")] if p)
        self.procs = []

    def log(self, generation, rank):
        return os.path.join(self.work, f"loss.{generation}.{rank}")

    def start(self, generation=0):
        """Starts the controller and the launcher; a plain launcher's ranks are told they are
        restart `generation` (torchrun counts its own)."""
        port_file = os.path.join(self.work, "port")
        if os.path.exists(port_file):
            os.remove(port_file)
        self.ctl = subprocess.Popen(
            [self.o.cli, "controller", "--world", str(self.o.world), "--dir", self.ckpt,
             "--max-restarts", str(self.max_restarts), "--port-file", port_file, "--json"],
            stdout=open(self.outcomes_path, "a"), stderr=open(self.path("controller.log"), "a"),
            env=self.env)  # fmt: skip
        deadline = time.monotonic() + 30
        while not (os.path.exists(port_file) and open(port_file).read().strip()):
            if time.monotonic() > deadline or self.ctl.poll() is not None:
                raise TrialError("the controller did not start: " + self.path("controller.log"))
            time.sleep(0.01)
        self.env["SAVEPOINT_CONTROLLER"] = "127.0.0.1:" + open(port_file).read().strip()
        args = ["--dir", self.ckpt, "--steps", str(self.o.steps), "--save-every",
                str(self.o.save_every), "--step-ms", "10", "--state-mb", str(self.o.state_mb),
                "--loss-log", os.path.join(self.work, "loss.{generation}.{rank}"), *self.extra]
        out = open(self.path("ranks.log"), "a")
        if self.o.launcher == "torchrun":
            self.launcher = subprocess.Popen(
                [self.o.python, "-m", "torch.distributed.run", "--standalone",
                 "--nproc-per-node", str(self.o.world), "--max-restarts", str(self.max_restarts),
                 "--monitor-interval", "0.1", EXAMPLE, *args],
                stdout=out, stderr=subprocess.STDOUT, env=self.env)  # fmt: skip
            self.procs = [self.launcher]
        else:
            env = dict(self.env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                       WORLD_SIZE=str(self.o.world),
                       TORCHELASTIC_RESTART_COUNT=str(generation))  # fmt: skip
            self.procs = [subprocess.Popen([self.o.python, EXAMPLE, *args], stdout=out,
                                           stderr=subprocess.STDOUT, env=dict(env, RANK=str(r)))
                          for r in range(self.o.world)]  # fmt: skip

    def path(self, name):
        return os.path.join(self.work, name)

    def outcomes(self):
        if not os.path.exists(self.outcomes_path):
            return []
        with open(self.outcomes_path) as f:
            return [json.loads(line) for line in f if line.strip()]

    def wait_until(self, what, pred, timeout=300):
        deadline = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > deadline:
                raise TrialError(f"timed out waiting for {what} (logs in {self.work})")
            if self.ctl.poll() is not None and not pred():
                raise TrialError(f"the controller ended while waiting for {what}")
            time.sleep(0.005)

    def kill_rank(self, generation, rank, after_step):
        """SIGKILLs rank `rank` of `generation` once it logged step `after_step`; returns the
        kill's time (ns since the epoch)."""
        log = self.log(generation, rank)
        self.wait_until(f"generation {generation} rank {rank} at step {after_step}",
                        lambda: last_step(log) >= after_step)  # fmt: skip
        pid = int(open(log + ".pid").read())
        at = time.time_ns()
        os.kill(pid, signal.SIGKILL)
        return at

    def finish(self, timeout=600):
        """Waits for the launcher and the controller; returns the launcher's exit codes."""
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(timeout=timeout))
            except subprocess.TimeoutExpired:
                p.kill()
                raise TrialError(f"the launcher did not end (logs in {self.work})")
        try:
            self.ctl.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.ctl.kill()
            raise TrialError("the controller did not end")
        return codes

    def kill_all(self):
        for p in [*self.procs, getattr(self, "ctl", None)]:
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def merged_losses(job, rank, generations):
    """Every step's loss as the newest generation logged it."""
    out = {}
    for g in range(generations):
        out.update(read_log(job.log(g, rank)))
    return out


def verify_all(opts, ckpt):
    torn = 0
    for name in sorted(os.listdir(ckpt)) if os.path.isdir(ckpt) else []:
        path = os.path.join(ckpt, name)
        if os.path.isdir(path) and not name.startswith("."):
            r = subprocess.run([opts.cli, "verify", path], capture_output=True, text=True)
            if r.returncode != 0:
                torn += 1
                print(f"TORN: {path}: {r.stdout}{r.stderr}", file=sys.stderr)
    return torn


def reference(opts, work):
    """One uninterrupted run: every rank's {step: loss}."""
    job = Job(opts, os.path.join(work, "reference"), 0)
    try:
        job.start()
        codes = job.finish()
    finally:
        job.kill_all()
    ref = [read_log(job.log(0, r)) for r in range(opts.world)]
    if any(c != 0 for c in codes) or any(len(x) != opts.steps for x in ref):
        raise TrialError(f"the reference run failed (logs in {job.work})")
    return ref


def check_resumed(job, ref, generations, starts):
    """Every rank resumed generation g at starts[g] and logged the reference's losses."""
    for r in range(job.o.world):
        for g, start in starts.items():
            steps = read_log(job.log(g, r))
            if not steps or min(steps) != start:
                raise TrialError(f"generation {g} rank {r} began at step "
                                 f"{min(steps) if steps else None}, not {start}")  # fmt: skip
        if merged_losses(job, r, generations) != ref[r]:
            raise TrialError(f"rank {r}: the losses differ from the uninterrupted run")


def report_kill(t, g, victim, step, killed_ns, outcome, opts):
    commit_ns = outcome["detected_unix_ns"] + outcome["detect_to_commit_ms"] * 1e6
    ms = (commit_ns - killed_ns) / 1e6
    print(f"kill: trial {t} generation {g} rank {victim} at step {step}: dump of step "
          f"{outcome['dump_step']} committed in {ms:.0f} ms (state {opts.state_mb} MiB, "
          f"{opts.launcher})", flush=True)  # fmt: skip
    return ms


def trial_failures(opts, work, t, ref, rng):
    """Two failures in a row (one with --launcher plain), each dumped and resumed."""
    plain = opts.launcher == "plain"
    kills = 1 if plain else 2
    job = Job(opts, os.path.join(work, f"trial{t}"), 0 if plain else kills)
    dumps = 0
    starts = {}
    try:
        job.start()
        after = rng.randint(5, max(6, opts.steps // 4))
        for g in range(kills):
            victim = rng.randrange(opts.world)
            killed = job.kill_rank(g, victim, after)
            job.wait_until(f"generation {g}'s outcome", lambda: len(job.outcomes()) > g)
            out = job.outcomes()[g]  # one line per generation (per start, when plain)
            if not out["dumped"]:
                raise TrialError(f"generation {g}: no dump: {out['why_no_dump']}")
            dumps += 1
            n = out["dump_step"]
            report_kill(t, g, victim, after, killed, out, opts)
            survivors = [r for r in range(opts.world) if r != victim]
            if any(last_step(job.log(g, r)) > n for r in survivors):
                raise TrialError(f"generation {g}: a survivor went past the dump's step {n}")
            starts[g + 1] = n + 1
            if plain:
                job.finish()
                job.start(g + 1)  # a plain launcher's restart: the same command again
            after = n + rng.randint(4, 10)
        codes = job.finish()
        if any(c != 0 for c in codes):
            raise TrialError(f"the launcher ended with {codes} (logs in {job.work})")
        check_resumed(job, ref, kills + 1, starts)
    finally:
        job.kill_all()
    return dumps, verify_all(opts, job.ckpt)


def trial_preempt(opts, work, t, ref, rng):
    """SIGTERM to the launcher: a checkpoint of the current step, then a resumed run."""
    # 50 ms steps (the losses do not depend on them): the ranks ask for the checkpoint after the
    # agents' 0.5 s settle time, and the job must still be running then.
    job = Job(opts, os.path.join(work, f"preempt{t}"), 0,
              ["--on-signal", "checkpoint", "--step-ms", "50"])  # fmt: skip
    try:
        job.start()
        after = rng.randint(5, opts.steps // 2)
        job.wait_until("step " + str(after), lambda: last_step(job.log(0, 0)) >= after)
        t0 = time.monotonic()
        job.procs[0].send_signal(signal.SIGTERM)  # torchrun SIGTERMs every rank at once
        job.finish()
        took = time.monotonic() - t0
        (out,) = job.outcomes()
        if not (out["preempted"] and out["dumped"]):
            raise TrialError(f"no preemption checkpoint: {out}")
        n = out["dump_step"]
        print(f"preempt: trial {t}: SIGTERM at step {after}: checkpoint of step {n}, every rank "
              f"gone in {took:.1f} s", flush=True)  # fmt: skip
        if took > 25:
            raise TrialError(f"the ranks took {took:.1f} s to go (grace 30 s)")
        # Slurm requeues the job: the same command again, generation 0 again.
        os.rename(job.log(0, 0), job.log(0, 0) + ".before")
        for r in range(1, opts.world):
            os.rename(job.log(0, r), job.log(0, r) + ".before")
        job.start()
        if any(c != 0 for c in job.finish()):
            raise TrialError(f"the resumed run failed (logs in {job.work})")
        for r in range(opts.world):
            before = read_log(job.log(0, r) + ".before")
            after_steps = read_log(job.log(0, r))
            if min(after_steps) != n + 1 or {**before, **after_steps} != ref[r]:
                raise TrialError(f"rank {r}: not resumed bit-exact at step {n + 1}")
    finally:
        job.kill_all()
    return 1, verify_all(opts, job.ckpt)


def trial_grace(opts, work, t, ref, rng):
    """A dump slower than the budget: given up, nothing committed, resumed from the newest
    periodic checkpoint."""
    job = Job(opts, os.path.join(work, f"grace{t}"), 1,
              ["--dump-delay", "4", "--signal-budget", "1"])  # fmt: skip
    try:
        job.start()
        after = opts.save_every + rng.randint(3, 8)
        victim = rng.randrange(opts.world)
        job.kill_rank(0, victim, after)
        job.wait_until("the outcome", lambda: len(job.outcomes()) > 0)
        out = job.outcomes()[0]
        if out["dumped"]:
            raise TrialError("the dump committed although it outlasted the budget")
        if any(c != 0 for c in job.finish()):
            raise TrialError(f"the restarted run failed (logs in {job.work})")
        print(f"grace: trial {t}: rank {victim} killed at step {after}: no dump "
              f"({out['why_no_dump']}); resumed from step {opts.save_every}", flush=True)
        if any(n.endswith("_failover") for n in os.listdir(job.ckpt)):
            raise TrialError("a dump directory was left")
        check_resumed(job, ref, 2, {1: opts.save_every + 1})
    finally:
        job.kill_all()
    return 0, verify_all(opts, job.ckpt)


def dd_reference(opts, work):
    """The physical reference of a dump: dd writing one rank's state with O_DIRECT and fsync
    into the same file system."""
    path = os.path.join(work, "dd.out")
    t0 = time.monotonic()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=4M",
                    f"count={max(1, opts.state_mb // 4)}", "oflag=direct", "conv=fsync"],
                   check=True, capture_output=True)  # fmt: skip
    print(f"dd: {opts.state_mb} MiB written in {(time.monotonic() - t0) * 1000:.0f} ms",
          flush=True)  # fmt: skip
    os.remove(path)


def trial_measure(opts, work, t, ref, rng):
    """One kill, timed to the committed dump; the job is then ended (no resume, no reference)."""
    job = Job(opts, os.path.join(work, f"measure{t}"), 0)
    try:
        job.start()
        victim, after = rng.randrange(opts.world), rng.randint(5, 15)
        killed = job.kill_rank(0, victim, after)
        job.wait_until("the outcome", lambda: len(job.outcomes()) > 0)
        out = job.outcomes()[0]
        if not out["dumped"]:
            raise TrialError(f"no dump: {out['why_no_dump']}")
        report_kill(t, 0, victim, after, killed, out, opts)
        job.finish()
    finally:
        job.kill_all()
    return 1, verify_all(opts, job.ckpt)


TRIALS = {"failures": trial_failures, "preempt": trial_preempt, "grace": trial_grace,
          "measure": trial_measure}  # fmt: skip


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cli", required=True, help="the savepoint CLI")
    p.add_argument("--python", default=sys.executable, help="the Python that has torch")
    p.add_argument("--pythonpath", default="", help="where the savepoint package is")
    p.add_argument("--launcher", choices=["torchrun", "plain"], default="torchrun")
    p.add_argument("--trials", type=int, default=1)
    p.add_argument("--kinds", default="failures",
                   help="comma-separated: failures,preempt,grace; or measure (kill timings only)")
    p.add_argument("--state-mb", type=int, default=16)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--save-every", type=int, default=25)
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    opts = p.parse_args(argv)
    opts.token = "trial-" + os.urandom(12).hex()
    seed = opts.seed if opts.seed is not None else random.randrange(1 << 30)
    print(f"failover trials: seed {seed}, launcher {opts.launcher}, {opts.world} ranks, "
          f"{opts.state_mb} MiB of state per rank", flush=True)  # fmt: skip
    rng = random.Random(seed)
    work = tempfile.mkdtemp(prefix="savepoint-trials.")
    kinds = opts.kinds.split(",")
    dumps = exact = torn = failed = 0
    try:
        ref = None if kinds == ["measure"] else reference(opts, work)
        if "measure" in kinds:
            dd_reference(opts, work)
        for t in range(1, opts.trials + 1):
            for kind in kinds:
                before = set(os.listdir(work))
                try:
                    d, bad = TRIALS[kind](opts, work, t, ref, rng)
                    dumps, torn = dumps + d, torn + bad
                    exact += kind != "measure"  # (measure resumes nothing)
                    passed = bad == 0
                except TrialError as e:
                    failed += 1
                    passed = False
                    print(f"{kind} trial {t} FAILED: {e}", flush=True)
                if not opts.keep:  # a trial's checkpoints take GiBs: a failed one keeps its logs
                    for name in set(os.listdir(work)) - before:
                        sub = os.path.join(work, name, "ckpt") if not passed else ""
                        subprocess.run(["rm", "-rf", sub or os.path.join(work, name)])
    finally:
        if opts.keep or failed:
            print("work directory:", work)
        else:
            subprocess.run(["rm", "-rf", work])
    n = opts.trials * len(kinds)
    print(f"trials {n}, dumps committed {dumps}, resumed bit-exact {exact}, torn {torn}",
          flush=True)
    return 0 if failed == 0 and torn == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
