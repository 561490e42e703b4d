"""The tests' numpy reference of vLLM's fp8 activation quantisers (written
from vLLM's CUDA kernels: dynamic_scaled_fp8_quant, static_scaled_fp8_quant,
dynamic_per_token_scaled_fp8_quant, per_token_group_quant_fp8), float32
throughout, e4m3 by the oracle's encoder; and what the vLLM adapter's
prepare and finalize deliver when it quantises the received rows:
expected codes and scales per receiving rank, and the combines of the
experts' outputs computed from the dequantised rows."""
import numpy as np

import oracle

F448 = np.float32(448.0)
TOKEN_FLOOR = np.float32(1.0) / np.float32(448.0 * 512.0)
GROUP_EPS = np.float32(1e-10)


class Config:
    """A vLLM quant_config stand-in (the attributes the adapter reads)."""

    def __init__(self, quant_dtype, block_shape=None, per_act_token_quant=False, a1_scale=None,
                 name=None):
        self.quant_dtype, self.block_shape = quant_dtype, block_shape
        self.per_act_token_quant, self.a1_scale = per_act_token_quant, a1_scale
        self.name = name

    def __repr__(self):
        return self.name or "Config(block_shape=%r)" % (self.block_shape,)


def _abs_max(a, axis=None, keepdims=False):
    """max |a|, NaN skipped (the kernels' fmaxf), 0 for nothing."""
    m = np.abs(a)
    m = np.where(np.isnan(m), np.float32(0), m)
    if m.size == 0:
        return np.float32(0)
    return m.max(axis=axis, keepdims=keepdims).astype(np.float32)


def _saturate(v, nan_to):
    v = np.asarray(v, np.float32)
    return np.where(np.isnan(v), np.float32(nan_to), np.clip(v, -F448, F448)).astype(np.float32)


def per_tensor_scale(rows):
    return np.array([_abs_max(rows) / F448], np.float32)


def per_tensor(rows, scale):
    """codes of rows x * (1 / scale), the inverted scale of the kernels."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inverted = np.float32(1.0) / np.float32(scale.reshape(-1)[0])
        v = (rows * inverted).astype(np.float32)
    return oracle.e4m3_bits(_saturate(v, 448.0))


def per_token(rows):
    amax = _abs_max(rows, axis=1, keepdims=True)
    scale = np.maximum((amax / F448).astype(np.float32), TOKEN_FLOOR).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        v = (rows / scale).astype(np.float32)
    return oracle.e4m3_bits(_saturate(v, 448.0)), scale


def per_group(rows, k):
    n, h = rows.shape
    g = rows.reshape(n, h // k, k)
    amax = np.maximum(_abs_max(g, axis=2), GROUP_EPS).astype(np.float32)
    scale = (amax / F448).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        v = (g / scale[:, :, None]).astype(np.float32)
    return oracle.e4m3_bits(_saturate(v, -448.0)).reshape(n, h), scale


def quantize(rows, cfg):
    """(codes [N, H] uint8, scales) of float32 rows [N, H] under cfg."""
    static = None if cfg.a1_scale is None else np.asarray(cfg.a1_scale, np.float32).reshape(1)
    if cfg.block_shape is not None:
        return per_group(rows, int(cfg.block_shape[-1]))
    if static is None and cfg.per_act_token_quant:
        return per_token(rows)
    scale = per_tensor_scale(rows) if static is None else static
    return per_tensor(rows, scale), scale


def dequantize(codes, scales, hidden):
    """float32 rows [N, H] that codes and their scales stand for."""
    f = oracle.e4m3_float(codes).reshape(-1, hidden)
    s = np.asarray(scales, np.float32)
    if s.size == 1:
        return (f * s.reshape(-1)[0]).astype(np.float32)
    s = s.reshape(len(f), -1)
    return (f * np.repeat(s, hidden // s.shape[1], axis=1)).astype(np.float32)


# ---- high throughput ------------------------------------------------------------

def ht_receive(p, inputs, rank, cfg):
    """(src [(source rank, token)], codes, scales) rank's receive quantised
    as the adapter's HT prepare does (all received rows together); an empty
    receive gives (src, None, None)."""
    src = oracle.ht_dispatch(p, inputs, rank)[0]
    if not src:
        return src, None, None
    rows = np.stack([oracle.bf16_float(inputs[s]["x"][t]) for s, t in src])
    codes, scales = quantize(rows, cfg)
    return src, codes, scales


def ht_combine(p, inputs, rank, cfg):
    """rank's finalize output [T, H] bf16 bits when each receiving rank r's
    experts return bf16(dequantised row * ht_partial_scale(r)) and the
    partials are summed in f32 over ranks ascending."""
    seen = {}
    for r in range(p.world):
        src, codes, scales = ht_receive(p, inputs, r, cfg)
        if not src:
            continue
        rows = dequantize(codes, scales, p.hidden)
        for i, (s, t) in enumerate(src):
            if s == rank:
                seen[(r, t)] = rows[i]
    inp = inputs[rank]
    out = np.zeros(inp["x"].shape, dtype=np.uint16)
    for t in range(len(inp["x"])):
        acc = np.zeros(p.hidden, dtype=np.float32)
        for r in sorted({int(e) // p.local for e in inp["topk_idx"][t] if e >= 0}):
            part = oracle.bf16_bits(seen[(r, t)] * oracle.ht_partial_scale(r))
            acc = (acc + oracle.bf16_float(part)).astype(np.float32)
        out[t] = oracle.bf16_bits(acc)
    return out


# ---- low latency ----------------------------------------------------------------

def ll_receive(p, inputs, rank, cfg):
    """(rows per local expert [(source rank, token)], codes per local
    expert, scales per local expert) of rank's LL receive quantised as the
    adapter's LL prepare does: one matrix of every received row (a
    per-tensor scale over all of them), each row on its own otherwise."""
    lists = oracle.ll_dispatch(p, inputs, rank)
    flat = [(l, s, t) for l, rows in enumerate(lists) for s, t in rows]
    codes = [np.zeros((len(rows), p.hidden), np.uint8) for rows in lists]
    scales = [None] * len(lists)
    if not flat:
        return lists, codes, scales
    rows = np.stack([oracle.bf16_float(inputs[s]["x"][t]) for _, s, t in flat])
    q, s = quantize(rows, cfg)
    per_row = np.asarray(s).size != 1
    for l in range(len(lists)):
        mine = [i for i, (e, _, _) in enumerate(flat) if e == l]
        codes[l] = q[mine]
        scales[l] = np.asarray(s)[mine] if per_row else np.asarray(s).reshape(1)
    return lists, codes, scales


def ll_combine_at_dispatch(p, inputs, rank, cfg):
    """rank's finalize output [T, H] bf16 bits, weights at dispatch: expert
    e's output is bf16(dequantised row * expert_scale(e)) on the rank that
    holds e; per rank the f32 fma sum over k, rounded to bf16, then those
    partials summed in f32 in the order the ranks first appear in the
    token's top-k (oracle.ll_combine with the rows the experts
    saw)."""
    seen = {}
    for r in range(p.world):
        lists, codes, scales = ll_receive(p, inputs, r, cfg)
        for l, rows in enumerate(lists):
            if not rows:
                continue
            deq = dequantize(codes[l], scales[l], p.hidden)
            for i, (s, t) in enumerate(rows):
                if s == rank:
                    seen[(r * p.local + l, t)] = deq[i]
    # The experts' rule on the dequantised received row.
    return oracle.ll_combine(
        p, inputs[rank],
        expert_out=lambda t, e: oracle.bf16_bits(seen[(e, t)] * oracle.expert_scale(e)))
