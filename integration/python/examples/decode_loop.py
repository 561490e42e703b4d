#!/usr/bin/env python3
"""A decode loop driving both engine adapters on one low-latency group the
way the engines do, every step checked against a reference built here from
every rank's seeded inputs:

- vLLM (moe_ep.vllm.PrepareAndFinalize): dual-batch overlap, two
  micro-batch threads taking turns; each sends (prepare_async /
  finalize_async), registers its receive hook for the other thread to
  run, and yields, as vLLM's ubatching does.
- SGLang (moe_ep.sglang.Dispatcher): two-batch overlap on one thread, two
  operations in flight (dispatch_a 0, dispatch_a 1, dispatch_b 0, ...).

  tools/launcher/moe_ep_run -n 2 -- /usr/bin/python3 integration/python/examples/decode_loop.py --steps 20

Host backend without CUDA; nccl backend on the GPU of MOE_EP_LOCAL_RANK
when CUDA is visible. Rank 0 prints one row per step and adapter; every
rank ends with "rank R: ok" or its failures (exit status 1).
"""
import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402

import moe_ep  # noqa: E402
import moe_ep.sglang  # noqa: E402
import moe_ep.vllm  # noqa: E402

RANK = int(os.environ.get("MOE_EP_RANK", "0"))
WORLD = int(os.environ.get("MOE_EP_WORLD_SIZE", "1"))
ON_GPU = torch.cuda.is_available()
failures = []


def fail(text):
    failures.append("rank %d %s" % (RANK, text))
    print(failures[-1], flush=True)


class Shape:
    def __init__(self, a):
        self.experts, self.hidden, self.top_k = a.experts_per_rank * WORLD, a.hidden, a.top_k
        self.local, self.max_tokens, self.layers, self.seed = a.experts_per_rank, a.tokens, a.layers, a.seed


# ---- inputs and reference ----------------------------------------------------

def inputs(s, step, layer, ubatch, rank):
    """One rank's micro-batch: x [T, H] bf16, topk_ids [T, K] int64
    (distinct experts, some -1), topk_weights [T, K] f32; on the CPU."""
    g = torch.Generator().manual_seed(((s.seed * 1009 + step) * 101 + layer) * 4 + ubatch * 2 + rank * 7919)
    t = int(torch.randint(0, s.max_tokens + 1, (1,), generator=g))
    x = (torch.randn(t, s.hidden, generator=g) * 2).to(torch.bfloat16)
    idx = torch.argsort(torch.rand(t, s.experts, generator=g), dim=1)[:, :s.top_k].contiguous()
    idx[torch.rand(t, s.top_k, generator=g) < 0.1] = -1
    return x, idx, torch.rand(t, s.top_k, generator=g)


def scale_of(e):
    return 1.0 + (e % 8) / 8.0


def experts(s, recv_x):
    """The local experts: y = bf16(x * scale(e)) (exact in f32)."""
    sc = torch.tensor([scale_of(RANK * s.local + l) for l in range(s.local)], device=recv_x.device)
    return (recv_x.float() * sc[:, None, None]).to(torch.bfloat16)


def expected_recv(s, every_rank):
    """Per local expert: the rows received, source rank then token order."""
    return [[every_rank[r][0][t] for r in range(WORLD) for t in range(every_rank[r][1].shape[0])
             if (every_rank[r][1][t] == RANK * s.local + l).any()] for l in range(s.local)]


def expected_out(s, x, idx, w):
    """Weights at dispatch (README "weights"): per rank the f32 sum of
    w * y in k order, to bf16; the partials summed in f32 in the order the
    token's ranks first appear in its top-k, to bf16."""
    out = torch.zeros(x.shape, dtype=torch.bfloat16)
    for t in range(x.shape[0]):
        order = []
        for e in idx[t].tolist():
            if e >= 0 and e // s.local not in order:
                order.append(e // s.local)
        acc = torch.zeros(s.hidden)
        for r in order:
            part = torch.zeros(s.hidden)
            for k, e in enumerate(idx[t].tolist()):
                if e >= 0 and e // s.local == r:
                    part += w[t, k] * (x[t].float() * scale_of(e)).to(torch.bfloat16).float()
            acc += part.to(torch.bfloat16).float()
        out[t] = acc.to(torch.bfloat16)
    return out


def ulps(a, b):
    def ordinal(t):
        i = t.cpu().contiguous().view(torch.int16).to(torch.int32)
        return torch.where(i < 0, -(i & 0x7FFF), i)
    return int((ordinal(a) - ordinal(b)).abs().max()) if a.numel() else 0


class Checks:
    """What one step of one adapter saw: rows received, worst ulp, failures."""

    def __init__(self, what, step):
        self.what, self.step, self.rows, self.worst, self.bad = what, step, 0, 0, 0
        self.crossed = None
        self.lock = threading.Lock()

    def recv(self, s, layer, ubatch, recv_x, count, every_rank):
        want = expected_recv(s, every_rank)
        got = count.cpu().tolist()
        with self.lock:
            self.rows += sum(got)
        if got != [len(r) for r in want]:
            return self.failed(layer, ubatch, "recv_count got %s want %s" % (got, [len(r) for r in want]))
        rx = recv_x.cpu()
        for l, rows in enumerate(want):
            if rows and not torch.equal(rx[l, :len(rows)].view(torch.int16), torch.stack(rows).view(torch.int16)):
                bad = (rx[l, :len(rows)].view(torch.int16) != torch.stack(rows).view(torch.int16)).nonzero()[0]
                return self.failed(layer, ubatch, "recv_x expert %d first bad index %s" % (l, bad.tolist()))

    def out(self, s, layer, ubatch, got, x, idx, w):
        want = expected_out(s, x, idx, w)
        d = ulps(got, want)
        with self.lock:
            self.worst = max(self.worst, d)
        if d > 1:
            i = int(((got.cpu().float() - want.float()).abs().reshape(-1)).argmax())
            self.failed(layer, ubatch, "output differs by %d ulp; first worst flat index %d: got %r "
                        "want %r" % (d, i, float(got.cpu().reshape(-1)[i]), float(want.reshape(-1)[i])))

    def failed(self, layer, ubatch, text):
        with self.lock:
            self.bad += 1
        fail("seed %d step %d %s layer %d micro-batch %d: %s"
             % (ARGS.seed, self.step, self.what, layer, ubatch, text))


# ---- vLLM: dual-batch overlap ------------------------------------------------------

class DualBatch:
    """Two micro-batch threads taking turns. A thread that sent registers its
    receive hook for the other thread, which runs it when it gets the turn;
    every wait is bounded."""

    def __init__(self, bound_s):
        self.cv = threading.Condition()
        self.turn, self.done, self.hooks, self.bound_s = 0, [False, False], [[], []], bound_s
        self.crossed = 0  # receives a micro-batch ran for the other one

    def start(self, me):
        with self.cv:
            if not self.cv.wait_for(lambda: self.turn == me, timeout=self.bound_s):
                raise RuntimeError("micro-batch %d never got its first turn" % me)

    def send_and_yield(self, me, hook):
        other = 1 - me
        with self.cv:
            self.hooks[other].append(hook)
            if not self.done[other]:
                self.turn = other
                self.cv.notify_all()
                if not self.cv.wait_for(lambda: self.turn == me, timeout=self.bound_s):
                    raise RuntimeError("micro-batch %d waited %.0f s for its turn" % (me, self.bound_s))
            mine, self.hooks[me] = self.hooks[me], []
        for h in mine:  # the other micro-batch's receives, run on this thread
            if not h.done:
                h()
                self.crossed += 1

    def finish(self, me):
        with self.cv:
            self.done[me] = True
            self.turn = 1 - me
            self.cv.notify_all()


def vllm_step(s, pf, dev, step, inp, checks):
    dbo = DualBatch(bound_s=120)
    errors = []

    def ubatch(me):
        try:
            if ON_GPU:  # the current device is per thread
                torch.cuda.set_device(dev)
            dbo.start(me)
            for layer in range(s.layers):
                x, idx, w = (t.to(dev) for t in inp[layer][me][RANK])
                hook, receiver = pf.prepare_async(x, w, idx, s.experts, None, False, None)
                dbo.send_and_yield(me, hook)
                a1q, _, meta, _, _ = receiver()
                checks.recv(s, layer, me, a1q, meta.expert_num_tokens, inp[layer][me])
                out = torch.empty_like(x)
                hook, receiver = pf.finalize_async(out, experts(s, a1q), w, idx, False, None)
                dbo.send_and_yield(me, hook)
                receiver()
                checks.out(s, layer, me, out.cpu(), *inp[layer][me][RANK])
        except Exception as e:  # noqa: BLE001 - reported as a failure of the step
            errors.append("micro-batch %d: %r" % (me, e))
        finally:
            dbo.finish(me)

    threads = [threading.Thread(target=ubatch, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
        if t.is_alive():
            errors.append("a micro-batch thread is still running after 300 s")
    for e in errors:
        checks.failed(-1, -1, e)
    checks.crossed = dbo.crossed


# ---- SGLang: two-batch overlap -------------------------------------------------------

class TopKOutput:
    """SGLang's TopKOutput fields."""

    def __init__(self, w, idx):
        self.topk_weights, self.topk_ids, self.router_logits = w, idx, None


def sglang_step(s, d, dev, step, inp, checks):
    for layer in range(s.layers):
        mine = [[t.to(dev) for t in inp[layer][i][RANK]] for i in (0, 1)]
        for i in (0, 1):
            d.dispatch_a(mine[i][0], TopKOutput(mine[i][2], mine[i][1]), tbo_subbatch_index=i)
        for i in (0, 1):  # sub-batch 1's receive waits while 0 computes and sends back
            o = d.dispatch_b(tbo_subbatch_index=i)
            checks.recv(s, layer, i, o.hidden_states, o.masked_m, inp[layer][i])
            d.combine_a(experts(s, o.hidden_states), o.topk_ids, o.topk_weights, tbo_subbatch_index=i)
        for i in (0, 1):
            checks.out(s, layer, i, d.combine_b(tbo_subbatch_index=i).cpu(), *inp[layer][i][RANK])


# ---- main -----------------------------------------------------------------------------

def main():
    s = Shape(ARGS)
    dev = torch.device("cpu")
    if ON_GPU:
        local = int(os.environ.get("MOE_EP_LOCAL_RANK", RANK))
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    cfg = {"backend": "nccl" if ON_GPU else "host", "mode": "low_latency",
           "num_experts": s.experts, "hidden": s.hidden, "top_k": s.top_k,
           "max_tokens_per_rank": s.max_tokens}
    with moe_ep.Group(cfg) as g:
        pf = moe_ep.vllm.PrepareAndFinalize(g)
        d = moe_ep.sglang.Dispatcher(g)
        if RANK == 0:
            print("%d ranks, %s backend, %d experts, hidden %d, top-%d, %d layers, 2 micro-batches "
                  "of up to %d tokens" % (WORLD, g.backend, s.experts, s.hidden, s.top_k, s.layers,
                                          s.max_tokens))
            print("%5s  %-7s %-13s %9s %8s %12s %9s  %s" % ("step", "adapter", "tokens/ubatch",
                                                          "recv rows", "max ulp", "other-thread",
                                                          "ms", "check"))
        for step in range(ARGS.steps):
            inp = [[[inputs(s, step, layer, i, r) for r in range(WORLD)] for i in (0, 1)]
                   for layer in range(s.layers)]
            tokens = "+".join(str(sum(inp[l][i][RANK][0].shape[0] for l in range(s.layers)))
                              for i in (0, 1))
            for what, run, obj in (("vllm", vllm_step, pf), ("sglang", sglang_step, d)):
                checks = Checks(what, step)
                t0 = time.perf_counter()
                run(s, obj, dev, step, inp, checks)
                if ON_GPU:
                    torch.cuda.synchronize()
                ms = (time.perf_counter() - t0) * 1e3  # includes the reference checks
                if RANK == 0:
                    crossed = "-" if checks.crossed is None else "%d hooks" % checks.crossed
                    print("%5d  %-7s %-13s %9d %8d %12s %9.1f  %s"
                          % (step, what, tokens, checks.rows, checks.worst, crossed, ms,
                             "ok" if not checks.bad else "FAILED"), flush=True)
    print("rank %d: %s" % (RANK, "ok (%d steps)" % ARGS.steps if not failures
                           else "%d failures" % len(failures)), flush=True)
    sys.exit(1 if failures else 0)


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--layers", type=int, default=2, help="MoE layers per step")
    p.add_argument("--tokens", type=int, default=16, help="max tokens per micro-batch and rank")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--experts-per-rank", type=int, default=4)
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    for name in ("steps", "layers", "tokens", "hidden", "experts_per_rank", "top_k"):
        if getattr(a, name) < 1:
            p.error("--%s=%d must be at least 1" % (name.replace("_", "-"), getattr(a, name)))
    if a.top_k > a.experts_per_rank * WORLD:
        p.error("--top-k=%d exceeds the %d experts" % (a.top_k, a.experts_per_rank * WORLD))
    return a


if __name__ == "__main__":
    ARGS = parse()
    main()
