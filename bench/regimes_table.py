#!/usr/bin/env python3
"""The table and the plot of bench/regimes.sh's runs.

    bench/regimes_table.py RUNS.txt [--svg OUT.svg] [--score final|best] [--title T]

RUNS.txt has one line a run: setting size strategy seed run-id final best
(best: the test score of the round with the best validation score). Prints,
per size, each strategy's mean +- std over its seeds (sample std) and n, then
the verdict of the mixture (full; comigs on text) against local and against
fedavg: ahead or behind only where the gap exceeds twice the larger of the
two spreads, level otherwise; and the same judged on pairs (a seed fixes the
partition: the mean of the per-seed gaps against twice their spread). Accuracy is higher-better; bits per byte
(text) lower-better. The SVG plots the means against data per client (log
scale) with +-std bars, one line a strategy, so the crossings show.
"""
import argparse
import math
import statistics
import sys
from collections import defaultdict

COLORS = {"local": "#7f7f7f", "fedavg": "#1f77b4", "comigs": "#2ca02c", "pfedmoap": "#9467bd", "full": "#d62728"}
ORDER = ["local", "fedavg", "comigs", "pfedmoap", "full"]


def size_key(s):
    return float("inf") if s == "all" else float(s)


def load(path):
    runs = defaultdict(dict)  # (size, strategy) -> seed -> (final, best)
    setting = None
    for line in open(path):
        f = line.split()
        if len(f) != 7:
            continue
        setting = f[0]
        runs[(f[1], f[2])][f[3]] = (float(f[5]), float(f[6]))
    return setting, runs


def stats(vals):
    m = statistics.fmean(vals)
    sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return m, sd


def verdict(gap, noise):
    if gap > noise:
        return "ahead"
    if -gap > noise:
        return "behind"
    return "level"


def compare(runs, size, a, b, which, lower_better):
    """The mixture a against baseline b at size: (unpaired verdict, gap, 2 x
    the larger spread; paired verdict, mean per-seed gap, 2 x the spread of
    the per-seed gaps). A seed fixes the partition, so the same seed's runs
    of two strategies are a pair."""
    ra, rb = runs.get((size, a)), runs.get((size, b))
    if not ra or not rb:
        return None
    sign = -1 if lower_better else 1
    ma, sa = stats([v[which] for v in ra.values()])
    mb, sb = stats([v[which] for v in rb.values()])
    gap, noise = sign * (ma - mb), 2 * max(sa, sb)
    common = sorted(set(ra) & set(rb))
    diffs = [sign * (ra[k][which] - rb[k][which]) for k in common]
    pm, ps = stats(diffs) if diffs else (0.0, 0.0)
    return verdict(gap, noise), gap, noise, verdict(pm, 2 * ps), pm, 2 * ps


def svg(setting, runs, sizes, strategies, which, lower_better, title, out, xlabel=None):
    W, H, L, R, T, B = 640, 400, 70, 120, 40, 50
    pts = {}
    lo, hi = float("inf"), float("-inf")
    for st in strategies:
        for sz in sizes:
            seeds = runs.get((sz, st))
            if not seeds:
                continue
            m, sd = stats([v[which] for v in seeds.values()])
            pts.setdefault(st, []).append((sz, m, sd))
            lo, hi = min(lo, m - sd), max(hi, m + sd)
    if lo == float("inf"):
        return
    pad = (hi - lo) * 0.08 or 1.0
    lo, hi = lo - pad, hi + pad
    finite = [size_key(s) for s in sizes if s != "all"]
    xmin, xmax = math.log(min(finite)), math.log(max(finite))
    xall = xmax + (xmax - xmin) * 0.18 if "all" in sizes else xmax

    def X(sz):
        v = xall if sz == "all" else math.log(float(sz))
        return L + (v - xmin) / ((xall - xmin) or 1) * (W - L - R)

    def Y(v):
        return T + (hi - v) / (hi - lo) * (H - T - B)

    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{L}" y="22" font-size="14">{title}</text>',
         f'<line x1="{L}" y1="{H-B}" x2="{W-R}" y2="{H-B}" stroke="black"/>',
         f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H-B}" stroke="black"/>']
    for sz in sizes:
        o.append(f'<text x="{X(sz):.1f}" y="{H-B+16}" text-anchor="middle">{sz}</text>')
        o.append(f'<line x1="{X(sz):.1f}" y1="{H-B}" x2="{X(sz):.1f}" y2="{H-B+4}" stroke="black"/>')
    unit = "bits per byte (lower is better)" if lower_better else "test accuracy, %"
    label = "bytes" if lower_better else "examples"
    xlabel = xlabel or f"{label} of train + validation data a client (log scale)"
    o.append(f'<text x="{(L+W-R)/2}" y="{H-12}" text-anchor="middle">{xlabel}</text>')
    o.append(f'<text x="16" y="{(T+H-B)/2}" transform="rotate(-90 16 {(T+H-B)/2})" text-anchor="middle">{unit}</text>')
    for k in range(6):
        v = lo + (hi - lo) * k / 5
        o.append(f'<text x="{L-6}" y="{Y(v)+4:.1f}" text-anchor="end">{v:.2f}</text>')
        o.append(f'<line x1="{L}" y1="{Y(v):.1f}" x2="{W-R}" y2="{Y(v):.1f}" stroke="#eee"/>')
    for i, st in enumerate(s for s in strategies if s in pts):
        c = COLORS.get(st, "black")
        p = pts[st]
        o.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>' %
                 (c, " ".join(f"{X(sz):.1f},{Y(m):.1f}" for sz, m, _ in p)))
        for sz, m, sd in p:
            o.append(f'<line x1="{X(sz):.1f}" y1="{Y(m-sd):.1f}" x2="{X(sz):.1f}" y2="{Y(m+sd):.1f}" stroke="{c}"/>')
            o.append(f'<circle cx="{X(sz):.1f}" cy="{Y(m):.1f}" r="3" fill="{c}"/>')
        o.append(f'<line x1="{W-R+10}" y1="{T+10+18*i}" x2="{W-R+30}" y2="{T+10+18*i}" stroke="{c}" stroke-width="2"/>')
        o.append(f'<text x="{W-R+36}" y="{T+14+18*i}">{st}</text>')
    o.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(o) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runs")
    ap.add_argument("--svg")
    ap.add_argument("--score", choices=["final", "best"], default="final")
    ap.add_argument("--title")
    ap.add_argument("--xlabel", help="the x axis' label (default: data a client); the size column may hold another quantity")
    a = ap.parse_args()
    setting, runs = load(a.runs)
    if not runs:
        sys.exit("regimes_table: no runs in " + a.runs)
    lower_better = setting == "text"
    mixture = "comigs" if lower_better else "full"
    sizes = sorted({k[0] for k in runs}, key=size_key)
    strategies = [s for s in ORDER if any((sz, s) in runs for sz in sizes)]
    which = 0 if a.score == "final" else 1
    nseeds = max(len(v) for v in runs.values())
    score = "final" if a.score == "final" else "best-on-validation"
    print(f"{setting}: {score} {'test bits per byte' if lower_better else 'test accuracy %'}, mean ± std over {nseeds} seeds")
    print("| size | " + " | ".join(strategies) + f" | {mixture} vs local | {mixture} vs fedavg |")
    print("|---" * (len(strategies) + 3) + "|")
    for sz in sizes:
        cells, ms = [], {}
        for st in strategies:
            seeds = runs.get((sz, st))
            if not seeds:
                cells.append("")
                continue
            m, sd = stats([v[which] for v in seeds.values()])
            ms[st] = (m, sd)
            cells.append(f"{m:.2f} ± {sd:.2f}" + ("" if len(seeds) == nseeds else f" (n {len(seeds)})"))
        vs = []
        for base in ("local", "fedavg"):
            c = compare(runs, sz, mixture, base, which, lower_better)
            vs.append(f"paired {c[4]:+.2f} (2σ {c[5]:.2f}) **{c[3]}**; unpaired {c[1]:+.2f} (2σ {c[2]:.2f}) {c[0]}"
                      if c else "")
        print(f"| {sz} | " + " | ".join(cells) + " | " + " | ".join(vs) + " |")
    if a.svg:
        svg(setting, runs, sizes, strategies, which, lower_better,
            a.title or f"{setting}: {a.score} score, mean ± std over seeds", a.svg, a.xlabel)


if __name__ == "__main__":
    main()
