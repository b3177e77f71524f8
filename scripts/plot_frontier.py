#!/usr/bin/env python3
"""Draws the latency-memory frontier from `estream bench --json` output as a plain SVG.

Usage: scripts/plot_frontier.py BENCH.json [-o frontier.svg] [--tokens T]

One panel per prompt length (or only T): x = peak RSS (GiB), y = latency (s); one marker per
run, coloured by schedule (resident runs in black). The frontier (runs no other run beats in
both memory and latency) is joined by a line. No third-party packages: the SVG is written by hand.
"""
import argparse
import json
import sys

COLORS = {"resident": "#000000", "early": "#1b9e77", "after-routing": "#d95f02", "on-demand": "#7570b3"}


def frontier(points):
    pts = sorted(points)
    out, best = [], float("inf")
    for x, y in pts:
        if y < best:
            out.append((x, y))
            best = y
    return out


def panel(runs, t, ox, oy, w, h):
    pts = [(r["peak_rss_bytes"] / 2**30, r["seconds"], r["schedule"], r["budget"]) for r in runs if "seconds" in r]
    if not pts:
        return ""
    xmax = max(p[0] for p in pts) * 1.15
    ymax = max(p[1] for p in pts) * 1.15
    sx = lambda x: ox + 50 + (w - 70) * x / xmax
    sy = lambda y: oy + h - 40 - (h - 70) * y / ymax
    s = [f'<text x="{ox + w / 2}" y="{oy + 18}" text-anchor="middle" font-size="14">T = {t} tokens</text>',
         f'<line x1="{sx(0)}" y1="{sy(0)}" x2="{sx(xmax)}" y2="{sy(0)}" stroke="#444"/>',
         f'<line x1="{sx(0)}" y1="{sy(0)}" x2="{sx(0)}" y2="{sy(ymax)}" stroke="#444"/>',
         f'<text x="{ox + w / 2}" y="{oy + h - 8}" text-anchor="middle" font-size="12">peak RSS (GiB)</text>',
         f'<text x="{ox + 14}" y="{oy + h / 2}" font-size="12" transform="rotate(-90 {ox + 14} {oy + h / 2})" '
         f'text-anchor="middle">latency (s)</text>']
    for i in range(5):
        xv, yv = xmax * i / 4, ymax * i / 4
        s.append(f'<text x="{sx(xv)}" y="{sy(0) + 14}" text-anchor="middle" font-size="10">{xv:.2f}</text>')
        s.append(f'<text x="{sx(0) - 4}" y="{sy(yv) + 3}" text-anchor="end" font-size="10">{yv:.2f}</text>')
    f = frontier([(p[0], p[1]) for p in pts])
    if len(f) > 1:
        s.append('<polyline fill="none" stroke="#999" stroke-dasharray="4 3" points="' +
                 " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in f) + '"/>')
    for x, y, sched, budget in pts:
        c = COLORS.get(sched, "#e7298a")
        s.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" fill="{c}"><title>{sched} {budget}: '
                 f'{y:.3f} s, {x:.2f} GiB</title></circle>')
    return "\n".join(s)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bench_json")
    ap.add_argument("-o", "--output", default="frontier.svg")
    ap.add_argument("--tokens", type=int)
    a = ap.parse_args()
    doc = json.load(open(a.bench_json))
    runs = doc["runs"]
    ts = sorted({r["n_tokens"] for r in runs if a.tokens is None or r["n_tokens"] == a.tokens})
    if not ts:
        sys.exit("no runs to plot")
    w, h = 360, 300
    width = w * len(ts)
    body = [panel([r for r in runs if r["n_tokens"] == t], t, i * w, 20, w, h) for i, t in enumerate(ts)]
    legend = []
    for i, (name, c) in enumerate(COLORS.items()):
        legend.append(f'<circle cx="{20 + i * 120}" cy="{h + 35}" r="4" fill="{c}"/>'
                      f'<text x="{28 + i * 120}" y="{h + 39}" font-size="11">{name}</text>')
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h + 50}" font-family="sans-serif">\n'
           f'<text x="8" y="14" font-size="12">{doc.get("model", "")}: latency vs peak RSS</text>\n' +
           "\n".join(body) + "\n" + "\n".join(legend) + "\n</svg>\n")
    open(a.output, "w").write(svg)
    print(a.output)


if __name__ == "__main__":
    main()
