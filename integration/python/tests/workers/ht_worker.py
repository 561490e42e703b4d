"""HT worker: prepare's layout, dispatch (packed rows, local ids, weights,
per-expert counts, num_recv_tokens) and combine (partials summed over
ranks ascending) bit-exact against the oracle; a deferred round trip with
its hooks on a second thread; pre-quantised fp8 rows (f32, UE8M0 and packed
scales) carried verbatim; worst-case sized outputs; two dispatches on one
handle (cached layout); bad input."""
import numpy as np
import torch

import common
import moe_ep
import oracle
from common import RANK, WORLD, bits, bf16_tensor, same, fail, expect_raises, run_on_thread

P = oracle.Problem(WORLD, num_experts=4 * WORLD, hidden=256, top_k=4, max_tokens=32)


def check_layout(seed, inp, layout):
    idx = inp["topk_idx"]
    ranks = np.where(idx >= 0, idx // P.local, -1)
    in_rank = np.stack([(ranks == r).any(axis=1) for r in range(WORLD)], axis=1) \
        if len(idx) else np.zeros((0, WORLD), bool)
    per_expert = np.bincount(idx[idx >= 0], minlength=P.num_experts).astype(np.int32)
    same("num_tokens_per_rank", seed, bits(layout[0]), in_rank.sum(axis=0).astype(np.int32))
    same("num_tokens_per_expert", seed, bits(layout[1]), per_expert)
    same("is_token_in_rank", seed, bits(layout[2]), in_rank)


def roundtrip(g, seed, defer):
    inputs = oracle.all_inputs(P, seed)
    inp = inputs[RANK]
    x, idx, w = (bf16_tensor(inp["x"]), torch.from_numpy(inp["topk_idx"]),
                 torch.from_numpy(inp["weights"]))
    h = g.prepare(idx)
    check_layout(seed, inp, h.layout)
    res = g.dispatch(h, x, topk_weights=w, defer=defer)
    if defer:
        pending = repr(res.result)  # its rows are not there yet
        if "recv_x=pending" not in pending:
            fail("repr of a pending dispatch's result", seed, pending)
        res = run_on_thread(res)
        if res is None:
            return
    src, want_idx, want_w, counts = oracle.ht_dispatch(P, inputs, RANK)
    if res.num_recv_tokens != len(src):
        fail("num_recv_tokens", seed, "got %s want %d" % (res.num_recv_tokens, len(src)))
        return
    want_x = np.stack([inputs[s]["x"][t] for s, t in src]) if src else np.zeros((0, P.hidden), np.uint16)
    same("ht recv_x", seed, bits(res.recv_x), want_x)
    same("ht recv_topk_idx", seed, bits(res.recv_topk_idx), want_idx)
    same("ht recv_topk_weights", seed, bits(res.recv_topk_weights), want_w)
    same("ht recv_count", seed, bits(res.recv_count), counts)
    y = (res.recv_x.float() * float(oracle.ht_partial_scale(RANK))).to(torch.bfloat16)
    out = g.combine(h, y, defer=defer)
    if defer:
        out = run_on_thread(out)
    same("ht combine", seed, bits(out), oracle.ht_combine(P, inp))
    h.free()


E4M3 = torch.from_numpy(oracle.e4m3_float(np.arange(256, dtype=np.uint8)))


def seen_rows(recv_x, recv_scales):
    """The float32 rows the experts see: fp8 codes times their group's
    scale (packed int32 scales are UE8M0 exponent bytes; one column is the
    token's scale for every group)."""
    n, h = recv_x.shape
    if recv_scales.dtype == torch.int32:
        exps = recv_scales.contiguous().view(torch.uint8)[:, :h // 128].to(torch.float64)
        scales = torch.pow(2.0, exps - 127.0).to(torch.float32)
    else:
        scales = recv_scales.expand(n, h // 128)
    codes = E4M3[recv_x.contiguous().view(torch.uint8).long()].view(n, h // 128, 128)
    return (codes * scales[:, :, None]).view(n, h)


def fp8_roundtrip(g, seed, fmt, as_pair, defer):
    """x quantised before dispatch, passed as (x_fp8, scales) or with
    x_scales=; rows and scales arrive exactly as sent."""
    inputs = oracle.all_inputs(P, seed)
    quant = [oracle.ht_fp8_inputs(P, inp, fmt) for inp in inputs]
    q, sc, seen = quant[RANK]
    xq, xs = torch.from_numpy(q).view(moe_ep.FP8_STORAGE), torch.from_numpy(sc)
    idx, w = torch.from_numpy(inputs[RANK]["topk_idx"]), torch.from_numpy(inputs[RANK]["weights"])
    h = g.prepare(idx)
    # fp8_ue8m0 scales are f32 as fp8's are: named. One f32 column is read
    # as per-token scales at hidden 256; named too when passed by keyword.
    kw = {"format": fmt} if fmt == "fp8_ue8m0" or (fmt == "fp8_per_token" and not as_pair) else {}
    if as_pair:
        res = g.dispatch(h, (xq, xs), topk_weights=w, defer=defer, **kw)
    else:
        res = g.dispatch(h, xq, x_scales=xs, topk_weights=w, defer=defer, **kw)
    if defer:
        res = run_on_thread(res, seed)
        if res is None:
            return
    src, want_idx, want_w, counts = oracle.ht_dispatch(P, inputs, RANK)
    if res.num_recv_tokens != len(src) or res.recv_x.dtype != moe_ep.FP8_STORAGE \
            or res.recv_scales.dtype != xs.dtype:
        fail("fp8 %s outputs" % fmt, seed, "%s rows (want %d), %s, %s" % (
            res.num_recv_tokens, len(src), res.recv_x.dtype, res.recv_scales.dtype))
        return
    cols = sc.shape[1]
    want_q = np.stack([quant[s][0][t] for s, t in src]) if src else np.zeros((0, P.hidden), np.uint8)
    want_s = np.stack([quant[s][1][t] for s, t in src]) if src else np.zeros((0, cols), sc.dtype)
    same("fp8 %s recv_x" % fmt, seed, bits(res.recv_x), want_q)
    same("fp8 %s recv_scales" % fmt, seed, bits(res.recv_scales), want_s)
    same("fp8 %s recv_topk_idx" % fmt, seed, bits(res.recv_topk_idx), want_idx)
    same("fp8 %s recv_topk_weights" % fmt, seed, bits(res.recv_topk_weights), want_w)
    same("fp8 %s recv_count" % fmt, seed, bits(res.recv_count), counts)
    y = (seen_rows(res.recv_x, res.recv_scales) * float(oracle.ht_partial_scale(RANK))) \
        .to(torch.bfloat16)
    same("fp8 %s combine" % fmt, seed, bits(g.combine(h, y)), oracle.ht_combine(P, inputs[RANK], seen))
    h.free()


def worst_case(g, seed):
    """Fixed-size outputs: world * max_tokens rows, rows past the receive
    name no expert; combine takes the whole y."""
    inputs = oracle.all_inputs(P, seed)
    inp = inputs[RANK]
    x, idx, w = (bf16_tensor(inp["x"]), torch.from_numpy(inp["topk_idx"]),
                 torch.from_numpy(inp["weights"]))
    h = g.prepare(idx)
    res = g.dispatch(h, x, topk_weights=w, worst_case=True)
    rows = WORLD * P.max_tokens
    src, want_idx, want_w, counts = oracle.ht_dispatch(P, inputs, RANK)
    n = len(src)
    if res.num_recv_tokens != n or res.recv_x.shape[0] != rows or res.recv_topk_idx.shape[0] != rows:
        fail("worst-case shapes", seed, "count %s (want %d), rows %d and %d (want %d)" % (
            res.num_recv_tokens, n, res.recv_x.shape[0], res.recv_topk_idx.shape[0], rows))
        return
    pad_idx = np.full((rows - n, P.top_k), -1, np.int32)
    pad_w = np.zeros((rows - n, P.top_k), np.float32)
    same("worst-case recv_topk_idx", seed, bits(res.recv_topk_idx),
         np.concatenate([want_idx, pad_idx]))
    same("worst-case recv_topk_weights", seed, bits(res.recv_topk_weights),
         np.concatenate([want_w, pad_w]))
    want_x = np.stack([inputs[s]["x"][t] for s, t in src]) if src else np.zeros((0, P.hidden), np.uint16)
    same("worst-case recv_x", seed, bits(res.recv_x[:n]), want_x)
    same("worst-case recv_count", seed, bits(res.recv_count), counts)
    y = (res.recv_x.float() * float(oracle.ht_partial_scale(RANK))).to(torch.bfloat16)
    y[n:] = float("nan")  # rows past the receive are never read
    same("worst-case combine", seed, bits(g.combine(h, y)), oracle.ht_combine(P, inp))
    h.free()


def cached_layout(g, seed):
    """Two dispatches on one handle (bf16, then the same tokens pre-quantised
    to fp8); the combine follows the latest."""
    inputs = oracle.all_inputs(P, seed)
    inp = inputs[RANK]
    x, idx, w = (bf16_tensor(inp["x"]), torch.from_numpy(inp["topk_idx"]),
                 torch.from_numpy(inp["weights"]))
    h = g.prepare(idx)
    first = g.dispatch(h, x, topk_weights=w)
    src = oracle.ht_dispatch(P, inputs, RANK)[0]
    want_x = np.stack([inputs[s]["x"][t] for s, t in src]) if src else np.zeros((0, P.hidden), np.uint16)
    same("cached: first recv_x", seed, bits(first.recv_x), want_x)
    quant = [oracle.ht_fp8_inputs(P, i, "fp8") for i in inputs]
    q, sc, seen = quant[RANK]
    second = g.dispatch(h, (torch.from_numpy(q).view(moe_ep.FP8_STORAGE), torch.from_numpy(sc)),
                        topk_weights=w)
    want_q = np.stack([quant[s][0][t] for s, t in src]) if src else np.zeros((0, P.hidden), np.uint8)
    same("cached: second recv_x", seed, bits(second.recv_x), want_q)
    y = (seen_rows(second.recv_x, second.recv_scales) * float(oracle.ht_partial_scale(RANK))) \
        .to(torch.bfloat16)
    same("cached: combine", seed, bits(g.combine(h, y)), oracle.ht_combine(P, inp, seen))
    h.free()


def bad_input(g):
    idx = torch.tensor([[0, 1, -1, 2]], dtype=torch.int64)
    x = torch.zeros((1, P.hidden), dtype=torch.bfloat16)
    h = g.prepare(idx)
    expect_raises("ht weights missing", moe_ep.InvalidArgumentError, "params->topk_weights is NULL",
                  lambda: g.dispatch(h, x))
    q = torch.zeros((1, P.hidden), dtype=moe_ep.FP8_STORAGE)
    w1 = torch.ones((1, 4))
    expect_raises("fp8 x without scales", moe_ep.InvalidArgumentError, "params->x_scales is NULL",
                  lambda: g.dispatch(h, q, topk_weights=w1))
    expect_raises("scales with a bf16 x", moe_ep.InvalidArgumentError, "bf16 rows carry no scales",
                  lambda: g.dispatch(h, x, x_scales=torch.ones((1, P.hidden // 128)), topk_weights=w1))
    expect_raises("scales of the wrong shape", moe_ep.InvalidArgumentError,
                  "params->x_scales has shape",
                  lambda: g.dispatch(h, (q, torch.ones((1, 3))), topk_weights=w1))
    expect_raises("round_scale", NotImplementedError, "never quantises",
                  lambda: g.dispatch(h, x, topk_weights=w1, round_scale=True))
    expect_raises("handle_layout of an HT handle", moe_ep.UnsupportedError, "LL only",
                  lambda: g.handle_layout(h))
    # A dispatch one rank refuses is an operation its peers still make: they
    # call it alike, and on the host backend theirs fails naming that rank.
    if RANK == 0:  # every rank sends this token to rank 0 only
        expect_raises("ht capacity", moe_ep.InvalidArgumentError, "rows but this rank receives",
                      lambda: g.dispatch(h, x, topk_weights=torch.ones((1, 4)), recv_capacity=0))
    else:
        expect_raises("ht capacity refused by rank 0", moe_ep.InvalidArgumentError,
                      "rank 0 refused its own call of this dispatch",
                      lambda: g.dispatch(h, x, topk_weights=torch.ones((1, 4))))
    h.free()


def main():
    with moe_ep.Group(common.config(0, mode="high_throughput", num_experts=P.num_experts,
                                    hidden=P.hidden, top_k=P.top_k,
                                    max_tokens_per_rank=P.max_tokens)) as g:
        if g.info().mode != "high_throughput":
            fail("info", "-", repr(g.info()))
        roundtrip(g, 1, defer=False)
        roundtrip(g, 2, defer=True)
        fp8_roundtrip(g, 4, "fp8", as_pair=True, defer=False)
        fp8_roundtrip(g, 5, "fp8_ue8m0", as_pair=False, defer=True)
        fp8_roundtrip(g, 6, "fp8_ue8m0_packed", as_pair=True, defer=True)
        fp8_roundtrip(g, 9, "fp8_per_token", as_pair=True, defer=False)
        fp8_roundtrip(g, 10, "fp8_per_token", as_pair=False, defer=True)
        worst_case(g, 7)
        cached_layout(g, 8)
        bad_input(g)
        roundtrip(g, 3, defer=False)  # still usable
    common.finish()


if __name__ == "__main__":
    main()
