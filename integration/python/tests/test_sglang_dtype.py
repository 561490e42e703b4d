"""The SGLang dispatcher sends the rows SGLang's own DeepEP dispatcher
would: fp8 or bf16 as SGLang's get_deepep_output_dtype chooses (stand-in
modules here), re-read at set_quant_config (the quant method's
dispatcher_output_dtype), in both modes; a dtype moe-ep does not carry is
refused. One real rank on the host backend; rows bit-exact against x,
scales against the oracle's quantiser."""
import enum
import sys
import types

import numpy as np
import pytest
import torch

import oracle
from moe_ep.sglang import Dispatcher
from test_sglang_ll_scales import DEEP_GEMM, OLD_DEEP_GEMM, TopKOutput, batch, check_scales

MOE_UTILS = "sglang.srt.layers.moe.utils"
ENVIRON = "sglang.srt.environ"
E, H, K, T = 4, 512, 2, 6
SEED = 53


class OutputDtype(enum.Enum):
    BF16 = "bf16"
    FP8 = "fp8"
    INT8 = "int8"
    NVFP4 = "nvfp4"


def sglang_rules(monkeypatch, server="auto", jit=False, ue8m0=False):
    """SGLang as the dispatcher reads it: deep_gemm_wrapper at its later
    location, and a get_deepep_output_dtype that, like SGLang's, takes the
    server argument unless it is 'auto', then the quant config's
    dispatcher_output_dtype, else fp8."""
    dg = types.ModuleType(DEEP_GEMM)
    dg.ENABLE_JIT_DEEPGEMM, dg.DEEPGEMM_SCALE_UE8M0, dg.DEEPGEMM_BLACKWELL = jit, ue8m0, False
    utils = types.ModuleType(MOE_UTILS)

    def get_deepep_output_dtype(dispatcher):
        if server != "auto":
            return OutputDtype(server)
        qc = dispatcher.quant_config
        if qc is not None and qc.get("dispatcher_output_dtype") is not None:
            return OutputDtype(qc["dispatcher_output_dtype"])
        return OutputDtype.FP8
    utils.get_deepep_output_dtype = get_deepep_output_dtype
    utils.get_moe_runner_backend = lambda: types.SimpleNamespace(is_cutlass=lambda: False)
    for name, mod in ((DEEP_GEMM, dg), (OLD_DEEP_GEMM, None), (MOE_UTILS, utils),
                      (ENVIRON, None)):
        monkeypatch.setitem(sys.modules, name, mod)


def ll_rows(d, x, idx, w):
    d.dispatch_a(x, TopKOutput(w, idx))
    out = d.dispatch_b()
    return out


def finish(d, out, idx, w):
    d.combine_a(torch.zeros(tuple(out.hidden_states.shape), dtype=torch.bfloat16), idx, w)
    d.combine_b()


def check_bf16_rows(what, inp, out):
    """One rank: expert e's rows are the tokens naming it, ascending, as sent."""
    assert out.hidden_states.dtype == torch.bfloat16 and out.hidden_states_scale is None, \
        "%s, seed %d: rows %s, scales %r; want bf16 rows and no scales" % (
            what, SEED, out.hidden_states.dtype, out.hidden_states_scale)
    for e in range(E):
        rows = [t for t in range(T) if e in inp["topk_idx"][t]]
        n = int(out.masked_m[e])
        assert n == len(rows), "%s, seed %d expert %d: count %d, want %d" % (what, SEED, e, n,
                                                                             len(rows))
        if not rows:
            continue
        got = out.hidden_states[e, :n].view(torch.int16).numpy().view(np.uint16)
        want = inp["x"][rows]
        bad = np.argwhere(got != want)
        assert not len(bad), "%s, seed %d expert %d: first bad %s: got %#x want %#x" % (
            what, SEED, e, tuple(bad[0]), got[tuple(bad[0])], want[tuple(bad[0])])


def test_ll_rows_follow_sglang_on_a_bf16_group(one_rank_group, monkeypatch):
    """SGLang's default (fp8) quantises on a group that dispatches bf16; the
    quant method's dispatcher_output_dtype bf16 then sends bf16 rows."""
    sglang_rules(monkeypatch)
    g = one_rank_group(num_experts=E, hidden=H, top_k=K, max_tokens_per_rank=8)
    d = Dispatcher(g)
    inp, x, idx, w = batch(SEED)
    out = ll_rows(d, x, idx, w)
    check_scales("sglang fp8 on a bf16 group", SEED, inp, out.hidden_states_scale, out.masked_m,
                 "f32")
    finish(d, out, idx, w)
    d.set_quant_config({"dispatcher_output_dtype": "bf16"})
    out = ll_rows(d, x, idx, w)
    check_bf16_rows("sglang bf16 after set_quant_config", inp, out)
    finish(d, out, idx, w)


def test_ll_bf16_on_an_fp8_group_is_refused_at_dispatch(one_rank_group, monkeypatch):
    sglang_rules(monkeypatch, server="bf16")
    g = one_rank_group(num_experts=E, hidden=H, top_k=K, max_tokens_per_rank=8,
                       dispatch_dtype="fp8_e4m3")
    d = Dispatcher(g)
    inp, x, idx, w = batch(SEED)
    with pytest.raises(ValueError, match=r"dispatch_a: SGLang dispatches bf16 rows here .* "
                                         r"configure the group with dispatch_dtype: bf16"):
        d.dispatch_a(x, TopKOutput(w, idx))
    # Nothing was sent: the dispatcher and its group go on.
    sglang_rules(monkeypatch)
    d.set_quant_config({})
    out = ll_rows(d, x, idx, w)
    check_scales("sglang fp8 after the refusal", SEED, inp, out.hidden_states_scale,
                 out.masked_m, "f32")
    finish(d, out, idx, w)


def test_normal_rows_follow_the_quant_config(one_rank_group, monkeypatch):
    """With JIT DeepGEMM SGLang quantises a normal dispatch unless its
    dtype is bf16, which a quant method may set after the dispatcher is
    made; the alignment stays 128 either way."""
    sglang_rules(monkeypatch, jit=True, ue8m0=True)
    g = one_rank_group(mode="high_throughput", num_experts=E, hidden=H, top_k=K,
                       max_tokens_per_rank=8)
    d = Dispatcher(normal_group=g)
    inp, x, idx, w = batch(SEED)
    for quant_config, fp8 in ((None, True), ({"dispatcher_output_dtype": "bf16"}, False),
                              ({"dispatcher_output_dtype": "fp8"}, True)):
        if quant_config is not None:
            d.set_quant_config(quant_config)
        what = "normal, quant_config %r, seed %d" % (quant_config, SEED)
        d.dispatch_a(x, TopKOutput(w, idx))
        o = d.dispatch_b()
        rows = [t for t in range(T) if (inp["topk_idx"][t] >= 0).any()]
        if fp8:
            want = np.stack([oracle.ue8m0_pack(oracle.fp8_quantize(inp["x"][t], True)[1])
                             for t in rows])
            got = o.hidden_states_scale.contiguous().numpy()
            assert got.shape == want.shape and \
                (got.view(np.uint32) == want.view(np.uint32)).all(), \
                "%s: scales %r, want packed UE8M0 %r" % (what, got, want)
        else:
            assert o.hidden_states.dtype == torch.bfloat16 and o.hidden_states_scale is None, \
                "%s: rows %s, want bf16 rows as given" % (what, o.hidden_states.dtype)
            got = o.hidden_states.view(torch.int16).numpy().view(np.uint16)
            assert (got == inp["x"][rows]).all(), "%s: bf16 rows differ from x" % what
        counts = [int(np.sum(inp["topk_idx"] == e)) for e in range(E)]
        assert list(o.num_recv_tokens_per_expert) == [(c + 127) // 128 * 128 for c in counts], \
            "%s: counts %r" % (what, o.num_recv_tokens_per_expert)
        d.combine_a(torch.zeros(tuple(o.hidden_states.shape), dtype=torch.bfloat16), o.topk_ids,
                    o.topk_weights)
        d.combine_b()


@pytest.mark.parametrize("where", ["constructor", "set_quant_config"])
def test_a_dtype_moe_ep_does_not_carry_is_refused(one_rank_group, monkeypatch, where):
    g = one_rank_group(num_experts=E, hidden=H, top_k=K, max_tokens_per_rank=8)
    if where == "constructor":
        sglang_rules(monkeypatch, server="nvfp4")
        with pytest.raises(NotImplementedError, match="SGLang asks its DeepEP dispatcher for "
                                                      "nvfp4 rows"):
            Dispatcher(g)
        return
    sglang_rules(monkeypatch)
    d = Dispatcher(g)
    with pytest.raises(NotImplementedError, match="set_quant_config: SGLang asks its DeepEP "
                                                  "dispatcher for nvfp4 rows"):
        d.set_quant_config({"dispatcher_output_dtype": "nvfp4"})
    assert d.quant_config is None  # unchanged: the earlier choice stands
