"""HT worker: prepare's layout, dispatch (packed rows, local ids, weights,
per-expert counts, num_recv_tokens) and combine (partials summed over
ranks ascending) bit-exact against the oracle; a deferred round trip with
its hooks on a second thread; bad input."""
import threading

import numpy as np
import torch

import common
import moe_ep
import oracle
from common import RANK, WORLD, bits, bf16_tensor, same, fail, expect_raises

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


def run_on_thread(hook):
    box = {}

    def run():
        try:
            box["r"] = hook()
        except Exception as e:  # noqa: BLE001 - reported
            box["e"] = repr(e)
    t = threading.Thread(target=run)
    t.start()
    t.join(120)
    if "e" in box or t.is_alive():
        fail("hook thread", "-", box.get("e", "still running after 120 s"))
    return box.get("r")


def roundtrip(g, seed, defer):
    inputs = oracle.all_inputs(P, seed)
    inp = inputs[RANK]
    x, idx, w = (bf16_tensor(inp["x"]), torch.from_numpy(inp["topk_idx"]),
                 torch.from_numpy(inp["weights"]))
    h = g.prepare(idx)
    check_layout(seed, inp, h.layout)
    res = g.dispatch(h, x, topk_weights=w, defer=defer)
    if defer:
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


def bad_input(g):
    idx = torch.tensor([[0, 1, -1, 2]], dtype=torch.int64)
    x = torch.zeros((1, P.hidden), dtype=torch.bfloat16)
    h = g.prepare(idx)
    expect_raises("ht weights missing", moe_ep.InvalidArgumentError, "params->topk_weights is NULL",
                  lambda: g.dispatch(h, x))
    if RANK == 0:  # every rank sends this token to rank 0 only
        expect_raises("ht capacity", moe_ep.InvalidArgumentError, "rows but this rank receives",
                      lambda: g.dispatch(h, x, topk_weights=torch.ones((1, 4)), recv_capacity=0))
    h.free()


def main():
    with moe_ep.Group(common.config(0, mode="high_throughput", num_experts=P.num_experts,
                                    hidden=P.hidden, top_k=P.top_k,
                                    max_tokens_per_rank=P.max_tokens)) as g:
        if g.info().mode != "high_throughput":
            fail("info", "-", repr(g.info()))
        roundtrip(g, 1, defer=False)
        roundtrip(g, 2, defer=True)
        bad_input(g)
        roundtrip(g, 3, defer=False)  # still usable
    common.finish()


if __name__ == "__main__":
    main()
