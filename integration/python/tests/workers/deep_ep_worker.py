"""DeepEP-compatible Buffer through the opt-in `deep_ep` alias, on a
torch.distributed (gloo) group: LL bf16 and fp8 (DeepEP's shapes, dtypes,
column-major scales, handle tuple), combine bit-exact, the receive hook on
a second thread, arguments moe-ep refuses; normal mode (HT) layout,
dispatch and combine bit-exact."""
import threading

import numpy as np
import torch
import torch.distributed as dist

import common
import deep_ep
import deep_ep.utils
import moe_ep.deep_ep
import oracle
from common import RANK, WORLD, bits, bf16_tensor, same, fail, expect_raises

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


def expert_outputs(recv_x):
    scale = torch.tensor([float(oracle.expert_scale(RANK * P.local + l)) for l in range(P.local)])
    return (recv_x.float() * scale[:, None, None]).to(torch.bfloat16)


def low_latency(group):
    buf = deep_ep.Buffer(group, 0, 0, low_latency_mode=True, num_qps_per_rank=P.local,
                         allow_nvlink_for_low_latency_mode=True, explicitly_destroy=True,
                         moe_ep_config=HOST)
    inputs, x, idx, w = inputs_for(5)
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
    expect_raises("src_info", NotImplementedError, "src_info", lambda: handle[0].shape)
    event.current_stream_wait()
    out, event, hook = buf.low_latency_combine(expert_outputs(recv_x), idx, w, handle)
    same("deep_ep LL combine", 5, bits(out), oracle.ll_combine_at_combine(P, inputs[RANK]))

    # The receive hook, run on another thread (two-batch overlap).
    inputs, x, idx, w = inputs_for(6)
    recv_x, count, handle, _, hook = buf.low_latency_dispatch(
        x, idx, P.max_tokens, P.num_experts, use_fp8=False, return_recv_hook=True)
    t = threading.Thread(target=hook)
    t.start()
    t.join(120)
    check_ll_recv(6, inputs, recv_x, count)
    out, _, hook = buf.low_latency_combine(expert_outputs(recv_x), idx, w, handle,
                                           return_recv_hook=True)
    hook()
    same("deep_ep LL combine (hook)", 6, bits(out), oracle.ll_combine_at_combine(P, inputs[RANK]))

    # Zero-copy combine: the experts write into the buffer the combine reads.
    inputs, x, idx, w = inputs_for(11)
    recv_x, count, handle, _, _ = buf.low_latency_dispatch(
        x, idx, P.max_tokens, P.num_experts, use_fp8=False)
    y = buf.get_next_low_latency_combine_buffer(handle)
    if y.shape != recv_x.shape or y.dtype != torch.bfloat16:
        fail("deep_ep zero-copy buffer", 11, "%s %s" % (tuple(y.shape), y.dtype))
    y.copy_(expert_outputs(recv_x))
    out, _, _ = buf.low_latency_combine(y, idx, w, handle, zero_copy=True)
    same("deep_ep LL combine (zero copy)", 11, bits(out), oracle.ll_combine_at_combine(P, inputs[RANK]))
    expect_raises("zero_copy on another tensor", ValueError, "get_next_low_latency_combine_buffer",
                  lambda: buf.low_latency_combine(y.clone(), idx, w, handle, zero_copy=True))

    # use_fp8 switches per call on the same Buffer, as in DeepEP.
    inputs, x, idx, w = inputs_for(10)
    (q, scales), count, _, _, _ = buf.low_latency_dispatch(
        x, idx, P.max_tokens, P.num_experts, use_fp8=True)
    check_ll_recv(10, inputs, q, count, scales, packed=False)
    expect_raises("tokens cap", ValueError, "num_max_dispatch_tokens_per_rank=8",
                  lambda: buf.low_latency_dispatch(x[:4], idx[:4], 8, P.num_experts, use_fp8=False))
    expect_raises("logfmt", NotImplementedError, "use_logfmt",
                  lambda: buf.low_latency_combine(out, idx, w, handle, use_logfmt=True))
    expect_raises("mask", NotImplementedError, "rank masking",
                  lambda: buf.low_latency_update_mask_buffer(0, True))
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
        if scales.shape != (P.local, WORLD * P.max_tokens, cols) or scales.dtype != want_dtype \
                or scales.stride(1) != 1 or q.dtype != moe_ep.FP8_STORAGE:
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
    expect_raises("HT fp8 x", NotImplementedError, "x=",
                  lambda: buf.dispatch((x, x), topk_idx=idx, topk_weights=w))
    expect_raises("HT bias", NotImplementedError, "bias", lambda: buf.combine(y, handle, bias=y))
    buf.destroy()


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
    captured = deep_ep.Buffer.capture()  # no CUDA here: nothing to wait for
    if not isinstance(captured.event, deep_ep.utils.EventHandle) or captured.event.event is not None:
        fail("capture", "-", "want an EventHandle without a CUDA event, got %r" % captured.event)
    captured.current_stream_wait()
    expect_raises("enable_shrink", NotImplementedError, "enable_shrink",
                  lambda: deep_ep.Buffer(group, enable_shrink=True))
    low_latency(group)
    normal(group)
    dist.destroy_process_group()
    common.finish()


if __name__ == "__main__":
    main()
