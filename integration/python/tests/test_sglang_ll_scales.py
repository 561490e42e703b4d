"""The SGLang dispatcher's low-latency fp8 scales are those SGLang's own
DeepEP dispatcher asks DeepEP for (packed UE8M0 when its JIT DeepGEMM runs
on Blackwell, else float32), read from SGLang's deep_gemm_wrapper (a
stand-in module here); ll_fp8_scale overrides; without SGLang the group's
fp8_scale stays. One real rank on the host backend; values against the
oracle's quantiser."""
import sys
import types

import numpy as np
import pytest
import torch

import oracle
from moe_ep.sglang import Dispatcher

DEEP_GEMM = "sglang.srt.layers.deep_gemm_wrapper"
OLD_DEEP_GEMM = "sglang.srt.layers.quantization.deep_gemm_wrapper"  # before SGLang moved it
E, H, K, T = 4, 512, 2, 6
SEED = 77


class TopKOutput:
    def __init__(self, w, idx):
        self.topk_weights, self.topk_ids, self.router_logits = w, idx, None


def sglang_flags(monkeypatch, jit, blackwell, path=DEEP_GEMM):
    """SGLang's deep_gemm_wrapper as the dispatcher reads it, at `path`
    (the other location absent); None: SGLang not importable."""
    for name in (DEEP_GEMM, OLD_DEEP_GEMM):
        monkeypatch.setitem(sys.modules, name, None)
    if jit is None:
        monkeypatch.setitem(sys.modules, "sglang", None)
        return
    mod = types.ModuleType(path)
    mod.ENABLE_JIT_DEEPGEMM, mod.DEEPGEMM_BLACKWELL = jit, blackwell
    monkeypatch.setitem(sys.modules, path, mod)


def expected_scales(x_bits, idx, pow2, packed):
    """Per local expert, the scales of the rows it receives (one rank:
    tokens ascending) as the oracle quantises them."""
    out = []
    for e in range(E):
        rows = [t for t in range(T) if e in idx[t]]
        s = [oracle.fp8_quantize(x_bits[t], pow2)[1] for t in rows]
        out.append(np.stack([oracle.ue8m0_pack(v) if packed else v for v in s]) if s else None)
    return out


def batch(seed):
    """(x bf16 bits [T, H], topk_idx, weights) of one rank as numpy, and
    the same as torch tensors."""
    inp = oracle.make_inputs(oracle.Problem(1, num_experts=E, hidden=H, top_k=K, max_tokens=8),
                             seed, 0, num_tokens=T)
    x = torch.from_numpy(inp["x"].view(np.int16)).view(torch.bfloat16)
    idx = torch.from_numpy(np.ascontiguousarray(inp["topk_idx"]))
    w = torch.from_numpy(np.ascontiguousarray(inp["weights"]))
    return inp, x, idx, w


def check_scales(what, seed, inp, scales, counts, want):
    """scales [E, R*N, cols] (a receive's, in DeepEP's view) and counts
    against the oracle's quantiser for scale format `want`."""
    cols = -(-H // 512) if want == "ue8m0_packed" else H // 128
    dtype = torch.int32 if want == "ue8m0_packed" else torch.float32
    assert scales.dtype == dtype and scales.shape[-1] == cols, \
        "%s, seed %d: scales %s [.., %d], want %s [.., %d] (%s)" % (
            what, seed, scales.dtype, scales.shape[-1], dtype, cols, want)
    exp = expected_scales(inp["x"], inp["topk_idx"], want != "f32", want == "ue8m0_packed")
    for e, rows in enumerate(exp):
        n = int(counts[e])
        want_n = 0 if rows is None else len(rows)
        assert n == want_n, "%s, seed %d expert %d: count %d, want %d" % (what, seed, e, n,
                                                                          want_n)
        if rows is None:
            continue
        got = scales[e, :n].contiguous().numpy()
        bad = np.argwhere(got.view(np.uint32) != rows.view(np.uint32))
        assert not len(bad), "%s, seed %d expert %d scales (%s): first bad %s: got %r want %r" % (
            what, seed, e, want, tuple(bad[0]), got[tuple(bad[0])], rows[tuple(bad[0])])


@pytest.mark.parametrize("jit, blackwell, given, want, path", [
    (True, True, None, "ue8m0_packed", DEEP_GEMM),      # SGLang asks for packed UE8M0
    (True, True, None, "ue8m0_packed", OLD_DEEP_GEMM),  # read where older SGLang has it
    (True, False, None, "f32", DEEP_GEMM),              # Hopper: plain float32 scales
    (False, True, None, "f32", DEEP_GEMM),              # no JIT DeepGEMM
    (None, None, None, "ue8m0", DEEP_GEMM),             # no SGLang: the group's fp8_scale
    (True, True, "f32", "f32", DEEP_GEMM),              # given wins
])
def test_ll_scales_follow_sglang(one_rank_group, monkeypatch, jit, blackwell, given, want, path):
    sglang_flags(monkeypatch, jit, blackwell, path)
    g = one_rank_group(num_experts=E, hidden=H, top_k=K, max_tokens_per_rank=8,
                       dispatch_dtype="fp8_e4m3", fp8_scale="ue8m0")
    d = Dispatcher(g, ll_fp8_scale=given)
    inp, x, idx, w = batch(SEED)
    d.dispatch_a(x, TopKOutput(w, idx))
    out = d.dispatch_b()
    check_scales("sglang ll", SEED, inp, out.hidden_states_scale, out.masked_m, want)
    # DeepEP's layout, which SGLang's masked GEMM takes: per expert
    # column-major, each column's rows padded to 16 bytes (TMA).
    s = out.hidden_states_scale
    assert s.stride(1) == 1 and s.stride(2) >= s.shape[1] and s.stride(2) % 4 == 0 and \
        s.stride(0) == s.stride(2) * s.shape[2], \
        "sglang ll, seed %d: scales %r strides %r, want column-major per expert" % (
            SEED, tuple(s.shape), s.stride())
    d.combine_a(torch.zeros(tuple(out.hidden_states.shape), dtype=torch.bfloat16), idx, w)
    d.combine_b()


def test_adapters_of_two_formats_share_one_group(one_rank_group, monkeypatch):
    """A vLLM prepare/finalize (the group's f32 scales) and an SGLang
    dispatcher asking for packed UE8M0 on one group, in an order that does
    not alternate (v, v, s, s, v, s, s, v): the group's receive ring keeps
    buffers per format, so each receive has its own format's scales."""
    import moe_ep.vllm
    sglang_flags(monkeypatch, None, None)
    g = one_rank_group(num_experts=E, hidden=H, top_k=K, max_tokens_per_rank=8,
                       dispatch_dtype="fp8_e4m3", fp8_scale="f32")
    pf = moe_ep.vllm.PrepareAndFinalize(g)
    d = Dispatcher(g, ll_fp8_scale="ue8m0_packed")
    quant = types.SimpleNamespace(quant_dtype=moe_ep.FP8_STORAGE, block_shape=[128, 128],
                                  per_act_token_quant=False, a1_scale=None)
    for step, who in enumerate("vvssvssv"):
        seed = SEED + 10 + step
        inp, x, idx, w = batch(seed)
        if who == "v":
            a1q, scale, meta, _, _ = pf.prepare(x, w, idx, E, None, False, quant)
            check_scales("vllm step %d" % step, seed, inp, scale, meta.expert_num_tokens, "f32")
            pf.finalize(torch.empty_like(x), torch.zeros(tuple(a1q.shape), dtype=torch.bfloat16),
                        w, idx, False, None)
        else:
            d.dispatch_a(x, TopKOutput(w, idx))
            out = d.dispatch_b()
            check_scales("sglang step %d" % step, seed, inp, out.hidden_states_scale,
                         out.masked_m, "ue8m0_packed")
            d.combine_a(torch.zeros(tuple(out.hidden_states.shape), dtype=torch.bfloat16), idx,
                        w)
            d.combine_b()


def test_ll_fp8_scale_needs_an_fp8_low_latency_group(one_rank_group):
    g = one_rank_group(num_experts=E, hidden=H, top_k=K, max_tokens_per_rank=8)
    with pytest.raises(ValueError, match="ll_fp8_scale='f32' needs a low-latency group that "
                                         "dispatches fp8"):
        Dispatcher(g, ll_fp8_scale="f32")
    with pytest.raises(ValueError, match="ll_fp8_scale='e8m0' must be None"):
        Dispatcher(g, ll_fp8_scale="e8m0")
