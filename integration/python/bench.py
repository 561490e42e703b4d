#!/usr/bin/python3
"""Python-side cost of moe_ep.Group.dispatch / combine per call (eager).

Each call's wall time is split into the time inside the library's entry
(measured around the ctypes call by a thin timing wrapper) and the rest:
argument checks, descriptor binding, output allocation and result objects,
i.e. what the package adds on top of a C engine's call. The "stub" rows
repeat the calls with the library's dispatch and combine replaced by a stub
that returns OK: the package's cost alone, with warm caches, once with the
outputs passed in (out=) and once with the package allocating them (as an
engine that does not keep its own buffers calls it). Runs one rank by
default (MOE_EP_RANK=0, MOE_EP_WORLD_SIZE=1); under tools/launcher/moe_ep_run
it runs on every rank and rank 0 prints. `--backend auto` (default) runs
the nccl backend where a GPU is visible (CUDA tensors, the current stream)
and the host backend elsewhere.

  /usr/bin/python3 integration/python/bench.py [--tokens 128] [--iters 2000]
      [--format bf16|fp8|fp8_ue8m0_packed] [--alloc-compare]

On the host backend the allocating rows with the library's work in them
measure fresh host pages being touched (page faults land in the library's
time, unmapping in Python's); the stub rows are the package's cost.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("MOE_EP_RANK", "0")
os.environ.setdefault("MOE_EP_WORLD_SIZE", "1")

import torch  # noqa: E402

import moe_ep  # noqa: E402
from moe_ep._torch import OutputSpec  # noqa: E402


class TimedEntry:
    """Calls a table entry and adds the time spent inside it to `spent`."""

    def __init__(self, fn, spent):
        self.fn, self.spent = fn, spent

    def __call__(self, *args):
        t0 = time.perf_counter_ns()
        st = self.fn(*args)
        self.spent.append(time.perf_counter_ns() - t0)
        return st


class StubLibrary:
    """dispatch and combine return OK at once: what remains is the
    package's own work (binding, checks, results) plus the ctypes call."""

    def __init__(self, lib):
        self._lib = lib

    def dispatch(self, *args):
        return 0

    def combine(self, *args):
        return 0

    def __getattr__(self, name):
        return getattr(self._lib, name)


class TimedLibrary:
    """The library with dispatch and combine timed; every other attribute
    passes through."""

    def __init__(self, lib):
        self._lib = lib
        self.inside = {"dispatch": [], "combine": []}
        self.dispatch = TimedEntry(lib.dispatch, self.inside["dispatch"])
        self.combine = TimedEntry(lib.combine, self.inside["combine"])

    def __getattr__(self, name):
        return getattr(self._lib, name)


def alloc_compare(g, hidden, fmt, iters):
    """Three ways to allocate one LL dispatch's outputs on the group's
    device: empty_like of a zero-dim tensor expanded to each output's shape
    (what the package does, moe_ep._torch.OutputSpec), one new_empty per
    output, and one block per call carved into views at 256-byte aligned
    offsets. Each is timed
    over blocks of calls, the outputs freed within the block as a caller
    that drops them does; prints the best block's mean per call (us)."""
    dev = g.device
    local, slots = g.num_local_experts, g.world_size * g.config.max_tokens_per_rank
    pieces = [((local, slots, hidden), torch.bfloat16 if fmt == "bf16" else moe_ep.FP8_STORAGE)]
    if fmt != "bf16":
        packed = fmt == "fp8_ue8m0_packed"
        cols = (hidden // 128 + 3) // 4 if packed else hidden // 128
        pieces.append(((local, slots, cols), torch.int32 if packed else torch.float32))
    pieces.append(((local,), torch.int32))
    empty = [torch.empty(0, dtype=dt, device=dev) for _, dt in pieces]
    offsets, total = [], 0
    for shape, dt in pieces:
        offsets.append(total)
        n = torch.empty(0, dtype=dt).element_size()
        for d in shape:
            n *= d
        total = (total + n + 255) // 256 * 256
    byte = torch.empty(0, dtype=torch.uint8, device=dev)
    cut = [(o, o + e.element_size() * torch.Size(sh).numel(), e.dtype, sh)
           for o, e, (sh, _) in zip(offsets, empty, pieces)]

    specs = [OutputSpec(sh, dt, dev) for sh, dt in pieces]

    def from_specs():
        return [spec.new() for spec in specs]

    def separate():
        return [e.new_empty(sh) for e, (sh, _) in zip(empty, pieces)]

    def carved():
        flat = byte.new_empty((total,))
        return [flat[a:b].view(dt).view(sh) for a, b, dt, sh in cut]

    print("allocating one LL dispatch's outputs (%s, %d tensors) on %s, us per call:"
          % (fmt, len(pieces), dev))
    for name, fn in (("OutputSpec.new each", from_specs), ("one new_empty each", separate),
                     ("one block, carved", carved)):
        best = None
        for _ in range(5):
            t0 = time.perf_counter_ns()
            for _ in range(iters):
                fn()
            per = (time.perf_counter_ns() - t0) / iters / 1000.0
            best = per if best is None else min(best, per)
        print("  %-20s %8.2f" % (name, best))


def quantiles(ns):
    us = sorted(v / 1000.0 for v in ns)
    return statistics.median(us), us[int(len(us) * 0.9)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--experts", type=int, default=16, help="global experts")
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--backend", default="auto", help="auto: nccl where a GPU is visible")
    ap.add_argument("--address", default="127.0.0.1:29650", help="bootstrap host:port")
    ap.add_argument("--format", default="bf16", choices=("bf16", "fp8", "fp8_ue8m0_packed"),
                    help="the dispatch's row format (fp8 adds the scales to the outputs)")
    ap.add_argument("--alloc-compare", action="store_true",
                    help="also time two ways of allocating the dispatch's outputs")
    a = ap.parse_args()
    fmt = a.format

    cfg = {"backend": a.backend, "num_experts": a.experts, "hidden": a.hidden, "top_k": a.top_k,
           "max_tokens_per_rank": a.tokens, "bootstrap": {"address": a.address}}
    with moe_ep.Group(cfg) as g:
        dev = g.device
        timed = TimedLibrary(g._lib)
        g._lib = timed
        torch.manual_seed(g.rank)
        x = torch.randn(a.tokens, a.hidden, device=dev).to(torch.bfloat16)
        idx = torch.stack([torch.randperm(a.experts)[:a.top_k] for _ in range(a.tokens)]).to(dev)
        w = torch.rand(a.tokens, a.top_k, device=dev)
        out = torch.empty_like(x)
        y = None  # the experts' output: recv_x's shape in bf16 (recv_x may be fp8)
        rows = {k: [] for k in ("dispatch alloc", "dispatch out=", "combine alloc",
                                "combine out=")}
        recv = None
        for i in range(a.iters + 50):
            use_out = i % 2 == 1
            h = g.prepare(idx)
            t0 = time.perf_counter_ns()
            res = g.dispatch(h, x, out=recv if use_out else None, format=fmt)
            t1 = time.perf_counter_ns()
            recv = res
            if y is None:
                y = torch.zeros(res.recv_x.shape, dtype=torch.bfloat16, device=dev)
            t2 = time.perf_counter_ns()
            g.combine(h, y, topk_weights=w, out=out if use_out else None)
            t3 = time.perf_counter_ns()
            h.free()
            if i >= 50:
                sfx = " out=" if use_out else " alloc"
                rows["dispatch" + sfx].append((t1 - t0, timed.inside["dispatch"][-1]))
                rows["combine" + sfx].append((t3 - t2, timed.inside["combine"][-1]))
        if dev.type == "cuda":
            torch.cuda.synchronize()
        poll = []
        for _ in range(1000):
            t0 = time.perf_counter_ns()
            g._lib._lib.group_poll_error(g.pointer)
            poll.append(time.perf_counter_ns() - t0)
        # The package alone, the library's entries stubbed (one handle, as in
        # a decode step replayed at a fixed shape), with outputs passed in
        # and allocated by the package, calls alternating.
        g._lib = g._ops().lib = StubLibrary(timed._lib)
        h = g.prepare(idx)
        stub = {k: [] for k in ("dispatch stub out=", "dispatch stub alloc", "combine stub out=",
                                "combine stub alloc")}
        for i in range(2 * a.iters):
            use_out = i % 2 == 0
            sfx = " stub out=" if use_out else " stub alloc"
            t0 = time.perf_counter_ns()
            res = g.dispatch(h, x, out=recv if use_out else None, format=fmt)
            t1 = time.perf_counter_ns()
            g.combine(h, y, topk_weights=w, out=out if use_out else None)  # out freed inside
            t2 = time.perf_counter_ns()
            del res  # outside the windows, as the loop above drops its dispatch outputs
            stub["dispatch" + sfx].append(t1 - t0)
            stub["combine" + sfx].append(t2 - t1)
        g._lib = g._ops().lib = timed._lib
        h.free()
        if g.rank != 0:
            return
        print("moe_ep Python overhead: backend %s, world %d, %d tokens, hidden %d, %d experts, "
              "top-%d, %s rows, %d calls each (us)" % (g.backend, g.world_size, a.tokens,
                                                       a.hidden, a.experts, a.top_k, fmt,
                                                       a.iters // 2))
        print("%-19s %10s %10s %12s %12s %13s" % ("call", "total p50", "library p50",
                                                 "python p50", "python p90", "python mean"))
        for name, pairs in rows.items():
            tot = quantiles([t for t, _ in pairs])
            lib = quantiles([c for _, c in pairs])
            py = [t - c for t, c in pairs]
            p50, p90 = quantiles(py)
            print("%-19s %10.2f %10.2f %12.2f %12.2f %13.2f" % (
                name, tot[0], lib[0], p50, p90, statistics.mean(py) / 1000.0))
        for name, ns in stub.items():
            p50, p90 = quantiles(ns)
            print("%-19s %10s %10s %12.2f %12.2f %13.2f" % (
                name, "-", "-", p50, p90, statistics.mean(ns) / 1000.0))
        print("ctypes call floor (group_poll_error): p50 %.2f us" % quantiles(poll)[0])
        if a.alloc_compare:
            alloc_compare(g, a.hidden, fmt, a.iters)


if __name__ == "__main__":
    main()
