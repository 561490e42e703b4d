"""The vLLM adapter called from two threads at once (two micro-batches,
as its class allows): a prepare gives up the operation dispatched first
whatever order the threads record theirs in, a prepare waits for another
thread's turn within the adapter's bound, and a receiver called from two
threads fills its cache once. One real rank on the host backend, in this
process; the interleavings are forced (interleave)."""
import threading

import pytest
import torch

import moe_ep
import moe_ep.vllm
from moe_ep.vllm import _received, prepare_finalize
from interleave import Runner, second_while_first_stopped, wait_for, watch_locks

E, H, K, T = 4, 128, 2, 6


class PerTensorFp8:
    """vLLM's quant_config for fp8 activations quantised after the receive."""
    quant_dtype = moe_ep.FP8_STORAGE
    per_act_token_quant = False
    block_shape = None
    a1_scale = None


def make_group(one_rank_group, mode):
    return one_rank_group(mode=mode, num_experts=E, hidden=H, top_k=K, max_tokens_per_rank=16)


def layer_call(seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((T, H), generator=gen).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)])
    return x, torch.rand((T, K), generator=gen), ids


def prepare_async(pf, call, quant_config=None):
    x, w, ids = call
    return pf.prepare_async(x, w, ids, E, None, False, quant_config)


def finalize_ll(pf, call, a1q):
    """The combine of experts that return their rows unchanged: one rank,
    so each token comes back as its row times the sum of its weights."""
    x, w, ids = call
    out = torch.empty_like(x)
    pf.finalize(out, a1q, w, ids, False, None)
    want = (x.float() * w.sum(1, keepdim=True)).to(torch.bfloat16)
    assert torch.allclose(out.float(), want.float(), rtol=2e-2, atol=2e-2), \
        "rank 0: the finalize returned rows that are not its own call's"


def test_prepare_gives_up_the_operation_dispatched_first(one_rank_group, monkeypatch):
    """Micro-batch 0 dispatches first, but stops before recording its
    operation; micro-batch 1's prepare comes meanwhile. Micro-batch 0 is
    then dropped (its layer call raised before finalize), so the next
    prepare finds two operations in flight and must give up micro-batch
    0's, whose buffer set its own dispatch overwrites, not micro-batch
    1's, whose receive and finalize are still to come."""
    either = threading.Event()  # micro-batch 1's prepare returned, or waits for micro-batch 0's
    watch_locks(monkeypatch, prepare_finalize, either)
    pf = moe_ep.vllm.PrepareAndFinalize(make_group(one_rank_group, "low_latency"))
    calls = [layer_call(seed) for seed in (1, 2, 3)]
    dispatched = threading.Event()
    record = pf._inflight.add

    def add(op, *tensors):
        if threading.current_thread() is mb0:
            dispatched.set()  # its dispatch went out; its operation is not recorded yet
            wait_for(either, "micro-batch 1's prepare returning or waiting")
        record(op, *tensors)

    monkeypatch.setattr(pf._inflight, "add", add)
    mb0 = Runner(lambda: prepare_async(pf, calls[0]))
    # Micro-batch 0's op is dropped: never received, never finalized.
    _, (_, receiver1) = second_while_first_stopped(
        mb0, lambda: prepare_async(pf, calls[1]), dispatched, either, "micro-batch's prepare")
    _, receiver2 = prepare_async(pf, calls[2])  # finds both in flight: gives one up
    finalize_ll(pf, calls[1], receiver1()[0])
    finalize_ll(pf, calls[2], receiver2()[0])


def test_prepare_waits_for_the_turn_within_the_bound(one_rank_group):
    """A prepare that another thread's prepare keeps out of its turn past
    the adapter's wait bound raises moe_ep.TimeoutError naming the rank,
    the wait and the bound, and leaves the adapter usable."""
    pf = moe_ep.vllm.PrepareAndFinalize(make_group(one_rank_group, "low_latency"))
    pf._bound_s = 0.05  # the wait below cannot end before it: the turn stays held
    assert pf._turn.acquire(blocking=False)  # another thread's prepare, stuck inside its turn
    try:
        with pytest.raises(moe_ep.TimeoutError) as e:
            prepare_async(pf, layer_call(1))
    finally:
        pf._turn.release()
    assert str(e.value).startswith(
        "rank 0: prepare: another thread's prepare on this PrepareAndFinalize held its turn "
        "(from giving up stale operations to recording its dispatch) for more than 0 s "
        "(bootstrap.timeout_ms"), str(e.value)
    assert len(pf._inflight) == 0, "rank 0: a prepare that timed out left an operation in flight"
    call = layer_call(2)
    _, receiver = prepare_async(pf, call)
    finalize_ll(pf, call, receiver()[0])


@pytest.mark.parametrize("mode", ["low_latency", "high_throughput"])
def test_receiver_called_from_two_threads_fills_once(one_rank_group, monkeypatch, mode):
    """The first call of a receiver stops while it fills its cache (LL:
    quantising the received rows; HT: mapping the ids to global ones); a
    second call from another thread meanwhile waits for that cache
    instead of reading it half filled or filling it again, and both get
    the same tensors."""
    either = threading.Event()  # the second call returned, or waits for the first's fill
    watch_locks(monkeypatch, prepare_finalize, either)
    ll = mode == "low_latency"
    pf = moe_ep.vllm.PrepareAndFinalize(make_group(one_rank_group, mode))
    call = layer_call(4)
    hook, receiver = prepare_async(pf, call, PerTensorFp8() if ll else None)
    hook()  # the receive ran: the two calls below share only what the receiver makes of it
    owner, name = (_received, "batched") if ll else (pf, "_global_ids")
    real, filled, fills = getattr(owner, name), threading.Event(), []

    def fill(*args):
        fills.append(threading.current_thread().name)
        if threading.current_thread() is first:
            filled.set()
            wait_for(either, "the second receiver call returning or waiting")
        return real(*args)

    monkeypatch.setattr(owner, name, fill)
    first = Runner(receiver)
    got = second_while_first_stopped(first, receiver, filled, either, "receiver call")
    assert len(fills) == 1, "rank 0: the receiver's cache was filled %d times" % len(fills)
    for i in (0, 1, 3, 4):  # a1q, its scales, the ids and weights (HT); not the new meta
        assert got[0][i] is got[1][i], "rank 0: the two calls got different item %d" % i
    x, w, ids = call
    if ll:
        pf.finalize(torch.empty_like(x), torch.zeros(got[0][0].shape, dtype=torch.bfloat16), w,
                    ids, False, None)
    else:
        pf.finalize(torch.empty_like(x), torch.zeros((len(got[0][3]), H), dtype=torch.bfloat16),
                    got[0][4], got[0][3], False, None)
