"""moe_ep.sglang.Dispatcher's normal (prefill) mode and deepep_mode 'auto'
on host groups, under a stand-in of the SGLang modules the dispatcher
reads (token_dispatcher.base's DispatchOutputFormat and BaseDispatcher,
dp_attention), written from how SGLang behaves. Against the oracle
(sglang_normal_expected): received rows, scales, local ids, weights and
per-expert counts bit-exact; the combined output of SGLang-style experts
(weights applied on the experts' side) bit-exact; bf16 rows, rows
pre-quantised to fp8 (f32, UE8M0 and packed scales, row- and
column-major) and rows the dispatcher quantises; expert_alignment; two
sub-batches in flight with their receives on a second thread; 'auto'
switching between low-latency and normal batches by every hint SGLang has
used; ranks with no tokens; bad input raising the exception that names it,
the dispatcher still usable after."""
import enum

import sglang_stand_in  # noqa: E402

sglang_stand_in.install(with_dp_attention=True)

import collections  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

import common  # noqa: E402
import moe_ep  # noqa: E402
import moe_ep.sglang  # noqa: E402
import oracle  # noqa: E402
import sglang_normal_expected as want  # noqa: E402
from common import (RANK, WORLD, bf16_tensor, bits, expect_raises, fail,  # noqa: E402
                    run_on_thread, same)
from ht_worker import seen_rows  # noqa: E402
from ll_worker import P, check_dispatch, expert_outputs, torch_inputs  # noqa: E402
from sglang.srt.layers import dp_attention  # noqa: E402
from sglang.srt.layers.moe.token_dispatcher import base  # noqa: E402

HT = want.HT
Dispatcher = moe_ep.sglang.Dispatcher


class DeepEPMode(enum.Enum):
    """SGLang's DeepEPMode (its values; member names changed case over
    versions)."""
    NORMAL = "normal"
    LOW_LATENCY = "low_latency"
    AUTO = "auto"


class TopKOutput(collections.namedtuple("TopKOutput", "topk_weights topk_ids router_logits")):
    pass


class CombineInput(collections.namedtuple("CombineInput", "hidden_states topk_ids topk_weights")):
    """SGLang's DeepEPNormalCombineInput / DeepEPLLCombineInput."""


class ForwardBatch:
    def __init__(self, extend):
        self.is_extend_in_batch = extend


class ForwardMode:
    def __init__(self, decode):
        self._decode = decode

    def is_decode(self):
        return self._decode


# ---- normal-mode batches --------------------------------------------------------

def batch(seed, fmt=None, empty_rank=None, rank0_only=False):
    """Every rank's inputs, and with fmt ("f32", "ue8m0", "ue8m0_packed")
    every rank's rows quantised by the oracle: (codes, scales, seen)."""
    inputs = want.inputs_for(seed, empty_rank, rank0_only=rank0_only)
    quant = [oracle.ht_fp8_inputs(HT, i, want.ORACLE_FORMAT[fmt]) for i in inputs] if fmt \
        else None
    return inputs, quant


def dispatch_args(inputs, quant=None, column_major=False):
    """(hidden_states, TopKOutput) of this rank: bf16 rows, or with quant
    the pair (x_fp8, scales) SGLang's quantiser gives (column_major: the
    scales as a transposed-storage view, as for DeepGEMM's UE8M0 path)."""
    inp = inputs[RANK]
    topk = TopKOutput(torch.from_numpy(inp["weights"]), torch.from_numpy(inp["topk_idx"]), None)
    if quant is None:
        return bf16_tensor(inp["x"]), topk
    q, sc, _ = quant[RANK]
    scales = torch.from_numpy(np.ascontiguousarray(sc.T)).t() if column_major else \
        torch.from_numpy(sc)
    return (torch.from_numpy(q).view(moe_ep.FP8_STORAGE), scales), topk


def check_received(what, seed, o, inputs, quant, alignment=1):
    if quant is None:
        rows_of, scale_shape = (lambda s, t: (inputs[s]["x"][t], None)), None
    else:
        rows_of, scale_shape = (lambda s, t: (quant[s][0][t], quant[s][1][t])), \
            quant[RANK][1].shape[1:]
    return want.check_output(what, seed, o, want.received(inputs, rows_of, alignment),
                             (HT.hidden,), scale_shape)


def experts_on(o):
    """SGLang's experts on a NormalOutput: the weighted, summed rows."""
    rows = o.hidden_states.float() if o.hidden_states_scale is None else \
        seen_rows(o.hidden_states, o.hidden_states_scale)
    return want.experts(rows, o.topk_ids, o.topk_weights)


def check_combined(what, seed, out, inputs, quant):
    same(what, seed, bits(out), want.combined(inputs[RANK], None if quant is None
                                              else quant[RANK][2]))


def normal_batch(d, seed, what, fmt=None, pre=False, column_major=False, alignment=1,
                 empty_rank=None, rank0_only=False, **hint):
    """One normal batch through dispatch() and combine(), checked. fmt with
    pre: rows quantised by the caller; fmt without: by the dispatcher
    (its normal_fp8). Every rank always combines (a skipped collective
    would hang the others); the checks only record failures."""
    inputs, quant = batch(seed, fmt, empty_rank, rank0_only)
    hs, topk = dispatch_args(inputs, quant if pre else None, column_major)
    o = d.dispatch(hidden_states=hs, topk_output=topk, **hint)
    check_received(what, seed, o, inputs, quant, alignment)
    out = d.combine(combine_input=CombineInput(experts_on(o), o.topk_ids, o.topk_weights), **hint)
    check_combined(what + " combine", seed, out, inputs, quant)
    return o


def normal_tbo(d, seed):
    """Two sub-batches in flight: both dispatches out, sub-batch 0's receive
    on a second thread; combine_a of both, sub-batch 1's receive on the
    second thread."""
    batches = [batch(seed + i) for i in (0, 1)]
    args = [dispatch_args(b[0]) for b in batches]
    for i in (0, 1):
        d.dispatch_a(args[i][0], args[i][1], tbo_subbatch_index=i)
    run_on_thread(d.pending_hook(0), seed)
    got = [d.dispatch_b(tbo_subbatch_index=i) for i in (0, 1)]
    for i in (0, 1):
        check_received("normal tbo %d" % i, seed + i, got[i], batches[i][0], None)
        d.combine_a(CombineInput(experts_on(got[i]), got[i].topk_ids, got[i].topk_weights),
                    tbo_subbatch_index=i)
    run_on_thread(d.pending_hook(1), seed + 1)
    for i in (0, 1):
        check_combined("normal tbo %d combine" % i, seed + i, d.combine_b(tbo_subbatch_index=i),
                       batches[i][0], None)


def normal_mode(ht):
    d = Dispatcher(normal_group=ht)
    if d.deepep_mode != "normal":
        fail("default mode", "-", "normal_group alone gave deepep_mode=%r" % d.deepep_mode)
    o = normal_batch(d, 401, "normal bf16")
    if o.format is not base.DispatchOutputFormat.DEEPEP_NORMAL:
        fail("normal format", 401, "got %r, want SGLang's DEEPEP_NORMAL" % (o.format,))
    normal_batch(Dispatcher(normal_group=ht, deepep_mode=DeepEPMode.NORMAL, expert_alignment=128),
                 402, "normal aligned 128", alignment=128)
    normal_tbo(d, 411)
    for seed, fmt, column_major in ((421, "f32", False), (422, "ue8m0", True),
                                    (423, "ue8m0_packed", True)):
        normal_batch(d, seed, "normal pre-quantised %s" % fmt, fmt, pre=True,
                     column_major=column_major)
    for seed, fmt in ((431, "f32"), (432, "ue8m0"), (433, "ue8m0_packed")):
        normal_batch(Dispatcher(normal_group=ht, normal_fp8=fmt), seed,
                     "normal quantised by the dispatcher %s" % fmt, fmt)
    normal_batch(d, 441, "normal, rank 0 with no tokens", empty_rank=0)
    normal_batch(Dispatcher(normal_group=ht, normal_fp8="ue8m0_packed"), 442,
                 "normal fp8, last rank with no tokens", "ue8m0_packed", empty_rank=WORLD - 1)
    o = normal_batch(d, 443, "normal, only rank 0's experts (the others receive nothing)",
                     rank0_only=True)
    if RANK and (o.hidden_states.shape[0] or any(o.num_recv_tokens_per_expert)):
        fail("normal, nothing received", 443, "got %d rows, counts %r" % (
            o.hidden_states.shape[0], o.num_recv_tokens_per_expert))
    cls = moe_ep.sglang.engine_class()
    e = cls(normal_group=ht)
    if not isinstance(e, base.BaseDispatcher) or e.quant_config is not None:
        fail("engine class", "-", "%r is not a BaseDispatcher with its state" % (type(e),))
    normal_batch(e, 451, "engine class normal")


# ---- auto -------------------------------------------------------------------------

def ll_batch(d, seed, what, empty_rank=None, **hint):
    """One low-latency batch (at most the LL group's max_tokens_per_rank
    tokens) through dispatch() and combine(), checked."""
    inputs = want.inputs_for(seed, empty_rank, p=P)
    x, idx, w = torch_inputs(inputs[RANK])
    o = d.dispatch(x, TopKOutput(w, idx, None), **hint)
    if not o.format.is_deepep_ll() or o.topk_ids is not idx or o.hidden_states_scale is not None:
        fail(what, seed, "want a low-latency output (format deepep_ll, the dispatch's topk_ids, "
             "no scale); got format %r" % (o.format,))
    check_dispatch(seed, inputs, moe_ep.DispatchResult(o.hidden_states, None, o.masked_m),
                   P.hidden)
    out = d.combine(CombineInput(expert_outputs(d.group, o.hidden_states), idx, w), **hint)
    same(what + " combine", seed, bits(out), oracle.ll_combine(P, inputs[RANK]))


def auto_mode(ll, ht):
    d = Dispatcher(ll, normal_group=ht)
    if d.deepep_mode != "auto":
        fail("default mode", "-", "both groups gave deepep_mode=%r" % d.deepep_mode)
    normal_batch(d, 501, "auto normal (is_extend_in_batch)", is_extend_in_batch=True)
    ll_batch(d, 502, "auto ll (forward_batch)", forward_batch=ForwardBatch(False))
    normal_batch(d, 503, "auto normal fp8 (forward_mode)", "f32", pre=True,
                 forward_mode=ForwardMode(decode=False))
    ll_batch(d, 504, "auto ll, last rank with no tokens", empty_rank=WORLD - 1,
             forward_mode=ForwardMode(decode=True))
    normal_batch(d, 505, "auto normal, rank 0 with no tokens", empty_rank=0,
                 forward_batch=ForwardBatch(True))
    ll_batch(d, 506, "auto ll (is_extend_in_batch)", is_extend_in_batch=False)
    ll_batch(d, 507, "auto ll (a ForwardMode where the forward batch goes)",
             forward_batch=ForwardMode(decode=True))
    # Current SGLang: no keyword, the global says.
    extend = [False]
    dp_attention.get_is_extend_in_batch = lambda: extend[0]
    try:
        ll_batch(d, 507, "auto ll (SGLang's global)")
        extend[0] = True
        normal_batch(d, 508, "auto normal (SGLang's global)")
        ll_batch(d, 509, "auto ll (a keyword over the global)", is_extend_in_batch=False)
    finally:
        del dp_attention.get_is_extend_in_batch
    ll_batch(Dispatcher(ll, normal_group=ht, deepep_mode="auto"), 510, "auto ll (explicit)",
             is_extend_in_batch=False)
    ll_batch(Dispatcher(ll, deepep_mode=DeepEPMode.LOW_LATENCY), 511, "low_latency, a hint "
             "ignored", is_extend_in_batch=True)


# ---- bad input ------------------------------------------------------------------------

def bad_constructors(ll, ht, other_ll):
    for what, exc, fragment, make in (
            ("mode string", ValueError, "deepep_mode='fast' must be one of",
             lambda: Dispatcher(normal_group=ht, deepep_mode="fast")),
            ("normal without HT", ValueError, "deepep_mode='normal' needs normal_group",
             lambda: Dispatcher(ll, deepep_mode="normal")),
            ("auto without LL", ValueError, "deepep_mode='auto' needs group",
             lambda: Dispatcher(normal_group=ht, deepep_mode=DeepEPMode.AUTO)),
            ("unused group", ValueError, "deepep_mode='low_latency' never uses normal_group",
             lambda: Dispatcher(ll, normal_group=ht, deepep_mode="low_latency")),
            ("LL as normal_group", ValueError, "normal_group's mode is low_latency",
             lambda: Dispatcher(normal_group=ll)),
            ("HT as group", NotImplementedError, "mode is high_throughput",
             lambda: Dispatcher(ht)),
            ("normal_fp8", ValueError, "normal_fp8='e8m0' must be",
             lambda: Dispatcher(normal_group=ht, normal_fp8="e8m0")),
            ("expert_alignment", ValueError, "expert_alignment=0 must be",
             lambda: Dispatcher(normal_group=ht, expert_alignment=0)),
            ("LL option in normal mode", ValueError, "weights_at_dispatch=False with "
             "deepep_mode='normal'",
             lambda: Dispatcher(normal_group=ht, weights_at_dispatch=False)),
            ("normal option in LL mode", ValueError, "normal_fp8='f32' with "
             "deepep_mode='low_latency'",
             lambda: Dispatcher(ll, normal_fp8="f32")),
            ("groups disagree", ValueError, "num_experts=%d and normal_group %d"
             % (2 * HT.num_experts, HT.num_experts),
             lambda: Dispatcher(other_ll, normal_group=ht))):
        expect_raises(what, exc, fragment, make)


def bad_normal_calls(ht, seed):
    d = Dispatcher(normal_group=ht)
    inputs, quant = batch(seed, "f32")
    hs, topk = dispatch_args(inputs)
    q_s = dispatch_args(inputs, quant)[0]
    expect_raises("stage", RuntimeError, "sub-batch 0 is at stage 'idle'", lambda: d.dispatch_b())
    expect_raises("tuple of 3", ValueError, "hidden_states is a tuple of 3",
                  lambda: d.dispatch_a(q_s + (q_s[1],), topk))
    expect_raises("quantising int rows", ValueError, "hidden_states has dtype torch.int32",
                  lambda: Dispatcher(normal_group=ht, normal_fp8="f32").dispatch_a(
                      hs.to(torch.int32), topk))
    o = d.dispatch(hs, topk)
    y = experts_on(o)
    expect_raises("overlap_args", NotImplementedError, "overlap_args=",
                  lambda: d.combine_a(y, o.topk_ids, o.topk_weights, overlap_args=object()))
    expect_raises("rows", ValueError, "hidden_states has %d rows" % (y.shape[0] + 1),
                  lambda: d.combine_a(y.new_zeros((y.shape[0] + 1, HT.hidden)), o.topk_ids,
                                      o.topk_weights))
    expect_raises("ids shape", ValueError, "topk_ids has shape",
                  lambda: d.combine_a(y, o.topk_ids[:, :1], o.topk_weights))
    d.combine_a(hidden_states=y, topk_idx=o.topk_ids.clone(), topk_weights=o.topk_weights)
    check_combined("normal after refusals", seed, d.combine_b(), inputs, None)


def bad_auto_calls(ll, ht, seed):
    d = Dispatcher(ll, normal_group=ht)
    inputs, quant = batch(seed, "f32")
    hs, topk = dispatch_args(inputs)
    expect_raises("auto without a hint", ValueError, "deepep_mode='auto' needs to know",
                  lambda: d.dispatch_a(hs, topk))
    expect_raises("hint type", TypeError, "is_extend_in_batch='yes' must be a bool",
                  lambda: d.dispatch_a(hs, topk, is_extend_in_batch="yes"))
    expect_raises("forward_batch", TypeError, "forward_batch (object) has neither",
                  lambda: d.dispatch_a(hs, topk, forward_batch=object()))
    expect_raises("fp8 pair in LL", NotImplementedError, "hidden_states=(x_fp8, scales) in "
                  "low_latency mode",
                  lambda: d.dispatch_a(dispatch_args(inputs, quant)[0], topk,
                                       is_extend_in_batch=False))
    o = d.dispatch(hs, topk, is_extend_in_batch=True)
    ci = CombineInput(experts_on(o), o.topk_ids, o.topk_weights)
    expect_raises("combine in the other mode", ValueError,
                  "the mode hint says low_latency, but sub-batch 0 was dispatched in normal",
                  lambda: d.combine(ci, is_extend_in_batch=False))
    check_combined("auto after refusals", seed, d.combine(ci, is_extend_in_batch=True), inputs,
                   None)


def main():
    # Every group listens at the start, while its port is fresh: a port
    # that free_ports() found free can be taken later as another group's
    # outgoing (ephemeral) port.
    with moe_ep.Group(common.config(0, num_experts=P.num_experts, hidden=P.hidden, top_k=P.top_k,
                                    max_tokens_per_rank=P.max_tokens)) as ll, \
            moe_ep.Group(common.config(1, mode="high_throughput", num_experts=HT.num_experts,
                                       hidden=HT.hidden, top_k=HT.top_k,
                                       max_tokens_per_rank=HT.max_tokens)) as ht, \
            moe_ep.Group(common.config(2, num_experts=2 * P.num_experts, hidden=P.hidden,
                                       top_k=P.top_k, max_tokens_per_rank=P.max_tokens)) as other:
        normal_mode(ht)
        bad_normal_calls(ht, 601)
        bad_auto_calls(ll, ht, 611)
        auto_mode(ll, ht)
        bad_constructors(ll, ht, other)
    common.finish()


if __name__ == "__main__":
    main()
