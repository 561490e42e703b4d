#!/usr/bin/env python3
"""GPU check of the Python front end on the nccl backend (not run by CI).
One process per GPU, started by the launcher, which also sets the
bootstrap address (one group per run: run each part separately; `ht`,
which makes four groups, has rank 0 pick a port for each):

  tools/launcher/moe_ep_run -n 2 --timeout_s 300 -- python3 integration/python/gpu/gpu_check.py group
  tools/launcher/moe_ep_run -n 2 --timeout_s 300 -- python3 integration/python/gpu/gpu_check.py deep_ep
  tools/launcher/moe_ep_run -n 2 --timeout_s 300 -- python3 integration/python/gpu/gpu_check.py deep_ep_fp8
  tools/launcher/moe_ep_run -n 2 --timeout_s 300 -- python3 integration/python/gpu/gpu_check.py ht
  tools/launcher/moe_ep_run -n 2 --timeout_s 300 -- python3 integration/python/gpu/gpu_check.py auto
  tools/launcher/moe_ep_run -n 2 --timeout_s 300 -- python3 integration/python/gpu/gpu_check.py grow
  tools/launcher/moe_ep_run -n 2 --timeout_s 300 -- python3 integration/python/gpu/gpu_check.py deep_ep_graph
  tools/launcher/moe_ep_run -n 2 --timeout_s 300 -- python3 integration/python/gpu/gpu_check.py dropped

`group`: CUDA tensors on the current stream; eager dispatch rows
bit-exact against a torch reference built from every rank's seeded inputs;
combine within one bf16 ulp (prints whether it is bit-exact); hooks run on
a second thread on that thread's own stream; prepare + dispatch + combine
captured in one CUDA graph with outputs passed in, replayed on new inputs
and compared with eager results bit for bit. `deep_ep`: the
DeepEP-compatible Buffer's LL dispatch (receive hook) and combine
(async_finish event) against the same reference; `deep_ep_fp8`: fp8
dispatch with DeepEP's column-major scales, dequantised rows within e4m3's
precision. `deep_ep_graph` (`_fp8`): that Buffer's LL dispatch and combine
captured in one CUDA graph, as vLLM and SGLang decode, replayed on new
inputs and checked against the reference (bf16: and against an eager call
bit for bit). `ht`: high-throughput groups (256 and 64 experts) through the
Group API, then the Buffer's normal mode: bf16 dispatch of 0 to 4096
tokens per rank, hidden 7168 and 2880, top-k 8 and 1 (recv_x rows, local
expert ids, weights, per-expert counts, num_recv_tokens; the Buffer's
get_dispatch_layout), pre-quantised fp8 with f32, UE8M0, packed UE8M0 and
per-token scales (bytes and scales verbatim; DeepEP's [T] scales through
the Buffer), worst-case outputs (num_worst_tokens),
a cached layout (a second tensor on one handle), and combine (with
DeepEP's bias pair after the cached dispatch), all
bit-exact against an expectation built from every rank's seeded inputs;
a worst-case dispatch + combine captured in a CUDA graph and replayed on
new inputs (num_worst_tokens at and below the library's rows, and a
Buffer whose group that dispatch sized: max_tokens_per_rank
num_worst_tokens / world_size); vLLM's HT prepare with its counts on the
host (expert_num_tokens_cpu). `auto`: SGLang's deepep_mode auto, both modes through one
low-latency Buffer. `grow`: a Buffer over a gloo group grows its derived
normal-mode cap while a combine is pending, that combine running on the
replaced group, which the next agreement closes. `dropped`: a vLLM
prepare whose receive is never run, then a whole layer call: on an HT
group that call matches bit for bit, on an LL group its finalize raises
MismatchError (the abandoned receive fails the group). `ht` prints one line per check. Each rank prints "rank R: ok"
or its failures, and exits non-zero on any failure.
"""
import contextlib
import os
import socket
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


def inputs(seed, rank, tokens=None, hidden=H, experts=E, top_k=K):
    """Rank `rank`'s x bf16 [T, hidden], topk_idx int64 [T, top_k] (distinct
    experts, about 10% -1) and weights f32 [T, top_k], from the seed alone,
    so every rank can build every rank's inputs."""
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    t = int(torch.randint(1, N + 1, (1,), generator=g)) if tokens is None else tokens
    x = (torch.randn(t, hidden, generator=g) * 2).to(torch.bfloat16)
    idx = torch.argsort(torch.rand(t, experts, generator=g), dim=1)[:, :top_k].contiguous()
    idx[torch.rand(t, top_k, generator=g) < 0.1] = -1
    w = torch.rand(t, top_k, generator=g)
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


def check_handle_layout(what, handle, all_in):
    """DeepEP's LL handle: src_info[l][slot] = the source token of each
    received slot (slots by source rank, then token), layout_range[l][r] =
    begin << 32 | count of source r's slots; read lazily from the library."""
    src_info, layout_range = handle[0].cpu(), handle[1].cpu()
    for l in range(EL):
        e, begin = RANK * EL + l, 0
        for r in range(WORLD):
            toks = [t for t in range(all_in[r][1].shape[0]) if (all_in[r][1][t] == e).any()]
            want = (begin << 32) | len(toks)
            got = int(layout_range[l, r])
            if got != want:
                fail(what, "layout_range[%d][%d] = %#x, want %#x" % (l, r, got, want))
                return
            got_src = src_info[l, begin:begin + len(toks)].tolist()
            if got_src != toks:
                fail(what, "src_info[%d][%d:%d] = %s, want %s"
                     % (l, begin, begin + len(toks), got_src[:8], toks[:8]))
                return
            begin += len(toks)
    print("rank %d %s: src_info and layout_range bit-exact" % (RANK, what))


def expected_combine(x, idx, w):
    """Per rank the token reaches (in the order its ranks first appear in
    top-k) an f32 sum of its slots in k order from 0, rounded to bf16; the
    partials summed in f32 from 0, then bf16 (README). Products are not
    fused here, hence the one-ulp tolerance."""
    out = torch.zeros(x.shape, dtype=torch.bfloat16)
    for t in range(x.shape[0]):
        ranks = []
        for k in range(K):
            e = int(idx[t, k])
            if e >= 0 and e // EL not in ranks:
                ranks.append(e // EL)
        acc = torch.zeros(H, dtype=torch.float32)
        for r in ranks:
            part = torch.zeros(H, dtype=torch.float32)
            for k in range(K):
                e = int(idx[t, k])
                if e >= 0 and e // EL == r:
                    y = (x[t].float() * scale_of(e)).to(torch.bfloat16).float()
                    part = part + w[t, k] * y
            acc = acc + part.to(torch.bfloat16).float()
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


def replay_on(graph, statics, seed, tokens, dev):
    """Every rank's inputs of `seed` (tokens each); this rank's copied into
    the captured graph's static tensors, the graph replayed and waited
    for. Returns (every rank's inputs, this rank's on the device)."""
    all_in = [inputs(seed, r, tokens=tokens) for r in range(WORLD)]
    mine = tuple(t.to(dev) for t in all_in[RANK])
    for static, new in zip(statics, mine):
        static.copy_(new)
    graph.replay()
    sync()
    return all_in, mine


def hook_stream_keeps_inputs(g, dev):
    """A combine hook run on another stream than its send, that stream
    still busy: the weights its receive reads, dropped by the caller right
    after hook() returns, stay allocated until that stream's work ended
    (record_stream), so a new tensor of their size on the send stream gets
    other memory; the combine matches the reference."""
    all_in = [inputs(6, r) for r in range(WORLD)]
    x, idx, w = (t.to(dev) for t in all_in[RANK])
    h = g.prepare(idx)
    res = g.dispatch(h, x)
    hook = g.combine(h, experts(res.recv_x), topk_weights=w, defer=True)
    other = torch.cuda.Stream()
    with torch.cuda.stream(other):
        torch.cuda._sleep(int(5e8))  # keeps the receive queued well past the checks below
        out = hook()
    w_ptr, shape = w.data_ptr(), w.shape
    del w
    fresh = torch.empty(shape, dtype=torch.float32, device=dev)
    if fresh.data_ptr() == w_ptr:
        fail("hook on another stream", "the weights' memory was handed out again while that "
             "stream's receive still read it")
    other.synchronize()
    check_combine("hook on another stream", out, *all_in[RANK])


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
        hook_stream_keeps_inputs(g, dev)
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
            all_in, (nx, nidx, nw) = replay_on(graph, (sx, sidx, sw), seed, x.shape[0], dev)
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
    check_handle_layout("deep_ep handle", handle, all_in)
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
        if ON_GPU:  # streams and sleeps: CUDA only
            hooks_on_dispatch_stream(buf, x, idx, w, all_in)
    buf.destroy()


def hooks_on_dispatch_stream(buf, x, idx, w, all_in):
    """DeepEP's receive hooks launch on the stream their dispatch or combine
    was called on, whatever stream is current where they run and on
    whichever thread. The calls run on a side stream s1; a second side
    stream s2 is current where the hooks run. Three passes, each reading
    the outputs on s1: the hooks run from another thread (a kernel's first
    launch, CUDA's lazy module loading, waits for the device: this pass
    loads them); run with s2 current and held by a sleep, the receive must
    not wait for it (the outputs are read before the hold ends); run from
    another thread after s1 queued held work that overwrites the outputs,
    the receive must still follow that work."""
    dev = device()
    s1, s2 = torch.cuda.Stream(dev), torch.cuda.Stream(dev)

    def on_s2(hold):
        def run(hook):
            with torch.cuda.stream(s2):
                if hold:
                    torch.cuda._sleep(1_000_000_000)
                hook()
        return run

    def elsewhere(hook):
        t = threading.Thread(target=on_s2(False), args=(hook,))
        t.start()
        t.join()

    def one_pass(what, run, hold_s1):
        recv_x, count, handle, _, hook = buf.low_latency_dispatch(
            x, idx, N, E, use_fp8=False, return_recv_hook=True)
        if hold_s1:
            torch.cuda._sleep(1_000_000_000)
        recv_x.fill_(float("nan"))
        count.fill_(-1)
        early = (handle[0], handle[1])  # before the hook, as DeepEP allows: the hook fills them
        run(hook)
        check_recv("deep_ep dispatch " + what, recv_x, count, all_in)
        if handle[0] is not early[0] or handle[1] is not early[1]:
            fail("deep_ep handle read before the hook, " + what, "a later read gave other tensors")
        check_handle_layout("deep_ep handle read before the hook, " + what, handle, all_in)
        out, _, hook = buf.low_latency_combine(experts(recv_x), idx, w, handle,
                                               return_recv_hook=True)
        if hold_s1:
            torch.cuda._sleep(1_000_000_000)
        out.fill_(float("nan"))
        run(hook)
        check_combine("deep_ep combine " + what, out, *all_in[RANK])
        sync()

    with torch.cuda.stream(s1):
        one_pass("hook run from another thread", elsewhere, False)
        one_pass("hook run with a held stream current", on_s2(True), False)
        one_pass("hook run from another thread after held work", elsewhere, True)


def part_deep_ep_graph(use_fp8=False):
    """The Buffer's LL dispatch and combine in one CUDA graph, as vLLM and
    SGLang decode: captured once on static inputs, replayed on new ones
    copied in, each replay's receive and combine checked against the
    reference (bf16; fp8: the counts, its rows being quantised) and against
    an eager call of the same inputs bit for bit (fp8: every received row,
    dequantised, and the combine)."""
    import moe_ep.deep_ep as deep_ep
    if not ON_GPU:
        return
    dev = device()
    buf = deep_ep.Buffer(None, low_latency_mode=True, explicitly_destroy=True,
                         moe_ep_config={"backend": BACKEND})
    tokens = N // 2
    all_in = [inputs(30, r, tokens=tokens) for r in range(WORLD)]
    sx, sidx, sw = (t.to(dev).clone() for t in all_in[RANK])

    def layer():
        recv_x, count, handle, _, _ = buf.low_latency_dispatch(sx, sidx, N, E, use_fp8=use_fp8)
        if use_fp8:
            q, scales = recv_x
            recv_x = (fp8_values(q).view(EL, WORLD * N, H // 128, 128) *
                      scales[..., None]).view(EL, WORLD * N, H).to(torch.bfloat16)
        out, _, _ = buf.low_latency_combine(experts(recv_x), sidx, sw, handle)
        return recv_x, count, out
    layer()  # eager first: creates the group and loads its kernels
    sync()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_recv, g_count, g_out = layer()
    what = "deep_ep graph" + (" fp8" if use_fp8 else "")
    for seed in (31, 32, 33):
        all_in, _ = replay_on(graph, (sx, sidx, sw), seed, tokens, dev)
        counts = [len(r) for r in expected_recv(all_in)]
        if use_fp8:
            if g_count.cpu().tolist() != counts:
                fail(what + " recv_count", "replay seed %d: %s" % (seed, g_count.cpu().tolist()))
        else:
            check_recv("%s replay seed %d" % (what, seed), g_recv, g_count, all_in)
            check_combine("%s replay seed %d" % (what, seed), g_out, *all_in[RANK])
        # Read before the eager call: for bf16 g_recv is the library's
        # buffer, which that call's dispatch may fill again.
        g_rows = [g_recv[l, :c].clone() for l, c in enumerate(counts)]
        e_recv, e_count, e_out = layer()
        sync()
        for l, c in enumerate(counts):
            if not torch.equal(e_recv[l, :c].view(torch.int16), g_rows[l].view(torch.int16)):
                fail(what, "replay seed %d: local expert %d's received rows differ from the "
                     "eager call's" % (seed, l))
        if not torch.equal(e_out.view(torch.int16), g_out.view(torch.int16)):
            fail(what, "replay seed %d differs from the eager call" % seed)
    print("rank %d %s: %d replays checked" % (RANK, what, 3))
    buf.destroy()


# ---- high throughput: the Group API (mode high_throughput) and the Buffer's normal mode

HT_HIDDEN, HT_TOP_K, HT_TOKENS = 7168, 8, 4096  # the HT groups' maxima
# (seed, tokens by rank (rank r has tokens[r % len]), hidden, top_k) per expert count.
HT_CASES = {
    256: [(11, (1, 7), 7168, 8), (12, (512, 7), 2880, 8), (13, (4096, 4096), 7168, 8),
          (14, (4096, 1), 2880, 1), (15, (7, 512), 7168, 1)],
    # The rank without tokens comes last: should it break the group, the
    # other cases have already run.
    64: [(21, (7, 1), 7168, 8), (22, (512, 4096), 2880, 8), (23, (1, 512), 7168, 1),
         (24, (0, 512), 7168, 8)],
}
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_store = None  # rank 0's TCPStore serves until the process ends


def group_addresses(n, span=1):
    """One bootstrap address per group: a group's listener holds its port
    for the group's life, and a destroyed group's port may sit in TCP
    TIME_WAIT. Rank 0 picks n free ports and publishes them in a TCPStore
    on the launcher's address, which no group uses then; the launcher's
    variable is dropped so that it does not override the configs' address.
    span > 1: the span - 1 ports above each one are free too (the Buffer's
    normal-mode group of SGLang's auto mode listens at the port above its
    LL group's)."""
    global _store
    from torch.distributed import TCPStore
    host, port = os.environ.pop("MOE_EP_BOOTSTRAP_ADDRESS").rsplit(":", 1)
    _store = TCPStore(host, int(port), WORLD, RANK == 0)
    if RANK == 0:
        held, bases, found = [], [], "none"
        try:
            # bounded: a free port whose neighbours are free is found in a
            # few tries on any machine with free ports at all
            for _ in range(64 * n):
                if len(bases) == n:
                    break
                s = socket.socket()
                held.append(s)  # kept bound until every base is picked
                s.bind((host, 0))
                base = s.getsockname()[1]
                if base + span - 1 > 65535:
                    continue
                for k in range(1, span):
                    t = socket.socket()
                    held.append(t)
                    try:
                        t.bind((host, base + k))
                    except OSError:
                        break
                else:
                    bases.append(base)
            if len(bases) == n:
                found = ",".join(str(b) for b in bases)
        finally:
            # the other ranks wait for the key: publish even a failure
            _store.set("ports", found)
            for s in held:
                s.close()
    ports = _store.get("ports").decode()
    if ports == "none":
        raise RuntimeError("rank %d: rank 0 could not find %d runs of %d free ports on %s"
                           % (RANK, n, span, host))
    return ["%s:%s" % (host, p) for p in ports.split(",")]


def ht_config(address, **keys):
    cfg = {"backend": BACKEND, "mode": "high_throughput", "hidden": HT_HIDDEN,
           "top_k": HT_TOP_K, "max_tokens_per_rank": HT_TOKENS,
           "bootstrap": {"address": address, "timeout_ms": 60000},
           # A rank may still be building a 4096-token expectation while its
           # peer's dispatch waits for it.
           "timeouts": {"kernel_ms": 60000}}
    cfg.update(keys)
    return cfg


@contextlib.contextmanager
def case(what):
    """One line per check: ok, or FAIL after the lines of what differed.
    An exception fails the check and the part goes on to the next one."""
    before = len(failures)
    try:
        yield
    except Exception as e:  # noqa: BLE001 (reported, then the next check runs)
        fail(what, "raised %s: %s" % (type(e).__name__, e))
    print("rank %d %s: %s" % (RANK, what, "ok" if len(failures) == before else "FAIL"), flush=True)


def same(what, got, want):
    """Bit-exact: the same shape, element size and bytes."""
    got = got.cpu()
    if got.shape != want.shape or got.element_size() != want.element_size():
        fail(what, "got %s %s, want %s %s" % (tuple(got.shape), got.dtype, tuple(want.shape),
                                              want.dtype))
        return
    a, b = (t.contiguous().view(_BITS[t.element_size()]) for t in (got, want))
    bad = (a != b).nonzero()
    if len(bad):
        i, mask = tuple(bad[0].tolist()), (1 << 8 * a.element_size()) - 1
        fail(what, "%d of %d differ; first at %s: bits got 0x%x want 0x%x"
             % (len(bad), a.numel(), i, a[i].item() & mask, b[i].item() & mask))


def on_device(tensors):
    dev = device()
    return tuple(t.to(dev) for t in tensors)


def ht_inputs(seed, tokens, hidden, experts, top_k=HT_TOP_K):
    return [inputs(seed, r, tokens[r % len(tokens)], hidden, experts, top_k)
            for r in range(WORLD)]


def fp8_inputs(seed, tokens, fmt):
    """Every rank's pre-quantised x as an engine passes it: e4m3 codes
    [T, H] (any finite code: HT carries the bytes unread) and scales,
    [T, H/128] f32 (arbitrary for fp8, powers of two for fp8_ue8m0),
    [T, H/512] int32 (fp8_ue8m0_packed: four UE8M0 exponent bytes each) or
    [T, 1] f32 (fp8_per_token)."""
    out = []
    for r in range(WORLD):
        g = torch.Generator().manual_seed(seed * 1000 + r)
        t, groups = tokens[r % len(tokens)], HT_HIDDEN // 128
        q = torch.randint(0, 256, (t, HT_HIDDEN), generator=g, dtype=torch.uint8)
        q[(q & 0x7F) == 0x7F] = 0  # no NaN codes: the combine reads the codes' values
        if fmt == "fp8":
            s = torch.rand(t, groups, generator=g) * 4 + 1e-3
        elif fmt == "fp8_per_token":
            s = torch.rand(t, 1, generator=g) * 4 + 1e-3
        elif fmt == "fp8_ue8m0":
            s = torch.pow(2.0, torch.randint(-20, 5, (t, groups), generator=g).float())
        else:
            s = torch.randint(107, 135, (t, groups), generator=g, dtype=torch.uint8)
            s = s.view(torch.int32)
        out.append((q, s))
    return out


def to_rank(idx, experts, r):
    """[T, K] bool: the slots whose expert lives on rank r."""
    return (idx >= 0) & (idx // (experts // WORLD) == r)


def routed(mine, tensors):
    """The rows of every rank's tensor that this rank receives, in the
    documented HT order: source rank, then token."""
    return torch.cat([t[m.any(1)] for m, t in zip(mine, tensors)])


def ht_expected(all_in, experts):
    """This rank's HT receive: x rows, local expert ids (-1 elsewhere),
    weights (0 elsewhere), counts per local expert, and per source the
    slots routed here (for other tensors sent along the same layout)."""
    el = experts // WORLD
    mine = [to_rank(idx, experts, RANK) for _, idx, _ in all_in]
    ids = routed(mine, [torch.where(m, i - RANK * el, torch.full_like(i, -1))
                        for m, (_, i, _) in zip(mine, all_in)]).int()
    w = routed(mine, [torch.where(m, v, torch.zeros_like(v)) for m, (_, _, v) in zip(mine, all_in)])
    return {"mine": mine, "x": routed(mine, [x for x, _, _ in all_in]), "idx": ids, "w": w,
            "count": torch.bincount(ids[ids >= 0].long(), minlength=el).int()}


def partial(rows, r):
    """Rank r's expert output for rows it received (bf16, or fp8 codes read
    unscaled): bf16(value * scale_of(r)). The product is exact in f32 (8 or 4
    significant bits times 4), so the only rounding is to bf16, alike on
    CPU and GPU."""
    v = fp8_values(rows) if rows.element_size() == 1 else rows.float()
    return (v * scale_of(r)).to(torch.bfloat16)


def ht_combined(rows, idx, experts):
    """Combine's out for this rank's tokens (README): every rank r holding
    one of token t's experts sends back partial(row t, r); out is their sum
    over r ascending in f32 from +0, rounded to bf16 once (+0 for a token
    sent nowhere)."""
    acc = torch.zeros(rows.shape, dtype=torch.float32)
    for r in range(WORLD):
        sent = to_rank(idx, experts, r).any(1, keepdim=True)
        # Adding +0 where rank r has none of the token's experts adds
        # nothing: a sum from +0 is never -0 (only -0 + -0 is).
        acc += torch.where(sent, partial(rows, r).float(), torch.zeros(()))
    return acc.to(torch.bfloat16)


def check_rows(what, want, recv_x, recv_idx, recv_w, recv_scales=None, rows=None,
               idx_dtype=torch.int32):
    """A receive against `want`. rows (worst case): the outputs have that
    many rows; past the receive, recv_topk_idx is -1, the weight 0 and
    recv_x (and recv_scales) unspecified."""
    n = len(want["idx"])
    want_idx, want_w = want["idx"].to(idx_dtype), want["w"]
    if rows is not None:
        recv_x = recv_x[:n]
        recv_scales = recv_scales[:n] if recv_scales is not None else None
        k = want_idx.shape[1]
        want_idx = torch.cat([want_idx, torch.full((rows - n, k), -1, dtype=idx_dtype)])
        want_w = torch.cat([want_w, torch.zeros(rows - n, k)])
    same(what + " recv_x", recv_x, want["x"])
    if "scales" in want:
        same(what + " recv_scales", recv_scales, want["scales"])
    same(what + " recv_topk_idx", recv_idx, want_idx)
    same(what + " recv_topk_weights", recv_w, want_w)


def check_counts(what, res, want, reported):
    if res.num_recv_tokens != reported:
        fail(what + " num_recv_tokens", "got %s want %s" % (res.num_recv_tokens, reported))
    same(what + " recv_count", res.recv_count, want["count"])


def ht_bf16(g, experts, seed, tokens, hidden, top_k):
    what = "ht E%d bf16 T=%s H=%d K=%d" % (experts, tokens, hidden, top_k)
    with case(what):
        all_in = ht_inputs(seed, tokens, hidden, experts, top_k)
        x, idx, w = on_device(all_in[RANK])
        h = g.prepare(idx)
        res = g.dispatch(h, x, topk_weights=w)
        want = ht_expected(all_in, experts)
        check_counts(what, res, want, len(want["idx"]))
        check_rows(what, want, res.recv_x, res.recv_topk_idx, res.recv_topk_weights)
        out = g.combine(h, partial(res.recv_x, RANK))
        same(what + " combine", out, ht_combined(*all_in[RANK][:2], experts))
        h.free()


def ht_fp8(g, experts, seed, tokens, fmt):
    """(x_fp8, scales) in; codes and scales out bit for bit."""
    what = "ht E%d %s T=%s" % (experts, fmt, tokens)
    with case(what):
        all_in = ht_inputs(seed, tokens, HT_HIDDEN, experts)
        quant = fp8_inputs(seed, tokens, fmt)
        q, s = on_device(quant[RANK])
        _, idx, w = on_device(all_in[RANK])
        h = g.prepare(idx)
        # The format follows the scales (f32: fp8, or one column per token;
        # int32: packed); power-of-two scales in f32 are named.
        kw = {"format": fmt} if fmt == "fp8_ue8m0" else {}
        res = g.dispatch(h, (q.view(moe_ep.FP8_STORAGE), s), topk_weights=w, **kw)
        want = ht_expected(all_in, experts)
        want["x"] = routed(want["mine"], [c for c, _ in quant])
        want["scales"] = routed(want["mine"], [c for _, c in quant])
        check_counts(what, res, want, len(want["idx"]))
        check_rows(what, want, res.recv_x, res.recv_topk_idx, res.recv_topk_weights,
                   res.recv_scales)
        out = g.combine(h, partial(res.recv_x, RANK))
        same(what + " combine", out, ht_combined(quant[RANK][0], all_in[RANK][1], experts))
        h.free()


def ht_worst(g, experts, seed, tokens):
    what = "ht E%d worst case T=%s" % (experts, tokens)
    with case(what):
        all_in = ht_inputs(seed, tokens, HT_HIDDEN, experts)
        x, idx, w = on_device(all_in[RANK])
        h = g.prepare(idx)
        res = g.dispatch(h, x, topk_weights=w, worst_case=True)
        want = ht_expected(all_in, experts)
        # A GPU group keeps the count on the device (no host sync): None.
        check_counts(what, res, want, None if ON_GPU else len(want["idx"]))
        check_rows(what, want, res.recv_x, res.recv_topk_idx, res.recv_topk_weights,
                   rows=WORLD * HT_TOKENS)
        out = g.combine(h, partial(res.recv_x, RANK))  # y: all the fixed-size rows
        same(what + " combine", out, ht_combined(*all_in[RANK][:2], experts))
        h.free()


def ht_cached(g, experts, seed, tokens):
    """A second dispatch on the same handle sends another tensor along its
    layout (DeepEP's cached dispatch); the combine follows that one."""
    what = "ht E%d cached layout T=%s" % (experts, tokens)
    with case(what):
        all_in = ht_inputs(seed, tokens, HT_HIDDEN, experts)
        second = [x for x, _, _ in ht_inputs(seed + 50, tokens, HT_HIDDEN, experts)]
        x, idx, w = on_device(all_in[RANK])
        h = g.prepare(idx)
        want = ht_expected(all_in, experts)
        res = g.dispatch(h, x, topk_weights=w)
        check_rows(what + " first", want, res.recv_x, res.recv_topk_idx, res.recv_topk_weights)
        res = g.dispatch(h, second[RANK].to(x.device), topk_weights=w)
        want["x"] = routed(want["mine"], second)
        check_counts(what + " second", res, want, len(want["idx"]))
        check_rows(what + " second", want, res.recv_x, res.recv_topk_idx, res.recv_topk_weights)
        out = g.combine(h, partial(res.recv_x, RANK))
        same(what + " combine", out, ht_combined(second[RANK], all_in[RANK][1], experts))
        h.free()


def graph_check(what, experts, tokens, seed, step, check):
    """step(x, idx, w) runs once eagerly, then is captured in one CUDA graph
    on the same input tensors; each replay on the inputs of seeds seed + 1
    to seed + 3 (copied into those tensors, same shapes) is checked by
    check(label, all_in, want, outs) with outs what the capture returned."""
    if not ON_GPU:
        print("rank %d %s: skipped (CUDA graphs need a GPU)" % (RANK, what), flush=True)
        return
    static = on_device(ht_inputs(seed, tokens, HT_HIDDEN, experts)[RANK])
    graph = None
    with case(what + " capture"):
        step(*static)  # eagerly first, as before any capture
        sync()
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured):
            outs = step(*static)  # their handle is kept while the graph is replayed
        graph = captured
    if graph is None:
        return
    for seed in range(seed + 1, seed + 4):
        label = "%s replay seed %d" % (what, seed)
        with case(label):
            all_in = ht_inputs(seed, tokens, HT_HIDDEN, experts)
            for s, t in zip(static, on_device(all_in[RANK])):
                s.copy_(t)
            graph.replay()
            sync()
            check(label, all_in, ht_expected(all_in, experts), outs)


def ht_graph(g, experts, tokens):
    """prepare + worst-case dispatch + combine in one CUDA graph."""
    def step(x, idx, w):
        h = g.prepare(idx)
        res = g.dispatch(h, x, topk_weights=w, worst_case=True)
        return res, g.combine(h, partial(res.recv_x, RANK)), h

    def check(what, all_in, want, outs):
        res, out, _ = outs
        same(what + " recv_count", res.recv_count, want["count"])
        check_rows(what, want, res.recv_x, res.recv_topk_idx, res.recv_topk_weights,
                   rows=WORLD * HT_TOKENS)
        same(what + " combine", out, ht_combined(*all_in[RANK][:2], experts))
    graph_check("ht E%d graph T=%s" % (experts, tokens), experts, tokens, 40, step, check)


# ---- the Buffer's normal mode ------------------------------------------------

# (seed, tokens by rank, hidden, top_k, expert_alignment). The first
# get_dispatch_layout creates the group (256 experts; hidden, top_k and
# max_tokens_per_rank from ht_config).
BUFFER_CASES = [(31, (512, 7), 7168, 8, 1), (32, (4096, 1), 2880, 1, 128),
                (33, (1, 4096), 7168, 8, 4)]


def buffer_bf16(buf, experts, seed, tokens, hidden, top_k, align):
    """get_dispatch_layout, dispatch given its layout as DeepEP callers
    pass it, combine with the dispatch's weights."""
    what = "deep_ep E%d bf16 T=%s H=%d K=%d alignment %d" % (experts, tokens, hidden, top_k, align)
    with case(what):
        all_in = ht_inputs(seed, tokens, hidden, experts, top_k)
        x, idx, w = on_device(all_in[RANK])
        per_rank, per_rdma, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, experts)
        cidx, cw = all_in[RANK][1:]
        want_in = torch.stack([to_rank(cidx, experts, r).any(1) for r in range(WORLD)], 1)
        same(what + " is_token_in_rank", in_rank, want_in)
        same(what + " num_tokens_per_rank", per_rank, want_in.sum(0).int())
        same(what + " num_tokens_per_expert", per_expert,
             torch.bincount(cidx[cidx >= 0], minlength=experts).int())
        if per_rdma is not None:
            fail(what + " num_tokens_per_rdma_rank", "got %r want None" % (per_rdma,))
        recv_x, recv_idx, recv_w, counts, handle, _ = buf.dispatch(
            x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w, expert_alignment=align)
        want = ht_expected(all_in, experts)
        check_rows(what, want, recv_x, recv_idx, recv_w, idx_dtype=idx.dtype)
        check_list(what, counts, [(c + align - 1) // align * align for c in want["count"].tolist()])
        out, combined_w, _ = buf.combine(partial(recv_x, RANK), handle, topk_weights=recv_w)
        same(what + " combine", out, ht_combined(*all_in[RANK][:2], experts))
        same(what + " combined weights", combined_w,
             torch.where(cidx >= 0, cw, torch.zeros_like(cw)))


def check_list(what, got, want):
    if got != want:
        fail(what + " num_recv_tokens_per_expert_list", "got %s want %s" % (got, want))


def buffer_fp8(buf, experts, seed, tokens, fmt, one_d=False):
    """(x_fp8, scales) in, (recv_x_fp8, recv_scales) out bit for bit; f32
    scales as DeepGEMM's column-major view, as engines pass them; one_d:
    DeepEP's per-token [T] scales, received as [N_recv]."""
    what = "deep_ep E%d %s T=%s" % (experts, fmt, tokens)
    with case(what):
        all_in = ht_inputs(seed, tokens, HT_HIDDEN, experts)
        quant = fp8_inputs(seed, tokens, fmt)
        q, s = on_device(quant[RANK])
        if s.dtype == torch.float32:
            s = s.t().contiguous().t()
        _, idx, w = on_device(all_in[RANK])
        (rq, rs), recv_idx, recv_w, counts, handle, _ = buf.dispatch(
            (q.view(moe_ep.FP8_STORAGE), s.view(-1) if one_d else s), topk_idx=idx,
            topk_weights=w)
        if one_d:
            if rs.dim() != 1:
                fail(what + " recv_scales", "shape %s for [T] scales" % (tuple(rs.shape),))
            rs = rs.view(-1, 1)
        want = ht_expected(all_in, experts)
        want["x"] = routed(want["mine"], [c for c, _ in quant])
        want["scales"] = routed(want["mine"], [c for _, c in quant])
        check_rows(what, want, rq, recv_idx, recv_w, rs, idx_dtype=idx.dtype)
        check_list(what, counts, want["count"].tolist())
        out, _, _ = buf.combine(partial(rq, RANK), handle)
        same(what + " combine", out, ht_combined(quant[RANK][0], all_in[RANK][1], experts))


def buffer_worst(buf, experts, seed, tokens):
    """num_worst_tokens: outputs of that many rows and an empty per-expert
    list. At world_size * max_tokens_per_rank rows the dispatch takes no
    host sync; fewer rows are views of those (checked, with a sync, to hold
    the receive)."""
    all_in = ht_inputs(seed, tokens, HT_HIDDEN, experts)
    x, idx, w = on_device(all_in[RANK])
    want = ht_expected(all_in, experts)
    # The largest receive of any rank: every rank must pick the same size.
    most = max(sum(int(to_rank(i, experts, r).any(1).sum()) for _, i, _ in all_in)
               for r in range(WORLD))
    for nw in (WORLD * HT_TOKENS, most + 3):
        what = "deep_ep E%d num_worst_tokens=%d T=%s" % (experts, nw, tokens)
        with case(what):
            recv_x, recv_idx, recv_w, counts, handle, _ = buf.dispatch(
                x, topk_idx=idx, topk_weights=w, num_worst_tokens=nw)
            check_rows(what, want, recv_x, recv_idx, recv_w, rows=nw, idx_dtype=idx.dtype)
            check_list(what, counts, [])
            out, _, _ = buf.combine(partial(recv_x, RANK), handle, topk_weights=recv_w)
            same(what + " combine", out, ht_combined(*all_in[RANK][:2], experts))


def buffer_cached(buf, experts, seed, tokens):
    """dispatch(handle=) sends a second tensor along the first dispatch's
    layout; combine follows it, with DeepEP's bias pair added."""
    what = "deep_ep E%d cached dispatch T=%s" % (experts, tokens)
    with case(what):
        all_in = ht_inputs(seed, tokens, HT_HIDDEN, experts)
        second = [x for x, _, _ in ht_inputs(seed + 50, tokens, HT_HIDDEN, experts)]
        x, idx, w = on_device(all_in[RANK])
        recv_x, recv_idx, recv_w, _, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w)
        want = ht_expected(all_in, experts)
        check_rows(what + " first", want, recv_x, recv_idx, recv_w, idx_dtype=idx.dtype)
        recv_x2, idx2, w2, counts2, handle2, _ = buf.dispatch(second[RANK].to(x.device),
                                                              handle=handle)
        if (idx2, w2, counts2, handle2) != (None, None, None, None):
            fail(what + " returns", "want (recv_x, None, None, None, None, event), as DeepEP's")
        same(what + " second recv_x", recv_x2, routed(want["mine"], second))
        gen = torch.Generator().manual_seed(seed * 1000 + RANK)
        bias = [torch.randn(tuple(x.shape), generator=gen).to(torch.bfloat16) for _ in (0, 1)]
        out, _, _ = buf.combine(partial(recv_x2, RANK), handle, topk_weights=recv_w,
                                bias=tuple(b.to(x.device) for b in bias))
        # bf16((bias_0 + bias_1) + combined) in f32 (README, normal mode)
        combined = ht_combined(second[RANK], all_in[RANK][1], experts).float()
        same(what + " combine with a bias", out,
             ((bias[0].float() + bias[1].float()) + combined).to(torch.bfloat16))


def buffer_graph(buf, experts, tokens, nw=WORLD * HT_TOKENS):
    """dispatch(num_worst_tokens) + combine in one CUDA graph. At world_size
    * max_tokens_per_rank rows nothing is checked; below, the capture must
    not read the host (nw then bounds every seed's receive: the sum of the
    ranks' tokens)."""

    def step(x, idx, w):
        recv_x, recv_idx, recv_w, _, handle, _ = buf.dispatch(
            x, topk_idx=idx, topk_weights=w, num_worst_tokens=nw)
        out, _, _ = buf.combine(partial(recv_x, RANK), handle, topk_weights=recv_w)
        return recv_x, recv_idx, recv_w, out, handle

    def check(what, all_in, want, outs):
        recv_x, recv_idx, recv_w, out, _ = outs
        check_rows(what, want, recv_x, recv_idx, recv_w, rows=nw, idx_dtype=all_in[RANK][1].dtype)
        same(what + " combine", out, ht_combined(*all_in[RANK][:2], experts))
    graph_check("deep_ep E%d graph num_worst_tokens=%d T=%s" % (experts, nw, tokens), experts,
                tokens, 45, step, check)


def buffer_worst_sized(address, experts, tokens):
    """A Buffer whose normal-mode group is created by a dispatch with
    num_worst_tokens = world_size * 300 (below the 1024 a batch would
    give): max_tokens_per_rank becomes 300, the library's rows are
    num_worst_tokens, and the dispatch + combine capture without a host
    read."""
    import moe_ep.deep_ep as deep_ep
    cfg = ht_config(address, num_experts=experts)
    del cfg["max_tokens_per_rank"]
    buf = deep_ep.Buffer(None, low_latency_mode=False, explicitly_destroy=True, moe_ep_config=cfg)
    nw = WORLD * 300
    what = "deep_ep num_worst_tokens=%d sizes the group" % nw
    with case(what):  # the first dispatch creates the group
        all_in = ht_inputs(38, tokens, HT_HIDDEN, experts)
        x, idx, w = on_device(all_in[RANK])
        recv_x, recv_idx, recv_w, _, handle, _ = buf.dispatch(
            x, topk_idx=idx, topk_weights=w, num_worst_tokens=nw)
        g = buf.moe_ep_normal_group
        if g.config.max_tokens_per_rank != 300 or handle.worst_rows != nw:
            fail(what, "max_tokens_per_rank %d, %d library rows" % (g.config.max_tokens_per_rank,
                                                                   handle.worst_rows))
        check_rows(what, ht_expected(all_in, experts), recv_x, recv_idx, recv_w, rows=nw,
                   idx_dtype=idx.dtype)
        out, _, _ = buf.combine(partial(recv_x, RANK), handle, topk_weights=recv_w)
        same(what + " combine", out, ht_combined(*all_in[RANK][:2], experts))
    buffer_graph(buf, experts, tokens, nw)
    buf.destroy()


def vllm_ht_meta(g, experts, seed, tokens):
    """vLLM's HT prepare: expert_num_tokens_cpu holds the counts on the host."""
    import moe_ep.vllm
    what = "vllm ht E%d expert_num_tokens_cpu T=%s" % (experts, tokens)
    with case(what):
        pf = moe_ep.vllm.PrepareAndFinalize(g)
        all_in = ht_inputs(seed, tokens, HT_HIDDEN, experts)
        x, idx, w = on_device(all_in[RANK])
        _, _, meta, ids, wts = pf.prepare(x, w, idx, experts, None, False, None)
        cpu = meta.expert_num_tokens_cpu
        if cpu is None or cpu.device.type != "cpu":
            fail(what, "want host counts, got %r" % (cpu,))
        else:
            same(what, cpu, ht_expected(all_in, experts)["count"])
        pf.finalize(torch.empty_like(x), torch.zeros((len(ids), HT_HIDDEN), dtype=torch.bfloat16,
                                                     device=x.device), wts, ids, False, None)


def part_buffer_normal(address):
    import moe_ep.deep_ep as deep_ep
    experts = 256
    buf = deep_ep.Buffer(None, low_latency_mode=False, explicitly_destroy=True,
                         moe_ep_config=ht_config(address))
    for c in BUFFER_CASES:
        buffer_bf16(buf, experts, *c)
    buffer_fp8(buf, experts, 34, (512, 7), "fp8")
    buffer_fp8(buf, experts, 35, (7, 4096), "fp8_ue8m0_packed")
    buffer_fp8(buf, experts, 39, (4096, 300), "fp8_per_token", one_d=True)
    buffer_worst(buf, experts, 36, (512, 4096))
    buffer_cached(buf, experts, 37, (4096, 512))
    buffer_graph(buf, experts, (300, 512))
    buffer_graph(buf, experts, (300, 512), nw=sum((300, 512)[r % 2] for r in range(WORLD)))
    buf.destroy()


def part_ht():
    """The Group API on two expert counts, then the Buffer's normal mode,
    each a group of its own."""
    device()
    addresses = group_addresses(4)
    for experts, address in zip((256, 64), addresses):
        with moe_ep.Group(ht_config(address, num_experts=experts),
                          device=LOCAL if ON_GPU else None) as g:
            for c in HT_CASES[experts]:
                ht_bf16(g, experts, *c)
            if experts == 256:
                for seed, fmt, tokens in ((16, "fp8", (512, 4096)), (17, "fp8_ue8m0", (7, 512)),
                                          (18, "fp8_ue8m0_packed", (4096, 1)),
                                          (27, "fp8_per_token", (300, 4096))):
                    ht_fp8(g, experts, seed, tokens, fmt)
                ht_worst(g, experts, 19, (512, 4096))
                ht_cached(g, experts, 20, (4096, 7))
                ht_graph(g, experts, (512, 300))
                vllm_ht_meta(g, experts, 26, (512, 7))
            with case("ht E%d poll_error" % experts):
                g.poll_error()
    part_buffer_normal(addresses[2])
    buffer_worst_sized(addresses[3], 256, (300, 200))


def part_grow():
    """A Buffer over a torch (gloo) group, its normal-mode cap derived from
    a small first batch, grows while micro-batch A's combine is pending:
    the replaced group (a communicator of its own, its rank 0 still
    listening on the configured address) runs A's combine beside the new
    group, and the next agreement closes it on every rank."""
    import torch.distributed as dist
    import moe_ep.deep_ep as deep_ep
    device()
    address, store = group_addresses(2)
    dist.init_process_group("gloo", init_method="tcp://" + store, rank=RANK, world_size=WORLD)
    experts = 256
    cfg = ht_config(address, num_experts=experts)
    del cfg["max_tokens_per_rank"]
    buf = deep_ep.Buffer(dist.group.WORLD, low_latency_mode=False, explicitly_destroy=True,
                         moe_ep_config=cfg)
    buffer_bf16(buf, experts, 61, (8, 5), HT_HIDDEN, HT_TOP_K, 1)
    first = buf.moe_ep_normal_group
    what = "grow: micro-batch A dispatched, B outgrows the cap"
    with case(what):
        if first.config.max_tokens_per_rank != 1024:
            fail(what, "derived cap %d, want 1024" % first.config.max_tokens_per_rank)
        a_in = ht_inputs(62, (6, 9), HT_HIDDEN, experts)
        x, idx, w = on_device(a_in[RANK])
        recv_a, recv_idx, recv_w, _, handle_a, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w)
        check_rows(what + " A", ht_expected(a_in, experts), recv_a, recv_idx, recv_w,
                   idx_dtype=idx.dtype)
    buffer_bf16(buf, experts, 63, (3000, 7), HT_HIDDEN, HT_TOP_K, 1)
    grown = buf.moe_ep_normal_group
    what = "grow: A's combine on the replaced group"
    with case(what):
        if grown is first or grown.config.max_tokens_per_rank != 4096 or first._g is None:
            fail(what, "want a new group of cap 4096 and the first still open; cap %d, %s"
                 % (grown.config.max_tokens_per_rank, "same group" if grown is first else
                    "first closed" if first._g is None else "first open"))
        if grown.config.bootstrap_address == address:
            fail(what, "the new group took the retired group's address %s" % address)
        out, _, _ = buf.combine(partial(recv_a, RANK), handle_a, topk_weights=recv_w)
        same(what, out, ht_combined(*a_in[RANK][:2], experts))
    buffer_bf16(buf, experts, 64, (7, 8), HT_HIDDEN, HT_TOP_K, 1)
    with case("grow: the replaced group closed at the next agreement"):
        if first._g is not None:
            fail("grow", "the replaced group is still open after its last combine")
    buf.destroy()
    dist.destroy_process_group()


def part_auto():
    """SGLang's deepep_mode auto: one Buffer(low_latency_mode=True), made
    with SGLang's positional arguments and allow_mnnvl=True, decodes
    through low_latency_* and prefills through the normal-mode calls (a
    second group, created by the first normal dispatch with x's hidden; the
    first layout computed in torch on the GPU, later ones by prepare);
    the LL combine gets a copy of topk_idx."""
    import moe_ep.deep_ep as deep_ep
    dev = device()
    address = group_addresses(1, span=2)[0]
    host, port = address.rsplit(":", 1)
    cfg = {"backend": BACKEND, "bootstrap": {"address": address, "timeout_ms": 60000},
           "timeouts": {"kernel_ms": 60000}}
    buf = deep_ep.Buffer(None, 0, 0, True, EL, True, True, True, moe_ep_config=cfg)
    for seed, normal in ((41, (31, (512, 7), 7168, 8, 1)), (42, (32, (1000, 1), 2880, 1, 4))):
        all_in = [inputs(seed, r) for r in range(WORLD)]
        x, idx, w = (t.to(dev) for t in all_in[RANK])
        recv_x, count, handle, _, _ = buf.low_latency_dispatch(x, idx, N, E, use_fp8=False)
        sync()
        check_recv("auto LL seed %d" % seed, recv_x, count, all_in)
        out, _, _ = buf.low_latency_combine(experts(recv_x), idx.clone(), w, handle)
        sync()
        check_combine("auto LL seed %d" % seed, out, *all_in[RANK])
        buffer_bf16(buf, 256, *normal)
        buf.clean_low_latency_buffer(N, H, E)
    ht = buf.moe_ep_normal_group
    with case("auto groups"):
        if ht.config.hidden != 7168 or ht.config.max_tokens_per_rank != 1024 or \
                ht.config.bootstrap_address != "%s:%d" % (host, int(port) + 1):
            fail("auto groups", repr(ht.config))
    buf.destroy()


def part_dropped():
    """Receives an engine never ran (README, "Receives an engine never
    runs"), through the vLLM adapter: a prepare whose receive is dropped,
    then a whole layer call. High throughput survives the abandon, so that
    call matches bit for bit; in low latency on the nccl backend the
    abandon fails the group, and the call's finalize raises MismatchError
    naming this rank instead of waiting."""
    import moe_ep.vllm
    ht_address, ll_address = group_addresses(2)
    dev_index = LOCAL if ON_GPU else None
    with moe_ep.Group(ht_config(ht_address, num_experts=64), device=dev_index) as g:
        what = "dropped: vllm ht layer call after a dropped prepare"
        with case(what):
            pf = moe_ep.vllm.PrepareAndFinalize(g)
            x, idx, w = on_device(ht_inputs(51, (100,), HT_HIDDEN, 64)[RANK])
            pf.prepare_async(x, w, idx, 64, None, False, None)  # its receive never runs
            all_in = ht_inputs(52, (120,), HT_HIDDEN, 64)
            x, idx, w = on_device(all_in[RANK])
            a1q, _, _, ids, wts = pf.prepare(x, w, idx, 64, None, False, None)
            same(what + " a1q", a1q, ht_expected(all_in, 64)["x"])
            out = torch.empty_like(x)
            pf.finalize(out, partial(a1q, RANK), wts, ids, False, None)
            same(what + " finalize", out, ht_combined(*all_in[RANK][:2], 64))
    if not ON_GPU:
        return  # the host backend survives an abandoned LL receive (the CPU tests check it)
    cfg = {"backend": BACKEND, "num_experts": E, "hidden": H, "top_k": K,
           "max_tokens_per_rank": N, "bootstrap": {"address": ll_address, "timeout_ms": 60000}}
    with moe_ep.Group(cfg, device=dev_index) as g:
        what = "dropped: vllm ll, the abandoned receive fails the group"
        with case(what):
            pf = moe_ep.vllm.PrepareAndFinalize(g)
            x, idx, w = on_device(inputs(53, RANK))
            pf.prepare_async(x, w, idx, E, None, False, None)  # its receive never runs
            x, idx, w = on_device(inputs(54, RANK))
            a1q, _, _, _, _ = pf.prepare(x, w, idx, E, None, False, None)
            try:
                pf.finalize(torch.empty_like(x), experts(a1q), w, idx, False, None)
                fail(what, "finalize went on; want MismatchError from the abandoned receive")
            except moe_ep.MismatchError as e:
                if "rank %d" % RANK not in str(e):
                    fail(what, "the error does not name rank %d: %s" % (RANK, e))
                print("rank %d %s: %s" % (RANK, what, e), flush=True)


def main():
    part = sys.argv[1] if len(sys.argv) > 1 else "group"
    {"group": part_group, "deep_ep": part_deep_ep,
     "deep_ep_fp8": lambda: part_deep_ep(use_fp8=True), "ht": part_ht,
     "auto": part_auto, "grow": part_grow, "deep_ep_graph": part_deep_ep_graph,
     "dropped": part_dropped,
     "deep_ep_graph_fp8": lambda: part_deep_ep_graph(use_fp8=True)}[part]()
    print("rank %d: %s" % (RANK, "ok" if not failures else "%d failures" % len(failures)),
          flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
