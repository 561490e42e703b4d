#!/usr/bin/env python3
"""pc_stalls.py: a summary of ncu's per-instruction warp-stall samples.

Reads the CSV that `ncu -i REPORT --page source --csv --print-source sass`
prints (plain or gzipped; `run_device.sh llpc` writes them) and prints, for
the kernel in it: the share of every stall reason over all samples, how
many of its SASS instructions ran, and the instructions that hold the most
samples of one reason, with their offsets from the kernel's first
instruction.

  pc_stalls.py pc_dispatch.csv.gz [--reason stall_no_inst] [--top 12]
"""
import argparse
import csv
import gzip
import sys


def rows_of(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    # line 1 names the kernel, line 2 the columns, then one per instruction
    if len(rows) < 3 or "Address" not in rows[1]:
        sys.exit(f"pc_stalls: {path} is not ncu's source page as CSV")
    return rows[0], rows[1], rows[2:]


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--reason", default="stall_no_inst",
                    help="the reason whose top instructions are listed")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    kernel, header, data = rows_of(args.csv)
    col = {h: i for i, h in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    if args.reason not in col:
        sys.exit(f"pc_stalls: --reason {args.reason} is not a column; one of: "
                 + " ".join(reasons))
    value = lambda row, h: number(row[col[h]])
    total = sum(value(r, "Warp Stall Sampling (All Samples)") for r in data)
    ran = sum(1 for r in data if value(r, "Instructions Executed") > 0)
    print(f"{kernel[1] if len(kernel) > 1 else kernel[0]}")
    print(f"  {len(data)} SASS instructions, {ran} executed; {total:.0f} samples")
    if total == 0:
        return
    shares = sorted(((sum(value(r, h) for r in data), h) for h in reasons), reverse=True)
    print("  " + ", ".join(f"{h[6:]} {100 * s / total:.1f} %" for s, h in shares if s > 0))
    base = int(data[0][col["Address"]], 16)
    top = sorted(data, key=lambda r: -value(r, args.reason))[:args.top]
    for r in top:
        if value(r, args.reason) == 0:
            break
        off = int(r[col["Address"]], 16) - base
        print(f"  +{off:#07x} {args.reason[6:]} {value(r, args.reason):6.0f}  "
              f"{r[col['Source']].strip()[:72]}")


if __name__ == "__main__":
    main()
