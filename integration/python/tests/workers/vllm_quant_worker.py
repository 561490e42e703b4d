"""vLLM adapter, quant_configs quantised after the receive (per tensor,
dynamic and static; per token; block_shape [128, 64]) on a
high-throughput group and a bf16 low-latency group: a1q and a1q_scale
bit-exact against the tests' numpy reference of vLLM's quantisers
(vllm_quant_expected) applied to the oracle's receive, finalize of the
experts' outputs from the dequantised rows bit-exact; full: refusals
naming the attribute, and a block-fp8 config on an fp8_e4m3 LL group
(quantised in the dispatch) against the oracle.
argv: [full|short]"""
import sys

import numpy as np
import torch

import common
import moe_ep
import moe_ep.vllm
import oracle
import vllm_quant_expected as expected
from common import RANK, WORLD, bits, bf16_tensor, expect_raises, fail, run_on_thread, same
from ht_worker import E4M3
from ll_worker import P as LL
from ll_worker import check_dispatch, expert_outputs, torch_inputs
from vllm_quant_expected import Config

FULL = sys.argv[1:] == ["full"]
HT = oracle.Problem(WORLD, num_experts=4 * WORLD, hidden=256, top_k=4, max_tokens=32)
FP8 = moe_ep.FP8_STORAGE

CONFIGS = [
    Config(FP8, name="per tensor, dynamic"),
    Config(FP8, a1_scale=torch.tensor([0.0123]), name="per tensor, static a1_scale"),
    Config(FP8, per_act_token_quant=True, name="per token"),
    Config(FP8, block_shape=[128, 64], name="block_shape [128, 64]"),
]


def edge_inputs(p, seed):
    """Every rank's inputs; on each rank token 0's row is zero and token
    1's is scaled by 2^-30 (exact in bf16), so the scales' floors count."""
    inputs = oracle.all_inputs(p, seed)
    for inp in inputs:
        x = inp["x"]
        if len(x) > 0:
            x[0] = 0
        if len(x) > 1:
            x[1] = oracle.bf16_bits(oracle.bf16_float(x[1]) * np.float32(2.0 ** -30))
    return inputs


def dequantized(a1q, scale):
    """float32 rows the experts see: codes times the scale of their tensor,
    row or channel group (scales broadcast over the last axis)."""
    f = E4M3[a1q.contiguous().view(torch.uint8).long()]
    s = scale.float()
    return f * s.repeat_interleave(f.shape[-1] // s.shape[-1], dim=-1)


def check_types(what, seed, a1q, scale, want_scale_shape):
    if a1q.dtype != FP8 or scale is None or scale.dtype != torch.float32 or \
            tuple(scale.shape) != tuple(want_scale_shape):
        fail(what, seed, "a1q %s, a1q_scale %s; want %s and float32 %s" % (
            a1q.dtype, None if scale is None else "%s %s" % (scale.dtype, tuple(scale.shape)),
            FP8, tuple(want_scale_shape)))
        return False
    return True


# ---- high throughput ------------------------------------------------------------

def ht_case(g, cfg, seed, older_library=False):
    """older_library: the adapter made on a library that says it is 0.4,
    which carries no per-token scales: those rows cross bf16 instead."""
    version = g._lib.version
    if older_library:
        g._lib.version = (0, 4, 0)
    try:
        pf = moe_ep.vllm.PrepareAndFinalize(g)
    finally:
        g._lib.version = version
    what = "vllm ht %r%s" % (cfg, " (library 0.4)" if older_library else "")
    inputs = edge_inputs(HT, seed)
    inp = inputs[RANK]
    x, idx, w = bf16_tensor(inp["x"]), torch.from_numpy(inp["topk_idx"]), \
        torch.from_numpy(inp["weights"])
    formats, real = [], g.dispatch
    g.dispatch = lambda *a, **k: formats.append(k.get("format")) or real(*a, **k)
    try:
        hook, receiver = pf.prepare_async(x, w, idx, HT.num_experts, None, False, cfg)
    finally:
        del g.dispatch
    # Dynamic per-token rows cross quantised (their scales are their own);
    # the other formats cross bf16 and are quantised after the receive.
    per_token = cfg.per_act_token_quant and cfg.a1_scale is None and cfg.block_shape is None and \
        not older_library
    if formats != ["fp8_per_token" if per_token else None]:
        fail(what + " dispatch format", seed, "the dispatch was made with format %r" % formats)
    run_on_thread(hook, seed)
    a1q, scale, _, ids, wts = receiver()
    src, codes, scales = expected.ht_receive(HT, inputs, RANK, cfg)
    if codes is None:  # nothing received: vLLM's HT prepare quantises nothing either
        if a1q.shape[0] != 0 or scale is not None:
            fail(what, seed, "an empty receive gave a1q %s and a1q_scale %r"
                 % (tuple(a1q.shape), scale))
        y = a1q
    else:
        if not check_types(what, seed, a1q, scale, scales.shape):
            return
        if cfg.a1_scale is not None and scale is not cfg.a1_scale:
            fail(what, seed, "a1q_scale is not the static a1_scale (vLLM returns it as given)")
        same(what + " a1q", seed, bits(a1q), codes)
        same(what + " a1q_scale", seed, bits(scale), scales)
        y = (dequantized(a1q, scale) * float(oracle.ht_partial_scale(RANK))).to(torch.bfloat16)
    out = torch.empty_like(x)
    pf.finalize(out, y, wts, ids, False, None)
    same(what + " finalize", seed, bits(out), expected.ht_combine(HT, inputs, RANK, cfg))


# ---- low latency ----------------------------------------------------------------

def ll_scale_shape(cfg, a1q):
    e, slots, h = a1q.shape
    if cfg.block_shape is not None:
        return (e, slots, h // int(cfg.block_shape[-1]))
    if cfg.per_act_token_quant and cfg.a1_scale is None:
        return (e, slots, 1)
    return (e, 1, 1)


def ll_case(g, cfg, seed):
    pf = moe_ep.vllm.PrepareAndFinalize(g)
    what = "vllm ll %r" % cfg
    inputs = edge_inputs(LL, seed)
    x, idx, w = torch_inputs(inputs[RANK])
    a1q, scale, meta, _, _ = pf.prepare(x, w, idx, LL.num_experts, None, False, cfg)
    lists, codes, scales = expected.ll_receive(LL, inputs, RANK, cfg)
    same(what + " expert_num_tokens", seed, bits(meta.expert_num_tokens),
         np.array([len(r) for r in lists], np.int32))
    if not check_types(what, seed, a1q, scale, ll_scale_shape(cfg, a1q)):
        return
    got_q, got_s = bits(a1q), scale.numpy()
    for l, rows in enumerate(lists):
        n = len(rows)
        if not n:
            continue
        if not same("%s a1q expert %d" % (what, l), seed, got_q[l, :n], codes[l]):
            return
        per_tensor = ll_scale_shape(cfg, a1q)[1] == 1
        got = got_s[l].reshape(1) if per_tensor else got_s[l, :n]
        if not same("%s a1q_scale expert %d" % (what, l), seed, got, scales[l]):
            return
    y = expert_outputs(g, dequantized(a1q, scale))
    out = torch.empty_like(x)
    pf.finalize(out, y, w, idx, False, None)
    same(what + " finalize", seed, bits(out),
         expected.ll_combine_at_dispatch(LL, inputs, RANK, cfg))


def ll_block_fp8_in_dispatch(g, seed):
    """128-channel block fp8 on an fp8_e4m3 group: quantised in the
    dispatch with the library's rule, as before."""
    pf = moe_ep.vllm.PrepareAndFinalize(g)
    inputs = oracle.all_inputs(LL, seed)
    x, idx, w = torch_inputs(inputs[RANK])
    a1q, scale, meta, _, _ = pf.prepare(x, w, idx, LL.num_experts, None, False,
                                        Config(FP8, block_shape=[128, 128]))
    e, s, c = scale.shape
    p = (s + 3) // 4 * 4  # the column stride rounded up to 16 bytes, as DeepGEMM's TMA needs
    if scale.stride() != (c * p, 1, p):
        fail("vllm ll block fp8 a1q_scale layout", seed, "strides %s, want DeepEP's column-major "
             "view %s" % (scale.stride(), (c * p, 1, p)))
    check_dispatch(seed, inputs, moe_ep.DispatchResult(a1q, scale, meta.expert_num_tokens),
                   LL.hidden, fp8=(False, False))
    pf.finalize(torch.empty_like(x), expert_outputs(g, dequantized(a1q, scale)), w, idx, False,
                None)


class Experts:
    """vLLM's experts as post_init_setup sees them: packed None stands for
    an older vLLM without supports_packed_ue8m0_act_scales."""

    def __init__(self, packed):
        if packed is not None:
            self.supports_packed_ue8m0_act_scales = lambda: packed


def ll_scales_follow_the_experts(g, seed):
    """On an fp8 group (fp8_scale ue8m0): the LL dispatch's scales are
    those vLLM's DeepEP LL prepare asks for once post_init_setup has seen
    the experts: packed UE8M0 for experts that take them, else f32 (not
    the group's ue8m0); a given scale_format wins, but packed scales for
    experts that do not take them are refused."""
    cases = (
        ("experts take packed", None, True, (True, True), torch.int32, -(-LL.hidden // 512)),
        ("experts take no packed", None, False, (False, False), torch.float32, LL.hidden // 128),
        ("older vLLM", None, None, (False, False), torch.float32, LL.hidden // 128),
        ("scale_format ue8m0", "ue8m0", True, (True, False), torch.float32, LL.hidden // 128),
        ("before post_init_setup", None, "unset", (True, False), torch.float32, LL.hidden // 128),
    )
    for i, (what, given, packed, fp8, dtype, cols) in enumerate(cases):
        pf = moe_ep.vllm.PrepareAndFinalize(g, scale_format=given)
        if packed != "unset":
            pf.post_init_setup(Experts(packed))
        inputs = oracle.all_inputs(LL, seed + i)
        x, idx, w = torch_inputs(inputs[RANK])
        a1q, scale, meta, _, _ = pf.prepare(x, w, idx, LL.num_experts, None, False,
                                            Config(FP8, block_shape=[128, 128]))
        if scale.dtype != dtype or scale.shape[-1] != cols:
            fail("vllm ll scales, " + what, seed + i, "a1q_scale %s [.., %d], want %s [.., %d]"
                 % (scale.dtype, scale.shape[-1], dtype, cols))
        else:
            check_dispatch(seed + i, inputs, moe_ep.DispatchResult(a1q, scale,
                                                                   meta.expert_num_tokens),
                           LL.hidden, fp8=fp8)
        y = torch.zeros(tuple(a1q.shape), dtype=torch.bfloat16)
        pf.finalize(torch.empty_like(x), y, w, idx, False, None)
    pf = moe_ep.vllm.PrepareAndFinalize(g, scale_format="ue8m0_packed")
    expect_raises("vllm ll packed scales the experts do not take", ValueError,
                  "Experts does not take packed UE8M0", lambda: pf.post_init_setup(Experts(False)))


# ---- refusals -------------------------------------------------------------------

def refusals(pf, seed, cases):
    p = HT if pf.group.mode == "high_throughput" else LL
    x, idx, w = torch_inputs(oracle.make_inputs(p, seed, RANK))
    for what, cfg, exc, fragment in cases:
        expect_raises("vllm %s quant %s" % (pf.group.mode, what), exc, fragment,
                      lambda: pf.prepare(x, w, idx, p.num_experts, None, False, cfg))
    if len(pf._inflight):
        fail("vllm quant refusals", seed, "a refused prepare left %d operation(s) in flight"
             % len(pf._inflight))


HT_REFUSALS = [
    ("int8", Config(torch.int8), NotImplementedError, "quant_dtype=torch.int8"),
    ("nvfp4", Config("nvfp4"), NotImplementedError, "quant_config.quant_dtype='nvfp4'"),
    ("block and per token", Config(FP8, block_shape=[128, 64], per_act_token_quant=True),
     NotImplementedError, "per_act_token_quant=True with block_shape=[128, 64]"),
    ("block and a1_scale", Config(FP8, block_shape=[128, 64], a1_scale=torch.ones(1)),
     NotImplementedError, "a1_scale is set with block_shape=[128, 64]"),
    ("per-token a1_scale", Config(FP8, a1_scale=torch.ones(4)), NotImplementedError,
     "a1_scale has 4 elements"),
    ("block not dividing", Config(FP8, block_shape=[128, 96]), NotImplementedError,
     "block_shape=[128, 96] with hidden 256"),
    ("block of one", Config(FP8, block_shape=[128]), NotImplementedError, "block_shape=[128]"),
]
LL_BF16_REFUSALS = [
    ("block 128 on bf16", Config(FP8, block_shape=[128, 128]), NotImplementedError,
     "configure dispatch_dtype: fp8_e4m3"),
]
LL_FP8_REFUSALS = [
    ("per tensor on fp8", Config(FP8), NotImplementedError, "use a bf16 group"),
    ("per token on fp8", Config(FP8, per_act_token_quant=True), NotImplementedError,
     "per_act_token_quant=True is quantised after the receive"),
    ("block 64 on fp8", Config(FP8, block_shape=[128, 64]), NotImplementedError,
     "block_shape=[128, 64] is quantised after the receive"),
]


def main():
    configs = CONFIGS if FULL else CONFIGS[::2]
    with moe_ep.Group(common.config(0, mode="high_throughput", num_experts=HT.num_experts,
                                    hidden=HT.hidden, top_k=HT.top_k,
                                    max_tokens_per_rank=HT.max_tokens)) as g:
        for i, cfg in enumerate(configs):
            ht_case(g, cfg, 601 + i)
        if FULL:
            ht_case(g, CONFIGS[2], 605, older_library=True)
            refusals(moe_ep.vllm.PrepareAndFinalize(g), 611, HT_REFUSALS)
    with moe_ep.Group(common.config(1, num_experts=LL.num_experts, hidden=LL.hidden,
                                    top_k=LL.top_k, max_tokens_per_rank=LL.max_tokens)) as g:
        for i, cfg in enumerate(configs):
            ll_case(g, cfg, 621 + i)
        if FULL:
            refusals(moe_ep.vllm.PrepareAndFinalize(g), 631, LL_BF16_REFUSALS)
    if FULL:
        with moe_ep.Group(common.config(2, num_experts=LL.num_experts, hidden=LL.hidden,
                                        top_k=LL.top_k, max_tokens_per_rank=LL.max_tokens,
                                        dispatch_dtype="fp8_e4m3")) as g:
            refusals(moe_ep.vllm.PrepareAndFinalize(g), 641, LL_FP8_REFUSALS)
            ll_block_fp8_in_dispatch(g, 651)
        with moe_ep.Group(common.config(3, num_experts=LL.num_experts, hidden=LL.hidden,
                                        top_k=LL.top_k, max_tokens_per_rank=LL.max_tokens,
                                        dispatch_dtype="fp8_e4m3", fp8_scale="ue8m0")) as g:
            ll_scales_follow_the_experts(g, 661)
    common.finish()


if __name__ == "__main__":
    main()
