"""Tables, plot and summary line of `scripts/bench --scale` (docs/PERFORMANCE.md, "Scale").

    scale_report.py SAVEPOINT_JSONL DCP_JSONL CONTROLLER_JSONL PNG [SAVEPOINT_V2_JSONL
                    [SAVEPOINT_V3_JSONL]]

Reads the JSON lines of bench/scale_bench.cc (format version 4, and optionally versions 2 and 3),
bench/scale_dcp.py and bench/controller_scale_bench.cc (any may be empty), prints one table each,
writes the curves (coordination time, of a first save and of a save of the same layout again,
coordinator memory, manifest size, one rank's load planning against the rank count: savepoint with
each manifest, and DCP) as a PNG, and ends with the `scale:` line of the largest version 4 run
(its first save).
"""

import json
import sys


def rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.startswith("{")]


def table(title, data, cols):
    print(f"\n{title}")
    print("  ".join(f"{c:>{w}}" for c, w, _ in cols))
    for r in data:
        cells = []
        for c, w, fmt in cols:
            v = r.get(c)
            cells.append(f"{'-' if v is None else format(v, fmt):>{w}}")
        print("  ".join(cells))


def plot(sp, sp2, sp3, dcp, png):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(2, 2, figsize=(11, 8))
    ok = [r for r in sp if not r.get("error")]
    ok2 = [r for r in sp2 if not r.get("error")]
    ok3 = [r for r in sp3 if not r.get("error")]
    v4, v3 = "savepoint (format 4)", "savepoint (format 3)"
    v2 = "savepoint (format 2, JSON)"
    panels = [
        (ax[0][0], "coordination of one save (s)", [(v4, ok, "coordinate_s", 1),
                                                    (v4 + ", same layout again", ok,
                                                     "repeat_coordinate_s", 1),
                                                    ("dd of the v4 MANIFEST's bytes", ok,
                                                     "manifest_dd_s", 1),
                                                    (v3, ok3, "coordinate_s", 1),
                                                    (v2, ok2, "coordinate_s", 1),
                                                    ("DCP", dcp, "coordinate_s", 1)]),
        (ax[0][1], "coordinator memory (MiB)", [(v4 + " peak", sp, "coordinator_peak_mib", 1),
                                                (v3 + " peak", sp3, "coordinator_peak_mib", 1),
                                                (v2 + " peak", sp2, "coordinator_peak_mib", 1),
                                                ("DCP peak growth", dcp,
                                                 "coordinator_peak_growth_mib", 1)]),
        (ax[1][0], "manifest / metadata (MiB)", [(v4, ok, "manifest_bytes", 1 / 2**20),
                                                 (v3, ok3, "manifest_bytes", 1 / 2**20),
                                                 (v2, ok2, "manifest_bytes", 1 / 2**20),
                                                 ("DCP .metadata", dcp, "metadata_bytes",
                                                  1 / 2**20)]),
        (ax[1][1], "one rank's load planning (ms)", [(v4, ok, "load_plan_ms", 1),
                                                     (v3, ok3, "load_plan_ms", 1),
                                                     (v2, ok2, "load_plan_ms", 1),
                                                     ("DCP", dcp, "load_plan_ms", 1)]),
    ]
    for a, title, series in panels:
        for label, data, key, scale in series:
            pts = [(r["ranks"], r[key] * scale) for r in data if r.get(key)]  # (log axes)
            if pts:
                a.plot(*zip(*pts), marker="o", label=label)
        a.set_xscale("log", base=2)
        a.set_yscale("log")
        a.set_xlabel("ranks")
        a.set_title(title)
        a.grid(True, which="both", alpha=0.3)
        a.legend()
    fig.suptitle("70B layout, TP 8 x PP 8 x DP N/64; load into TP 4, N/2 ranks")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"\nplot: {png}")


def main(argv):
    sp, dcp, ctl = rows(argv[1]), rows(argv[2]), rows(argv[3])
    sp2 = rows(argv[5]) if len(argv) > 5 else []
    sp3 = rows(argv[6]) if len(argv) > 6 else []
    cols = [("ranks", 6, "d"), ("entries", 9, "d"), ("plan_bytes", 11, "d"),
            ("rank_plan_ms_mean", 9, ".2f"), ("decide_s", 8, ".2f"), ("commit_s", 8, ".2f"),
            ("coordinate_s", 12, ".2f"), ("repeat_coordinate_s", 12, ".2f"),
            ("manifest_dd_s", 13, ".2f"), ("coordinator_peak_mib", 8, ".0f"),
            ("manifest_bytes", 12, "d"),
            ("load_plan_ms", 10, ".1f"), ("error", 5, "")]
    table("savepoint, format version 4 (bench/scale_bench)", sp, cols)
    if sp3:
        table("savepoint, format version 3 (bench/scale_bench --format-version 3)", sp3, cols)
    if sp2:
        table("savepoint, format version 2 (bench/scale_bench --format-version 2)", sp2, cols)
    table("PyTorch DCP default planners (bench/scale_dcp.py)", dcp, [
        ("ranks", 6, "d"), ("plan_bytes", 11, "d"), ("rank_plan_ms_mean", 9, ".2f"),
        ("coordinate_s", 12, ".2f"), ("coordinator_peak_growth_mib", 8, ".0f"),
        ("metadata_bytes", 12, "d"), ("load_plan_ms", 10, ".1f")])
    table("failover controller (bench/controller_scale_bench)", ctl, [
        ("agents", 6, "d"), ("kill", 5, ""), ("connect_s", 9, ".2f"),
        ("controller_cores", 9, ".3f"), ("controller_rss_mib", 9, ".1f"), ("detect_ms", 9, ".0f"),
        ("stopped_ranks", 7, "d")])
    if sp or dcp:
        try:
            plot(sp, sp2, sp3, dcp, argv[4])
        except ImportError:
            print("\nplot: matplotlib is missing (scripts/bench --scale installs it)")
    if sp:
        last = sp[-1]
        d = next((r for r in dcp if r["ranks"] == last["ranks"]), dcp[-1] if dcp else None)
        dcp_part = "not run" if d is None else f"{d['coordinate_s']:.2f} s" + (
            "" if d["ranks"] == last["ranks"] else f" (at {d['ranks']} ranks)")
        failed = "-" if last.get("error") else None
        manifest = failed or f"{last['manifest_bytes'] / 2**20:.1f}"
        load = failed or f"{last['load_plan_ms']:.1f}"
        err = f" (save failed: {last['error']})" if failed else ""
        print(f"\nscale: ranks {last['ranks']}, coordinate {last['coordinate_s']:.2f} s, "
              f"coordinator peak {last['coordinator_peak_mib']:.0f} MiB, manifest {manifest} MiB, "
              f"rank load plan {load} ms, dcp coordinate {dcp_part}{err}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
