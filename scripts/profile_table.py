#!/usr/bin/env python3
"""The per-part profile table of docs/PERFORMANCE.md (issue 19, part 3) from `estream prefill --sweep
... --repeat 1 --json` output: one run per sweep point, so every run keeps its own timing split.

    estream prefill -m MODEL --tokens @prompt.txt -t 2 --sweep 512,512,1024,4096,512,1024,4096 \
        --repeat 1 --json > run.json
    scripts/profile_table.py --preset qwen3-30b-a3b --peak 1605 --skip 1 run.json

For each prompt length T: the median wall time over its runs, and per part (projections, attention
kernel, router, experts; other = the rest: norms, RoPE, residual adds, quantisation of the
activations, embeddings, LM head) the median time over the runs, its share of the median total and
its op rate (2 ops per multiply-add, the counts of profiler::PrefillMacs split by part). --peak is
the int8 peak of the machine in G op/s (bench/peak_bench), for the "% of peak" columns.
"""
import argparse
import json
import statistics

# n_layer, n_embd, q_dim, kv_dim, n_expert, n_expert_used, n_ff_expert, n_vocab
PRESETS = {
    "qwen3-30b-a3b": (48, 2048, 4096, 512, 128, 8, 768, 151936),
    "olmoe-1b-7b": (16, 2048, 2048, 2048, 64, 8, 1024, 50304),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), required=True)
    ap.add_argument("--peak", type=float, required=True, help="int8 peak of the machine, G op/s")
    ap.add_argument("--skip", type=int, default=0, help="warm-up points at the start of each file, dropped")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    L, d, q, kv, E, k, ff, V = PRESETS[a.preset]
    macs = {"proj": L * (d * (q + 2 * kv) + q * d), "router": L * d * E, "experts": L * k * 3 * d * ff}
    pair = L * 2 * q  # multiply-adds per (query, key) pair: scores and weighted sum
    runs = {}
    for f in a.files:
        with open(f) as fh:
            points = json.loads(fh.read().strip().splitlines()[-1])["sweep"][a.skip:]
        for p in points:
            t = p["timing"]
            r = {"total": p["seconds"], "proj": t["attention_projections"], "kern": t["attention_kernel"],
                 "router": t["router"], "experts": t["experts"], "dense": t["dense_ffn"]}
            r["other"] = r["total"] - sum(r[x] for x in ("proj", "kern", "router", "experts", "dense"))
            runs.setdefault(p["n_tokens"], []).append(r)
    print("| T | runs (s) | median | tok/s | end to end | projections | attention kernel | router | experts | "
          "other |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for T in sorted(runs):
        rs = runs[T]
        med = lambda key: statistics.median(x[key] for x in rs)  # noqa: E731
        tot = med("total")
        ops = {key: 2 * T * m for key, m in macs.items()}
        ops["kern"] = 2 * T * (T + 1) / 2 * pair
        cells = []
        for key in ("proj", "kern", "router", "experts"):
            v = med(key)
            g = ops[key] / v / 1e9
            cells.append(f"{v:.3f} s, {100 * v / tot:.1f}%, {g:.0f} G op/s ({100 * g / a.peak:.0f}%)")
        cells.append(f"{med('other'):.3f} s, {100 * med('other') / tot:.1f}%")
        whole = 2 * (T * sum(macs.values()) + T * (T + 1) / 2 * pair + d * V) / tot / 1e9
        print(f"| {T} | {' / '.join('%.3f' % x['total'] for x in rs)} | {tot:.3f} s | {T / tot:.1f} | "
              f"{whole:.0f} G op/s, **{100 * whole / a.peak:.1f}%** | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
