"""vLLM's high-throughput prepare quantises block-fp8 activations with the
scales vLLM's own DeepEP HT prepare makes: powers of two where vLLM's
is_deep_gemm_e8m0_used() (DeepGEMM with E8M0 scales), plain float32
otherwise, the group's fp8_scale where vLLM is not importable (a stand-in
vllm.utils.deep_gemm here); a scale_format given wins. One real rank on
the host backend; scales against the oracle's quantiser."""
import sys
import types

import numpy as np
import pytest
import torch

import moe_ep
import moe_ep.vllm
import oracle

DEEP_GEMM = "vllm.utils.deep_gemm"
E, H, K, T = 4, 512, 2, 6
SEED = 53


def vllm_e8m0(monkeypatch, used):
    """vllm.utils.deep_gemm as the adapter reads it; None: vLLM not importable."""
    if used is None:
        monkeypatch.setitem(sys.modules, DEEP_GEMM, None)
        monkeypatch.setitem(sys.modules, "vllm", None)
        return
    mod = types.ModuleType(DEEP_GEMM)
    mod.is_deep_gemm_e8m0_used = lambda: used
    monkeypatch.setitem(sys.modules, DEEP_GEMM, mod)


@pytest.mark.parametrize("used, given, want", [
    (True, None, "ue8m0"),     # DeepGEMM with E8M0: powers of two
    (False, None, "f32"),      # plain float32 scales
    (None, None, "ue8m0_packed"),  # no vLLM: the group's fp8_scale
    (True, "f32", "f32"),      # given wins
])
def test_ht_block_fp8_scales_follow_vllm(one_rank_group, monkeypatch, used, given, want):
    vllm_e8m0(monkeypatch, used)
    g = one_rank_group(mode="high_throughput", num_experts=E, hidden=H, top_k=K,
                       max_tokens_per_rank=8, fp8_scale="ue8m0_packed")
    pf = moe_ep.vllm.PrepareAndFinalize(g, scale_format=given)
    inp = oracle.make_inputs(oracle.Problem(1, num_experts=E, hidden=H, top_k=K, max_tokens=8),
                             SEED, 0, num_tokens=T)
    x = torch.from_numpy(inp["x"].view(np.int16)).view(torch.bfloat16)
    idx = torch.from_numpy(np.ascontiguousarray(inp["topk_idx"]))
    w = torch.from_numpy(np.ascontiguousarray(inp["weights"]))
    quant = types.SimpleNamespace(quant_dtype=moe_ep.FP8_STORAGE, block_shape=[128, 128],
                                  per_act_token_quant=False, a1_scale=None)
    a1q, scale, _, ids, wts = pf.prepare(x, w, idx, E, None, False, quant)
    what = "vLLM e8m0 %r, scale_format %r, seed %d" % (used, given, SEED)
    rows = [t for t in range(T) if (inp["topk_idx"][t] >= 0).any()]  # one rank: all, in order
    exp = np.stack([oracle.fp8_quantize(inp["x"][t], want != "f32")[1] for t in rows])
    if want == "ue8m0_packed":
        exp = np.stack([oracle.ue8m0_pack(s) for s in exp])
    got = scale.contiguous().numpy()
    assert got.shape == exp.shape, "%s: scales %r, want %r (%s)" % (what, got.shape, exp.shape,
                                                                    want)
    bad = np.argwhere(got.view(np.uint32) != exp.view(np.uint32))
    assert not len(bad), "%s: scales (%s) first bad %s: got %r want %r" % (
        what, want, tuple(bad[0]), got[tuple(bad[0])], exp[tuple(bad[0])])
    pf.finalize(torch.empty_like(x), torch.zeros((len(ids), H), dtype=torch.bfloat16), wts, ids,
                False, None)
