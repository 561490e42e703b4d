#!/usr/bin/env python3
"""load_depth.py: how many 16-byte global loads each one has in flight.

Reads `cuobjdump -sass` output (plain or gzipped; `run_device.sh sass`
writes it for the bundle's library) and, for every kernel whose name
contains --kernel, walks each 128-bit global load (LDG.E.128 and its
cached forms) forward to the first instruction that reads a register of
its destination, counting the 128-bit loads issued in between. A batch of
N independent loads, issued before any is used, reads N-1, N-2, ..., 0. A
batch that reads 0 at every load waits for each load before the next: the
compiler moved every load through the same scratch registers.

The reader is a text scan, not a decoder: a register counts as read when
it appears after an instruction's first operand (or anywhere in a store
or other instruction without a destination), and 64-bit and vector
operands are matched by their first register. Good enough to see a batch
serialised; read the SASS itself before trusting one number.

  load_depth.py sass.txt.gz --kernel ll_combine_kernel
"""
import argparse
import gzip
import re

LOAD = re.compile(r"\bLDG\.E(?:\.[A-Z0-9_]+)*\.128\b")
INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
REG = re.compile(r"\bR(\d+)\b")
# instructions whose first operand is read, not written
NO_DEST = ("ST", "RED", "ATOM", "BRA", "BAR", "EXIT", "RET", "CALL", "MEMBAR")
PRED = re.compile(r"^@!?U?P\w+\s+")


def unpredicated(text):
    """The instruction without its guard predicate (@P0, @!UP1, ...)."""
    return PRED.sub("", text)


def kernels_of(path):
    opener = gzip.open if path.endswith(".gz") else open
    name, insns = None, []
    with opener(path, "rt") as f:
        for line in f:
            if "Function : " in line:
                if name:
                    yield name, insns
                name, insns = line.split("Function : ", 1)[1].strip(), []
                continue
            m = INSN.search(line)
            if m and name:
                insns.append((int(m.group(1), 16), m.group(2)))
    if name:
        yield name, insns


def reads(text):
    """The registers an instruction reads (see the module's caveat)."""
    op = unpredicated(text).split(None, 1)
    if len(op) < 2:
        return set()
    if op[0].startswith(NO_DEST):
        return {int(r) for r in REG.findall(op[1])}
    parts = op[1].split(",", 1)
    # a predicated load's own destination is not a read; its address is
    srcs = parts[1] if len(parts) > 1 else ""
    if "[" in parts[0]:
        srcs = op[1]
    return {int(r) for r in REG.findall(srcs)}


def depths(insns, window):
    out = []
    for i, (addr, text) in enumerate(insns):
        if not LOAD.search(text):
            continue
        dest = REG.search(unpredicated(text))
        if not dest:
            continue
        quad = set(range(int(dest.group(1)), int(dest.group(1)) + 4))
        depth = 0
        for _, later in insns[i + 1:i + 1 + window]:
            if reads(later) & quad:
                break
            if LOAD.search(later):
                depth += 1
        out.append((addr, depth))
    return out


def batches(found, gap):
    """Loads grouped where each is within `gap` bytes of the one before."""
    group = []
    for addr, d in found:
        if group and addr - group[-1][0] > gap:
            yield group
            group = []
        group.append((addr, d))
    if group:
        yield group


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sass")
    ap.add_argument("--kernel", default="ll_combine",
                    help="substring of the kernels' mangled names")
    ap.add_argument("--window", type=int, default=400,
                    help="instructions followed after each load")
    ap.add_argument("--gap", type=int, default=0x300,
                    help="bytes between two loads of one batch, at most")
    args = ap.parse_args()
    for name, insns in kernels_of(args.sass):
        if args.kernel not in name:
            continue
        found = depths(insns, args.window)
        print(f"{name}\n  {len(insns)} instructions, {len(found)} 128-bit global loads")
        for group in batches(found, args.gap):
            if len(group) < 2:
                continue
            ds = " ".join(str(d) for _, d in group)
            print(f"  +0x{group[0][0]:05x}: {len(group):2d} loads, in flight beside each: {ds}")


if __name__ == "__main__":
    main()
