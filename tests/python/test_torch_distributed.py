"""savepoint.save / load with process_group=: DTensor, replicated and per-rank (PerRank) state over
torch process groups (gloo on CPU, 2-4 forked processes), resharding to other meshes and world
sizes, optimizer state through torch's get_state_dict / set_state_dict, and faults: ranks that
disagree (in structure, or in the bytes of replicated tensors), a rank that dies or hangs
mid-save, impossible loads."""

import datetime
import faulthandler
import os
import pickle
import time
import traceback

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch without gloo", allow_module_level=True)

import torch.multiprocessing as mp  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import (  # noqa: E402
    DTensor,
    Partial,
    Replicate,
    Shard,
    distribute_tensor,
)

import savepoint  # noqa: E402
from savepoint import _torch_comm  # noqa: E402

# ---------------------------------------------------------------------- running ranks

_DEADLINE = 60  # seconds a test's ranks may take (their stacks are dumped 10 s before)
# The fork server imports these once; each rank is forked from it with them loaded.
mp.set_forkserver_preload(["torch", "torch.distributed", "savepoint", __name__])


def _child(rank, n, store, out_dir, fn, args):
    stacks = open(os.path.join(out_dir, f"stacks-{rank}.txt"), "w")  # (where a hung rank is)
    faulthandler.dump_traceback_later(_DEADLINE - 10, file=stacks)
    result = None
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=n,
                                timeout=datetime.timedelta(seconds=60))  # fmt: skip
        result = ("ok", fn(rank, n, *args))
    except BaseException as e:  # noqa: BLE001 (reported to the parent)
        result = ("error", type(e).__name__, str(e), traceback.format_exc())
    tmp = os.path.join(out_dir, f"result-{rank}.tmp")
    with open(tmp, "wb") as f:
        pickle.dump(result, f)
    os.rename(tmp, os.path.join(out_dir, f"result-{rank}.pkl"))  # (whole when the parent sees it)
    _torch_comm.flush_aborts()  # (what interpreter exit does)
    os._exit(0)  # no teardown: a dead or hung peer must not make this rank hang on exit


def run_ranks(tmp_path, n, fn, *args, wait_for=None, deadline=_DEADLINE):
    """Runs fn(rank, n, *args) on n ranks of a gloo group, forked by a fork server (a clean
    process with torch imported: forking this process, which may hold the locks of torch's or
    earlier tests' threads, can deadlock the children); fn must be a module-level function. Returns {rank: result} where a
    result is ("ok", value) or ("error", type name, message, traceback). Ranks not in `wait_for`
    (default: all) may die or hang: they are killed once the others reported."""
    out = tmp_path / f"ranks-{time.monotonic_ns()}"
    out.mkdir()
    ctx = mp.start_processes(_child, args=(n, str(out / "store"), str(out), fn, args), nprocs=n,
                             join=False, start_method="forkserver")  # fmt: skip
    awaited = range(n) if wait_for is None else wait_for
    end = time.monotonic() + deadline
    try:
        while not all((out / f"result-{r}.pkl").exists() for r in awaited):
            assert time.monotonic() < end, f"ranks did not finish in {deadline} s:\n" + "".join(
                f"rank {r}:\n{(out / f'stacks-{r}.txt').read_text()}" for r in awaited)
            time.sleep(0.05)
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.join(timeout=5 if wait_for is None else 0.5)
            if p.is_alive():
                p.kill()
                p.join()
    results = {}
    for r in range(n):
        f = out / f"result-{r}.pkl"
        if f.exists():
            results[r] = pickle.loads(f.read_bytes())
    return results


def values(results):
    """The ranks' return values; fails showing a rank's traceback if it raised."""
    for r, res in sorted(results.items()):
        assert res[0] == "ok", f"rank {r} raised {res[1]}: {res[2]}\n{res[3]}"
    return [results[r][1] for r in sorted(results)]


def reference(name, shape, dtype=torch.float32):
    """A deterministic global tensor for `name`."""
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    return torch.randn(shape, generator=g).to(dtype)


# ---------------------------------------------------------------------- save and reshard

# name -> (global shape, placements on a 2x2 mesh); uneven shards on purpose.
LAYOUT_2x2 = {
    "w": ((8, 6), (Shard(0), Shard(1))),
    "b": ((5,), (Replicate(), Shard(0))),
    "e": ((7, 3), (Shard(0), Shard(0))),
    "r": ((3, 2), (Replicate(), Replicate())),
    "h": ((4, 4), (Shard(1), Replicate())),
    "z": ((1, 3), (Shard(0), Replicate())),  # empty on half the ranks
}


def _state_2x2(rank, n):
    mesh = init_device_mesh("cpu", (2, 2))
    model = {k: distribute_tensor(reference(k, s), mesh, p) for k, (s, p) in LAYOUT_2x2.items()}
    model["ddp"] = reference("ddp", (4, 4)).to(torch.bfloat16)
    return {"model": model, "step": 100 + rank, "name": "run", "ints": torch.arange(6)}


def _save_2x2(rank, n, path):
    stats = savepoint.save(_state_2x2(rank, n), path, process_group=dist.group.WORLD, timeout=30)
    return stats["bytes"]


def _placement(dim, shape):
    return Replicate() if dim is None else Shard(min(dim, len(shape) - 1))


def _load_1d(rank, n, path, dim):
    mesh = init_device_mesh("cpu", (n,))
    like = {"model": {k: distribute_tensor(torch.zeros(s), mesh, [_placement(dim, s)])
                      for k, (s, _) in LAYOUT_2x2.items()}}  # fmt: skip
    like["model"]["ddp"] = torch.zeros(4, 4, dtype=torch.bfloat16)
    out = savepoint.load(path, like=like, process_group=dist.group.WORLD, timeout=30)
    for k, dt in like["model"].items():
        full = dt.full_tensor() if isinstance(dt, DTensor) else dt
        ref = reference(k, full.shape, full.dtype)
        assert torch.equal(full, ref), k
        assert out["model"][k] is dt  # filled in place and returned
    return out["step"], out["name"], sorted(out)  # "ints" is not in `like`: not read


def test_dtensor_2x2_saved_once_and_resharded(tmp_path):
    path = str(tmp_path / "ckpt")
    written = values(run_ranks(tmp_path, 4, _save_2x2, path))
    # Each replicated byte written once: the data files hold exactly the global tensors' bytes.
    total = sum(4 * np.prod(s) for s, _ in LAYOUT_2x2.values()) + 2 * 16 + 8 * 6
    assert sum(written) == total
    assert sum(1 for w in written if w > 0) >= 3  # balanced by bytes over the ranks
    # An ordinary checkpoint: one process loads whole tensors; values come from rank 0.
    whole = savepoint.load(path)
    for k, (s, _) in LAYOUT_2x2.items():
        assert torch.equal(whole["model"][k], reference(k, s)), k
    assert whole["step"] == 100 and torch.equal(whole["ints"], torch.arange(6))
    # Another world size and other placements (3 ranks: uneven everywhere).
    for n, dim in ((2, 1), (3, 0), (1, None)):
        got = values(run_ranks(tmp_path, n, _load_1d, path, dim))
        assert got == [(100, "run", ["model", "name", "step"])] * n


def _save_2x2_version(rank, n, path, version):
    state = _state_2x2(rank, n)
    return savepoint.save(state, path, process_group=dist.group.WORLD, timeout=30,
                          format_version=version)["bytes"]  # fmt: skip


def test_indexed_manifest_from_python_is_loaded_resharded(tmp_path):
    """format_version=4 reaches the distributed save (the compact indexed manifest a large job
    needs) and the checkpoint loads into other layouts, bit for bit."""
    path = str(tmp_path / "ckpt")
    values(run_ranks(tmp_path, 4, _save_2x2_version, path, 4))
    with open(os.path.join(path, "MANIFEST"), "rb") as f:
        assert int.from_bytes(f.read(12)[8:12], "little") == 4
    for n, dim in ((2, 1), (3, 0)):
        got = values(run_ranks(tmp_path, n, _load_1d, path, dim))
        assert got == [(100, "run", ["model", "name", "step"])] * n


def _save_subgroup(rank, n, path):
    from torch.distributed.device_mesh import DeviceMesh

    pg = dist.new_group([3, 1])  # group ranks: global 1 -> 0, global 3 -> 1 (sorted)
    if rank not in (1, 3):
        return None
    mesh = DeviceMesh.from_group(pg, "cpu")
    w = distribute_tensor(reference("w", (6, 4)), mesh, [Shard(1)])
    savepoint.save({"w": w, "rank": rank}, path, process_group=pg, timeout=30)
    like = {"w": distribute_tensor(torch.zeros(6, 4), mesh, [Shard(0)])}
    got = savepoint.load(path, like=like, process_group=pg, timeout=30)
    return got["rank"], torch.equal(like["w"].full_tensor(), reference("w", (6, 4)))


def test_process_group_subgroup_of_the_world(tmp_path):
    path = str(tmp_path / "ckpt")
    assert values(run_ranks(tmp_path, 4, _save_subgroup, path)) == [None, (1, True), None, (1, True)]
    assert torch.equal(savepoint.load(path)["w"], reference("w", (6, 4)))


# 16 ranks on a (dp 4, tp 4) mesh: weights split over tp and replicated over dp, optimizer-like
# state split over both (ZeRO), a tensor replicated everywhere, uneven splits; loaded by 8 ranks on
# a (2, 4) mesh with other placements. Small state: correctness beyond 8 processes (issue 33).
LAYOUT_4x4 = {
    "w": ((32, 24), (Replicate(), Shard(0))),
    "o": ((24, 32), (Replicate(), Shard(1))),
    "m": ((32, 24), (Shard(1), Shard(0))),
    "n": ((24,), (Replicate(), Replicate())),
    "u": ((13, 5), (Shard(0), Shard(1))),
}


def _save_4x4(rank, n, path):
    mesh = init_device_mesh("cpu", (4, 4))
    state = {k: distribute_tensor(reference(k, s), mesh, p) for k, (s, p) in LAYOUT_4x4.items()}
    state["step"] = 7
    return savepoint.save(state, path, process_group=dist.group.WORLD, timeout=60)["bytes"]


def _load_2x4(rank, n, path):
    mesh = init_device_mesh("cpu", (2, 4))
    like = {k: distribute_tensor(torch.zeros(s), mesh, [Shard(len(s) - 1), Shard(0)])
            for k, (s, _) in LAYOUT_4x4.items()}  # fmt: skip
    out = savepoint.load(path, like=like, process_group=dist.group.WORLD, timeout=60)
    same = [k for k, (s, _) in LAYOUT_4x4.items() if torch.equal(like[k].full_tensor(),
                                                                  reference(k, s))]  # fmt: skip
    return out["step"], same


def test_sixteen_ranks_save_once_and_reshard_to_eight(tmp_path):
    path = str(tmp_path / "ckpt")
    written = values(run_ranks(tmp_path, 16, _save_4x4, path, deadline=180))
    assert sum(written) == sum(4 * np.prod(s) for s, _ in LAYOUT_4x4.values())  # each byte once
    whole = savepoint.load(path)
    for k, (s, _) in LAYOUT_4x4.items():
        assert torch.equal(whole[k], reference(k, s)), k
    got = values(run_ranks(tmp_path, 8, _load_2x4, path, deadline=120))
    assert got == [(7, list(LAYOUT_4x4))] * 8


# ---------------------------------------------------------------------- optimizer state (FSDP2)


def _fsdp_model(n):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 5))
    fully_shard(model, mesh=init_device_mesh("cpu", (n,)))
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def _fsdp_steps(model, opt, rank, steps):
    for step in steps:
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(100 * step + rank))
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()


def _full(sd):
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v) for k, v in sd.items()}


def _fsdp_train(rank, n, path, resume):
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model, opt = _fsdp_model(n)
    if resume:
        msd, osd = get_state_dict(model, opt)
        out = savepoint.load(path, like={"model": msd, "optim": osd},
                             process_group=dist.group.WORLD)  # fmt: skip
        set_state_dict(model, opt, model_state_dict=out["model"], optim_state_dict=out["optim"])
        if resume == "check":  # another world size: the state must be what was saved
            msd, osd = get_state_dict(model, opt)
            return _full(msd), {k: _full(v) for k, v in osd["state"].items()}
    else:
        _fsdp_steps(model, opt, rank, range(2))
        msd, osd = get_state_dict(model, opt)
        savepoint.save({"model": msd, "optim": osd}, path, process_group=dist.group.WORLD)
    _fsdp_steps(model, opt, rank, range(2, 4))
    return _full(get_state_dict(model, opt)[0])


def test_fsdp2_optimizer_state_round_trips(tmp_path):
    path = str(tmp_path / "ckpt")
    uninterrupted = values(run_ranks(tmp_path, 2, _fsdp_train, path, None))[0]
    resumed = values(run_ranks(tmp_path, 2, _fsdp_train, path, "resume"))[0]
    for k, v in uninterrupted.items():
        assert torch.equal(v, resumed[k]), k  # bit for bit
    saved = savepoint.load(path)
    model, state = values(run_ranks(tmp_path, 3, _fsdp_train, path, "check"))[0]
    for k, v in model.items():
        assert torch.equal(v, saved["model"][k]), k
    for p, st in state.items():
        for k, v in st.items():
            assert torch.equal(v, saved["optim"]["state"][p][k]), (p, k)
    assert saved["optim"]["param_groups"][0]["lr"] == 0.01


# ---------------------------------------------------------------------- faults


def _save_disagreeing(rank, n, path):
    state = {"a": torch.ones(4), "step": 1, "b": torch.ones(2, 2)}
    if rank == 1:
        state["extra"] = torch.zeros(2)
    if rank == 2:
        state["a"] = torch.ones(5)
    try:
        savepoint.save(state, path, process_group=dist.group.WORLD, timeout=20)
    except savepoint.InvalidArgumentError as e:
        return str(e)
    return "saved"


def test_ranks_that_disagree_fail_before_anything_is_written(tmp_path):
    path = tmp_path / "d" / "ckpt"
    messages = values(run_ranks(tmp_path, 3, _save_disagreeing, str(path)))
    for m in messages:
        assert "nothing was written" in m
        assert "'extra' is on ranks [1] but not on ranks [0, 2]" in m
        assert "'a' is F32 [4] on ranks [0, 1], F32 [5] on ranks [2]" in m
    assert not (tmp_path / "d").exists()


def _save_with_fault(rank, n, path, victim, fault, timeout):
    if rank == victim:
        _torch_comm._test_fault = fault
    mesh = init_device_mesh("cpu", (n,))
    state = {"w": distribute_tensor(reference("w", (64, 8)), mesh, [Shard(0)]), "step": 3}
    start = time.monotonic()
    try:
        savepoint.save(state, path, process_group=dist.group.WORLD, timeout=timeout)
    except savepoint.SavepointError as e:
        return type(e).__name__, str(e), time.monotonic() - start
    return "saved", "", time.monotonic() - start


# Collectives of a save: #0 the agreement check, #1 plans to rank 0, #2 its verdict, #3 the
# checksums to rank 0 (after every rank wrote its file), #4 the result.
@pytest.mark.parametrize("victim,op", [(2, 3), (0, 2), (1, 1)])
def test_rank_dying_mid_save_commits_nothing_and_is_named(tmp_path, victim, op):
    path = tmp_path / "d" / "ckpt"
    survivors = [r for r in range(3) if r != victim]
    fault = {"op": op, "action": "exit"}
    results = run_ranks(tmp_path, 3, _save_with_fault, str(path), victim, fault, 20,
                        wait_for=survivors)  # fmt: skip
    for kind, message, seconds in values({r: results[r] for r in survivors}):
        assert kind == "SavepointIOError", message
        assert f"rank {victim} is gone" in message
        assert seconds < 10  # noticed at once, not after the timeout
    assert not path.exists()
    leftovers = [p.name for p in (tmp_path / "d").iterdir()] if (tmp_path / "d").exists() else []
    assert victim == 0 or leftovers == []  # (a dead coordinator leaves hidden debris for gc)


def test_rank_aborting_fails_every_rank_at_once(tmp_path):
    path = tmp_path / "ckpt"
    fault = {"op": 1, "action": "abort"}
    for kind, message, seconds in values(run_ranks(tmp_path, 3, _save_with_fault, str(path), 2,
                                                   fault, 20)):  # fmt: skip
        assert kind == "InternalError", message
        assert "rank 2 aborted the group: injected abort" in message
        assert seconds < 10
    assert not path.exists()


def test_rank_hanging_mid_save_times_out_naming_it(tmp_path):
    path = tmp_path / "ckpt"
    fault = {"op": 3, "action": "hang"}
    results = run_ranks(tmp_path, 3, _save_with_fault, str(path), 1, fault, 2.0, wait_for=[0, 2])
    for kind, message, seconds in values({r: results[r] for r in (0, 2)}):
        assert kind == "DeadlineExceededError", message
        assert "timed out waiting for ranks [1]" in message
        assert 1.5 < seconds < 8
    assert not path.exists()


# ---------------------------------------------------------------------- per-rank state, replicas


def _own_state(rank, seed):
    """Rank `rank`'s per-rank state: its RNG state, a loader position with every value kind and a
    rank-dependent shape, a counter (a big int on rank 1)."""
    torch.manual_seed(seed + rank)
    rng = torch.get_rng_state()
    loader = {"epoch": 2, "offset": 17 * rank, "frac": 0.1 * rank + 1e-17, "tag": bytes([rank, 0]),
              "name": f"shard-{rank}", "done": rank == 1, "seen": np.arange(rank + 1) * 3,
              "empty": torch.zeros(0, 2), "scalar": torch.tensor(rank * 1.5)}  # fmt: skip
    return {"rng": rng, "loader": loader, "counter": 2**70 + rank if rank == 1 else rank}


def _same(a, b):
    if isinstance(a, dict):
        return sorted(a) == sorted(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return type(a) is type(b) and a == b


def _save_per_rank(rank, n, path, seed):
    mesh = init_device_mesh("cpu", (n,))
    own = _own_state(rank, seed)
    state = {"w": distribute_tensor(reference("w", (6, 4)), mesh, [Shard(0)]), "step": 7,
             "rng": savepoint.PerRank(own["rng"]), "loader": savepoint.PerRank(own["loader"]),
             "counter": savepoint.PerRank(own["counter"])}  # fmt: skip
    savepoint.save(state, path, process_group=dist.group.WORLD, timeout=30)
    torch.manual_seed(12345)  # (another state: the load must bring this rank's back)
    return _load_per_rank_as(rank, n, path, "strict")


def _load_per_rank(rank, n, path, modes):
    return [_load_per_rank_as(rank, n, path, mode) for mode in modes]


def _load_per_rank_as(rank, n, path, mode):
    mesh = init_device_mesh("cpu", (n,))
    rng = torch.empty_like(torch.get_rng_state())
    like = {"w": distribute_tensor(torch.zeros(6, 4), mesh, [Shard(1)]),
            "rng": savepoint.PerRank(rng)}  # fmt: skip
    try:
        out = savepoint.load(path, like=like, process_group=dist.group.WORLD, per_rank=mode,
                             timeout=30)  # fmt: skip
    except savepoint.SavepointError as e:
        return type(e).__name__, str(e)
    assert torch.equal(like["w"].full_tensor(), reference("w", (6, 4)))
    assert out["step"] == 7
    if mode == "all":
        return [out[k] for k in ("rng", "loader", "counter")]
    assert out["rng"] is rng  # the like tensor, filled in place
    torch.set_rng_state(out["rng"])  # a valid RNG state: this rank's stream goes on
    return out["rng"], out["loader"], out["counter"], torch.rand(3)


def test_per_rank_state_round_trips_to_its_rank(tmp_path):
    seed = int.from_bytes(os.urandom(2), "little")
    print(f"seed {seed}")
    path = str(tmp_path / "ckpt")
    loaded = values(run_ranks(tmp_path, 3, _save_per_rank, path, seed))  # (and load back)
    owns = [_own_state(r, seed) for r in range(3)]
    # One process: every rank's entries under "<key>@rank<r>", as a list indexed by rank.
    listed = savepoint.info(path)
    names = {t["name"] for t in listed["tensors"]} | set(listed["values"])
    for r in range(3):
        assert {f"rng@rank{r}", f"loader@rank{r}.offset", f"loader@rank{r}.seen",
                f"counter@rank{r}"} <= names  # fmt: skip
    whole = savepoint.load(path)
    for r in range(3):
        for k in ("rng", "loader", "counter"):
            assert _same(owns[r][k], whole[k][r]), (k, r)
    # The same world size: each rank its own; its RNG stream continues where it was saved.
    for r, (rng, loader, counter, draw) in enumerate(loaded):
        assert _same(owns[r]["rng"], rng) and _same(owns[r]["loader"], loader), r
        assert counter == owns[r]["counter"]
        torch.set_rng_state(owns[r]["rng"])
        assert torch.equal(draw, torch.rand(3))
    # Another world size: refused by default, naming the key and both sizes; or by choice.
    four = values(run_ranks(tmp_path, 4, _load_per_rank, path, ["strict", "modulo", "all"]))
    for r, ((kind, message), modulo, everything) in enumerate(four):
        assert kind == "InvalidArgumentError", message
        assert "obj['rng'] was saved per rank by 3 ranks" in message
        assert "this job has 4" in message and "per_rank='modulo'" in message
        assert _same(owns[r % 3]["loader"], modulo[1]) and modulo[2] == owns[r % 3]["counter"]
        for k, listed in zip(("rng", "loader", "counter"), everything):
            assert len(listed) == 3 and all(_same(owns[r][k], listed[r]) for r in range(3)), k


def _save_replicas(rank, n, path, verify):
    torch.manual_seed(1000 + rank)
    big = torch.zeros(10 << 20)  # 40 MiB: hashed in pieces on threads
    if rank == 1:
        big[-1] = 1  # one bit of the last piece differs
    state = {"same": torch.arange(5.0), "rng": torch.get_rng_state(), "big": big,
             "half": torch.full((3,), float(rank % 2)), "np": np.ones(2),
             "tail": torch.tensor([7] * 36 + [rank == 2], dtype=torch.uint8)}  # fmt: skip
    try:
        savepoint.save(state, path, process_group=dist.group.WORLD, timeout=30,
                       verify_replicas=verify)  # fmt: skip
    except savepoint.InvalidArgumentError as e:
        return str(e)
    return "saved"


def test_replicated_tensors_that_differ_fail_naming_key_and_ranks(tmp_path):
    path = tmp_path / "d" / "ckpt"
    for m in values(run_ranks(tmp_path, 3, _save_replicas, str(path), True)):
        assert "nothing was written" in m and "savepoint.PerRank" in m
        assert "'rng' (3 different contents: ranks [0]; ranks [1]; ranks [2])" in m
        assert "'half' (2 different contents: ranks [0, 2]; ranks [1])" in m
        assert "'big' (2 different contents: ranks [0, 2]; ranks [1])" in m
        assert "'tail' (2 different contents: ranks [0, 1]; ranks [2])" in m
        assert "'same'" not in m and "'np'" not in m
    assert not (tmp_path / "d").exists()
    assert values(run_ranks(tmp_path, 3, _save_replicas, str(path), False)) == ["saved"] * 3
    assert torch.equal(savepoint.load(path)["same"], torch.arange(5.0))


def test_replica_digest_sees_every_byte():
    from savepoint import _core

    def digest(a):
        return _core.replica_digest(a.__array_interface__["data"][0], a.nbytes)

    check = np.frombuffer(b"123456789", np.uint8)
    assert digest(check) == (0xE3069283).to_bytes(4, "little")  # standard CRC32C (ISA-L)
    base = np.arange(67, dtype=np.uint8)
    assert digest(base) == digest(base.copy())
    flipped = set()
    for i in range(base.size):  # one bit anywhere
        for bit in (0, 7):
            b = base.copy()
            b[i] ^= 1 << bit
            flipped.add(digest(b))
    assert len(flipped) == 2 * base.size and digest(base) not in flipped
    zeros = {digest(np.zeros(n, np.uint8)) for n in range(70)}  # lengths tell apart too
    assert len(zeros) == 70


def _save_bad_per_rank(rank, n, path):
    out = []
    for state in ({"a": savepoint.PerRank({"b": savepoint.PerRank(1)})},
                  savepoint.PerRank({"a": 1}),
                  {"a@rank1": 5, "a": savepoint.PerRank(rank)}):  # fmt: skip
        try:
            savepoint.save(state, path, process_group=dist.group.WORLD, timeout=30)
            out.append("saved")
        except savepoint.SavepointError as e:
            out.append(f"{type(e).__name__}: {e}")
    return out


def test_per_rank_misuse_is_refused_on_every_rank(tmp_path):
    path = tmp_path / "ckpt"
    for nested, root, clash in values(run_ranks(tmp_path, 2, _save_bad_per_rank, str(path))):
        assert "InvalidArgumentError" in nested and "a PerRank inside the PerRank" in nested
        assert "InvalidArgumentError" in root and "the whole state cannot be PerRank" in root
        assert clash == "saved"
    # A key that looks like a per-rank name keeps its name; the PerRank entry gets "~1" (the
    # usual rule for names taken twice).
    assert savepoint.load(str(path)) == {"a@rank1": 5, "a": [0, 1]}
    assert sorted(savepoint.info(str(path))["values"]) == ["a@rank0", "a@rank1", "a@rank1~1"]


# ---------------------------------------------------------------------- load errors, async


def _load_errors(rank, n, path):
    mesh = init_device_mesh("cpu", (n,))
    w = distribute_tensor(torch.zeros(8, 6), mesh, [Shard(0)])
    pg = dist.group.WORLD
    out = {}
    for what, like, kwargs in (
            ("missing", {"model": {"w": w, "nope": torch.zeros(2)}}, {}),
            ("shape", {"model": {"w": distribute_tensor(torch.zeros(8, 5), mesh, [Shard(1)])}}, {}),
            ("one rank", {"model": {"w": w, **({"nope": w} if rank == 1 else {})}}, {}),
            ("partial", {"model": {"w": DTensor.from_local(torch.zeros(8, 6), mesh, [Partial()])}},
             {})):  # fmt: skip
        try:
            savepoint.load(path, like=like, process_group=pg, **kwargs)
            out[what] = "loaded"
        except savepoint.SavepointError as e:
            out[what] = (type(e).__name__, str(e))
    got = savepoint.load(path, like={"model": {"w": w, "nope": torch.zeros(2)}}, process_group=pg,
                         strict=False)  # fmt: skip
    out["non-strict"] = sorted(got["model"]), torch.equal(w.full_tensor(), reference("w", (8, 6)))
    return out


def test_load_errors_are_clear_on_every_rank(tmp_path):
    path = str(tmp_path / "ckpt")
    values(run_ranks(tmp_path, 4, _save_2x2, path))
    for out in values(run_ranks(tmp_path, 3, _load_errors, path)):
        kind, message = out["missing"]
        assert kind == "NotFoundError" and "no tensor for like['model']['nope']" in message
        kind, message = out["shape"]
        assert kind == "InvalidArgumentError" and "like['model']['w']" in message
        assert "[8, 5]" in message and "[8, 6]" in message
        kind, message = out["one rank"]
        assert kind == "NotFoundError" and "rank 1" in message and "nope" in message
        kind, message = out["partial"]
        assert kind == "InvalidArgumentError" and "Partial" in message
        assert out["non-strict"] == (["w"], True)


def _save_async(rank, n, path):
    mesh = init_device_mesh("cpu", (n,))
    w = distribute_tensor(reference("w", (64, 8)), mesh, [Shard(0)])
    ddp = reference("ddp", (16,))
    own = torch.full((2,), rank)
    fut = savepoint.save({"w": w, "ddp": ddp, "own": savepoint.PerRank(own)}, path,
                         process_group=dist.group.WORLD, async_=True)  # fmt: skip
    with torch.no_grad():  # training goes on: the save has its own copy and its own group
        w.to_local().zero_()
        ddp.zero_()
        own.zero_()
        for _ in range(5):
            t = torch.ones(4)
            dist.all_reduce(t)
    assert fut.wait(timeout=60) and fut.done()
    return fut.result()["bytes"]


def test_async_save_snapshots_and_overlaps_training(tmp_path):
    path = str(tmp_path / "ckpt")
    assert sum(values(run_ranks(tmp_path, 2, _save_async, path))) == 4 * (64 * 8 + 16) + 2 * 16
    back = savepoint.load(path)
    assert [t.tolist() for t in back["own"]] == [[0, 0], [1, 1]]
    assert torch.equal(back["w"], reference("w", (64, 8)))
    assert torch.equal(back["ddp"], reference("ddp", (16,)))


def test_strict_false_without_process_group_skips_missing_like_entries(tmp_path):
    path = str(tmp_path / "ckpt")
    savepoint.save({"a": torch.arange(4.0)}, path)
    like = {"a": torch.zeros(4), "b": torch.ones(2)}
    with pytest.raises(savepoint.NotFoundError, match=r"like\['b'\]"):
        savepoint.load(path, like=like)
    got = savepoint.load(path, like=like, strict=False)
    assert sorted(got) == ["a"] and torch.equal(like["a"], torch.arange(4.0))
    assert torch.equal(like["b"], torch.ones(2))


def test_control_groups_on_a_torch_without_sort_ranks():
    """torch 2.11's new_group has no sort_ranks (found on the GPU machine): savepoint then relies
    on torch sorting the ranks, and refuses a group whose ranks are not in ascending order."""

    class OldDist:
        @staticmethod
        def new_group(ranks=None, timeout=None, backend=None, pg_options=None,
                      use_local_synchronization=False, group_desc=None):  # fmt: skip
            return None

    class NewDist:
        @staticmethod
        def new_group(ranks=None, sort_ranks=True):
            return None

    assert _torch_comm._keep_order(NewDist, [2, 0]) == {"sort_ranks": False}
    assert _torch_comm._keep_order(OldDist, [0, 1, 3]) == {}
    with pytest.raises(savepoint.UnimplementedError, match=r"\[2, 0\] \(not in ascending order\)"):
        _torch_comm._keep_order(OldDist, [2, 0])
