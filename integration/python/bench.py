#!/usr/bin/python3
"""Python-side cost of moe_ep.Group.dispatch / combine per call (eager).

Each call's wall time is split into the time inside the library's entry
(measured around the ctypes call by a thin timing wrapper) and the rest:
argument checks, descriptor binding, output allocation and result objects,
i.e. what the package adds on top of a C engine's call. The "stub" rows
repeat the calls with the library's dispatch and combine replaced by a stub
that returns OK: the package's cost alone, with warm caches. Runs one rank by
default (MOE_EP_RANK=0, MOE_EP_WORLD_SIZE=1); under tools/launcher/moe_ep_run
it runs on every rank and rank 0 prints. `--backend auto` (default) runs
the nccl backend where a GPU is visible (CUDA tensors, the current stream)
and the host backend elsewhere.

  /usr/bin/python3 integration/python/bench.py [--tokens 128] [--iters 2000]
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
    a = ap.parse_args()

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
        rows = {k: [] for k in ("dispatch", "dispatch out=", "combine", "combine out=")}
        recv = None
        for i in range(a.iters + 50):
            use_out = i % 2 == 1
            h = g.prepare(idx)
            t0 = time.perf_counter_ns()
            res = g.dispatch(h, x, out=recv if use_out else None)
            t1 = time.perf_counter_ns()
            recv = res
            t2 = time.perf_counter_ns()
            g.combine(h, res.recv_x, topk_weights=w, out=out if use_out else None)
            t3 = time.perf_counter_ns()
            h.free()
            if i >= 50:
                sfx = " out=" if use_out else ""
                rows["dispatch" + sfx].append((t1 - t0, timed.inside["dispatch"][-1]))
                rows["combine" + sfx].append((t3 - t2, timed.inside["combine"][-1]))
        if dev.type == "cuda":
            torch.cuda.synchronize()
        poll = []
        for _ in range(1000):
            t0 = time.perf_counter_ns()
            g._lib._lib.group_poll_error(g.pointer)
            poll.append(time.perf_counter_ns() - t0)
        # The package alone, the library's entries stubbed (one handle,
        # outputs passed in, as in a decode step replayed at a fixed shape).
        g._lib = g._ops().lib = StubLibrary(timed._lib)
        h = g.prepare(idx)
        stub = {"dispatch": [], "combine": []}
        for i in range(a.iters):
            t0 = time.perf_counter_ns()
            g.dispatch(h, x, out=recv)
            t1 = time.perf_counter_ns()
            g.combine(h, recv.recv_x, topk_weights=w, out=out)
            t2 = time.perf_counter_ns()
            stub["dispatch"].append(t1 - t0)
            stub["combine"].append(t2 - t1)
        g._lib = g._ops().lib = timed._lib
        h.free()
        if g.rank != 0:
            return
        print("moe_ep Python overhead: backend %s, world %d, %d tokens, hidden %d, %d experts, "
              "top-%d, %d calls each (us)" % (g.backend, g.world_size, a.tokens, a.hidden,
                                              a.experts, a.top_k, a.iters // 2))
        print("%-14s %10s %10s %12s %12s %13s" % ("call", "total p50", "library p50",
                                                 "python p50", "python p90", "python mean"))
        for name, pairs in rows.items():
            tot = quantiles([t for t, _ in pairs])
            lib = quantiles([c for _, c in pairs])
            py = [t - c for t, c in pairs]
            p50, p90 = quantiles(py)
            print("%-14s %10.2f %10.2f %12.2f %12.2f %13.2f" % (
                name, tot[0], lib[0], p50, p90, statistics.mean(py) / 1000.0))
        for name, ns in stub.items():
            p50, p90 = quantiles(ns)
            print("%-14s %10s %10s %12.2f %12.2f %13.2f" % (
                name + " stub", "-", "-", p50, p90, statistics.mean(ns) / 1000.0))
        print("ctypes call floor (group_poll_error): p50 %.2f us" % quantiles(poll)[0])


if __name__ == "__main__":
    main()
