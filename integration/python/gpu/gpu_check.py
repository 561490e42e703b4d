#!/usr/bin/env python3
"""GPU check of the Python front end on the nccl backend (not run by CI).
One process per GPU, started by the launcher, which also sets the
bootstrap address (one group per run: run each part separately):

  tools/launcher/moe_ep_run -n 2 --timeout_s 300 -- python3 integration/python/gpu/gpu_check.py group
  tools/launcher/moe_ep_run -n 2 --timeout_s 300 -- python3 integration/python/gpu/gpu_check.py deep_ep
  tools/launcher/moe_ep_run -n 2 --timeout_s 300 -- python3 integration/python/gpu/gpu_check.py deep_ep_fp8

`group`: CUDA tensors on the current stream; eager dispatch rows
bit-exact against a torch reference built from every rank's seeded inputs;
combine within one bf16 ulp (prints whether it is bit-exact); hooks run on
a second thread on that thread's own stream; prepare + dispatch + combine
captured in one CUDA graph with outputs passed in, replayed on new inputs
and compared with eager results bit for bit. `deep_ep`: the
DeepEP-compatible Buffer's LL dispatch (receive hook) and combine
(async_finish event) against the same reference; `deep_ep_fp8`: fp8
dispatch with DeepEP's column-major scales, dequantised rows within e4m3's
precision. Each rank prints
"rank R: ok" or its failures, and exits non-zero on any failure.
"""
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402

import moe_ep  # noqa: E402

RANK = int(os.environ["MOE_EP_RANK"])
WORLD = int(os.environ["MOE_EP_WORLD_SIZE"])
LOCAL = int(os.environ.get("MOE_EP_LOCAL_RANK", RANK))
E, H, K, N = 8 * WORLD, 2048, 8, 64
EL = E // WORLD
# Without a GPU the same checks run on the host backend (graph capture
# skipped), which is how the checks themselves are tried before a GPU run.
ON_GPU = torch.cuda.is_available()
BACKEND = "nccl" if ON_GPU else "host"
failures = []


def device():
    if not ON_GPU:
        return torch.device("cpu")
    torch.cuda.set_device(LOCAL)
    return torch.device("cuda", LOCAL)


def sync():
    if ON_GPU:
        torch.cuda.synchronize()


def fail(what, text):
    failures.append("rank %d %s: %s" % (RANK, what, text))
    print(failures[-1], flush=True)


def inputs(seed, rank, tokens=None):
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    t = int(torch.randint(1, N + 1, (1,), generator=g)) if tokens is None else tokens
    x = (torch.randn(t, H, generator=g) * 2).to(torch.bfloat16)
    idx = torch.argsort(torch.rand(t, E, generator=g), dim=1)[:, :K].contiguous()
    idx[torch.rand(t, K, generator=g) < 0.1] = -1
    w = torch.rand(t, K, generator=g)
    return x, idx, w


def scale_of(e):
    return 1.0 + (e % 8) / 8.0


def expected_recv(all_in):
    """Per local expert: the source rows in (source rank, token) order."""
    rows = []
    for l in range(EL):
        e = RANK * EL + l
        rows.append([all_in[s][0][t] for s in range(WORLD)
                     for t in range(all_in[s][1].shape[0]) if (all_in[s][1][t] == e).any()])
    return rows


def expected_combine(x, idx, w):
    """One f32 sum per token in k order from 0, then bf16 (README)."""
    out = torch.zeros(x.shape, dtype=torch.bfloat16)
    for t in range(x.shape[0]):
        acc = torch.zeros(H, dtype=torch.float32)
        for k in range(K):
            e = int(idx[t, k])
            if e >= 0:
                y = (x[t].float() * scale_of(e)).to(torch.bfloat16).float()
                acc = acc + w[t, k] * y
        out[t] = acc.to(torch.bfloat16)
    return out


def fp8_values(q):
    """e4m3fn codes as float32 (uint8 storage on torch without fp8)."""
    if q.dtype != torch.uint8:
        return q.float()
    table = []
    for c in range(256):
        e, m = (c >> 3) & 0xF, c & 0x7
        v = m * 2.0 ** -9 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7)
        table.append(float("nan") if (e, m) == (15, 7) else (-v if c & 0x80 else v))
    return torch.tensor(table, device=q.device)[q.long()]


_expert_scales = {}


def experts(recv_x):
    # The scales are made once per device, before any CUDA-graph capture:
    # a host-to-device copy may not be captured.
    s = _expert_scales.get(recv_x.device)
    if s is None:
        s = torch.tensor([scale_of(RANK * EL + l) for l in range(EL)], device=recv_x.device)
        _expert_scales[recv_x.device] = s
    return (recv_x.float() * s[:, None, None]).to(torch.bfloat16)


def check_recv(what, recv_x, count, all_in):
    rows = expected_recv(all_in)
    got = count.cpu().tolist()
    if got != [len(r) for r in rows]:
        fail(what + " recv_count", "got %s want %s" % (got, [len(r) for r in rows]))
        return
    rx = recv_x.cpu()
    for l, r in enumerate(rows):
        if r and not torch.equal(rx[l, :len(r)].view(torch.int16), torch.stack(r).view(torch.int16)):
            bad = (rx[l, :len(r)].view(torch.int16) != torch.stack(r).view(torch.int16)).nonzero()[0]
            fail(what + " recv_x", "expert %d first bad %s" % (l, bad.tolist()))
            return


def ulps(a, b):
    def ordinal(t):
        i = t.cpu().view(torch.int16).to(torch.int32)
        return torch.where(i < 0, -(i & 0x7FFF), i)
    return int((ordinal(a) - ordinal(b)).abs().max()) if a.numel() else 0


def check_combine(what, out, x, idx, w):
    want = expected_combine(x, idx, w)
    d = ulps(out, want)
    print("rank %d %s: combine %s" % (RANK, what, "bit-exact" if d == 0 else "max %d ulp" % d),
          flush=True)
    if d > 1:
        fail(what + " combine", "max %d bf16 ulp from the reference" % d)


def part_group():
    dev = device()
    cfg = {"backend": BACKEND, "num_experts": E, "hidden": H, "top_k": K, "max_tokens_per_rank": N}
    with moe_ep.Group(cfg, device=LOCAL if ON_GPU else None) as g:
        all_in = [inputs(1, r) for r in range(WORLD)]
        x, idx, w = (t.to(dev) for t in all_in[RANK])
        h = g.prepare(idx)
        res = g.dispatch(h, x)
        check_recv("eager", res.recv_x, res.recv_count, all_in)
        out = g.combine(h, experts(res.recv_x), topk_weights=w)
        sync()
        check_combine("eager", out, *all_in[RANK])
        g.poll_error()

        # Hooks on a second thread, on that thread's own stream.
        all_in = [inputs(2, r) for r in range(WORLD)]
        x, idx, w = (t.to(dev) for t in all_in[RANK])
        h2 = g.prepare(idx)
        hook = g.dispatch(h2, x, defer=True)
        box = {}

        def run(hk, key):
            if not ON_GPU:
                box[key] = hk()
                return
            torch.cuda.set_device(dev)
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                box[key] = hk()
            s.synchronize()
        t = threading.Thread(target=run, args=(hook, "d"))
        t.start()
        t.join(120)
        check_recv("hook", box["d"].recv_x, box["d"].recv_count, all_in)
        hook = g.combine(h2, experts(box["d"].recv_x), topk_weights=w, defer=True)
        t = threading.Thread(target=run, args=(hook, "c"))
        t.start()
        t.join(120)
        check_combine("hook", box["c"], *all_in[RANK])

        if not ON_GPU:
            return
        # One CUDA graph: prepare + dispatch + combine, outputs passed in.
        sx, sidx, sw = (t.clone() for t in (x, idx, w))
        sout = torch.empty_like(sx)
        h0 = g.prepare(sidx)  # one eager round trip makes the buffers to reuse
        recv = g.dispatch(h0, sx)
        g.combine(h0, experts(recv.recv_x), topk_weights=sw, out=sout)
        sync()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            gh = g.prepare(sidx)
            g.dispatch(gh, sx, out=recv)
            g.combine(gh, experts(recv.recv_x), topk_weights=sw, out=sout)
        for seed in (3, 4, 5):
            all_in = [inputs(seed, r, tokens=x.shape[0]) for r in range(WORLD)]
            nx, nidx, nw = (t.to(dev) for t in all_in[RANK])
            sx.copy_(nx)
            sidx.copy_(nidx)
            sw.copy_(nw)
            graph.replay()
            sync()
            check_combine("graph replay seed %d" % seed, sout, *all_in[RANK])
            eh = g.prepare(nidx)
            eres = g.dispatch(eh, nx)
            eout = g.combine(eh, experts(eres.recv_x), topk_weights=nw)
            sync()
            if not torch.equal(eout.view(torch.int16), sout.view(torch.int16)):
                fail("graph", "replay seed %d differs from eager" % seed)
        g.poll_error()
        del gh


def part_deep_ep(use_fp8=False):
    """One Buffer per run: the launcher's bootstrap address serves one group."""
    import moe_ep.deep_ep as deep_ep
    dev = device()
    buf = deep_ep.Buffer(None, low_latency_mode=True, explicitly_destroy=True,
                         moe_ep_config={"backend": BACKEND})
    all_in = [inputs(6, r) for r in range(WORLD)]
    x, idx, w = (t.to(dev) for t in all_in[RANK])
    recv_x, count, handle, event, hook = buf.low_latency_dispatch(
        x, idx, N, E, use_fp8=use_fp8, return_recv_hook=True)
    hook()
    if use_fp8:
        q, scales = recv_x
        if scales.shape != (EL, WORLD * N, H // 128) or scales.stride(1) != 1:
            fail("deep_ep fp8 scales", "shape %s strides %s (want column-major)"
                 % (tuple(scales.shape), scales.stride()))
        deq = (fp8_values(q).view(EL, WORLD * N, H // 128, 128) * scales[..., None]).view(EL, WORLD * N, H)
        rows = expected_recv(all_in)
        for l, r in enumerate(rows):
            if r:
                want = torch.stack(r).float()
                err = (deq[l, :len(r)].cpu() - want).abs() - (want.abs() / 16 + 1e-3)
                if (err > 0).any():
                    fail("deep_ep fp8", "expert %d dequantised rows off by more than e4m3 allows" % l)
        recv_x = deq.to(torch.bfloat16)
    else:
        check_recv("deep_ep", recv_x, count, all_in)
    out, event, hook = buf.low_latency_combine(experts(recv_x), idx, w, handle, async_finish=True)
    event.current_stream_wait()
    sync()
    if not use_fp8:
        check_combine("deep_ep", out, *all_in[RANK])
    buf.destroy()


def main():
    part = sys.argv[1] if len(sys.argv) > 1 else "group"
    {"group": part_group, "deep_ep": part_deep_ep,
     "deep_ep_fp8": lambda: part_deep_ep(use_fp8=True)}[part]()
    print("rank %d: %s" % (RANK, "ok" if not failures else "%d failures" % len(failures)),
          flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
