#!/usr/bin/env python3
"""Issue #8 figures for one packed model: regret of `estream profile`'s choice against the
`estream sweep` oracle, profiling + selection time against sweep time, re-solve time.

Usage: scripts/config_figures.py MODEL.packed.gguf BUDGET [BUDGET ...] [--out DIR] [-t N]
       [--sweep-args "--queue-depths 1,4,16"] [--repeat 3] [--skip-calibration] [--reuse-sweeps]

Steps (everything is run through the `estream` binary, build/tools/estream/estream by default):
  1. `estream profile MODEL --budget B1 --recalibrate --refresh-disk --json` (the full cost: disk
     characterisation, one calibration request per group size, selection, storing), unless
     --skip-calibration; then `estream profile MODEL --budget Bi --json` for every budget (re-solve
     from the stored profile).
  2. `estream sweep MODEL --budget Bi --json` (the exhaustive oracle) for every budget.
  3. Noise control: the sweep measures each point once. The chosen point and the sweep's best
     point are measured again, alternated, `--repeat` times each (`estream sweep` restricted to
     one point), and regret = median(chosen) / median(best) - 1 from those medians. The raw
     regret from the sweep's single measurements is reported beside it.
Writes DIR/summary.json and prints a Markdown table.
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time


def run_json(cmd):
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wall = time.time() - t0
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr.strip()}")
    return json.loads(p.stdout[p.stdout.index("{"):]), wall


def point_key(p):
    return (p["group_size"], p["banks"], p["queue_depth"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("budgets", nargs="+")
    ap.add_argument("--out", default="config-figures")
    ap.add_argument("--estream", default="build/tools/estream/estream")
    ap.add_argument("-t", "--threads", default="2")
    ap.add_argument("--sweep-args", default="")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-calibration", action="store_true")
    ap.add_argument("--reuse-sweeps", action="store_true", help="use DIR/sweep-BUDGET.json where it exists")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    es = [a.estream]
    common = ["-t", a.threads]
    summary = {"model": a.model, "budgets": []}

    calib = None
    if not a.skip_calibration:
        print(f"profile (calibrate) at {a.budgets[0]} ...", file=sys.stderr, flush=True)
        calib, wall = run_json(es + ["profile", a.model, "--budget", a.budgets[0], "--recalibrate", "--refresh-disk",
                                     "--json"] + common)
        calib["command_wall_seconds"] = wall
        json.dump(calib, open(os.path.join(a.out, "profile-calibrate.json"), "w"), indent=2)
        summary["calibration"] = {k: calib.get(k) for k in ("profile_seconds", "disk_seconds", "calibration_seconds",
                                                             "solve_seconds", "store_seconds", "disk")}
        summary["calibration"]["command_wall_seconds"] = wall

    for b in a.budgets:
        print(f"profile (re-solve) at {b} ...", file=sys.stderr, flush=True)
        prof, prof_wall = run_json(es + ["profile", a.model, "--budget", b, "--json"] + common)
        json.dump(prof, open(os.path.join(a.out, f"profile-{b}.json"), "w"), indent=2)
        print(f"sweep at {b} ...", file=sys.stderr, flush=True)
        sweep_path = os.path.join(a.out, f"sweep-{b}.json")
        if a.reuse_sweeps and os.path.exists(sweep_path):
            sweep = json.load(open(sweep_path))
        else:
            sweep, _ = run_json(es + ["sweep", a.model, "--budget", b, "--json"] + common + shlex.split(a.sweep_args))
            json.dump(sweep, open(sweep_path, "w"), indent=2)
        chosen = point_key(prof)
        best = point_key(sweep["best"])
        by_key = {point_key(r): r for r in sweep["results"]}
        raw = None
        if chosen in by_key:
            raw = by_key[chosen]["seconds"] / sweep["best"]["seconds"] - 1
        # Alternated re-measurement of the chosen and the best point.
        meas = {chosen: [], best: []}
        for _ in range(a.repeat):
            for k in ([chosen, best] if chosen != best else [chosen]):
                r, _ = run_json(es + ["sweep", a.model, "--budget", b, "--groups", str(k[0]), "--banks", str(k[1]),
                                      "--queue-depths", str(k[2]), "--json"] + common)
                if not r["results"]:
                    sys.exit(f"point {k} did not run at budget {b}")
                meas[k].append(r["results"][0]["seconds"])
                meas[k + ("rss",)] = max(meas.get(k + ("rss",), 0), r["results"][0]["peak_rss_bytes"])
        med = {k: statistics.median(meas[k]) for k in (chosen, best)}
        row = {
            "budget": b, "budget_bytes": prof["budget_bytes"],
            "chosen": dict(zip(("group_size", "banks", "queue_depth"), chosen)),
            "predicted_seconds": prof["predicted_seconds"],
            "sweep_best": dict(zip(("group_size", "banks", "queue_depth"), best)),
            "sweep_points": len(sweep["results"]), "sweep_skipped": sweep.get("skipped", 0),
            "sweep_seconds": sweep["sweep_seconds"], "sweep_min_seconds": sweep["best"]["seconds"],
            "raw_regret": raw,
            "chosen_seconds": meas[chosen], "best_seconds": meas[best],
            "regret": med[chosen] / med[best] - 1,
            "chosen_peak_rss_bytes": meas[chosen + ("rss",)],
            "resolve_command_seconds": prof_wall, "solve_seconds": prof["solve_seconds"],
            "over_budget_points": sum(1 for r in sweep["results"] if r.get("over_budget")),
        }
        summary["budgets"].append(row)
        json.dump(summary, open(os.path.join(a.out, "summary.json"), "w"), indent=2)

    print("| budget | chosen G/B/Q | predicted s | measured s (median) | sweep best G/B/Q | best s (median) | regret |"
          " raw regret | sweep points | sweep s | chosen peak RSS |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in summary["budgets"]:
        c, s = r["chosen"], r["sweep_best"]
        raw = "-" if r["raw_regret"] is None else f"{100 * r['raw_regret']:+.1f}%"
        print(f"| {r['budget']} | {c['group_size']}/{c['banks']}/{c['queue_depth']} | {r['predicted_seconds']:.2f} | "
              f"{statistics.median(r['chosen_seconds']):.2f} | {s['group_size']}/{s['banks']}/{s['queue_depth']} | "
              f"{statistics.median(r['best_seconds']):.2f} | {100 * r['regret']:+.1f}% | "
              f"{raw} | {r['sweep_points']} | "
              f"{r['sweep_seconds']:.0f} | {r['chosen_peak_rss_bytes'] / 2**20:.0f} MiB |")
    if calib:
        ps = calib["profile_seconds"]
        print(f"\nprofile (disk + calibration + selection + store): {ps:.1f} s; "
              + ", ".join(f"sweep {r['budget']}: {r['sweep_seconds']:.0f} s = {r['sweep_seconds'] / ps:.0f}x"
                          for r in summary["budgets"]))


if __name__ == "__main__":
    main()
