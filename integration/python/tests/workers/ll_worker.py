"""LL worker: dispatch rows, counts and fp8 scales bit-exact against the
oracle; combine bit-exact, with the weights at combine or at dispatch;
hooks run on a second thread with two micro-batches in flight; out=;
handle_layout (DeepEP's src_info, layout_range) against the oracle and its
refusals; bad input raising the library's sentence with the group still
usable.
argv: [full|short]"""
import gc
import sys
import threading
import weakref

import numpy as np
import torch

import common
import moe_ep
import oracle
from common import RANK, WORLD, bits, bf16_tensor, same, fail, expect_raises

FULL = sys.argv[1:] == ["full"]
P = oracle.Problem(WORLD, num_experts=4 * WORLD, hidden=256, top_k=4, max_tokens=24)
SCALE = torch.tensor([float(oracle.expert_scale(e)) for e in range(P.num_experts)])


def torch_inputs(inp):
    return (bf16_tensor(inp["x"]), torch.from_numpy(inp["topk_idx"]),
            torch.from_numpy(inp["weights"]))


def expert_outputs(g, recv_x):
    """y = bf16(x * scale(e)) for every slot of every local expert."""
    s = SCALE[RANK * g.num_local_experts:(RANK + 1) * g.num_local_experts]
    return (recv_x.float() * s[:, None, None]).to(torch.bfloat16)


def check_dispatch(seed, inputs, res, hidden, fp8=None):
    rows = oracle.ll_dispatch(P, inputs, RANK)
    same("recv_count", seed, bits(res.recv_count), np.array([len(r) for r in rows], np.int32))
    got_x = bits(res.recv_x)
    got_s = res.recv_scales.numpy() if res.recv_scales is not None else None
    for l, lrows in enumerate(rows):
        if not lrows:
            continue
        xs = np.stack([inputs[s]["x"][t][:hidden] for s, t in lrows])
        if fp8 is None:
            if not same("recv_x expert %d" % l, seed, got_x[l, :len(lrows)], xs):
                return
            continue
        pow2, packed = fp8
        q = [oracle.fp8_quantize(r, pow2) for r in xs]
        if not same("fp8 recv_x expert %d" % l, seed, got_x[l, :len(lrows)],
                    np.stack([a for a, _ in q])):
            return
        want_s = np.stack([oracle.ue8m0_pack(b) if packed else b for _, b in q])
        if not same("fp8 recv_scales expert %d" % l, seed, got_s[l, :len(lrows)], want_s):
            return


def roundtrip(g, seed, weights_at_dispatch=False, hidden=None, top_k=None):
    inputs = oracle.all_inputs(P, seed)
    h_len = hidden or P.hidden
    if top_k is not None:  # a layer with a smaller top-k: keep the first k slots
        for inp in inputs:
            inp["topk_idx"] = np.ascontiguousarray(inp["topk_idx"][:, :top_k])
            inp["weights"] = np.ascontiguousarray(inp["weights"][:, :top_k])
    for inp in inputs:
        inp["x"] = np.ascontiguousarray(inp["x"][:, :h_len])
    x, idx, w = torch_inputs(inputs[RANK])
    h = g.prepare(idx)
    res = g.dispatch(h, x, topk_weights=w if weights_at_dispatch else None)
    check_dispatch(seed, inputs, res, h_len)
    out = g.combine(h, expert_outputs(g, res.recv_x), topk_weights=None if weights_at_dispatch else w)
    p = oracle.Problem(WORLD, P.num_experts, h_len, top_k or P.top_k, P.max_tokens)
    same("combine (weights at %s)" % ("dispatch" if weights_at_dispatch else "combine"), seed,
         bits(out), oracle.ll_combine(p, inputs[RANK]))
    h.free()


def overlapped(g, seed):
    """Two micro-batches in flight (both buffer sets); every hook runs on a
    second thread while this thread sends the other micro-batch."""
    batches = [oracle.all_inputs(P, seed + i) for i in (0, 1)]
    tensors = [torch_inputs(b[RANK]) for b in batches]
    worker_errors = []

    def on_thread(hook):
        box = {}

        def run():
            try:
                box["result"] = hook()
            except Exception as e:  # noqa: BLE001 - reported below
                worker_errors.append(repr(e))
        t = threading.Thread(target=run)
        t.start()
        t.join(120)
        if t.is_alive():
            worker_errors.append("hook thread still running after 120 s")
        return box.get("result")

    handles = [g.prepare(t[1]) for t in tensors]
    hooks = [g.dispatch(handles[i], tensors[i][0], defer=True) for i in (0, 1)]
    if not all(isinstance(k, moe_ep.Hook) for k in hooks):
        fail("defer", seed, "dispatch(defer=True) did not return a Hook")
    recvs = [on_thread(k) for k in hooks]
    for i in (0, 1):
        if recvs[i] is not None:
            check_dispatch(seed + i, batches[i], recvs[i], P.hidden)
    outs = []
    for i in (0, 1):
        hook = g.combine(handles[i], expert_outputs(g, recvs[i].recv_x), topk_weights=tensors[i][2],
                         defer=True)
        outs.append(on_thread(hook))
    for i in (0, 1):
        same("overlapped combine", seed + i, bits(outs[i]), oracle.ll_combine(P, batches[i][RANK]))
    if worker_errors:
        fail("hook thread", seed, "; ".join(worker_errors))
    expect_raises("hook twice", moe_ep.InvalidArgumentError, "already ran", hooks[0])


def with_out_buffers(g, seed):
    """Outputs passed in (as a graph would): filled in place, same objects."""
    inputs = oracle.all_inputs(P, seed)
    x, idx, w = torch_inputs(inputs[RANK])
    first = g.dispatch(g.prepare(torch.zeros((0, P.top_k), dtype=torch.int64)),
                       torch.zeros((0, P.hidden), dtype=torch.bfloat16))
    out = torch.empty((len(x), P.hidden), dtype=torch.bfloat16)
    h = g.prepare(idx)
    res = g.dispatch(h, x, out=first)
    if res.recv_x.data_ptr() != first.recv_x.data_ptr():
        fail("out=", seed, "dispatch allocated instead of filling out=")
    check_dispatch(seed, inputs, res, P.hidden)
    got = g.combine(h, expert_outputs(g, res.recv_x), topk_weights=w, out=out)
    if got is not out:
        fail("out=", seed, "combine did not return out")
    same("combine into out=", seed, bits(out), oracle.ll_combine(P, inputs[RANK]))


def slot_layout(g, seed):
    """handle_layout after the receive, against the oracle's slot order;
    refused before it; outputs filled in place when passed."""
    inputs = oracle.all_inputs(P, seed)
    x, idx, w = torch_inputs(inputs[RANK])
    h = g.prepare(idx)
    expect_raises("handle_layout before dispatch", moe_ep.InvalidArgumentError,
                  "not been dispatched", lambda: g.handle_layout(h))
    hook = g.dispatch(h, x, defer=True)
    expect_raises("handle_layout before the hook", moe_ep.InvalidArgumentError,
                  "a dispatch whose hook has not run yet", lambda: g.handle_layout(h))
    res = hook()
    want_src, want_range = oracle.ll_layout(P, inputs, RANK)
    src, ranges = g.handle_layout(h)
    same("handle_layout src_info", seed, bits(src), want_src)
    same("handle_layout layout_range", seed, bits(ranges), want_range)
    mine = (torch.full_like(src, 7), torch.full_like(ranges, 7))
    got = g.handle_layout(h, *mine)
    if got[0] is not mine[0] or got[1] is not mine[1]:
        fail("handle_layout out tensors", seed, "did not fill the tensors passed")
    same("handle_layout src_info (passed in)", seed, bits(mine[0]), want_src)
    expect_raises("handle_layout of the wrong shape", moe_ep.InvalidArgumentError,
                  "params->layout_range has shape",
                  lambda: g.handle_layout(h, layout_range=torch.zeros((1, 1), dtype=torch.int64)))
    out = g.combine(h, expert_outputs(g, res.recv_x), topk_weights=w)
    same("combine after handle_layout", seed, bits(out), oracle.ll_combine(P, inputs[RANK]))
    h.free()


def handle_dropped(g, seed):
    """An engine may drop its last reference to a handle between a deferred
    call and its hook (SGLang clears self.handle before combine_b runs the
    hook): the hook keeps the handle it runs on."""
    inputs = oracle.all_inputs(P, seed)
    x, idx, w = torch_inputs(inputs[RANK])
    hook = g.dispatch(g.prepare(idx), x, defer=True)
    gc.collect()
    check_dispatch(seed, inputs, hook(), P.hidden)
    h = g.prepare(idx)
    res = g.dispatch(h, x)
    hook = g.combine(h, expert_outputs(g, res.recv_x), topk_weights=w, defer=True)
    h = None
    gc.collect()
    same("combine hook after its handle was dropped", seed, bits(hook()),
         oracle.ll_combine(P, inputs[RANK]))


def bad_input(g):
    """Each error is local to this rank and leaves nothing queued."""
    idx = torch.tensor([[0, 1, 2, 3]], dtype=torch.int64)
    expect_raises("expert id", moe_ep.InvalidArgumentError,
                  "params->topk_idx[0][1]=%d is not an expert id" % P.num_experts,
                  lambda: g.prepare(torch.tensor([[0, P.num_experts, 1, 2]])))
    expect_raises("repeat", moe_ep.InvalidArgumentError, "names expert 1 twice",
                  lambda: g.prepare(torch.tensor([[1, 1, 2, 3]])))
    expect_raises("top_k", moe_ep.InvalidArgumentError, "params->top_k=5",
                  lambda: g.prepare(torch.zeros((1, 5), dtype=torch.int64)))
    h = g.prepare(idx)
    expect_raises("x dtype", moe_ep.InvalidArgumentError, "params->x has dtype",
                  lambda: g.dispatch(h, torch.zeros((1, P.hidden))))
    expect_raises("x stride", moe_ep.InvalidArgumentError, "params->x is not contiguous",
                  lambda: g.dispatch(h, torch.zeros((2, 2 * P.hidden), dtype=torch.bfloat16)[:1, ::2]))
    expect_raises("hidden", moe_ep.InvalidArgumentError, "params->hidden=12",
                  lambda: g.dispatch(h, torch.zeros((1, 12), dtype=torch.bfloat16)))
    expect_raises("x type", TypeError, "x must be a torch.Tensor",
                  lambda: g.dispatch(h, [[0.0] * P.hidden]))
    expect_raises("combine first", moe_ep.InvalidArgumentError, "not been dispatched",
                  lambda: g.combine(h, torch.zeros((1, 1, P.hidden), dtype=torch.bfloat16),
                                    topk_weights=torch.zeros((1, 4))))
    expect_raises("x_scales in LL", moe_ep.InvalidArgumentError,
                  "x_scales is for high_throughput dispatch; low-latency dispatch quantises bf16 x",
                  lambda: g.dispatch(h, torch.zeros((1, P.hidden), dtype=torch.bfloat16),
                                     x_scales=torch.ones((1, P.hidden // 128))))
    expect_raises("worst_case in LL", moe_ep.InvalidArgumentError, "MOE_EP_FLAG_WORST_CASE",
                  lambda: g.dispatch(h, torch.zeros((1, P.hidden), dtype=torch.bfloat16),
                                     worst_case=True))
    h.free()
    expect_raises("freed handle", moe_ep.InvalidArgumentError, "handle was freed",
                  lambda: g.dispatch(h, torch.zeros((1, P.hidden), dtype=torch.bfloat16)))
    expect_raises("num_sms", moe_ep.InvalidArgumentError, "num_sms=-1",
                  lambda: g.set_num_sms(-1))
    if g.max_sms_used() != 0 or g.poll_error() is not None:
        fail("sms / poll_error", "-", "host backend: want 0 SMs and no recorded error")
    expect_raises("config", moe_ep.ConfigError, "dispatch_dtype",
                  lambda: moe_ep.Config({"dispatch_dtype": "fp16"}))


def dropped_group_is_destroyed(port):
    """A used Group dropped without close() is destroyed with its last
    reference, not whenever the cycle collector runs (on some thread, at
    some time: group_destroy is a collective barrier)."""
    gc.disable()
    try:
        g = moe_ep.Group(common.config(port, num_experts=P.num_experts, hidden=P.hidden,
                                       top_k=P.top_k, max_tokens_per_rank=P.max_tokens))
        roundtrip(g, 61)
        ref = weakref.ref(g)
        del g
        if ref() is not None:
            fail("dropped group", 61, "the Group outlived its last reference (a cycle holds it)")
    finally:
        gc.enable()


def main():
    with moe_ep.Group(common.config(0, num_experts=P.num_experts, hidden=P.hidden, top_k=P.top_k,
                                    max_tokens_per_rank=P.max_tokens)) as g:
        info = g.info()
        if (info.rank, info.world_size, info.backend) != (RANK, WORLD, "host"):
            fail("info", "-", repr(info))
        for seed in range(1, 4 if FULL else 2):
            roundtrip(g, seed)
        roundtrip(g, 11, weights_at_dispatch=True)
        roundtrip(g, 12, hidden=128, top_k=2)
        overlapped(g, 21)
        with_out_buffers(g, 31)
        slot_layout(g, 32)
        handle_dropped(g, 33)
        if FULL:
            bad_input(g)
            roundtrip(g, 41)  # still usable after the errors
    expect_raises("closed group", moe_ep.InvalidArgumentError, "this Group is closed",
                  lambda: g.prepare(torch.zeros((1, P.top_k), dtype=torch.int64)))
    if FULL:
        for port, (scale, pow2, packed, flag) in enumerate(
                [("f32", False, False, False), ("f32", True, False, True),
                 ("ue8m0_packed", True, True, False)], start=1):
            with moe_ep.Group(common.config(port, num_experts=P.num_experts, hidden=P.hidden,
                                            top_k=P.top_k, max_tokens_per_rank=P.max_tokens,
                                            dispatch_dtype="fp8_e4m3", fp8_scale=scale)) as g:
                seed = 50 + port
                inputs = oracle.all_inputs(P, seed)
                x, idx, w = torch_inputs(inputs[RANK])
                h = g.prepare(idx)
                res = g.dispatch(h, x, round_scale=flag)
                if res.recv_x.dtype != moe_ep.FP8_STORAGE:
                    fail("fp8 dtype", seed, str(res.recv_x.dtype))
                check_dispatch(seed, inputs, res, P.hidden, fp8=(pow2, packed))
        dropped_group_is_destroyed(4)
    common.finish()


if __name__ == "__main__":
    main()
