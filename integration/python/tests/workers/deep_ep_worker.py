"""DeepEP-compatible Buffer through the opt-in `deep_ep` alias, on a
torch.distributed (gloo) group: LL bf16 and fp8 (DeepEP's shapes, dtypes,
column-major scales, handle tuple with src_info and layout_range), combine
bit-exact, the receive hook on a second thread, arguments moe-ep refuses;
an mpi4py-style comm= instead of a group; normal mode (HT) layout,
dispatch and combine bit-exact, pre-quantised (x_fp8, scales) input,
num_worst_tokens (the group it sizes; a receive past it raising on every
rank), cached dispatch (handle=), combine with a bias (one tensor or
DeepEP's pair); SGLang's `auto` mode: both modes through one low-latency
Buffer, created the way SGLang does."""
import gc
import os

import numpy as np
import torch
import torch.distributed as dist

import common
import deep_ep
import deep_ep.utils
import moe_ep
import moe_ep.deep_ep
import oracle
from common import RANK, WORLD, bits, bf16_tensor, same, fail, expect_raises, run_on_thread

P = oracle.Problem(WORLD, num_experts=4 * WORLD, hidden=512, top_k=4, max_tokens=16)
HOST = {"backend": "host", "bootstrap": {"timeout_ms": 60000}, "timeouts": {"kernel_ms": 60000}}


def inputs_for(seed):
    inputs = oracle.all_inputs(P, seed)
    inp = inputs[RANK]
    return inputs, bf16_tensor(inp["x"]), torch.from_numpy(inp["topk_idx"]), \
        torch.from_numpy(inp["weights"])


def check_ll_recv(seed, inputs, recv_x, recv_count, scales=None, packed=False):
    rows = oracle.ll_dispatch(P, inputs, RANK)
    same("deep_ep recv_count", seed, bits(recv_count), np.array([len(r) for r in rows], np.int32))
    got = bits(recv_x)
    for l, lrows in enumerate(rows):
        if not lrows:
            continue
        xs = np.stack([inputs[s]["x"][t] for s, t in lrows])
        if scales is None:
            same("deep_ep recv_x expert %d" % l, seed, got[l, :len(lrows)], xs)
            continue
        q = [oracle.fp8_quantize(r, packed) for r in xs]
        same("deep_ep fp8 recv_x expert %d" % l, seed, got[l, :len(lrows)], np.stack([a for a, _ in q]))
        want_s = np.stack([oracle.ue8m0_pack(b) if packed else b for _, b in q])
        same("deep_ep fp8 scales expert %d" % l, seed, scales[l, :len(lrows)].numpy(), want_s)


def check_ll_handle(seed, inputs, handle):
    """handle[0] / handle[1] (and unpacking) give DeepEP's src_info and
    layout_range of this rank's receive."""
    want_src, want_range = oracle.ll_layout(P, inputs, RANK)
    src_info, layout_range, n, hidden, experts = handle
    if src_info.dtype != torch.int32 or layout_range.dtype != torch.int64:
        fail("deep_ep LL handle dtypes", seed, "%s %s" % (src_info.dtype, layout_range.dtype))
    same("deep_ep LL handle[0] src_info", seed, bits(src_info), want_src)
    same("deep_ep LL handle[1] layout_range", seed, bits(handle[1]), want_range)
    if handle[-5] is not src_info or (n, hidden, experts) != (P.max_tokens, P.hidden, P.num_experts):
        fail("deep_ep LL handle", seed, "handle[-5] is not handle[0], or %r" % ((n, hidden, experts),))
    # DeepEP's tests read each expert's ranges like this.
    for l in range(P.local):
        for s in range(WORLD):
            begin, count = int(layout_range[l, s] >> 32), int(layout_range[l, s] & 0xFFFFFFFF)
            if (src_info[l, begin:begin + count] < 0).any():
                fail("deep_ep LL layout_range", seed, "expert %d source %d: a -1 in its range" % (l, s))


def expert_outputs(recv_x):
    scale = torch.tensor([float(oracle.expert_scale(RANK * P.local + l)) for l in range(P.local)])
    return (recv_x.float() * scale[:, None, None]).to(torch.bfloat16)


def low_latency(group):
    buf = deep_ep.Buffer(group, 0, 0, low_latency_mode=True, num_qps_per_rank=P.local,
                         allow_nvlink_for_low_latency_mode=True, explicitly_destroy=True,
                         moe_ep_config=HOST)
    inputs, x, idx, w = inputs_for(5)
    # A wrong stats tensor is refused before anything is sent (every rank
    # alike), so the verified round trip below is the group's next call.
    for what, bad in (("[local+1]", torch.zeros(P.local + 1, dtype=torch.int32)),
                      ("int64", torch.zeros(P.local, dtype=torch.int64))):
        expect_raises("deep_ep LL stats " + what, ValueError, "cumulative_local_expert_recv_stats is",
                      lambda: buf.low_latency_dispatch(x, idx, P.max_tokens, P.num_experts,
                                                       cumulative_local_expert_recv_stats=bad,
                                                       use_fp8=False))
    stats = torch.zeros(P.local, dtype=torch.int32)
    recv_x, count, handle, event, hook = buf.low_latency_dispatch(
        x, idx, P.max_tokens, P.num_experts, cumulative_local_expert_recv_stats=stats,
        use_fp8=False)
    if hook is not None or recv_x.shape != (P.local, WORLD * P.max_tokens, P.hidden) \
            or recv_x.dtype != torch.bfloat16 or count.dtype != torch.int32:
        fail("deep_ep LL outputs", 5, "%s %s %s" % (tuple(recv_x.shape), recv_x.dtype, hook))
    check_ll_recv(5, inputs, recv_x, count)
    same("cumulative_local_expert_recv_stats", 5, bits(stats), bits(count))
    if len(handle) != 5 or tuple(handle[2:]) != (P.max_tokens, P.hidden, P.num_experts):
        fail("deep_ep LL handle", 5, repr(handle))
    check_ll_handle(5, inputs, handle)
    event.current_stream_wait()
    out, event, hook = buf.low_latency_combine(expert_outputs(recv_x), idx, w, handle)
    same("deep_ep LL combine", 5, bits(out), oracle.ll_combine(P, inputs[RANK]))

    # The receive hook, run on another thread (two-batch overlap).
    inputs, x, idx, w = inputs_for(6)
    recv_x, count, handle, _, hook = buf.low_latency_dispatch(
        x, idx, P.max_tokens, P.num_experts, use_fp8=False, return_recv_hook=True)
    # The handle unpacked before the hook, as DeepEP allows: tensors the
    # hook (on the other thread) fills.
    early = (handle[0], handle[1])
    run_on_thread(hook, 6)
    check_ll_recv(6, inputs, recv_x, count)
    if handle[0] is not early[0] or handle[1] is not early[1]:
        fail("deep_ep LL handle read before the hook", 6, "a read after it gave other tensors")
    check_ll_handle(6, inputs, handle)
    out, _, hook = buf.low_latency_combine(expert_outputs(recv_x), idx, w, handle,
                                           return_recv_hook=True)
    hook()
    same("deep_ep LL combine (hook)", 6, bits(out), oracle.ll_combine(P, inputs[RANK]))

    # SGLang's decode: the combine's hook runs after the dispatcher dropped
    # the handle (self.handle = None in _combine_core, hook() in combine_b).
    inputs, x, idx, w = inputs_for(12)
    recv_x, count, handle, _, hook = buf.low_latency_dispatch(
        x, idx, P.max_tokens, P.num_experts, use_fp8=False, return_recv_hook=True)
    hook()
    out, _, hook = buf.low_latency_combine(expert_outputs(recv_x), idx, w, handle,
                                           return_recv_hook=True)
    handle = None
    gc.collect()
    hook()
    same("deep_ep LL combine (hook after the handle was dropped)", 12, bits(out),
         oracle.ll_combine(P, inputs[RANK]))

    # Zero-copy combine: the experts write into the buffer the combine reads.
    inputs, x, idx, w = inputs_for(11)
    recv_x, count, handle, _, _ = buf.low_latency_dispatch(
        x, idx, P.max_tokens, P.num_experts, use_fp8=False)
    y = buf.get_next_low_latency_combine_buffer(handle)
    if y.shape != recv_x.shape or y.dtype != torch.bfloat16:
        fail("deep_ep zero-copy buffer", 11, "%s %s" % (tuple(y.shape), y.dtype))
    y.copy_(expert_outputs(recv_x))
    out, _, _ = buf.low_latency_combine(y, idx, w, handle, zero_copy=True)
    same("deep_ep LL combine (zero copy)", 11, bits(out), oracle.ll_combine(P, inputs[RANK]))
    # DeepEP's own pattern: the outputs copied into the buffer, the
    # experts' tensor passed as x (only its shape counts); asking twice
    # with no LL operation between gives the same buffer.
    inputs, x, idx, w = inputs_for(13)
    recv_x, count, handle, _, _ = buf.low_latency_dispatch(
        x, idx, P.max_tokens, P.num_experts, use_fp8=False)
    y = expert_outputs(recv_x)
    first = buf.get_next_low_latency_combine_buffer(handle)
    again = buf.get_next_low_latency_combine_buffer(handle)
    if again.data_ptr() != first.data_ptr():
        fail("deep_ep zero-copy buffer asked twice", 13, "two buffers: %#x, then %#x"
             % (first.data_ptr(), again.data_ptr()))
    again.copy_(y)
    out, _, _ = buf.low_latency_combine(y, idx, w, handle, zero_copy=True)
    same("deep_ep LL combine (zero copy, x the experts' tensor)", 13, bits(out),
         oracle.ll_combine(P, inputs[RANK]))
    # A buffer handed out before another LL operation passed the turn is
    # not the one the combine would read: refused, not combined stale.
    inputs, x, idx, w = inputs_for(14)
    recv_x, count, handle, _, _ = buf.low_latency_dispatch(
        x, idx, P.max_tokens, P.num_experts, use_fp8=False)
    stale = buf.get_next_low_latency_combine_buffer(handle)
    stale.copy_(expert_outputs(recv_x))
    _, _, other, _, _ = buf.low_latency_dispatch(x, idx, P.max_tokens, P.num_experts,
                                                  use_fp8=False)
    expect_raises("zero_copy with a buffer from before the last LL operation", ValueError,
                  "handed out before the last low-latency dispatch or combine",
                  lambda: buf.low_latency_combine(stale, idx, w, handle, zero_copy=True))
    expect_raises("zero_copy with x of another shape", ValueError, "x of shape",
                  lambda: buf.low_latency_combine(torch.zeros((1, 1, P.hidden), dtype=torch.bfloat16),
                                                  idx, w, other, zero_copy=True))
    other = None

    # use_fp8 switches per call on the same Buffer, as in DeepEP.
    inputs, x, idx, w = inputs_for(10)
    (q, scales), count, _, _, _ = buf.low_latency_dispatch(
        x, idx, P.max_tokens, P.num_experts, use_fp8=True)
    check_ll_recv(10, inputs, q, count, scales, packed=False)
    # A dispatch the library refuses frees its handle at once, not when the
    # exception's traceback (which holds the frame) is dropped.
    try:
        buf.low_latency_dispatch(torch.zeros((len(x), 2 * P.hidden), dtype=torch.bfloat16), idx,
                                 P.max_tokens, P.num_experts, use_fp8=False)
        fail("refused dispatch", 10, "a hidden above the group's was accepted")
    except moe_ep.InvalidArgumentError as e:
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_name != "low_latency_dispatch":
            tb = tb.tb_next
        left = tb.tb_frame.f_locals.get("handle") if tb is not None else None
        if left is None or left._ptr is not None:
            fail("refused dispatch", 10, "its prepared handle %r is still live" % (left,))
    expect_raises("tokens cap", ValueError, "num_max_dispatch_tokens_per_rank=8",
                  lambda: buf.low_latency_dispatch(x[:4], idx[:4], 8, P.num_experts, use_fp8=False))
    expect_raises("logfmt", NotImplementedError, "use_logfmt",
                  lambda: buf.low_latency_combine(out, idx, w, handle, use_logfmt=True))
    expect_raises("mask", NotImplementedError, "rank masking",
                  lambda: buf.low_latency_update_mask_buffer(0, True))
    expect_raises("nvfp4", NotImplementedError, "use_nvfp4=True",
                  lambda: buf.low_latency_dispatch(x, idx, P.max_tokens, P.num_experts,
                                                   use_nvfp4=True))
    expect_raises("nvfp4 global scale", NotImplementedError, "x_global_scale",
                  lambda: buf.low_latency_dispatch(x, idx, P.max_tokens, P.num_experts,
                                                   x_global_scale=torch.ones(1)))
    expect_raises("single-batch overlap", NotImplementedError, "overlap=True",
                  lambda: buf.low_latency_combine(out, idx, w, handle, overlap=True))
    expect_raises("overlap signals", NotImplementedError, "comp_signal",
                  lambda: buf.low_latency_combine(out, idx, w, handle,
                                                  comp_signal=torch.zeros(4, dtype=torch.int32)))

    # SGLang with single-batch overlap configured but off for this call:
    # overlap=False and the mode's tuning arguments, accepted.
    inputs, x, idx, w = inputs_for(16)
    recv_x, count, handle, _, _ = buf.low_latency_dispatch(
        x, idx, P.max_tokens, P.num_experts, use_fp8=False)
    out, _, _ = buf.low_latency_combine(expert_outputs(recv_x), idx, w, handle, overlap=False,
                                        packed_recv_count=count, block_m=64, threshold=7,
                                        num_sms=3)
    same("deep_ep LL combine (overlap=False)", 16, bits(out),
         oracle.ll_combine(P, inputs[RANK]))
    buf.clean_low_latency_buffer(P.max_tokens, P.hidden, P.num_experts)
    buf.destroy()

    for ue8m0 in (False, True):
        buf = deep_ep.Buffer(group, low_latency_mode=True, moe_ep_config=HOST)
        seed = 7 + ue8m0
        inputs, x, idx, w = inputs_for(seed)
        (q, scales), count, handle, _, _ = buf.low_latency_dispatch(
            x, idx, P.max_tokens, P.num_experts, use_fp8=True, round_scale=ue8m0, use_ue8m0=ue8m0)
        cols = P.hidden // 512 if ue8m0 else P.hidden // 128
        want_dtype = torch.int32 if ue8m0 else torch.float32
        rows = WORLD * P.max_tokens
        padded = (rows + 3) // 4 * 4  # DeepGEMM's TMA needs 16-byte column strides
        if scales.shape != (P.local, rows, cols) or scales.dtype != want_dtype \
                or scales.stride() != (cols * padded, 1, padded) or q.dtype != moe_ep.FP8_STORAGE:
            fail("deep_ep fp8 layout", seed, "%s %s %s %s" % (tuple(scales.shape), scales.dtype,
                                                            scales.stride(), q.dtype))
        check_ll_recv(seed, inputs, q, count, scales, packed=ue8m0)
        buf.destroy()


def normal(group):
    buf = deep_ep.Buffer(group, int(1e6), 0, low_latency_mode=False, explicitly_destroy=True,
                         moe_ep_config=dict(HOST, hidden=P.hidden))
    inputs, x, idx, w = inputs_for(9)
    per_rank, per_rdma, per_expert, in_rank, event = buf.get_dispatch_layout(idx, P.num_experts)
    i = inputs[RANK]["topk_idx"]
    ranks = np.where(i >= 0, i // P.local, -1)
    want_in = np.stack([(ranks == r).any(axis=1) for r in range(WORLD)], axis=1)
    same("deep_ep is_token_in_rank", 9, bits(in_rank), want_in)
    if per_rdma is not None or in_rank.dtype != torch.bool:
        fail("deep_ep layout", 9, "%r %s" % (per_rdma, in_rank.dtype))
    expect_raises("HT dispatch by is_token_in_rank", NotImplementedError, "topk_idx=None",
                  lambda: buf.dispatch(x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                                       num_tokens_per_expert=per_expert))
    expect_raises("HT dispatch without weights", NotImplementedError, "topk_weights=None",
                  lambda: buf.dispatch(x, is_token_in_rank=in_rank, topk_idx=idx))
    recv_x, recv_idx, recv_w, per_expert_list, handle, event = buf.dispatch(
        x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w, expert_alignment=4)
    src, want_idx, want_w, counts = oracle.ht_dispatch(P, inputs, RANK)
    same("deep_ep HT recv_x", 9, bits(recv_x),
         np.stack([inputs[s]["x"][t] for s, t in src]) if src else np.zeros((0, P.hidden), np.uint16))
    same("deep_ep HT recv_topk_idx", 9, recv_idx.numpy(), want_idx.astype(np.int64))
    same("deep_ep HT recv_topk_weights", 9, recv_w.numpy(), want_w)
    if per_expert_list != [int((c + 3) // 4 * 4) for c in counts]:
        fail("deep_ep HT per-expert list", 9, "%s vs counts %s" % (per_expert_list, counts))
    y = (recv_x.float() * float(oracle.ht_partial_scale(RANK))).to(torch.bfloat16)
    out, combined_w, _ = buf.combine(y, handle, topk_weights=recv_w)
    same("deep_ep HT combine", 9, bits(out), oracle.ht_combine(P, inputs[RANK]))
    same("deep_ep HT combined weights", 9, combined_w.numpy(),
         np.where(inputs[RANK]["topk_idx"] >= 0, inputs[RANK]["weights"], 0).astype(np.float32))
    # Weights changed after dispatch would not be what combine returns.
    recv_w.mul_(2.0)
    expect_raises("HT combine of recv_topk_weights written in place", NotImplementedError,
                  "written in place", lambda: buf.combine(y, handle, topk_weights=recv_w))
    # Engines run under inference mode, whose tensors count no writes: the
    # same round trip goes through there, weights and all.
    with torch.inference_mode():
        _, _, rw, _, h, _ = buf.dispatch(
            x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert, topk_idx=idx, topk_weights=w, expert_alignment=4)
        out, combined_w, _ = buf.combine(y, h, topk_weights=rw)
    same("deep_ep HT combine (inference mode)", 9, bits(out), oracle.ht_combine(P, inputs[RANK]))
    same("deep_ep HT combined weights (inference mode)", 9, combined_w.numpy(),
         np.where(inputs[RANK]["topk_idx"] >= 0, inputs[RANK]["weights"], 0).astype(np.float32))
    expect_raises("HT bias shape", ValueError, "bias[1] is (%d, 8)" % len(x),
                  lambda: buf.combine(y, handle, bias=(None, torch.zeros((len(x), 8),
                                                                         dtype=torch.bfloat16))))
    expect_raises("HT bias dtype", ValueError, "bias is (%d, %d) torch.float32" % (len(x), P.hidden),
                  lambda: buf.combine(y, handle, bias=torch.zeros((len(x), P.hidden))))
    expect_raises("HT bias tuple", ValueError, "bias is a tuple of 3",
                  lambda: buf.combine(y, handle, bias=(None, None, None)))
    normal_fp8(buf, 12, "fp8")
    normal_fp8(buf, 13, "fp8_ue8m0_packed")
    normal_fp8(buf, 14, "fp8_per_token")
    normal_fp8(buf, 15, "fp8_per_token", one_d=True)
    normal_worst(buf, 14)
    normal_cached(buf, 15)
    buf.destroy()


def biases(seed, count):
    """`count` bf16 bias tensors [T, H] for this rank (bit patterns and
    tensors), T this rank's tokens under `seed`."""
    t = len(oracle.make_inputs(P, seed, RANK)["x"])
    rng = np.random.default_rng(seed * 31 + RANK)
    b = [oracle.bf16_bits(rng.standard_normal((t, P.hidden)).astype(np.float32)) for _ in range(count)]
    return b, [bf16_tensor(v) for v in b]


def biased(combined_bits, bias_bits):
    """The combine with a bias: bf16((bias_0 + bias_1) + combined), f32."""
    acc = oracle.bf16_float(bias_bits[0])
    for b in bias_bits[1:]:
        acc = (acc + oracle.bf16_float(b)).astype(np.float32)
    return oracle.bf16_bits((acc + oracle.bf16_float(combined_bits)).astype(np.float32))


def received(inputs, src, key, width, dtype):
    """The rows `src` names of every rank's `key` array, stacked."""
    return np.stack([inputs[s][key][t] for s, t in src]) if src else np.zeros((0, width), dtype)


def normal_fp8(buf, seed, fmt, one_d=False):
    """(x_fp8, scales) in, (recv_x_fp8, recv_scales) out, verbatim; the f32
    scales as DeepGEMM's column-major view (the Buffer copies them).
    one_d: DeepEP's per-token scales as [T], received as [N_recv]."""
    inputs, x, idx, w = inputs_for(seed)
    for i in inputs:
        i["q"], i["s"], i["seen"] = oracle.ht_fp8_inputs(P, i, fmt)
    scales = torch.from_numpy(inputs[RANK]["s"])
    if scales.dtype == torch.float32:
        scales = scales.t().contiguous().t()
    if one_d:
        scales = scales.view(-1)
    (rq, rs), recv_idx, recv_w, per_expert, handle, _ = buf.dispatch(
        (torch.from_numpy(inputs[RANK]["q"]).view(moe_ep.FP8_STORAGE), scales), topk_idx=idx,
        topk_weights=w)
    src, want_idx, want_w, counts = oracle.ht_dispatch(P, inputs, RANK)
    cols = inputs[RANK]["s"].shape[1]
    want_s = received(inputs, src, "s", cols, inputs[RANK]["s"].dtype)
    if rs.dim() != scales.dim():
        fail("deep_ep HT %s recv_scales" % fmt, seed, "shape %s for scales of shape %s"
             % (tuple(rs.shape), tuple(scales.shape)))
    same("deep_ep HT %s recv_x" % fmt, seed, bits(rq), received(inputs, src, "q", P.hidden, np.uint8))
    same("deep_ep HT %s recv_scales" % fmt, seed, bits(rs),
         want_s.reshape(-1) if one_d else want_s)
    same("deep_ep HT %s recv_topk_idx" % fmt, seed, recv_idx.numpy(), want_idx.astype(np.int64))
    if per_expert != [int(c) for c in counts]:
        fail("deep_ep HT %s per-expert list" % fmt, seed, "%s vs %s" % (per_expert, counts))
    seen = received(inputs, src, "seen", P.hidden, np.float32)
    y = bf16_tensor(oracle.bf16_bits(seen * oracle.ht_partial_scale(RANK)))
    bias_bits, bias = biases(seed, 1)  # one tensor
    out, _, _ = buf.combine(y, handle, bias=bias[0])
    same("deep_ep HT %s combine with a bias" % fmt, seed, bits(out),
         biased(oracle.ht_combine(P, inputs[RANK], inputs[RANK]["seen"]), bias_bits))


def normal_worst(buf, seed):
    """num_worst_tokens: fixed-size outputs (beyond and below the library's
    world * max_tokens rows), padding rows -1 / 0, an empty per-expert list;
    a receive larger than num_worst_tokens on some rank raises on every
    rank."""
    inputs, x, idx, w = inputs_for(seed)
    g = buf.moe_ep_group
    src, want_idx, want_w, _ = oracle.ht_dispatch(P, inputs, RANK)
    n = len(src)
    # What combine hands the library: a GPU group never learns the receive
    # count on the host, so it takes y of every row the worst-case dispatch
    # filled (world_size * max_tokens_per_rank or more), not num_worst_tokens.
    y_rows = []
    library_combine = g.combine
    g.combine = lambda h, y, **kw: y_rows.append(y.shape[0]) or library_combine(h, y, **kw)
    for nw in (WORLD * g.config.max_tokens_per_rank + 8, WORLD * P.max_tokens):
        recv_x, recv_idx, recv_w, per_expert, handle, _ = buf.dispatch(
            x, topk_idx=idx, topk_weights=w, num_worst_tokens=nw)
        if recv_x.shape != (nw, P.hidden) or recv_idx.shape != (nw, P.top_k) or per_expert != []:
            fail("deep_ep HT num_worst_tokens=%d" % nw, seed, "%s %s %r" % (
                tuple(recv_x.shape), tuple(recv_idx.shape), per_expert))
            continue
        same("deep_ep HT worst recv_x", seed, bits(recv_x[:n]), received(inputs, src, "x", P.hidden, np.uint16))
        same("deep_ep HT worst recv_topk_idx", seed, recv_idx.numpy(),
             np.concatenate([want_idx, np.full((nw - n, P.top_k), -1, np.int32)]).astype(np.int64))
        same("deep_ep HT worst recv_topk_weights", seed, recv_w.numpy(),
             np.concatenate([want_w, np.zeros((nw - n, P.top_k), np.float32)]))
        y = (recv_x.float() * float(oracle.ht_partial_scale(RANK))).to(torch.bfloat16)
        out, _, _ = buf.combine(y, handle, topk_weights=recv_w)
        same("deep_ep HT worst combine (%d rows)" % nw, seed, bits(out), oracle.ht_combine(P, inputs[RANK]))
        filled = max(nw, WORLD * g.config.max_tokens_per_rank)
        if y_rows[-1] < filled:
            fail("deep_ep HT worst combine y", seed, "%d rows reached the library after a "
                 "dispatch of %d rows" % (y_rows[-1], filled))
    del g.combine
    # num_worst_tokens below one rank's receive: every token of every rank
    # goes to expert 0, so rank 0 receives WORLD * 3 rows and the others
    # none. Every rank raises, naming rank 0, so that none goes on to a
    # combine the others skip.
    idx = torch.full((3, P.top_k), -1, dtype=torch.int64)
    idx[:, 0] = 0
    nw = 3
    expect_raises("deep_ep HT num_worst_tokens=%d, rank 0 receives %d" % (nw, 3 * WORLD),
                  ValueError, "rank 0 received more than num_worst_tokens=3 tokens (this rank: "
                  "%s)" % (3 * WORLD if RANK == 0 else "within it"),
                  lambda: buf.dispatch(x[:3], topk_idx=idx, topk_weights=w[:3],
                                       num_worst_tokens=nw))


def worst_sizes_the_group(group):
    """A first dispatch with num_worst_tokens creates the group with
    max_tokens_per_rank = num_worst_tokens / world_size, so the library's
    rows are exactly num_worst_tokens: nothing checked, no rows added."""
    buf = deep_ep.Buffer(group, low_latency_mode=False, explicitly_destroy=True,
                         moe_ep_config=HOST)
    seed = 17
    inputs, x, idx, w = inputs_for(seed)
    nw = WORLD * P.max_tokens
    buf.get_dispatch_layout(idx, P.num_experts)
    recv_x, recv_idx, recv_w, _, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w,
                                                          num_worst_tokens=nw)
    g = buf.moe_ep_normal_group
    if g.config.max_tokens_per_rank != P.max_tokens or recv_x.shape[0] != nw or \
            handle.worst_rows != nw:
        fail("num_worst_tokens sizes the group", seed, "max_tokens_per_rank %d (want %d), %d "
             "rows, %d library rows (want %d)" % (g.config.max_tokens_per_rank, P.max_tokens,
                                                  recv_x.shape[0], handle.worst_rows, nw))
    y = (recv_x.float() * float(oracle.ht_partial_scale(RANK))).to(torch.bfloat16)
    out, _, _ = buf.combine(y, handle, topk_weights=recv_w)
    same("num_worst_tokens-sized group combine", seed, bits(out),
         oracle.ht_combine(P, inputs[RANK]))
    buf.destroy()


def default_group_buffer():
    """Buffer(None) in a process whose rank comes from an initialised
    torch.distributed (no launcher variables): the ranks agree the
    bootstrap address over its default group, not the library's default
    (torch's own port, 127.0.0.1:29500), and a round trip is exact."""
    saved = {k: os.environ.pop(k) for k in ("MOE_EP_RANK", "MOE_EP_WORLD_SIZE") if k in os.environ}
    try:
        buf = deep_ep.Buffer(None, 0, 0, True, explicitly_destroy=True, moe_ep_config=HOST)
        if (buf.rank, buf.group_size) != (RANK, WORLD):
            fail("Buffer(None) rank", 19, "%d/%d" % (buf.rank, buf.group_size))
        inputs, x, idx, w = inputs_for(19)
        recv_x, count, handle, _, _ = buf.low_latency_dispatch(x, idx, P.max_tokens,
                                                               P.num_experts, use_fp8=False)
        check_ll_recv(19, inputs, recv_x, count)
        out, _, _ = buf.low_latency_combine(expert_outputs(recv_x), idx, w, handle)
        same("Buffer(None) LL combine", 19, bits(out), oracle.ll_combine(P, inputs[RANK]))
        address = buf.moe_ep_group.config.bootstrap_address
        everyone = [None] * WORLD
        dist.all_gather_object(everyone, address)
        if len(set(everyone)) != 1 or address.endswith(":29500"):
            fail("Buffer(None) address", 19, "want one address rank 0 picked, got %s" % everyone)
        buf.destroy()
    finally:
        os.environ.update(saved)


def comm_buffer(group):
    """Buffer(comm=...) without a bootstrap address or job token configured:
    the ranks agree both through the communicator, as over a torch group."""
    buf = deep_ep.Buffer(None, 0, 0, True, comm=common.GlooComm(group), moe_ep_config=HOST)
    inputs, x, idx, w = inputs_for(18)
    recv_x, count, handle, _, _ = buf.low_latency_dispatch(x, idx, P.max_tokens, P.num_experts,
                                                           use_fp8=False)
    check_ll_recv(18, inputs, recv_x, count)
    out, _, _ = buf.low_latency_combine(expert_outputs(recv_x), idx, w, handle)
    same("comm= LL combine", 18, bits(out), oracle.ll_combine(P, inputs[RANK]))
    address = buf.moe_ep_group.config.bootstrap_address
    everyone = [None] * WORLD
    dist.all_gather_object(everyone, address, group=group)
    if len(set(everyone)) != 1 or address.endswith(":29500"):
        fail("comm= address", 18, "want one address rank 0 picked, got %s" % everyone)
    buf.destroy()
    # Entries that need no group refuse a destroyed Buffer too.
    expect_raises("get_dispatch_layout after destroy", RuntimeError, "destroy() was called",
                  lambda: buf.get_dispatch_layout(idx, P.num_experts))
    expect_raises("clean_low_latency_buffer after destroy", RuntimeError, "destroy() was called",
                  lambda: buf.clean_low_latency_buffer(P.max_tokens, P.hidden, P.num_experts))


def normal_cached(buf, seed):
    """handle=: the same layout with another x; combine after it."""
    inputs, x, idx, w = inputs_for(seed)
    recv_x, recv_idx, recv_w, _, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w)
    for i in inputs:
        i["x"] = oracle.bf16_bits(-0.5 * oracle.bf16_float(i["x"]))
    src = oracle.ht_dispatch(P, inputs, RANK)[0]
    recv_x2, none_idx, none_w, none_list, handle2, _ = buf.dispatch(bf16_tensor(inputs[RANK]["x"]),
                                                                    handle=handle)
    if (none_idx, none_w, none_list, handle2) != (None, None, None, None):
        fail("deep_ep HT cached returns", seed, "%r %r %r" % (none_idx, none_w, none_list))
    same("deep_ep HT cached recv_x", seed, bits(recv_x2), received(inputs, src, "x", P.hidden, np.uint16))
    y = (recv_x2.float() * float(oracle.ht_partial_scale(RANK))).to(torch.bfloat16)
    bias_bits, bias = biases(seed, 2)  # DeepEP's pair
    out, _, _ = buf.combine(y, handle, topk_weights=recv_w, bias=tuple(bias))
    same("deep_ep HT cached combine with bias (bias_0, bias_1)", seed, bits(out),
         biased(oracle.ht_combine(P, inputs[RANK]), bias_bits))


def expected_layout(inputs):
    """get_dispatch_layout's (per rank, per expert, is_token_in_rank) of
    this rank's routing."""
    i = inputs[RANK]["topk_idx"]
    ranks = np.where(i >= 0, i // P.local, -1)
    in_rank = np.stack([(ranks == r).any(axis=1) for r in range(WORLD)], axis=1)
    per_expert = np.array([(i == e).sum() for e in range(P.num_experts)], np.int32)
    return in_rank.sum(axis=0).astype(np.int32), per_expert, in_rank


def check_layout(what, seed, inputs, layout):
    per_rank, per_rdma, per_expert, in_rank, _ = layout
    want_rank, want_expert, want_in = expected_layout(inputs)
    if per_rdma is not None or in_rank.dtype != torch.bool or per_rank.dtype != torch.int32 \
            or per_expert.dtype != torch.int32:
        fail(what + " dtypes", seed, "%r %s %s %s" % (per_rdma, per_rank.dtype, per_expert.dtype,
                                                     in_rank.dtype))
    same(what + " num_tokens_per_rank", seed, per_rank.numpy(), want_rank)
    same(what + " num_tokens_per_expert", seed, per_expert.numpy(), want_expert)
    same(what + " is_token_in_rank", seed, bits(in_rank), want_in)


def auto_mode(group):
    """SGLang's deepep_mode=auto: one Buffer(low_latency_mode=True) built
    with SGLang's positional arguments and allow_mnnvl=True; decode through
    low_latency_*, prefill through get_dispatch_layout / dispatch / combine
    (a second group, created by the first normal dispatch with x's hidden),
    clean_low_latency_buffer between them; the LL combine given a copy of
    topk_idx (as vLLM's remapped ids are)."""
    buf = deep_ep.Buffer(group, int(1e6), 0, True, P.local, True, True, True,
                         moe_ep_config=HOST)
    for seed in (21, 24):
        inputs, x, idx, w = inputs_for(seed)
        recv_x, count, handle, _, _ = buf.low_latency_dispatch(
            x, idx, P.max_tokens, P.num_experts, use_fp8=False, use_ue8m0=True)
        check_ll_recv(seed, inputs, recv_x, count)
        out, _, _ = buf.low_latency_combine(expert_outputs(recv_x), idx.clone(), w, handle)
        same("auto LL combine (topk_idx copied)", seed, bits(out),
             oracle.ll_combine(P, inputs[RANK]))
        expect_raises("auto LL combine topk_idx shape", ValueError, "routes the combine",
                      lambda: buf.low_latency_combine(expert_outputs(recv_x), idx[:, :1], w,
                                                      handle))
        inputs, x, idx, w = inputs_for(seed + 1)
        check_layout("auto layout", seed + 1, inputs, buf.get_dispatch_layout(idx, P.num_experts))
        recv_x, recv_idx, recv_w, per_expert_list, nh, _ = buf.dispatch(
            x, topk_idx=idx, topk_weights=w)
        src, want_idx, want_w, counts = oracle.ht_dispatch(P, inputs, RANK)
        same("auto HT recv_x", seed + 1, bits(recv_x), received(inputs, src, "x", P.hidden, np.uint16))
        same("auto HT recv_topk_idx", seed + 1, recv_idx.numpy(), want_idx.astype(np.int64))
        if per_expert_list != [int(c) for c in counts]:
            fail("auto HT per-expert list", seed + 1, "%s vs %s" % (per_expert_list, counts))
        y = (recv_x.float() * float(oracle.ht_partial_scale(RANK))).to(torch.bfloat16)
        out, _, _ = buf.combine(y, nh)
        same("auto HT combine", seed + 1, bits(out), oracle.ht_combine(P, inputs[RANK]))
        buf.clean_low_latency_buffer(P.max_tokens, P.hidden, P.num_experts)
    ll, ht = buf.moe_ep_group, buf.moe_ep_normal_group
    if ll is None or ht is None or ll.config.mode != "low_latency" or \
            ht.config.mode != "high_throughput" or ht.config.hidden != P.hidden or \
            ht.config.max_tokens_per_rank != 1024:
        fail("auto groups", "-", "%r / %r" % (ll and ll.config, ht and ht.config))
    buf.destroy()


def first_batches_differ(group):
    """Ranks whose first normal-mode batches differ (1500 tokens on rank 0,
    none elsewhere, as DP attention has them) create one group: its
    max_tokens_per_rank is the largest rounded up, on every rank."""
    buf = deep_ep.Buffer(group, low_latency_mode=False, explicitly_destroy=True,
                         moe_ep_config=HOST)
    t = 1500 if RANK == 0 else 0
    idx = (torch.arange(t * P.top_k, dtype=torch.int64).reshape(t, P.top_k) % P.num_experts)
    w = torch.ones((t, P.top_k), dtype=torch.float32)
    x = torch.zeros((t, P.hidden), dtype=torch.bfloat16)
    buf.get_dispatch_layout(idx, P.num_experts)
    recv_x, _, _, _, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w)
    out, _, _ = buf.combine(recv_x, handle)
    cap = buf.moe_ep_group.config.max_tokens_per_rank
    if cap != 2048 or tuple(out.shape) != (t, P.hidden):
        fail("first batches differ", "-", "max_tokens_per_rank %d (want 2048), out %s"
             % (cap, tuple(out.shape)))
    buf.destroy()


def env_address(group):
    """MOE_EP_BOOTSTRAP_ADDRESS (as the launcher sets it) serves the first
    group and the next port the second; moe_ep_config's high_throughput
    section applies to the normal-mode group only; a previous_event's hook
    stays with its owner; a layout's num_experts must match the config's."""
    port = next(q for q in common.PORTS[1:] if q + 1 != common.PORTS[0])
    os.environ["MOE_EP_BOOTSTRAP_ADDRESS"] = "127.0.0.1:%d" % port
    try:
        buf = deep_ep.Buffer(group, 0, 0, True, moe_ep_config=dict(
            HOST, high_throughput={"max_tokens_per_rank": 2048}))
        inputs, x, idx, w = inputs_for(31)
        recv_x, count, handle, _, _ = buf.low_latency_dispatch(
            x, idx, P.max_tokens, P.num_experts, use_fp8=False)
        out, _, _ = buf.low_latency_combine(expert_outputs(recv_x), idx, w, handle)
        same("env address LL combine", 31, bits(out), oracle.ll_combine(P, inputs[RANK]))
        inputs, x, idx, w = inputs_for(32)
        ev = deep_ep.Buffer.capture()
        ev.register_hook_after_wait(lambda: "mine")
        check_layout("env address layout", 32, inputs,
                     buf.get_dispatch_layout(idx, P.num_experts, previous_event=ev))
        if ev.current_stream_wait() != "mine":
            fail("previous_event hook", 32, "the Buffer ran the caller's hook")
        recv_x, _, _, _, nh, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w)
        y = (recv_x.float() * float(oracle.ht_partial_scale(RANK))).to(torch.bfloat16)
        out, _, _ = buf.combine(y, nh)
        same("env address HT combine", 32, bits(out), oracle.ht_combine(P, inputs[RANK]))
        ll, ht = buf.moe_ep_group.config, buf.moe_ep_normal_group.config
        if (ll.bootstrap_address, ht.bootstrap_address) != (
                "127.0.0.1:%d" % port, "127.0.0.1:%d" % (port + 1)) or \
                (ll.max_tokens_per_rank, ht.max_tokens_per_rank) != (P.max_tokens, 2048):
            fail("env address groups", "-", "%r / %r" % (ll, ht))
        buf.destroy()
    finally:
        del os.environ["MOE_EP_BOOTSTRAP_ADDRESS"]
    buf = deep_ep.Buffer(group, moe_ep_config=dict(HOST, num_experts=P.num_experts))
    expect_raises("layout num_experts", ValueError, "differs from moe_ep_config's num_experts",
                  lambda: buf.get_dispatch_layout(idx, 2 * P.num_experts))
    expect_raises("mode section", TypeError, "moe_ep_config['low_latency'] must be a dict",
                  lambda: deep_ep.Buffer(group, moe_ep_config=dict(HOST, low_latency=5)))


def tokens_differ(group):
    """Ranks given different job tokens are told so when the group is made,
    every rank alike, instead of the others waiting out the bootstrap."""
    saved = os.environ.get("MOE_EP_JOB_TOKEN")
    os.environ["MOE_EP_JOB_TOKEN"] = "given-on-rank-%d-of-this-job" % RANK
    try:
        buf = deep_ep.Buffer(group, 0, 0, low_latency_mode=True, num_qps_per_rank=P.local,
                             explicitly_destroy=True, moe_ep_config=HOST)
        _, x, idx, _ = inputs_for(7)
        expect_raises("tokens differ", ValueError, "job tokens in MOE_EP_JOB_TOKEN differ",
                      lambda: buf.low_latency_dispatch(x, idx, P.max_tokens, P.num_experts,
                                                       use_fp8=False))
        buf.destroy()
    finally:
        if saved is None:
            os.environ.pop("MOE_EP_JOB_TOKEN", None)
        else:
            os.environ["MOE_EP_JOB_TOKEN"] = saved


def main():
    if deep_ep.Buffer is not moe_ep.deep_ep.Buffer:
        fail("alias", "-", "deep_ep.Buffer is not moe_ep.deep_ep.Buffer")
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % common.PORTS[0],
                            rank=RANK, world_size=WORLD)
    group = dist.new_group(list(range(WORLD)))
    if deep_ep.Buffer.get_low_latency_rdma_size_hint(P.max_tokens, P.hidden, WORLD,
                                                     P.num_experts) <= 0:
        fail("size hint", "-", "not positive")
    expect_raises("odd num_sms", ValueError, "even", lambda: deep_ep.Buffer.set_num_sms(23))
    # Without CUDA there is nothing to wait for; with it, a CUDA event.
    captured = deep_ep.Buffer.capture()
    want_event = torch.cuda.is_available() and torch.cuda.is_initialized()
    if not isinstance(captured.event, deep_ep.utils.EventHandle) or \
            (captured.event.event is not None) != want_event:
        fail("capture", "-", "want an EventHandle %s a CUDA event, got %r"
             % ("with" if want_event else "without", captured.event))
    captured.current_stream_wait()
    # DeepEP's later EventOverlap: a hook run (once) after the wait, its
    # result returned; wait(); `with ev(release_handle=True)` drops the event.
    ev = deep_ep.Buffer.capture()
    ev.register_hook_after_wait(lambda: "sorted")
    expect_raises("second hook", RuntimeError, "already registered",
                  lambda: ev.register_hook_after_wait(lambda: None))
    if ev.wait() != "sorted" or ev.current_stream_wait() is not None:
        fail("EventOverlap hook", "-", "want 'sorted' once, then None")
    with ev(release_handle=True):
        pass
    if ev.event is not None:
        fail("EventOverlap release_handle", "-", "the event outlived the with block")
    expect_raises("enable_shrink", NotImplementedError, "enable_shrink",
                  lambda: deep_ep.Buffer(group, enable_shrink=True))
    token_given = os.environ.get("MOE_EP_JOB_TOKEN")
    comm_buffer(group)  # first: no Buffer has agreed a token yet
    low_latency(group)
    default_group_buffer()
    token = os.environ.get("MOE_EP_JOB_TOKEN")
    if token_given is None and (token is None or len(token) != 32):
        fail("job token", "-", "the Buffer agreed no 32-character token: %r" % (token,))
    if token_given is not None and token != token_given:
        fail("job token", "-", "the Buffer replaced the given token")
    normal(group)
    auto_mode(group)
    first_batches_differ(group)
    worst_sizes_the_group(group)
    env_address(group)
    tokens_differ(group)
    dist.destroy_process_group()
    common.finish()


if __name__ == "__main__":
    main()
