"""The DeepEP-compatible Buffer on one real rank (host backend, in this
process): who runs the collective group_destroy (explicitly_destroy), and
a low-latency group that keeps num_max_dispatch_tokens_per_rank under
MOE_EP_MAX_TOKENS_PER_RANK while the normal-mode group takes it, and two
threads' first calls creating one group, normal-mode layouts kept per
thread, and pre-quantised scales of another shape refused before the
normal-mode dispatch exchanges anything."""
import gc
import re
import threading

import pytest
import torch

import moe_ep
from moe_ep import _rank_named
from moe_ep.deep_ep import Buffer
from moe_ep.deep_ep import buffer as buffer_module
from interleave import Runner, second_while_first_stopped, wait_for, watch_locks
from spawn import free_ports, library_path

E, H, K, N = 4, 128, 2, 8


@pytest.fixture
def lib(monkeypatch):
    """A library whose group_destroy calls are recorded (group pointers)."""
    monkeypatch.setenv("MOE_EP_RANK", "0")
    monkeypatch.setenv("MOE_EP_WORLD_SIZE", "1")
    for name in ("MOE_EP_MODE", "MOE_EP_MAX_TOKENS_PER_RANK", "MOE_EP_HT_MAX_TOKENS_PER_RANK",
                 "MOE_EP_BOOTSTRAP_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    lib = moe_ep.Library(library_path())
    lib.destroyed = []
    real = lib.group_destroy
    lib.real_group_destroy = real
    lib.group_destroy = lambda g: lib.destroyed.append(g) or real(g)
    return lib


def make_buffer(lib, explicitly_destroy):
    cfg = {"backend": "host", "bootstrap": {"address": "127.0.0.1:%d" % free_ports(1)[0]}}
    return Buffer(None, low_latency_mode=True, explicitly_destroy=explicitly_destroy,
                  moe_ep_config=cfg, library=lib)


def inputs(t=4):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn((t, H), generator=gen).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(t)])
    return x, idx, torch.rand((t, K), generator=gen)


def ll_round_trip(buf):
    """One LL dispatch and combine (creates the LL group); returns its pointer."""
    x, idx, w = inputs()
    recv_x, _, handle, _, _ = buf.low_latency_dispatch(x, idx, N, E, use_fp8=False)
    buf.low_latency_combine(recv_x, idx, w, handle)
    return buf.moe_ep_group.pointer


@pytest.mark.parametrize("explicitly_destroy", [True, False])
def test_gc_destroys_only_without_explicitly_destroy(lib, explicitly_destroy):
    """explicitly_destroy=True (vLLM's): dropping the Buffer leaves its group
    allocated, no collective from the garbage collector; False: the
    collection destroys it, as before."""
    buf = make_buffer(lib, explicitly_destroy)
    ptr = ll_round_trip(buf)
    del buf
    gc.collect()
    if explicitly_destroy:
        assert lib.destroyed == []
        lib.check(lib.real_group_destroy(ptr), "group_destroy")  # the test's own cleanup
    else:
        assert lib.destroyed == [ptr]


def test_destroy_runs_the_collective(lib):
    buf = make_buffer(lib, True)
    ptr = ll_round_trip(buf)
    buf.destroy()
    assert lib.destroyed == [ptr]
    del buf
    gc.collect()
    assert lib.destroyed == [ptr]


def test_max_tokens_override_sets_the_normal_mode_group_only(lib, monkeypatch):
    """Under MOE_EP_MAX_TOKENS_PER_RANK=8192 (above the low-latency range)
    the LL group still forms with num_max_dispatch_tokens_per_rank and
    dispatches; the normal-mode group takes 8192."""
    monkeypatch.setenv("MOE_EP_MAX_TOKENS_PER_RANK", "8192")
    buf = make_buffer(lib, True)
    ll_round_trip(buf)
    info = buf.moe_ep_group.config
    assert (info.mode, info.max_tokens_per_rank) == ("low_latency", N)
    x, idx, w = inputs(6)
    buf.get_dispatch_layout(idx, E)
    recv_x, _, _, _, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w)
    out, _, _ = buf.combine(recv_x, handle)
    assert torch.equal(out.view(torch.int16), x.view(torch.int16))  # one rank: the row itself
    ht = buf.moe_ep_normal_group.config
    assert (ht.mode, ht.max_tokens_per_rank) == ("high_throughput", 8192)
    buf.destroy()


def test_failures_name_the_rank(lib):
    """What the package raises itself names the rank, as the library's
    sentences do, and a sentence that names it already is left alone."""
    buf = make_buffer(lib, True)
    with pytest.raises(NotImplementedError, match=r"^rank 0: get_local_buffer_tensor"):
        buf.get_local_buffer_tensor()
    ll_round_trip(buf)
    x, idx, _ = inputs()
    with pytest.raises(ValueError, match=r"^rank 0: low_latency_dispatch: num_experts=5 differs"):
        buf.low_latency_dispatch(x, idx, N, E + 1, use_fp8=False)
    # A sentence that names this rank (the library's) keeps its own words.
    e = moe_ep.InvalidArgumentError("dispatch on rank 0: params->x is NULL")
    _rank_named._name(e, 0)
    assert str(e) == "dispatch on rank 0: params->x is NULL"
    buf.destroy()


def test_held_hooks_keep_busy(lib):
    """A third LL operation while the engine holds both earlier hooks is
    refused with BusyError and the group stays usable: the engine may still
    run those hooks, so nothing abandons them (an adapter's book abandons
    only receives an adapter holds for the engine). Once the blocking hook
    ran, the same operation goes through, and each hook's rows are its own
    call's."""
    buf = make_buffer(lib, True)
    ll_round_trip(buf)
    calls = [inputs(t) for t in (3, 5)]
    held = [buf.low_latency_dispatch(x, idx, N, E, use_fp8=False, return_recv_hook=True)
            for x, idx, _ in calls]
    x, idx, w = inputs()
    with pytest.raises(moe_ep.BusyError, match="run that hook first"):
        buf.low_latency_dispatch(x, idx, N, E, use_fp8=False)
    for (recv_x, count, _, _, hook), (cx, cidx, _) in zip(held, calls):
        hook()
        assert int(count.sum()) == cidx.numel(), \
            "a held hook received %d slots, want %d" % (int(count.sum()), cidx.numel())
    recv_x, _, handle, _, _ = buf.low_latency_dispatch(x, idx, N, E, use_fp8=False)
    out, _, _ = buf.low_latency_combine(recv_x, idx, w, handle)
    assert out.shape == x.shape
    buf.destroy()


def test_two_first_calls_create_one_group(lib, monkeypatch):
    """Two threads' first low-latency calls at once (two micro-batches):
    the first stops once it has found no group and is configuring one; the
    second then waits for that group instead of creating another (a second
    collective group_create on the same address), and both use it."""
    either = threading.Event()  # the second call returned, or waits for the first's group
    watch_locks(monkeypatch, buffer_module, either)
    buf = make_buffer(lib, True)
    created, create = [], lib.group_create
    lib.group_create = lambda *args: created.append(args) or create(*args)
    configuring, configure = threading.Event(), buf._config_for

    def config_for(mode, derived):
        if threading.current_thread() is first:
            configuring.set()
            wait_for(either, "the second first call returning or waiting")
        return configure(mode, derived)

    buf._config_for = config_for
    x, idx, _ = inputs()

    def first_call():  # what low_latency_dispatch does first: find or create the group
        return buf._ll_group("low_latency_dispatch", x, idx, N, E, False, False)[0]

    first = Runner(first_call)
    groups = second_while_first_stopped(first, first_call, configuring, either, "first call")
    assert len(created) == 1, "rank 0: two first calls created %d groups" % len(created)
    assert groups[0] is groups[1] is buf.moe_ep_group, "rank 0: the two calls got different groups"
    ll_round_trip(buf)
    buf.destroy()


def test_layouts_are_kept_per_thread(lib, monkeypatch):
    """Two micro-batch threads each call get_dispatch_layout, then dispatch
    the same topk_idx: each dispatch takes its own thread's prepared handle
    (one slot shared by both made both dispatches prepare again, count
    exchanges that ranks not interleaved this way do not make)."""
    buf = make_buffer(lib, True)
    x, idx, w = inputs(6)
    buf.get_dispatch_layout(idx, E)  # the first normal-mode dispatch makes the group
    recv_x, _, _, _, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w)
    buf.combine(recv_x, handle)
    g, prepared = buf.moe_ep_normal_group, []
    real = g.prepare
    monkeypatch.setattr(g, "prepare", lambda *a, **k: prepared.append(1) or real(*a, **k))
    calls = [inputs(6), inputs(5)]
    laid_out, go_on = threading.Event(), threading.Event()

    def other():
        xb, idxb, wb = calls[1]
        buf.get_dispatch_layout(idxb, E)
        laid_out.set()
        wait_for(go_on, "the first thread's dispatch and combine")
        recv, _, _, _, h, _ = buf.dispatch(xb, topk_idx=idxb, topk_weights=wb)
        return buf.combine(recv, h)[0], xb

    xa, idxa, wa = calls[0]
    buf.get_dispatch_layout(idxa, E)
    second = Runner(other)
    second.start()
    wait_for(laid_out, "the second thread's get_dispatch_layout")
    recv, _, _, _, h, _ = buf.dispatch(xa, topk_idx=idxa, topk_weights=wa)
    out_a = buf.combine(recv, h)[0]
    go_on.set()
    out_b, xb = second.outcome("the second thread")
    assert len(prepared) == 2, "rank 0: %d prepares for two layer calls, want 2" % len(prepared)
    for out, want in ((out_a, xa), (out_b, xb)):  # one rank: the row itself
        assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    buf.destroy()


def test_scales_of_another_shape_are_refused_before_prepare(lib, monkeypatch):
    """Any scale count other than hidden/128 float32, ceil(hidden/512)
    int32 or one float32 per token is refused with NotImplementedError
    naming the argument before prepare's count exchange runs, and the group
    stays usable."""
    buf = make_buffer(lib, True)
    x, idx, w = inputs(4)
    buf.get_dispatch_layout(idx, E)
    recv_x, _, _, _, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w)
    buf.combine(recv_x, handle)
    g, prepared = buf.moe_ep_normal_group, []
    real = g.prepare
    monkeypatch.setattr(g, "prepare", lambda *a, **k: prepared.append(1) or real(*a, **k))
    codes = torch.zeros((4, 1024), dtype=torch.uint8)  # hidden 1024: 8 float32 or 2 int32 scales
    for scales in (torch.ones((4, 2)), torch.ones(4, dtype=torch.int32), torch.ones((4, 1, 1)),
                   torch.ones((4, 1), dtype=torch.int32), torch.ones((4, 8), dtype=torch.int32)):
        with pytest.raises(NotImplementedError,
                           match=r"^rank 0: dispatch: x\[1\] \(scales\) of shape=%s is not "
                           r"supported" % re.escape(str(tuple(scales.shape)))):
            buf.dispatch((codes, scales), topk_idx=idx, topk_weights=w)
    assert prepared == [], "rank 0: %d prepares ran before the refusal" % len(prepared)
    recv_x, _, _, _, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w)
    out = buf.combine(recv_x, handle)[0]
    assert torch.equal(out.view(torch.int16), x.view(torch.int16)), "rank 0: the group after the refusals"
    buf.destroy()


def test_cached_dispatch_refuses_new_routing(lib):
    """dispatch(handle=h) repeats h's layout; a topk_idx or topk_weights
    given beside it would be ignored, so it is refused (DeepEP asserts
    the same), and the cached dispatch works without them."""
    buf = make_buffer(lib, True)
    x, idx, w = inputs(4)
    buf.get_dispatch_layout(idx, E)
    recv_x, _, _, _, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w)
    for name, kw in (("topk_idx", {"topk_idx": idx.flip(0)}),
                     ("topk_weights", {"topk_weights": w})):
        with pytest.raises(ValueError, match="rank 0: dispatch: %s is given with handle=" % name):
            buf.dispatch(x, handle=handle, **kw)
    again = buf.dispatch(x, handle=handle)[0]
    assert torch.equal(again.view(torch.int16), recv_x.view(torch.int16)), \
        "rank 0: the cached dispatch after the refusals"
    buf.combine(again, handle)
    buf.destroy()


def test_async_events_keep_the_operation_tensors():
    """With async_finish on a GPU the event keeps the operation's tensors
    alive until it is waited on, as DeepEP's does (None entries skipped);
    without async_finish, or off GPUs, there is no event and nothing kept."""
    from moe_ep.deep_ep.event import operation_event
    a, b = torch.ones(2), torch.zeros(3)
    ev = operation_event(True, True, a, None, b)
    assert ev.extra_tensors is not None and len(ev.extra_tensors) == 2
    assert ev.extra_tensors[0] is a and ev.extra_tensors[1] is b
    for args in ((False, True), (True, False)):
        ev = operation_event(*args, a, b)
        assert ev.event is None and ev.extra_tensors is None


def test_a_cap_out_of_range_names_deeps_argument(lib):
    """num_max_dispatch_tokens_per_rank above the low-latency range is
    refused with the library's sentence and the DeepEP argument it came
    from, in the size hint and in the call that creates the group."""
    want = (r"max_tokens_per_rank' = 2048 .* out of range for mode low_latency.*"
            r"DeepEP's num_max_dispatch_tokens_per_rank")
    with pytest.raises(moe_ep.ConfigError, match=want):
        Buffer.get_low_latency_rdma_size_hint(2048, H, 1, E)
    buf = make_buffer(lib, True)
    x, idx, _ = inputs(4)
    with pytest.raises(moe_ep.ConfigError, match="rank 0: .*" + want):
        buf.low_latency_dispatch(x, idx, 2048, E, use_fp8=False)
    buf.destroy()


def test_ll_handle_unpacked_before_its_hook_is_filled_by_the_hook(lib):
    """DeepEP's handle tensors exist once dispatch returns and its receive
    fills them: unpacked before the hook ran, moe-ep's are tensors the hook
    fills; after it, src_info names each expert's source tokens ascending
    (-1 past the count) and layout_range holds 0 << 32 | count (one rank)."""
    buf = make_buffer(lib, True)
    x, idx, w = inputs(5)
    recv_x, count, handle, _, hook = buf.low_latency_dispatch(x, idx, N, E, use_fp8=False,
                                                              return_recv_hook=True)
    src_info, layout_range, n, h, e = handle  # before the hook, as DeepEP allows
    assert (n, h, e) == (N, H, E)
    hook()
    for ex in range(E):
        tokens = [t for t in range(len(idx)) if ex in idx[t].tolist()]
        want = tokens + [-1] * (N - len(tokens))
        got = src_info[ex].tolist()
        assert got == want, "rank 0 expert %d: src_info %s, want %s" % (ex, got, want)
        assert layout_range[ex, 0].item() == len(tokens), \
            "rank 0 expert %d: layout_range %d, want %d" % (ex, layout_range[ex, 0].item(),
                                                           len(tokens))
    assert handle[0] is src_info, "rank 0: a second read gave other tensors"
    buf.low_latency_combine(recv_x, idx, w, handle)
    buf.destroy()


def test_library_refusals_name_deeps_arguments(lib):
    """A tensor the library refuses is named as the DeepEP call named it
    (low_latency_combine's x, not the library's params->y), under the
    DeepEP entry; the value and the rule stay the library's, and the
    group stays usable after each refusal."""
    buf = make_buffer(lib, True)
    x, idx, w = inputs()
    recv_x, _, handle, _, _ = buf.low_latency_dispatch(x, idx, N, E, use_fp8=False)
    ll_cases = (
        (r"low_latency_dispatch: x has dtype \(code=2, bits=32, lanes=1\) = float32; it must "
         r"be bf16", lambda: buf.low_latency_dispatch(x.float(), idx, N, E, use_fp8=False)),
        (r"low_latency_dispatch: topk_idx has dtype .* = float32; it must be int32 or int64",
         lambda: buf.low_latency_dispatch(x, idx.float(), N, E, use_fp8=False)),
        (r"low_latency_dispatch: topk_idx\[0\]\[0\]=%d is not an expert id" % (E + 3),
         lambda: buf.low_latency_dispatch(x, torch.full_like(idx, E + 3), N, E, use_fp8=False)),
        (r"low_latency_combine: x has dtype .* = float32; it must be bf16",
         lambda: buf.low_latency_combine(recv_x.float(), idx, w, handle)),
        (r"low_latency_combine: topk_weights has dtype \(code=2, bits=16, lanes=1\) = float16; "
         r"it must be float32", lambda: buf.low_latency_combine(recv_x, idx, w.half(), handle)),
        (r"low_latency_combine: out has shape \[3, %d\]; it must be \[4, %d\]" % (H, H),
         lambda: buf.low_latency_combine(recv_x, idx, w, handle,
                                         out=torch.empty((3, H), dtype=torch.bfloat16))),
    )
    for pattern, call in ll_cases:
        with pytest.raises(moe_ep.InvalidArgumentError, match=r"^(rank 0: )?" + pattern) as e:
            call()
        assert "params->" not in str(e.value), "rank 0: %s" % e.value
    out = buf.low_latency_combine(recv_x, idx, w, handle)[0]
    want = (w.sum(dim=1, keepdim=True) * x.float()).to(torch.bfloat16)  # one rank, every slot here
    assert torch.allclose(out.float(), want.float(), rtol=2e-2, atol=2e-2), \
        "rank 0: the LL round trip after the refusals"
    buf.get_dispatch_layout(idx, E)
    for pattern, call in (
            (r"dispatch: topk_weights has shape \[4, 1\]; it must be \[4, %d\]" % K,
             lambda: buf.dispatch(x, topk_idx=idx, topk_weights=w[:, :1])),
            (r"dispatch: x has dtype .* = float32; it must be",
             lambda: buf.dispatch(x.float(), topk_idx=idx, topk_weights=w))):
        with pytest.raises(moe_ep.InvalidArgumentError, match=r"^(rank 0: )?" + pattern) as e:
            call()
        assert "params->" not in str(e.value), "rank 0: %s" % e.value
    recv_x, _, _, _, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w)
    for pattern, y in ((r"combine: x\.shape\[-1\]=%d differs from the dispatch's hidden=%d"
                        % (H // 2, H), recv_x[:, :H // 2].contiguous()),
                       (r"combine: x has dtype .* = float32; it must be bf16", recv_x.float())):
        with pytest.raises(moe_ep.InvalidArgumentError, match=r"^(rank 0: )?" + pattern):
            buf.combine(y, handle)
    out = buf.combine(recv_x, handle)[0]
    assert torch.equal(out.view(torch.int16), x.view(torch.int16)), \
        "rank 0: the normal-mode round trip after the refusals"
    buf.destroy()


def test_reworded_keeps_the_rank_and_leaves_other_sentences():
    """The renaming keeps a leading "rank N: " and renames only the fields
    of its table; a sentence naming none of them is not touched."""
    from moe_ep.deep_ep._arg_names import COMBINE, reworded
    assert reworded("rank 3: combine: params->y has shape [1]; it must be [2]", "combine",
                    COMBINE) == "rank 3: combine: x has shape [1]; it must be [2]"
    assert reworded("combine: rank 1 failed: params->out is NULL", "combine", COMBINE) is None
    assert reworded("combine: timed out after 30000 ms waiting for rank 1", "combine",
                    COMBINE) is None


def test_normal_dispatch_event_keeps_the_ids_it_returns(lib, monkeypatch):
    """The event a normal dispatch returns is recorded after the received
    ids take DeepEP's dtype (int64 here, the library's int32), so a stream
    that waits on it reads them complete, and it keeps them alive; the
    handle, not DeepEP's tuple, says so when indexed."""
    from moe_ep.deep_ep import _normal as normal
    kept = []
    real = normal.operation_event
    monkeypatch.setattr(normal, "operation_event",
                        lambda af, cuda, *ts: kept.append(ts) or real(af, cuda, *ts))
    buf = make_buffer(lib, True)
    x, idx, w = inputs(4)
    buf.get_dispatch_layout(idx, E)
    recv_x, recv_idx, _, _, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w,
                                                     async_finish=True)
    assert recv_idx.dtype == torch.int64
    assert any(t is recv_idx for t in kept[-1]), \
        "rank 0: the dispatch's event was recorded before its returned recv_topk_idx was made"
    with pytest.raises(NotImplementedError, match=r"handle\[0\]: index=0 is not supported by "
                                                  r"moe-ep: moe-ep's normal-mode handle holds no "
                                                  r"prefix matrices"):
        handle[0]
    buf.combine(recv_x, handle)
    buf.destroy()
