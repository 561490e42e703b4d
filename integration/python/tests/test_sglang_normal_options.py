"""The SGLang dispatcher's normal-mode defaults are what SGLang's own
DeepEP dispatcher does, read from SGLang (stand-in modules here): with its
JIT DeepGEMM the rows are quantised before the dispatch (packed UE8M0
scales when DEEPGEMM_SCALE_UE8M0, else float32; bf16 with the cutlass
runner or SGLANG_DEEPEP_BF16_DISPATCH) and the per-expert counts aligned
to 128; without it, or without SGLang, rows as given and alignment 1; an
option given wins. One real rank on the host backend; scales against the
oracle's quantiser, counts against the routing."""
import sys
import types

import numpy as np
import pytest
import torch

import oracle
from moe_ep.sglang import Dispatcher
from test_sglang_ll_scales import DEEP_GEMM, OLD_DEEP_GEMM, TopKOutput

MOE_UTILS = "sglang.srt.layers.moe.utils"
ENVIRON = "sglang.srt.environ"
E, H, K, T = 4, 1024, 2, 6
SEED = 91


def sglang_flags(monkeypatch, jit, ue8m0=False, cutlass=False, bf16=False):
    """SGLang's modules as the dispatcher reads them (an SGLang without
    get_deepep_output_dtype: its older rules); jit None: SGLang not
    importable."""
    monkeypatch.setitem(sys.modules, OLD_DEEP_GEMM, None)
    if jit is None:
        for name in (DEEP_GEMM, MOE_UTILS, ENVIRON, "sglang"):
            monkeypatch.setitem(sys.modules, name, None)
        return
    dg = types.ModuleType(DEEP_GEMM)
    dg.ENABLE_JIT_DEEPGEMM, dg.DEEPGEMM_SCALE_UE8M0 = jit, ue8m0
    utils = types.ModuleType(MOE_UTILS)
    utils.get_moe_runner_backend = lambda: types.SimpleNamespace(is_cutlass=lambda: cutlass)
    environ = types.ModuleType(ENVIRON)
    environ.envs = types.SimpleNamespace(
        SGLANG_DEEPEP_BF16_DISPATCH=types.SimpleNamespace(get=lambda: bf16))
    for name, mod in ((DEEP_GEMM, dg), (MOE_UTILS, utils), (ENVIRON, environ)):
        monkeypatch.setitem(sys.modules, name, mod)


@pytest.mark.parametrize("flags, given, want_fp8, want_align", [
    ((True, True, False, False), {}, "ue8m0_packed", 128),   # DeepGEMM with UE8M0 scales
    ((True, False, False, False), {}, "f32", 128),           # DeepGEMM with float32 scales
    ((True, True, True, False), {}, None, 128),              # the cutlass runner: bf16 rows
    ((True, True, False, True), {}, None, 128),              # SGLANG_DEEPEP_BF16_DISPATCH
    ((False, True, False, False), {}, None, 1),              # no JIT DeepGEMM
    ((None, False, False, False), {}, None, 1),              # no SGLang
    ((True, True, False, False), {"normal_fp8": None, "expert_alignment": 4}, None, 4),
    ((True, False, False, False), {"normal_fp8": "ue8m0"}, "ue8m0", 128),
])
def test_normal_options_follow_sglang(one_rank_group, monkeypatch, flags, given, want_fp8,
                                      want_align):
    sglang_flags(monkeypatch, *flags)
    g = one_rank_group(mode="high_throughput", num_experts=E, hidden=H, top_k=K,
                       max_tokens_per_rank=8)
    d = Dispatcher(normal_group=g, **given)
    inp = oracle.make_inputs(oracle.Problem(1, num_experts=E, hidden=H, top_k=K, max_tokens=8),
                             SEED, 0, num_tokens=T)
    x = torch.from_numpy(inp["x"].view(np.int16)).view(torch.bfloat16)
    idx = torch.from_numpy(np.ascontiguousarray(inp["topk_idx"]))
    w = torch.from_numpy(np.ascontiguousarray(inp["weights"]))
    what = "flags %r, given %r, seed %d" % (flags, given, SEED)
    d.dispatch_a(x, TopKOutput(w, idx))
    o = d.dispatch_b()
    # One rank: every token arrives once, in order.
    rows = [t for t in range(T) if (inp["topk_idx"][t] >= 0).any()]
    assert int(o.hidden_states.shape[0]) == len(rows), what
    if want_fp8 is None:
        assert o.hidden_states.dtype == torch.bfloat16 and o.hidden_states_scale is None, \
            "%s: rows %s with scales %r, want bf16 rows as given" % (
                what, o.hidden_states.dtype, None if o.hidden_states_scale is None
                else o.hidden_states_scale.dtype)
    else:
        packed = want_fp8 == "ue8m0_packed"
        want = np.stack([oracle.fp8_quantize(inp["x"][t], want_fp8 != "f32")[1] for t in rows])
        if packed:
            want = np.stack([oracle.ue8m0_pack(s) for s in want])
        got = o.hidden_states_scale.contiguous().numpy()
        assert got.shape == want.shape and got.dtype.itemsize == 4, \
            "%s: scales %s %r, want %r (%s)" % (what, got.dtype, got.shape, want.shape, want_fp8)
        bad = np.argwhere(got.view(np.uint32) != want.view(np.uint32))
        assert not len(bad), "%s: scales (%s) first bad %s: got %r want %r" % (
            what, want_fp8, tuple(bad[0]), got[tuple(bad[0])], want[tuple(bad[0])])
    counts = [int(np.sum(inp["topk_idx"] == e)) for e in range(E)]
    aligned = [(c + want_align - 1) // want_align * want_align for c in counts]
    assert list(o.num_recv_tokens_per_expert) == aligned, \
        "%s: counts %r, want %r (alignment %d)" % (what, o.num_recv_tokens_per_expert, aligned,
                                                   want_align)
    d.combine_a(torch.zeros(tuple(o.hidden_states.shape), dtype=torch.bfloat16), o.topk_ids,
                o.topk_weights)
    d.combine_b()


def test_normal_defaults_are_refused_in_low_latency_only_when_given(one_rank_group,
                                                                    monkeypatch):
    """The defaults are no option given: a low-latency dispatcher takes
    them with SGLang's DeepGEMM on; a normal option given there is refused."""
    sglang_flags(monkeypatch, True, True)
    g = one_rank_group(num_experts=E, hidden=H, top_k=K, max_tokens_per_rank=8)
    assert Dispatcher(g).deepep_mode == "low_latency"
    with pytest.raises(ValueError, match="expert_alignment=128 with deepep_mode='low_latency'"):
        Dispatcher(g, expert_alignment=128)
