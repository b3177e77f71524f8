#!/usr/bin/env python3
"""Draws an `estream prefill --trace FILE` trace as a plain SVG timeline (no browser needed).

Usage: scripts/plot_trace.py TRACE.json [-o trace.svg] [--from MS] [--to MS] [--width PX]

One row per lane of the trace (compute, loader (reads), feeder), time in milliseconds along x,
one box per event coloured by category: compute (attention+router, expert steps), bubble (the
compute threads waiting for a group), verify (checksum passes), read (one group read). The same
JSON opens in ui.perfetto.dev or chrome://tracing for zooming and the events' arguments.
No third-party packages: the SVG is written by hand.
"""
import argparse
import json
import sys

COLORS = {"compute": "#4c78a8", "bubble": "#e45756", "verify": "#f2cf5b", "read": "#54a24b"}
ROW_H, GAP, LEFT, TOP = 26, 10, 150, 40


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("-o", "--output", default="trace.svg")
    ap.add_argument("--from", dest="t_from", type=float, default=None, help="start of the window, ms")
    ap.add_argument("--to", dest="t_to", type=float, default=None, help="end of the window, ms")
    ap.add_argument("--width", type=int, default=1100)
    args = ap.parse_args()

    with open(args.trace) as f:
        doc = json.load(f)
    events = doc.get("traceEvents", [])
    lanes = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    boxes = [e for e in events if e.get("ph") == "X"]
    if not boxes:
        print(f"{args.trace}: no events (was the model streamed, i.e. run with --budget?)", file=sys.stderr)
        return 1
    t0 = args.t_from if args.t_from is not None else 0.0
    t1 = args.t_to if args.t_to is not None else max((e["ts"] + e["dur"]) / 1e3 for e in boxes)
    if t1 <= t0:
        print("--to must be after --from", file=sys.stderr)
        return 1
    tids = sorted({e["tid"] for e in boxes})  # lanes with events (the feeder's is empty in engine runs)
    plot_w = args.width - LEFT - 20
    sx = lambda ms: LEFT + plot_w * (ms - t0) / (t1 - t0)
    height = TOP + len(tids) * (ROW_H + GAP) + 60
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{args.width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{args.width}" height="{height}" fill="white"/>',
           f'<text x="{LEFT}" y="20" font-size="14">{args.trace}: {t0:.1f}-{t1:.1f} ms</text>']
    for i, tid in enumerate(tids):
        y = TOP + i * (ROW_H + GAP)
        out.append(f'<text x="{LEFT - 8}" y="{y + ROW_H * 0.65}" text-anchor="end">{lanes.get(tid, tid)}</text>')
        out.append(f'<rect x="{LEFT}" y="{y}" width="{plot_w}" height="{ROW_H}" fill="#f4f4f4"/>')
        # Longest first, so that a step nested in another (a checksum pass inside its expert step)
        # is drawn on top of it.
        for e in sorted(boxes, key=lambda e: -e["dur"]):
            if e["tid"] != tid:
                continue
            a, b = e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3
            if b < t0 or a > t1:
                continue
            x0, x1 = sx(max(a, t0)), sx(min(b, t1))
            color = COLORS.get(e.get("cat", ""), "#999999")
            title = f'{e["name"]}: {e["dur"] / 1e3:.2f} ms ' + " ".join(f"{k}={v}" for k, v in e.get("args", {}).items())
            out.append(f'<rect x="{x0:.2f}" y="{y + 2}" width="{max(x1 - x0, 0.6):.2f}" height="{ROW_H - 4}" '
                       f'fill="{color}" stroke="white" stroke-width="0.3"><title>{title}</title></rect>')
    y = TOP + len(tids) * (ROW_H + GAP) + 5
    out.append(f'<line x1="{LEFT}" y1="{y}" x2="{LEFT + plot_w}" y2="{y}" stroke="#444"/>')
    for k in range(11):
        ms = t0 + (t1 - t0) * k / 10
        out.append(f'<line x1="{sx(ms):.1f}" y1="{y}" x2="{sx(ms):.1f}" y2="{y + 5}" stroke="#444"/>')
        out.append(f'<text x="{sx(ms):.1f}" y="{y + 18}" text-anchor="middle">{ms:.0f}</text>')
    out.append(f'<text x="{LEFT + plot_w / 2}" y="{y + 34}" text-anchor="middle">time (ms)</text>')
    lx = LEFT
    for cat, color in COLORS.items():
        out.append(f'<rect x="{lx}" y="{y + 42}" width="12" height="12" fill="{color}"/>')
        out.append(f'<text x="{lx + 16}" y="{y + 52}">{cat}</text>')
        lx += 90
    out.append("</svg>")
    with open(args.output, "w") as f:
        f.write("\n".join(out) + "\n")
    print(f"{args.output}: {len(boxes)} events, {len(tids)} lanes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
