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

DEEP_GEMM = "sglang.srt.layers.quantization.deep_gemm_wrapper"
E, H, K, T = 4, 512, 2, 6
SEED = 77


class TopKOutput:
    def __init__(self, w, idx):
        self.topk_weights, self.topk_ids, self.router_logits = w, idx, None


def sglang_flags(monkeypatch, jit, blackwell):
    """SGLang's deep_gemm_wrapper as the dispatcher reads it; None: SGLang
    not importable."""
    if jit is None:
        monkeypatch.setitem(sys.modules, DEEP_GEMM, None)
        monkeypatch.setitem(sys.modules, "sglang", None)
        return
    mod = types.ModuleType(DEEP_GEMM)
    mod.ENABLE_JIT_DEEPGEMM, mod.DEEPGEMM_BLACKWELL = jit, blackwell
    monkeypatch.setitem(sys.modules, DEEP_GEMM, mod)


def expected_scales(x_bits, idx, pow2, packed):
    """Per local expert, the scales of the rows it receives (one rank:
    tokens ascending) as the oracle quantises them."""
    out = []
    for e in range(E):
        rows = [t for t in range(T) if e in idx[t]]
        s = [oracle.fp8_quantize(x_bits[t], pow2)[1] for t in rows]
        out.append(np.stack([oracle.ue8m0_pack(v) if packed else v for v in s]) if s else None)
    return out


@pytest.mark.parametrize("jit, blackwell, given, want", [
    (True, True, None, "ue8m0_packed"),     # SGLang asks for packed UE8M0
    (True, False, None, "f32"),              # Hopper: plain float32 scales
    (False, True, None, "f32"),              # no JIT DeepGEMM
    (None, None, None, "ue8m0"),             # no SGLang: the group's fp8_scale
    (True, True, "f32", "f32"),              # given wins
])
def test_ll_scales_follow_sglang(one_rank_group, monkeypatch, jit, blackwell, given, want):
    sglang_flags(monkeypatch, jit, blackwell)
    g = one_rank_group(num_experts=E, hidden=H, top_k=K, max_tokens_per_rank=8,
                       dispatch_dtype="fp8_e4m3", fp8_scale="ue8m0")
    d = Dispatcher(g, ll_fp8_scale=given)
    inp = oracle.make_inputs(oracle.Problem(1, num_experts=E, hidden=H, top_k=K, max_tokens=8),
                             SEED, 0, num_tokens=T)
    x = torch.from_numpy(inp["x"][:T].view(np.int16)).view(torch.bfloat16)
    idx = torch.from_numpy(np.ascontiguousarray(inp["topk_idx"][:T]))
    w = torch.from_numpy(np.ascontiguousarray(inp["weights"][:T]))
    d.dispatch_a(x, TopKOutput(w, idx))
    out = d.dispatch_b()
    s = out.hidden_states_scale
    cols = -(-H // 512) if want == "ue8m0_packed" else H // 128
    dtype = torch.int32 if want == "ue8m0_packed" else torch.float32
    assert s.dtype == dtype and s.shape[-1] == cols, \
        "seed %d: scales %s [.., %d], want %s [.., %d] (%s)" % (SEED, s.dtype, s.shape[-1], dtype,
                                                              cols, want)
    exp = expected_scales(inp["x"][:T], inp["topk_idx"][:T], want != "f32",
                          want == "ue8m0_packed")
    for e, rows in enumerate(exp):
        n = int(out.masked_m[e])
        assert n == (0 if rows is None else len(rows)), "seed %d expert %d count %d" % (SEED, e, n)
        if rows is None:
            continue
        got = s[e, :n].contiguous().numpy()
        bad = np.argwhere(got.view(np.uint32) != rows.view(np.uint32))
        assert not len(bad), "seed %d expert %d scales (%s): first bad %s: got %r want %r" % (
            SEED, e, want, tuple(bad[0]), got[tuple(bad[0])], rows[tuple(bad[0])])
    d.combine_a(torch.zeros(tuple(out.hidden_states.shape), dtype=torch.bfloat16), idx, w)
    d.combine_b()


def test_ll_fp8_scale_needs_an_fp8_low_latency_group(one_rank_group):
    g = one_rank_group(num_experts=E, hidden=H, top_k=K, max_tokens_per_rank=8)
    with pytest.raises(ValueError, match="ll_fp8_scale='f32' needs a low-latency group that "
                                         "dispatches fp8"):
        Dispatcher(g, ll_fp8_scale="f32")
    with pytest.raises(ValueError, match="ll_fp8_scale='e8m0' must be None"):
        Dispatcher(g, ll_fp8_scale="e8m0")
