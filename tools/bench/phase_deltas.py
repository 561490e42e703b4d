#!/usr/bin/env python3
"""phase_deltas.py: the time between the fused dispatch's phase stamps, per
build, from `ll_kernel_bench phases` logs named stamps_<build>_<round>.log
(what `run_device.sh ab` writes).

Each log holds, per rank and token count, one line per phase: its min /
median / max over blocks, in us after the launch's first block entry. The
phases after "heads" wait for the peer, so a round whose peer started late
shifts them all; the gaps between phases of one block's path are what a
kernel edit changes. Per (build, tokens) this prints, over every round and
rank kept, the range of:
  sent     entry -> sent (medians): the send half;
  scan     heads -> joined: the expert lists read;
  check    joined -> seen: the count codes checked;
  copy     seen -> copied (medians): the row copy of thread 0's warp;
  copy max seen (median) -> copied (max): the block that copies longest;
  tail     copied -> done (medians): shadows and tags;
  done     done (max): the last block's end.
A (round, rank) whose joined median is more than `--late` times the
smallest joined median of that token count (over every log given) is left
out and counted: its peer started late, and every phase from the lists on
waited for it.

  python3 tools/bench/phase_deltas.py stamps_*_*.log [--late 2]
"""
import argparse
import collections
import os
import re
import sys

LINE = re.compile(r"PHASES rank (\d+) tokens (\d+) (\S[\w .]*?)\s+(-?[\d.]+)\s+(-?[\d.]+)\s+(-?[\d.]+)\s*$")
NAME = re.compile(r"stamps_(.+)_(\d+)\.log$")
# (label, later phase and statistic, earlier phase and statistic or None)
DELTAS = [
    ("sent", ("sent", 1), ("entry", 1)),
    ("scan", ("joined", 1), ("heads", 1)),
    ("check", ("seen", 1), ("joined", 1)),
    ("copy", ("copied", 1), ("seen", 1)),
    ("copy max", ("copied", 2), ("seen", 1)),
    ("tail", ("done", 1), ("copied", 1)),
    ("done", ("done", 2), None),
]


def parse(path):
    """{(rank, tokens): {phase: (min, median, max)}} of one log."""
    out = collections.defaultdict(dict)
    with open(path, errors="replace") as f:
        for line in f:
            m = LINE.search(line)
            if m:
                out[(int(m.group(1)), int(m.group(2)))][m.group(3).strip()] = (
                    float(m.group(4)), float(m.group(5)), float(m.group(6)))
    return out


def deltas(phases):
    """{label: us} of one (round, rank, tokens), for the phases it has."""
    got = {}
    for label, (late, ls), early in DELTAS:
        if late not in phases or (early is not None and early[0] not in phases):
            continue
        v = phases[late][ls]
        if early is not None:
            v -= phases[early[0]][early[1]]
        got[label] = v
    return got


def table(paths, late):
    """Lines of the table, builds in the order their first log was given."""
    runs = []  # (build, round, rank, tokens, phases)
    for p in paths:
        m = NAME.search(os.path.basename(p))
        if not m:
            raise SystemExit(f"phase_deltas: {p}: not named stamps_<build>_<round>.log")
        try:
            logs = parse(p)
        except OSError as e:
            raise SystemExit(f"phase_deltas: {p}: {e.strerror}")
        for (rank, tokens), phases in sorted(logs.items()):
            runs.append((m.group(1), int(m.group(2)), rank, tokens, phases))
    floor = {}
    for b, r, rank, t, ph in runs:
        if "joined" in ph:
            floor[t] = min(floor.get(t, ph["joined"][1]), ph["joined"][1])
    builds = list(dict.fromkeys(b for b, *_ in runs))
    lines = ["%-14s %6s %5s  %s" % ("build", "tokens", "kept",
                                     "  ".join("%-11s" % d[0] for d in DELTAS))]
    for t in sorted({t for *_, t, _ in runs}):
        for b in builds:
            kept, dropped = [], 0
            for b2, _, _, t2, ph in runs:
                if b2 != b or t2 != t:
                    continue
                if "joined" in ph and floor[t] > 0 and ph["joined"][1] > late * floor[t]:
                    dropped += 1
                else:
                    kept.append(deltas(ph))
            if not kept and not dropped:
                continue
            cells = []
            for label, *_ in DELTAS:
                vs = [k[label] for k in kept if label in k]
                lo, hi = ("%.2f" % min(vs), "%.2f" % max(vs)) if vs else ("-", "-")
                cells.append("%-11s" % (lo if lo == hi else lo + "-" + hi))
            lines.append("%-14s %6d %2d/%-2d  %s" % (b, t, len(kept), len(kept) + dropped,
                                                     "  ".join(cells)))
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--late", type=float, default=2.0,
                    help="leave out a rank whose joined median exceeds this times the floor")
    a = ap.parse_args()
    print("\n".join(table(a.logs, a.late)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
