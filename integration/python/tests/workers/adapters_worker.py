"""Engine adapters worker: moe_ep.vllm.PrepareAndFinalize (LL and HT, the
latter also with a block-fp8 quant_config, quantised before the dispatch)
and moe_ep.sglang.Dispatcher on real groups, values against the oracle;
two operations in flight with their hooks run on a second thread; bad
input raising the exception that names it, the adapter still usable after.
argv: [full|short]"""
import collections
import sys

import numpy as np
import torch

import common
import moe_ep
import moe_ep.sglang
import moe_ep.vllm
import oracle
from common import RANK, WORLD, bits, bf16_tensor, expect_raises, fail, run_on_thread, same
from ht_worker import seen_rows
from ll_worker import P, check_dispatch, expert_outputs, torch_inputs

FULL = sys.argv[1:] == ["full"]
HT = oracle.Problem(WORLD, num_experts=4 * WORLD, hidden=256, top_k=4, max_tokens=32)


def check_combine(what, seed, out, inp, p=P):
    """The same sum wherever the weights were given (README)."""
    same(what, seed, bits(out), oracle.ll_combine(p, inp))


def contiguous_map():
    """vLLM's expert_map for moe-ep's placement: global -> local id or -1."""
    m = torch.full((P.num_experts,), -1, dtype=torch.int32)
    m[RANK * P.local:(RANK + 1) * P.local] = torch.arange(P.local, dtype=torch.int32)
    return m


class DelegateStandIn:
    """Named as vLLM's TopKWeightAndReduceDelegate, which the adapter
    recognises by name."""


DelegateStandIn.__name__ = "TopKWeightAndReduceDelegate"


# ---- vLLM, low latency --------------------------------------------------------

def vllm_ll_sync(pf, seed):
    inputs = oracle.all_inputs(P, seed)
    x, idx, w = torch_inputs(inputs[RANK])
    a1q, scale, meta, ids, wts = pf.prepare(x, w, idx, P.num_experts, None, False, None)
    if scale is not None or ids is not None or wts is not None:
        fail("vllm prepare", seed, "want (a1q, None, meta, None, None)")
    if meta.expert_num_tokens is not meta.expert_num_tokens_cpu:
        fail("vllm meta", seed, "host backend: expert_num_tokens_cpu is the same tensor")
    res = moe_ep.DispatchResult(a1q, scale, meta.expert_num_tokens)
    check_dispatch(seed, inputs, res, P.hidden)
    out = torch.empty_like(x)
    pf.finalize(out, expert_outputs(pf.group, a1q), w, idx, False, DelegateStandIn())
    check_combine("vllm finalize", seed, out, inputs[RANK])


def vllm_ll_overlapped(pf, seed, what="vllm overlapped finalize"):
    """Two micro-batches in flight; every hook runs on a second thread,
    every receiver on this one (vLLM's dual-batch overlap)."""
    batches = [oracle.all_inputs(P, seed + i) for i in (0, 1)]
    t = [torch_inputs(b[RANK]) for b in batches]
    sent = [pf.prepare_async(t[i][0], t[i][2], t[i][1], P.num_experts, None, False, None)
            for i in (0, 1)]
    outs = []
    for i in (0, 1):
        run_on_thread(sent[i][0], seed + i)
        a1q, _, meta, _, _ = sent[i][1]()
        check_dispatch(seed + i, batches[i], moe_ep.DispatchResult(a1q, None, meta.expert_num_tokens),
                       P.hidden)
        outs.append(torch.empty_like(t[i][0]))
        hook, receiver = pf.finalize_async(outs[i], expert_outputs(pf.group, a1q), t[i][2], t[i][1],
                                           False, None)
        run_on_thread(hook, seed + i)
        if receiver() is not outs[i]:
            fail("vllm finalize_async", seed + i, "receiver did not return output")
    for i in (0, 1):
        check_combine(what, seed + i, outs[i], batches[i][RANK])


def vllm_ll_weight_on_input(pf, seed):
    """top-1 with apply_router_weight_on_input: the row is weighed before
    dispatch, the combine weighs by one."""
    p1 = oracle.Problem(WORLD, P.num_experts, P.hidden, 1, P.max_tokens)
    inp = oracle.make_inputs(p1, seed, RANK)
    x, idx, w = torch_inputs(inp)
    a1q, _, meta, _, _ = pf.prepare(x, w, idx, P.num_experts, contiguous_map(),
                                    True, None)
    out = torch.empty_like(x)
    pf.finalize(out, expert_outputs(pf.group, a1q), w, idx, True, None)
    weighed = oracle.bf16_bits(oracle.bf16_float(inp["x"]) * inp["weights"][:, :1])
    want = {"x": weighed, "topk_idx": inp["topk_idx"], "weights": np.ones_like(inp["weights"])}
    # Deterministic: the row is bf16(f32 x * f32 w), rounded to nearest even
    # as the oracle rounds it, and a combine by unit weights is exact.
    same("vllm weight on input", seed, bits(out), oracle.ll_combine(p1, want))


class Fp8Quant:
    quant_dtype = "fp8_e4m3"
    block_shape = [128, 128]
    per_act_token_quant = False


def vllm_bad_input(pf, seed):
    inputs = oracle.all_inputs(P, seed)
    x, idx, w = torch_inputs(inputs[RANK])
    swapped = contiguous_map().flip(0).contiguous()
    expect_raises("expert_map", NotImplementedError, "expert_map maps global expert 0",
                  lambda: pf.prepare(x, w, idx, P.num_experts, swapped, False, None))
    expect_raises("num_experts", ValueError, "num_experts=%d differs" % (P.num_experts + 1),
                  lambda: pf.prepare(x, w, idx, P.num_experts + 1, None, False, None))
    expect_raises("weight on input top-k", ValueError, "apply_router_weight_on_input=True needs",
                  lambda: pf.prepare(x, w, idx, P.num_experts, None, True, None))
    expect_raises("quant", NotImplementedError, "quant_config.quant_dtype='fp8_e4m3'",
                  lambda: pf.prepare(x, w, idx, P.num_experts, None, False, Fp8Quant()))
    expect_raises("a1 type", TypeError, "a1 must be a torch.Tensor",
                  lambda: pf.prepare(x.tolist(), w, idx, P.num_experts, None, False, None))
    expect_raises("a1 dtype", TypeError, "a1 has dtype torch.float32",
                  lambda: pf.prepare(x.float(), w, idx, P.num_experts, None, False, None))
    beyond = idx.clone()
    beyond[0, 0] = P.num_experts
    expect_raises("library sentence", moe_ep.InvalidArgumentError, "topk_idx",
                  lambda: pf.prepare(x, w, beyond, P.num_experts, None, False, None))
    a1q, _, _, _, _ = pf.prepare(x, w, idx, P.num_experts, None, False, None)
    y = expert_outputs(pf.group, a1q)
    out = torch.empty_like(x)
    expect_raises("unknown topk_ids", ValueError, "not a tensor that a pending prepare",
                  lambda: pf.finalize(out, y, w, idx.clone(), False, None))
    expect_raises("weight_and_reduce_impl", NotImplementedError, "weight_and_reduce_impl=object",
                  lambda: pf.finalize(out, y, w, idx, False, object()))
    pf.finalize(out, y, w, idx, False, None)  # the layer call stayed finalizable
    check_combine("vllm finalize after refusals", seed, out, inputs[RANK])


def vllm_same_ids_twice(pf, seed):
    """Two prepares given one topk_ids tensor (different rows and weights):
    finalize takes them oldest first, each combine the sum of its own."""
    batches = [oracle.all_inputs(P, seed + i, num_tokens=P.max_tokens // 2) for i in (0, 1)]
    for r in range(WORLD):
        batches[1][r]["topk_idx"] = batches[0][r]["topk_idx"]
    t = [torch_inputs(b[RANK]) for b in batches]
    idx = t[0][1]
    a1q = []
    for i in (0, 1):
        hook, receiver = pf.prepare_async(t[i][0], t[i][2], idx, P.num_experts, None, False, None)
        hook()
        a1q.append(receiver()[0].clone())  # the ring's set: read before a later dispatch reuses it
    for i in (0, 1):
        out = torch.empty_like(t[i][0])
        pf.finalize(out, expert_outputs(pf.group, a1q[i]), t[i][2], idx, False, None)
        check_combine("vllm same topk_ids, finalize %d" % i, seed + i, out, batches[i][RANK])


def vllm_dropped(g, seed):
    """Layer calls the engine gave up between prepare and finalize, one with
    its receive never run: the group's next operation that needs that
    receive's buffer set abandons it, and a third prepare gives up the
    oldest call (frees it), so the adapter holds two at most; the given-up
    call's finalize and hook are refused."""
    pf = moe_ep.vllm.PrepareAndFinalize(g)
    batches = [oracle.all_inputs(P, seed + i) for i in range(3)]
    t = [torch_inputs(b[RANK]) for b in batches]
    dropped = pf.prepare_async(t[0][0], t[0][2], t[0][1], P.num_experts, None, False, None)
    hook, receiver = pf.prepare_async(t[1][0], t[1][2], t[1][1], P.num_experts, None, False, None)
    hook()
    receiver()  # received, then dropped
    x, idx, w = t[2]
    a1q, _, meta, _, _ = pf.prepare(x, w, idx, P.num_experts, None, False, None)
    check_dispatch(seed + 2, batches[2], moe_ep.DispatchResult(a1q, None, meta.expert_num_tokens),
                   P.hidden)
    out = torch.empty_like(x)
    pf.finalize(out, expert_outputs(g, a1q), w, idx, False, None)
    check_combine("vllm finalize after two dropped calls", seed + 2, out, batches[2][RANK])
    expect_raises("vllm given-up finalize", ValueError, "gives up the oldest of two",
                  lambda: pf.finalize(torch.empty_like(t[0][0]), a1q, t[0][2], t[0][1], False,
                                      None))
    expect_raises("vllm given-up hook", moe_ep.InvalidArgumentError, "abandoned before it ran",
                  dropped[0])
    if len(pf._inflight) != 1:
        fail("vllm dropped", seed, "the adapter holds %d operations, want 1 (the second dropped "
             "call)" % len(pf._inflight))


def dropped_across_adapters(g, seed):
    """One layer's dispatch dropped with its receive never run, in a vLLM
    adapter and then in an SGLang dispatcher (an exception between
    dispatch_a and dispatch_b): the other adapters on the group go on (the
    operation that needs that buffer set abandons the receive), at once,
    with the values of their own calls."""
    layers = [moe_ep.vllm.PrepareAndFinalize(g) for _ in range(2)]
    d = moe_ep.sglang.Dispatcher(g)  # alive to the end: its hook is abandoned, not collected
    for step in range(4):
        inputs = oracle.all_inputs(P, seed + step)
        x, idx, w = torch_inputs(inputs[RANK])
        if step == 1:
            layers[1].prepare_async(x, w, idx, P.num_experts, None, False, None)
            continue
        if step == 2:
            d.dispatch_a(x, TopKOutput(w, idx))  # stays at "dispatched", as SGLang's own would
            continue
        a1q, _, meta, _, _ = layers[0].prepare(x, w, idx, P.num_experts, None, False, None)
        check_dispatch(seed + step, inputs, moe_ep.DispatchResult(a1q, None,
                                                                  meta.expert_num_tokens),
                       P.hidden)
        out = torch.empty_like(x)
        layers[0].finalize(out, expert_outputs(g, a1q), w, idx, False, None)
        check_combine("layer 0 after a dropped dispatch (step %d)" % step, seed + step, out,
                      inputs[RANK])
    expect_raises("the dropped SGLang receive", moe_ep.InvalidArgumentError,
                  "abandoned before it ran", d.dispatch_b)
    # The receive that raised gave its layer call up: the dispatcher goes on.
    sglang_single(d, seed + 4)


def vllm_ll(g):
    pf = moe_ep.vllm.PrepareAndFinalize(g)
    fmt = moe_ep.vllm.FusedMoEActivationFormat
    got = (pf.activation_format, pf.num_dispatchers(), pf.max_num_tokens_per_rank(),
           pf.output_is_reduced(), pf.supports_async(), pf.topk_indices_dtype())
    if got != (fmt.BatchedExperts, WORLD, P.max_tokens, True, True, None):
        fail("vllm properties", "-", repr(got))
    for seed in (101, 102) if FULL else (101,):
        vllm_ll_sync(pf, seed)
    vllm_ll_overlapped(pf, 111)
    vllm_ll_sync(moe_ep.vllm.PrepareAndFinalize(g, weights_at_dispatch=False), 121)
    if FULL:
        vllm_ll_weight_on_input(pf, 131)
        vllm_bad_input(pf, 141)
        vllm_same_ids_twice(pf, 151)
        vllm_dropped(g, 161)
        dropped_across_adapters(g, 171)


# ---- SGLang -----------------------------------------------------------------------

class TopKOutput:
    def __init__(self, w, idx):
        self.topk_weights, self.topk_ids, self.router_logits = w, idx, None


class CombineInput(collections.namedtuple("CombineInput", "hidden_states topk_ids topk_weights")):
    """SGLang's DeepEPLLCombineInput: the experts' output and the routing."""


def sglang_tbo(d, seed):
    """Two-batch overlap: both dispatches out, sub-batch 0's receive run on
    a second thread, then each sub-batch's experts and combine: sub-batch 0
    through current SGLang's combine_a(combine_input=...), sub-batch 1
    through the positional form."""
    batches = [oracle.all_inputs(P, seed + i) for i in (0, 1)]
    t = [torch_inputs(b[RANK]) for b in batches]
    t[1] = (t[1][0], t[1][1].to(torch.int32), t[1][2])  # SGLang's router gives int32 ids
    for i in (0, 1):
        d.dispatch_a(t[i][0], TopKOutput(t[i][2], t[i][1]), tbo_subbatch_index=i)
    run_on_thread(d.pending_hook(0), seed)
    got = [d.dispatch_b(tbo_subbatch_index=i) for i in (0, 1)]
    for i in (0, 1):
        o = got[i]
        check_dispatch(seed + i, batches[i], moe_ep.DispatchResult(o.hidden_states, None, o.masked_m),
                       P.hidden)
        want_m = (len(t[i][0]) * WORLD * P.top_k + P.num_experts) // P.num_experts
        # topk_ids come back int64 as SGLang's DeepEP dispatcher gives them:
        # the dispatch's own tensor when it was int64, else an int64 copy.
        ids_ok = o.topk_ids is t[i][1] if i == 0 else \
            o.topk_ids.dtype == torch.int64 and torch.equal(o.topk_ids, t[i][1].long())
        if o.hidden_states_scale is not None or not ids_ok or \
                o.topk_weights is not t[i][2] or o.expected_m != want_m or \
                not o.format.is_deepep_ll() or o.format.is_deepep_normal():
            fail("sglang output", seed + i, "scale None, the dispatch's topk tensors (ids "
                 "int64), expected_m=%d and format deepep_ll wanted; got ids %s, expected_m=%r "
                 "format %r" % (want_m, o.topk_ids.dtype, o.expected_m, o.format))
        y = expert_outputs(d.group, o.hidden_states)
        if i == 0:
            d.combine_a(combine_input=CombineInput(y, o.topk_ids, o.topk_weights),
                        tbo_subbatch_index=i)
        else:
            d.combine_a(y, o.topk_ids, o.topk_weights, tbo_subbatch_index=i)
    run_on_thread(d.pending_hook(1), seed + 1)
    for i in (0, 1):
        check_combine("sglang combine_b", seed + i, d.combine_b(tbo_subbatch_index=i),
                      batches[i][RANK])


def sglang_bad_input(d, seed):
    x, idx, w = torch_inputs(oracle.make_inputs(P, seed, RANK))
    expect_raises("stage", RuntimeError, "sub-batch 0 is at stage 'idle'", lambda: d.dispatch_b())
    expect_raises("sub-batch", ValueError, "tbo_subbatch_index=2",
                  lambda: d.dispatch_a(x, TopKOutput(w, idx), tbo_subbatch_index=2))
    expect_raises("topk_output", TypeError, "topk_output must have topk_ids",
                  lambda: d.dispatch_a(x, (w, idx)))
    d.dispatch_a(x, topk_idx=idx, topk_weights=w)  # the older keywords
    o = d.dispatch_b()
    y = expert_outputs(d.group, o.hidden_states)
    expect_raises("overlap_args", NotImplementedError, "overlap_args=",
                  lambda: d.combine_a(y, idx, w, overlap_args=object()))
    expect_raises("other weights", ValueError, "topk_weights is not the tensor dispatch_a got",
                  lambda: d.combine_a(y, idx, w.clone()))
    expect_raises("routing shape", ValueError, "topk_ids has shape",
                  lambda: d.combine_a(y, idx[:, :1], w))
    expect_raises("combine_input type", TypeError, "combine_input must have hidden_states",
                  lambda: d.combine_a(combine_input=(y, idx, w)))
    expect_raises("both forms", TypeError, "not both",
                  lambda: d.combine_a(CombineInput(y, idx, w), topk_weights=w))
    expect_raises("single-batch overlap", NotImplementedError, "single-batch overlap",
                  lambda: d.set_overlap_args(object(), {}))
    expect_raises("single-batch overlap's dispatch hook", NotImplementedError,
                  "register_deepep_dispatch_hook: hook=",
                  lambda: d.register_deepep_dispatch_hook(lambda disp: None))
    expect_raises("nvfp4", NotImplementedError, "input_global_scale",
                  lambda: d.set_quant_config({"input_global_scale": torch.ones(1)}))
    d.set_quant_config({"weight_dtype": "mxfp4"})  # what the dispatch does not read
    d.combine_a(hidden_states=y, topk_idx=idx.clone(), topk_weights=w)  # older keywords, ids copied
    check_combine("sglang after refusals", seed, d.combine_b(), oracle.make_inputs(P, seed, RANK))


def sglang_single(d, seed):
    """dispatch() and combine(combine_input=...): SGLang without two-batch
    overlap (keywords as SGLang's BaseDispatcher passes them)."""
    inp = oracle.make_inputs(P, seed, RANK)
    x, idx, w = torch_inputs(inp)
    o = d.dispatch(hidden_states=x, topk_output=TopKOutput(w, idx))
    check_dispatch(seed, oracle.all_inputs(P, seed), moe_ep.DispatchResult(o.hidden_states, None,
                                                                           o.masked_m), P.hidden)
    y = expert_outputs(d.group, o.hidden_states)
    check_combine("sglang combine()", seed, d.combine(combine_input=CombineInput(y, idx, w)), inp)


class ForwardBatch:
    """Older SGLang's ForwardBatch, which it passed fourth positionally."""

    def __init__(self):
        self.forward_mode = None


def sglang_positional(d, seed):
    """Older SGLang's positional forms: dispatch(hidden_states, topk_idx,
    topk_weights, forward_batch) and combine(hidden_states, topk_idx,
    topk_weights, forward_batch); then dispatch_a / combine_a with the
    three tensors and combine() with them alone."""
    inp = oracle.make_inputs(P, seed, RANK)
    x, idx, w = torch_inputs(inp)
    everyone = oracle.all_inputs(P, seed)
    o = d.dispatch(x, idx, w, ForwardBatch())
    check_dispatch(seed, everyone, moe_ep.DispatchResult(o.hidden_states, None, o.masked_m),
                   P.hidden)
    y = expert_outputs(d.group, o.hidden_states)
    check_combine("sglang positional combine() with forward_batch", seed,
                  d.combine(y, idx, w, ForwardBatch()), inp)
    expect_raises("forward_batch twice", TypeError, "forward_batch given twice",
                  lambda: d.combine_a(y, idx, w, ForwardBatch(), forward_batch=ForwardBatch()))
    d.dispatch_a(x, idx, w)
    o = d.dispatch_b()
    y = expert_outputs(d.group, o.hidden_states)
    check_combine("sglang positional combine()", seed, d.combine(y, idx, w), inp)


def sglang_redispatch(d, seed):
    """A sub-batch dispatched again before its receive ran (the engine
    dropped that layer call): the earlier call is given up, its receive
    abandoned, and the new one is received and combined with its own
    values. A sub-batch index out of range is refused by name."""
    first = torch_inputs(oracle.make_inputs(P, seed, RANK))
    d.dispatch_a(first[0], TopKOutput(first[2], first[1]), tbo_subbatch_index=1)
    dropped = d.pending_hook(1)
    inp = oracle.make_inputs(P, seed + 1, RANK)
    x, idx, w = torch_inputs(inp)
    d.dispatch_a(x, TopKOutput(w, idx), tbo_subbatch_index=1)
    expect_raises("the given-up sub-batch's receive", moe_ep.InvalidArgumentError,
                  "abandoned before it ran", dropped)
    o = d.dispatch_b(tbo_subbatch_index=1)
    check_dispatch(seed + 1, oracle.all_inputs(P, seed + 1),
                   moe_ep.DispatchResult(o.hidden_states, None, o.masked_m), P.hidden)
    y = expert_outputs(d.group, o.hidden_states)
    d.combine_a(y, idx, w, tbo_subbatch_index=1)
    check_combine("sglang combine after a redispatch", seed + 1,
                  d.combine_b(tbo_subbatch_index=1), inp)
    for bad in (2, -1):
        expect_raises("pending_hook(%d)" % bad, ValueError, "tbo_subbatch_index=%d" % bad,
                      lambda: d.pending_hook(bad))


def sglang(g):
    sglang_tbo(moe_ep.sglang.Dispatcher(g), 201)
    sglang_single(moe_ep.sglang.Dispatcher(g), 231)
    sglang_positional(moe_ep.sglang.Dispatcher(g), 241)
    if FULL:
        sglang_tbo(moe_ep.sglang.Dispatcher(g, weights_at_dispatch=False), 211)
        sglang_single(moe_ep.sglang.Dispatcher(g, weights_at_dispatch=False), 232)
        sglang_bad_input(moe_ep.sglang.Dispatcher(g), 221)
        sglang_redispatch(moe_ep.sglang.Dispatcher(g), 251)


# ---- vLLM, high throughput -----------------------------------------------------------

class BlockFp8:
    """vLLM's quant_config for block-fp8 models (DeepSeek's): dynamic
    activation scales per 128 channels."""
    quant_dtype = moe_ep.FP8_STORAGE  # float8_e4m3fn (uint8 storage before torch 2.1)
    block_shape = [128, 128]
    per_act_token_quant = False
    a1_scale = None

    def __init__(self, **override):
        self.__dict__.update(override)


def ht_expected_ids(want_idx):
    """vLLM's view of the received ids: global, and for a slot with no
    local expert an expert of another rank."""
    elsewhere = -1 if WORLD == 1 else (HT.num_experts - 1 if RANK == 0 else 0)
    return np.where(want_idx >= 0, want_idx + RANK * HT.local, elsewhere).astype(np.int64)


def vllm_ht(g, seed, quant_config=None, defer_input_quant=False):
    """bf16 rows: no quant_config, or one whose quantisation the experts do
    (defer_input_quant)."""
    pf = moe_ep.vllm.PrepareAndFinalize(g)
    if (pf.activation_format, pf.max_num_tokens_per_rank()) != \
            (moe_ep.vllm.FusedMoEActivationFormat.Standard, None):
        fail("vllm ht properties", seed, repr(pf.activation_format))
    inputs = oracle.all_inputs(HT, seed)
    inp = inputs[RANK]
    x, idx, w = bf16_tensor(inp["x"]), torch.from_numpy(inp["topk_idx"]), torch.from_numpy(inp["weights"])
    hook, receiver = pf.prepare_async(x, w, idx, HT.num_experts, None, False, quant_config,
                                      defer_input_quant)
    run_on_thread(hook, seed)
    rx, scale, meta, ids, wts = receiver()
    src, want_idx, want_w, counts = oracle.ht_dispatch(HT, inputs, RANK)
    want_x = np.stack([inputs[s]["x"][t] for s, t in src]) if src else np.zeros((0, HT.hidden), np.uint16)
    same("vllm ht a1q", seed, bits(rx), want_x)
    same("vllm ht topk_ids (global)", seed, bits(ids), ht_expected_ids(want_idx))
    same("vllm ht topk_weights", seed, bits(wts), want_w)
    same("vllm ht expert_num_tokens", seed, bits(meta.expert_num_tokens), counts)
    cpu = meta.expert_num_tokens_cpu
    if cpu is None or cpu.device.type != "cpu":
        fail("vllm ht expert_num_tokens_cpu", seed, "want the counts on the host, got %r" % (cpu,))
    else:
        same("vllm ht expert_num_tokens_cpu", seed, bits(cpu), counts)
    if scale is not None:
        fail("vllm ht scale", seed, "want None")
    y = (rx.float() * float(oracle.ht_partial_scale(RANK))).to(torch.bfloat16)
    out = torch.empty_like(x)
    hook, receiver = pf.finalize_async(out, y, wts, ids, False, None)
    run_on_thread(hook, seed)
    receiver()
    same("vllm ht finalize", seed, bits(out), oracle.ht_combine(HT, inp))
    vllm_ht_flat_delegate(g, pf, seed + 1)


def ht_combine_first_k(p, inputs, rank):
    """out [T, H] of rank's tokens when each receiving rank r's experts
    output bf16(x * ht_partial_scale(r)) for the token's first top-k entry
    on r and zeros for its others, weighted by the router weights: r's
    partial is bf16(f32(that row) * w[t, k0]); the partials summed in f32
    over ranks ascending, then bf16."""
    x, idx, w = inputs[rank]["x"], inputs[rank]["topk_idx"], inputs[rank]["weights"]
    out = np.zeros(x.shape, dtype=np.uint16)
    for t in range(len(x)):
        acc = np.zeros(p.hidden, dtype=np.float32)
        for r in sorted({int(e) // p.local for e in idx[t] if e >= 0}):
            k0 = next(k for k in range(p.top_k) if idx[t][k] >= 0 and idx[t][k] // p.local == r)
            row = oracle.bf16_float(oracle.bf16_bits(oracle.bf16_float(x[t]) * oracle.ht_partial_scale(r)))
            partial = oracle.bf16_float(oracle.bf16_bits((row * np.float32(w[t][k0])).astype(np.float32)))
            acc = (acc + partial).astype(np.float32)
        out[t] = oracle.bf16_bits(acc)
    return out


def vllm_ht_flat_delegate(g, pf, seed):
    """TopKWeightAndReduceDelegate with the experts' flat [N_recv * top_k, H]
    output (vLLM's standard-format experts): finalize weighs it by the
    received router weights and sums over the top-k, as vLLM's DeepEP
    finalize does; a flat output of another length is refused naming it."""
    inputs = oracle.all_inputs(HT, seed)
    inp = inputs[RANK]
    x, idx, w = bf16_tensor(inp["x"]), torch.from_numpy(inp["topk_idx"]), torch.from_numpy(inp["weights"])
    rx, _, _, ids, wts = pf.prepare(x, w, idx, HT.num_experts, None, False, None)
    n, k = ids.shape
    flat = torch.zeros((n, k, HT.hidden), dtype=torch.bfloat16)
    local = (ids >= RANK * HT.local) & (ids < (RANK + 1) * HT.local)
    row = (rx.float() * float(oracle.ht_partial_scale(RANK))).to(torch.bfloat16)
    for i in range(n):
        first = [j for j in range(k) if bool(local[i, j])]
        if first:
            flat[i, first[0]] = row[i]
    out = torch.empty_like(x)
    expect_raises("vllm ht flat delegate, wrong length", ValueError, "N_recv * top_k",
                  lambda: pf.finalize(out, torch.zeros((n * k + 1, HT.hidden), dtype=torch.bfloat16),
                                      wts, ids, False, DelegateStandIn()))
    pf.finalize(out, flat.view(n * k, HT.hidden), wts, ids, False, DelegateStandIn())
    same("vllm ht finalize, flat output with the delegate", seed, bits(out),
         ht_combine_first_k(HT, inputs, RANK))


ORACLE_FORMAT = {"f32": "fp8", "ue8m0": "fp8_ue8m0", "ue8m0_packed": "fp8_ue8m0_packed"}


def vllm_ht_fp8(g, seed, scale_format):
    """A block-fp8 quant_config: prepare quantises a1 before the dispatch
    and the experts get the codes and scales the oracle's quantisation
    gives, the combine sums partials of the dequantised rows."""
    pf = moe_ep.vllm.PrepareAndFinalize(g, scale_format=scale_format)
    what = "vllm ht fp8 %s" % (scale_format or "(group's fp8_scale)")
    inputs = oracle.all_inputs(HT, seed)
    quant = [oracle.ht_fp8_inputs(HT, i, ORACLE_FORMAT[scale_format or "f32"]) for i in inputs]
    inp = inputs[RANK]
    x, idx, w = bf16_tensor(inp["x"]), torch.from_numpy(inp["topk_idx"]), torch.from_numpy(inp["weights"])
    hook, receiver = pf.prepare_async(x, w, idx, HT.num_experts, None, False, BlockFp8())
    run_on_thread(hook, seed)
    rx, scale, meta, ids, wts = receiver()
    src, want_idx, want_w, counts = oracle.ht_dispatch(HT, inputs, RANK)
    cols = quant[RANK][1].shape[1]
    want_q = np.stack([quant[s][0][t] for s, t in src]) if src else np.zeros((0, HT.hidden), np.uint8)
    want_s = np.stack([quant[s][1][t] for s, t in src]) if src else \
        np.zeros((0, cols), quant[RANK][1].dtype)
    if rx.dtype != moe_ep.FP8_STORAGE or scale is None or \
            scale.dtype != torch.from_numpy(want_s).dtype:
        fail(what, seed, "a1q %s and scale %s, want %s and %s" % (
            rx.dtype, None if scale is None else scale.dtype, moe_ep.FP8_STORAGE, want_s.dtype))
        return
    same(what + " a1q", seed, bits(rx), want_q)
    same(what + " a1q_scale", seed, bits(scale), want_s)
    same(what + " topk_ids (global)", seed, bits(ids), ht_expected_ids(want_idx))
    same(what + " topk_weights", seed, bits(wts), want_w)
    same(what + " expert_num_tokens", seed, bits(meta.expert_num_tokens), counts)
    y = (seen_rows(rx, scale) * float(oracle.ht_partial_scale(RANK))).to(torch.bfloat16)
    out = torch.empty_like(x)
    pf.finalize(out, y, wts, ids, False, None)
    same(what + " finalize", seed, bits(out), oracle.ht_combine(HT, inp, quant[RANK][2]))


def vllm_ht_quant_refusals(g, seed):
    """quant_configs the adapter cannot honour raise naming the attribute;
    nothing was sent, so the adapter stays usable."""
    pf = moe_ep.vllm.PrepareAndFinalize(g)
    x, idx, w = torch_inputs(oracle.make_inputs(HT, seed, RANK))
    for what, cfg, fragment in (
            ("per-token", BlockFp8(per_act_token_quant=True), "per_act_token_quant=True"),
            ("block 96", BlockFp8(block_shape=[128, 96]), "block_shape=[128, 96]"),
            ("static scale", BlockFp8(a1_scale=torch.ones(1)), "a1_scale is set"),
            ("int8", BlockFp8(quant_dtype=torch.int8), "quant_dtype=torch.int8")):
        expect_raises("vllm ht quant " + what, NotImplementedError, fragment,
                      lambda: pf.prepare(x, w, idx, HT.num_experts, None, False, cfg))
    expect_raises("vllm ht fp8 a1 dtype", TypeError, "a1 has dtype torch.int32",
                  lambda: pf.prepare(x.to(torch.int32), w, idx, HT.num_experts, None, False,
                                     BlockFp8()))
    expect_raises("vllm scale_format", ValueError, "scale_format='e8m0' must be one of",
                  lambda: moe_ep.vllm.PrepareAndFinalize(g, scale_format="e8m0"))
    if len(pf._inflight):
        fail("vllm ht quant refusals", seed, "a refused prepare left %d operation(s) in flight"
             % len(pf._inflight))


def main():
    with moe_ep.Group(common.config(0, num_experts=P.num_experts, hidden=P.hidden, top_k=P.top_k,
                                    max_tokens_per_rank=P.max_tokens)) as g:
        vllm_ll(g)
        sglang(g)
    if FULL:
        with moe_ep.Group(common.config(1, mode="high_throughput", num_experts=HT.num_experts,
                                        hidden=HT.hidden, top_k=HT.top_k,
                                        max_tokens_per_rank=HT.max_tokens)) as g:
            vllm_ht(g, 301)
            expect_raises("sglang on HT", NotImplementedError, "mode is high_throughput",
                          lambda: moe_ep.sglang.Dispatcher(g))
            vllm_ht_fp8(g, 311, None)  # the group's fp8_scale: f32
            vllm_ht_fp8(g, 312, "ue8m0")
            vllm_ht_fp8(g, 313, "ue8m0_packed")
            vllm_ht_quant_refusals(g, 321)
            vllm_ht(g, 302, BlockFp8(), defer_input_quant=True)
    common.finish()


if __name__ == "__main__":
    main()
