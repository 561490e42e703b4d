"""What SGLang's normal (prefill) mode should give, for the SGLang
dispatcher workers: the receive of every rank from every rank's seeded
inputs (tests/oracle.py's HT receive: rows by source rank then token,
local ids or -1), SGLang's experts on the received rows, and the combined
output those experts lead to, computed on the source side in numpy."""
import numpy as np
import torch

import oracle
from common import RANK, WORLD, bits, fail, same

HT = oracle.Problem(WORLD, num_experts=4 * WORLD, hidden=256, top_k=4, max_tokens=32)
ORACLE_FORMAT = {"f32": "fp8", "ue8m0": "fp8_ue8m0", "ue8m0_packed": "fp8_ue8m0_packed"}


def inputs_for(seed, empty_rank=None, p=HT, rank0_only=False):
    """Every rank's inputs for one batch; empty_rank sends no tokens;
    rank0_only routes every token to rank 0's experts only (each token's
    slots a rotation of them), so every other rank receives nothing."""
    inputs = [oracle.make_inputs(p, seed, r, num_tokens=0 if r == empty_rank else None)
              for r in range(p.world)]
    if rank0_only:
        for inp in inputs:
            idx = inp["topk_idx"]
            t = np.arange(len(idx))[:, None]
            rotation = (t + np.arange(p.top_k)[None, :]) % p.local
            inp["topk_idx"] = np.where(idx >= 0, rotation, -1).astype(idx.dtype)
    return inputs


def experts(rows, ids, weights):
    """SGLang's experts on the received rows (float32 [N, H]: bf16 rows, or
    fp8 rows dequantised): expert l multiplies by l + 1, and each row's
    local slots are summed with their router weights applied, f32 from +0
    in k order, one bf16 rounding: y = bf16(sum_k w_k * (x * (l_k + 1)))."""
    acc = torch.zeros_like(rows)
    for k in range(ids.shape[1]):
        lid = ids[:, k]
        term = weights[:, k, None] * (rows * (lid + 1).to(torch.float32)[:, None])
        acc = torch.where((lid >= 0)[:, None], acc + term, acc)
    return acc.to(torch.bfloat16)


def combined(inp, seen=None, p=HT):
    """The [T, H] bf16 bits the source rank should get: per destination
    rank (ascending) the bf16 partial its experts return for the token,
    summed in f32 from +0, one bf16 rounding; +0 for a token no rank
    received. seen: the float32 rows the experts see (default the bf16 x)."""
    x, idx, w = inp["x"], inp["topk_idx"], inp["weights"]
    rows = oracle.bf16_float(x) if seen is None else np.asarray(seen, np.float32)
    acc = np.zeros(rows.shape, np.float32)
    for r in range(p.world):
        part = np.zeros(rows.shape, np.float32)
        has = np.zeros(len(x), bool)
        for k in range(p.top_k):
            e = idx[:, k]
            mine = (e >= 0) & (e // p.local == r)
            mult = (e - r * p.local + 1).astype(np.float32)
            term = (w[:, k, None] * (rows * mult[:, None])).astype(np.float32)
            part = np.where(mine[:, None], (part + term).astype(np.float32), part)
            has |= mine
        partial = oracle.bf16_float(oracle.bf16_bits(part))
        acc = np.where(has[:, None], (acc + partial).astype(np.float32), acc)
    return oracle.bf16_bits(acc)


def received(inputs, rows_of, alignment, p=HT):
    """This rank's expected NormalOutput fields: rows_of(s, t) gives the
    bits (and scales or None) source s sent for token t."""
    src, idx, w, counts = oracle.ht_dispatch(p, inputs, RANK)
    got = [rows_of(s, t) for s, t in src]
    return {"n": len(src), "rows": [g[0] for g in got], "scales": [g[1] for g in got],
            "topk_ids": idx.astype(np.int64), "topk_weights": w,
            "counts": [int((c + alignment - 1) // alignment * alignment) for c in counts]}


def check_output(what, seed, o, want, row_shape, scale_shape=None):
    """A NormalOutput against received(); False after the first mismatch."""
    if not o.format.is_deepep_normal() or o.format.is_deepep_ll():
        fail(what + " format", seed, "got %r, want deepep_normal" % (o.format,))
        return False
    if o.topk_ids.dtype != torch.int64 or o.topk_weights.dtype != torch.float32:
        fail(what + " dtypes", seed, "topk_ids %s, topk_weights %s; want int64, float32"
             % (o.topk_ids.dtype, o.topk_weights.dtype))
        return False
    if list(o.num_recv_tokens_per_expert) != want["counts"] or \
            not all(type(c) is int for c in o.num_recv_tokens_per_expert):
        fail(what + " num_recv_tokens_per_expert", seed, "got %r want %r (host ints)"
             % (o.num_recv_tokens_per_expert, want["counts"]))
        return False
    got = bits(o.hidden_states)
    rows = np.stack(want["rows"]) if want["n"] else np.zeros((0,) + row_shape, got.dtype)
    ok = same(what + " hidden_states", seed, got, rows)
    if scale_shape is None:
        if o.hidden_states_scale is not None:
            fail(what + " hidden_states_scale", seed, "got a tensor, want None for bf16 rows")
            return False
    else:
        got = bits(o.hidden_states_scale)
        sc = np.stack(want["scales"]) if want["n"] else np.zeros((0,) + scale_shape, got.dtype)
        ok = ok and same(what + " hidden_states_scale", seed, got, sc)
    ok = ok and same(what + " topk_ids", seed, bits(o.topk_ids), want["topk_ids"])
    return ok and same(what + " topk_weights", seed, bits(o.topk_weights), want["topk_weights"])
