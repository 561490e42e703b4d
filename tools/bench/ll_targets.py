#!/usr/bin/env python3
"""ll_targets.py: the EP2 LL table against the LL speed targets, from the
four JSON files `run_device.sh lltable` writes (ll_<eager|graph>_weights_
<true|false>.json, moe_ep_bench --json).

Prints, in RESULTS.md's layout, p50 us as a range over the ranks for every
row (dispatch and both combine modes, fp8 and bf16, eager and one CUDA
graph) with the target under each group; then, per target, the slower
rank's eager and graph medians and the margin ("met", or "+X over"); the
hook halves (eager, fp8); and the worst p99 / p50 of every row.

Dispatch rows are the default bench's (weights at dispatch), as are the hook
halves' dispatch columns; each combine mode is its own file's.

  python3 tools/bench/ll_targets.py DIR
"""
import argparse
import json
import os
import sys

TOKENS = (1, 8, 32, 128, 256)
# The LL speed targets (2 x H200, EP2, hidden 7168, top-8, 256 experts,
# p50 us, both ranks, eager and in one graph): 1.5x the best peer's speed,
# or the speed already reached where that was faster ("keep").
TARGETS = {
    ("dispatch", "fp8"): (11.3, 11.4, 12.9, 20.5, 31.1),
    ("dispatch", "bf16"): (11.5, 12.3, 14.7, 23.2, 31.8),
    ("combine_c", None): (11.1, 11.9, 15.3, 30.0, 50.3),
    ("combine_d", None): (10.1, 10.7, 11.1, 14.7, 20.4),
}
KEPT = {("dispatch", "fp8"): {128, 256}, ("dispatch", "bf16"): {32, 128, 256}}
# (call, mode, target key, dtypes, weights at dispatch, metric)
GROUPS = [
    ("dispatch", "", ("dispatch", "fp8"), ("fp8",), True, "dispatch_us"),
    ("dispatch", "", ("dispatch", "bf16"), ("bf16",), True, "dispatch_us"),
    ("combine", "weights at combine", ("combine_c", None), ("fp8", "bf16"), False, "combine_us"),
    ("combine", "weights at dispatch", ("combine_d", None), ("fp8", "bf16"), True, "combine_us"),
]


def load(directory):
    """{(graph, weights_at_dispatch): [result rows]} of the four files."""
    runs = {}
    for graph in (False, True):
        for w in (True, False):
            name = "ll_%s_weights_%s.json" % ("graph" if graph else "eager", str(w).lower())
            path = os.path.join(directory, name)
            try:
                with open(path) as f:
                    doc = json.load(f)
            except OSError as e:
                raise SystemExit("ll_targets: %s: %s" % (path, e.strerror))
            except ValueError as e:
                raise SystemExit("ll_targets: %s: not JSON (%s)" % (path, e))
            if doc.get("dispatch_weights") is not w:
                raise SystemExit("ll_targets: %s: dispatch_weights is %r, its name says %s"
                                 % (path, doc.get("dispatch_weights"), w))
            runs[(graph, w)] = doc.get("results", [])
    return runs


def values(rows, dtype, tokens, key):
    return [r[key] for r in rows
            if r.get("dtype") == dtype and r.get("tokens") == tokens and key in r
            and r.get("hidden") == 7168]


def cell(vs):
    if not vs:
        return "-"
    lo, hi = "%.1f" % min(vs), "%.1f" % max(vs)
    return lo if lo == hi else lo + "-" + hi


def table(runs):
    lines = ["| us, p50, both ranks | " + " | ".join(str(t) for t in TOKENS) + " |",
             "|---" * (len(TOKENS) + 1) + "|"]
    verdicts = []
    for call, mode, tkey, dtypes, w, metric in GROUPS:
        for dt in dtypes:
            for graph in (False, True):
                name = ", ".join(x for x in ("%s %s" % (call, dt), mode,
                                             "one graph" if graph else "eager") if x)
                rows = runs[(graph, w)]
                lines.append("| %s | %s |" % (name, " | ".join(
                    cell(values(rows, dt, t, metric + "_p50")) for t in TOKENS)))
        kept = KEPT.get(tkey, set())
        lines.append("| target | %s |" % " | ".join(
            "%.1f%s" % (v, " (keep)" if t in kept else "")
            for t, v in zip(TOKENS, TARGETS[tkey])))
        for t, target in zip(TOKENS, TARGETS[tkey]):
            # the slower rank of either dtype, eager and in one graph
            slowest = {}
            for graph in (False, True):
                vs = [v for dt in dtypes for v in values(runs[(graph, w)], dt, t, metric + "_p50")]
                if vs:
                    slowest[graph] = round(max(vs), 1)
            if not slowest:
                continue
            v = max(slowest.values())
            margin = "met" if v <= target else "+%.1f over" % (v - target)
            verdicts.append("- %s, %d token%s: %s against %.1f: %s" % (
                ", ".join(x for x in (call + (" " + tkey[1] if tkey[1] else ""), mode) if x),
                t, "" if t == 1 else "s",
                ", ".join("%s %.1f" % ("graph" if g else "eager", slowest[g]) for g in sorted(slowest)),
                target, margin))
    return lines, verdicts


def hooks(runs):
    """The hook halves, eager, fp8: send / receive ranges per token count."""
    out = []
    for name, w, half in (("d.send / d.recv", True, "dispatch"),
                          ("c.send / c.recv, weights at dispatch", True, "combine"),
                          ("c.send / c.recv, weights at combine", False, "combine")):
        rows = runs[(False, w)]
        out.append("| hook %s, fp8, eager | %s |" % (name, " | ".join(
            "%s / %s" % (cell(values(rows, "fp8", t, half + "_send_us_p50")),
                         cell(values(rows, "fp8", t, half + "_recv_us_p50")))
            for t in TOKENS)))
    return out


def tails(runs):
    """The worst p99 / p50 over every row of the four files."""
    worst = None
    for (graph, w), rows in sorted(runs.items()):
        for r in rows:
            for m in ("dispatch_us", "combine_us", "dispatch_send_us", "dispatch_recv_us",
                      "combine_send_us", "combine_recv_us"):
                p50, p99 = r.get(m + "_p50"), r.get(m + "_p99")
                if not p50 or p99 is None:
                    continue
                ratio = p99 / p50
                if worst is None or ratio > worst[0]:
                    worst = (ratio, m, r, graph, w)
    if worst is None:
        return "worst p99 / p50: no rows"
    ratio, m, r, graph, w = worst
    return ("worst p99 / p50: %.2f (%s, %s %d tokens, rank %d, %s, weights at %s: "
            "%.2f / %.2f us)" % (ratio, m, r["dtype"], r["tokens"], r["rank"],
                                 "one graph" if graph else "eager",
                                 "dispatch" if w else "combine", r[m + "_p50"], r[m + "_p99"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="the folder of lltable's JSON files")
    a = ap.parse_args()
    runs = load(a.dir)
    lines, verdicts = table(runs)
    print("\n".join(lines + hooks(runs)))
    print()
    print("\n".join(verdicts))
    print(tails(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
