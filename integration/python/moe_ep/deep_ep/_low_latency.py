"""Buffer's low-latency entries (DeepEP's low_latency_dispatch/combine) on
a moe-ep LL group, with DeepEP's shapes, dtypes and layouts."""
import operator
import threading

import torch

from .. import _fp8
from .._dropped import group_dropped_hooks
from .._overlap import on_send_stream
from .event import operation_event
from ._arg_names import LOW_LATENCY_COMBINE, LOW_LATENCY_DISPATCH, in_deepep_words
from ._refuse import refuse as _refuse

# (use_fp8, use_ue8m0) -> the call's moe-ep row format. DeepEP packs UE8M0
# scales as int32 [E_local, R*N, H/512], moe-ep's "fp8_ue8m0_packed".
_FORMATS = {
    (False, False): "bf16",
    (False, True): "bf16",  # UE8M0 names fp8 scales: bf16 rows have none
    (True, False): "fp8",
    (True, True): "fp8_ue8m0_packed",
}



def _check_stats(entry, stats, local_experts, device):
    """cumulative_local_expert_recv_stats is added to after the receive, so
    checked before anything is sent (as DeepEP checks it before launching):
    [num_local_experts] int32, contiguous, on x's device."""
    if stats is None:
        return
    ok = (isinstance(stats, torch.Tensor) and stats.dtype == torch.int32 and stats.dim() == 1
          and stats.shape[0] == local_experts and stats.is_contiguous()
          and stats.device == device)
    if not ok:
        got = ("%s %s on %s%s" % (tuple(stats.shape), stats.dtype, stats.device,
                                  "" if stats.is_contiguous() else ", not contiguous")
               if isinstance(stats, torch.Tensor) else type(stats).__name__)
        raise ValueError("%s: cumulative_local_expert_recv_stats is %s; it must be a contiguous "
                         "[num_local_experts=%d] torch.int32 tensor on x's device (%s)"
                         % (entry, got, local_experts, device))

class LowLatencyHandle(tuple):
    """DeepEP's LL handle tuple (src_info, layout_range, N, H, E); the moe-ep
    handle that routes the combine rides along as `.moe_ep`.

    src_info [E_local, R*N] int32 and layout_range [E_local, R] int64 come
    from the library (Group.handle_layout) on first access, by index or by
    unpacking, and are kept: a dispatch whose handle nobody reads pays
    nothing for them. Read before a later dispatch reuses the dispatch's
    buffer set (Group.handle_layout: the next dispatch once this one was
    combined), as DeepEP's own tests do right after dispatch. Read before
    the receive hook ran (return_recv_hook=True), they are tensors the
    hook fills on its stream when it runs, as DeepEP's receive fills its
    own."""

    def __new__(cls, group, ep_handle, n, hidden, num_experts, received=True):
        self = super().__new__(cls, (None, None, n, hidden, num_experts))
        self.moe_ep = ep_handle
        self._group = group
        self._layout = None
        # The hook may run on another thread while this one reads the handle.
        self._lock = threading.Lock()
        self._received = received  # the dispatch's receive has run
        self._fill_on_receive = False
        return self

    def _slot_layout(self):
        with self._lock:
            if self._layout is None:
                if self._received:
                    self._layout = self._group.handle_layout(self.moe_ep)
                else:
                    g = self._group
                    slots = g.world_size * g.config.max_tokens_per_rank
                    self._layout = (
                        torch.empty((g.num_local_experts, slots), dtype=torch.int32,
                                    device=g.device),
                        torch.empty((g.num_local_experts, g.world_size), dtype=torch.int64,
                                    device=g.device))
                    self._fill_on_receive = True
            return self._layout

    def _receive_ran(self):
        """Called by the hook after its receive: fills a layout handed out
        before it (on the hook's stream)."""
        with self._lock:
            self._received = True
            if self._fill_on_receive:
                self._group.handle_layout(self.moe_ep, *self._layout)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(len(self))))
        j = operator.index(i)
        if j < 0:
            j += len(self)
        if j in (0, 1):
            return self._slot_layout()[j]
        return tuple.__getitem__(self, i)

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __repr__(self):
        return "LowLatencyHandle(src_info, layout_range, %d, %d, %d)" % tuple.__getitem__(
            self, slice(2, 5))


class LowLatencyMixin:

    def _ll_group(self, entry, x, topk_idx, n, num_experts, use_fp8, use_ue8m0):
        if not self.low_latency_mode:
            raise RuntimeError("%s: this Buffer was created with low_latency_mode=False" % entry)
        fmt = _FORMATS[(bool(use_fp8), bool(use_ue8m0))]
        # bf16 buffers hold every format, so use_fp8 / use_ue8m0 can change
        # from call to call, as in DeepEP (moe_ep_config may still pin fp8).
        g = self._group_for("low_latency", {
            "num_experts": int(num_experts), "hidden": int(x.shape[-1]),
            "top_k": int(topk_idx.shape[-1]), "max_tokens_per_rank": int(n),
            "dispatch_dtype": "bf16", "fp8_scale": "f32"})
        cfg = g.config
        if n != cfg.max_tokens_per_rank:
            raise ValueError("%s: num_max_dispatch_tokens_per_rank=%d differs from the group's "
                             "max_tokens_per_rank=%d (fixed by the first call or moe_ep_config)"
                             % (entry, n, cfg.max_tokens_per_rank))
        if num_experts != cfg.num_experts:
            raise ValueError("%s: num_experts=%d differs from the group's num_experts=%d"
                             % (entry, num_experts, cfg.num_experts))
        if not use_fp8 and cfg.dispatch_dtype != "bf16":
            _refuse(entry, "use_fp8", False, "moe_ep_config pins dispatch_dtype %s, whose buffers "
                    "hold fp8 rows only" % cfg.dispatch_dtype)
        return g, fmt

    @in_deepep_words("low_latency_dispatch", LOW_LATENCY_DISPATCH)
    def low_latency_dispatch(self, x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts,
                             cumulative_local_expert_recv_stats=None,
                             dispatch_wait_recv_cost_stats=None, use_fp8=True, round_scale=False,
                             use_ue8m0=False, async_finish=False, return_recv_hook=False,
                             use_nvfp4=False, x_global_scale=None):
        """Returns (recv_x or (recv_x_fp8, scales), recv_count, handle, event,
        hook). scales are the column-major view DeepEP returns (a copy of
        the library's row-major scales, made when the receive completes).
        use_nvfp4 / x_global_scale (NVFP4 rows, which engines ask for on
        Blackwell) are named so that asking for them is refused clearly."""
        entry = "low_latency_dispatch"
        if use_nvfp4:
            _refuse(entry, "use_nvfp4", True, "rows travel as bf16 or fp8 e4m3")
        if x_global_scale is not None:
            _refuse(entry, "x_global_scale", "<tensor>", "it scales NVFP4 rows, which moe-ep "
                    "does not send")
        if dispatch_wait_recv_cost_stats is not None:
            _refuse(entry, "dispatch_wait_recv_cost_stats", "<tensor>",
                    "per-rank wait-time statistics are not collected")
        if async_finish and return_recv_hook:
            raise ValueError("%s: async_finish and return_recv_hook cannot both be True" % entry)
        if use_fp8 and use_ue8m0 and not round_scale:
            raise ValueError("%s: use_ue8m0=True needs round_scale=True (UE8M0 scales are "
                             "powers of two)" % entry)
        g, fmt = self._ll_group(entry, x, topk_idx, num_max_dispatch_tokens_per_rank,
                                num_experts, use_fp8, use_ue8m0)
        _check_stats(entry, cumulative_local_expert_recv_stats, g.num_local_experts,
                     x.device)
        handle = g.prepare(topk_idx)
        try:
            # Not recorded: the engine holds the hook and may still run it.
            res = group_dropped_hooks(g).send(
                lambda: g.dispatch(handle, x, defer=return_recv_hook,
                                   round_scale=bool(round_scale), format=fmt), record=False)
        except BaseException:  # the handle now, not whenever the traceback goes
            handle.free()
            raise
        if return_recv_hook:
            ep_hook, res = res, res.result
        scales_cm = _fp8.column_major_like(res.recv_scales)
        stats = cumulative_local_expert_recv_stats

        def finish():
            if scales_cm is not None:
                scales_cm.copy_(res.recv_scales)
            if stats is not None:
                stats.add_(res.recv_count)

        ll_handle = LowLatencyHandle(g, handle, num_max_dispatch_tokens_per_rank,
                                     int(x.shape[-1]), num_experts,
                                     received=not return_recv_hook)
        hook = None
        if return_recv_hook:
            def receive():
                ep_hook()
                finish()
                ll_handle._receive_ran()
            hook = on_send_stream(g, receive)
        else:
            finish()
        self._zero_copy.pass_turn()
        recv_x = (res.recv_x, scales_cm) if scales_cm is not None else res.recv_x
        event = operation_event(async_finish, g._is_cuda, x, topk_idx, res.recv_x, scales_cm,
                                res.recv_count)
        return recv_x, res.recv_count, ll_handle, event, hook

    @in_deepep_words("low_latency_combine", LOW_LATENCY_COMBINE)
    def low_latency_combine(self, x, topk_idx, topk_weights, handle, use_logfmt=False,
                            zero_copy=False, async_finish=False, return_recv_hook=False,
                            out=None, combine_wait_recv_cost_stats=None, overlap=False,
                            packed_recv_count=None, comp_signal=None, block_m=64, threshold=0,
                            num_sms=0, src_signals=None, src_signal_expect_value=0):
        """Returns (combined_x [T, H] bf16, event, hook); the weights are
        applied inside combine (per rank a bf16 partial of its slots in k
        order, the partials summed in f32: README's order).
        overlap and the arguments after it are SGLang's single-batch
        overlap, where the combine starts sending while the experts' GEMM
        still writes x, following per-block signals: overlap=True, or a
        comp_signal / src_signals tensor, is refused. Without overlap the
        rest (packed_recv_count, block_m, threshold, num_sms) only tune that
        mode's kernel and are accepted as SGLang passes them; moe-ep's LL
        kernels size their grid themselves."""
        entry = "low_latency_combine"
        if overlap:
            _refuse(entry, "overlap", True, "the combine starts after x is complete; "
                    "single-batch overlap's per-block signals are not read")
        for name, value in (("comp_signal", comp_signal), ("src_signals", src_signals)):
            if value is not None:
                _refuse(entry, name, "<tensor>", "single-batch overlap's per-block signals "
                        "are not read")
        if use_logfmt:
            _refuse(entry, "use_logfmt", True, "combine sends bf16 rows")
        turns = self._zero_copy
        if zero_copy:
            x = turns.source(entry, x)
        if combine_wait_recv_cost_stats is not None:
            _refuse(entry, "combine_wait_recv_cost_stats", "<tensor>",
                    "per-rank wait-time statistics are not collected")
        if async_finish and return_recv_hook:
            raise ValueError("%s: async_finish and return_recv_hook cannot both be True" % entry)
        if not isinstance(handle, LowLatencyHandle):
            raise TypeError("%s: handle must be the handle low_latency_dispatch returned, got %s"
                            % (entry, type(handle).__name__))
        ep_handle = handle.moe_ep
        # The combine is routed by the handle (the dispatch's topk_idx);
        # engines may pass a copy of the same ids (vLLM maps logical to
        # physical expert ids afresh for each call), so only the shape is
        # checked: reading the values would cost a device sync.
        if tuple(topk_idx.shape) != tuple(ep_handle.topk_idx.shape):
            raise ValueError("%s: topk_idx is %s but this handle's dispatch routed %s; moe-ep "
                             "routes the combine by the dispatch's topk_idx, which topk_idx must "
                             "repeat" % (entry, tuple(topk_idx.shape),
                                         tuple(ep_handle.topk_idx.shape)))
        g = self._live_group("low_latency", entry)
        result = group_dropped_hooks(g).send(
            lambda: g.combine(ep_handle, x, topk_weights=topk_weights, out=out,
                              defer=return_recv_hook), record=False)
        turns.pass_turn()
        hook = None
        if return_recv_hook:
            hook, result = on_send_stream(g, result), result.result
        event = operation_event(async_finish, g._is_cuda, x, topk_idx, topk_weights, result)
        return result, event, hook

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank, hidden, num_experts):
        """moe-ep's signals carry a per-operation epoch, so its buffers need
        no cleaning between layouts: this checks the sizes only."""
        self._check_live("clean_low_latency_buffer")
        g = self._ll_ep
        if g is None:
            return
        if num_max_dispatch_tokens_per_rank != g.config.max_tokens_per_rank or \
                num_experts != g.config.num_experts or hidden > g.config.hidden:
            raise ValueError(
                "clean_low_latency_buffer: (num_max_dispatch_tokens_per_rank=%d, hidden=%d, "
                "num_experts=%d) do not fit the group (max_tokens_per_rank=%d, hidden<=%d, "
                "num_experts=%d)" % (num_max_dispatch_tokens_per_rank, hidden, num_experts,
                                     g.config.max_tokens_per_rank, g.config.hidden,
                                     g.config.num_experts))

    def get_next_low_latency_combine_buffer(self, handle):
        """[E_local, R*N, H] bf16: where the experts may write their outputs
        for the next low_latency_combine(..., zero_copy=True). moe-ep's
        combine reads its input in place (the send half stores straight from
        it into the peers' windows), so the experts' output is never copied
        on the way. Two buffers take turns as DeepEP's do: every LL dispatch
        and combine passes the turn, and until then every call returns the
        same buffer, so two micro-batches whose operations alternate write
        different ones."""
        entry = "get_next_low_latency_combine_buffer"
        if not isinstance(handle, LowLatencyHandle):
            raise TypeError("%s: handle must be the handle low_latency_dispatch returned, got %s"
                            % (entry, type(handle).__name__))
        g = self._live_group("low_latency", entry)
        shape = (g.num_local_experts, g.world_size * g.config.max_tokens_per_rank, handle[3])
        return self._zero_copy.current(shape, g.device)

    def low_latency_update_mask_buffer(self, rank_to_mask, mask=False):
        _refuse("low_latency_update_mask_buffer", "rank_to_mask", rank_to_mask,
                "rank masking is not available")

    def low_latency_query_mask_buffer(self, mask_status):
        _refuse("low_latency_query_mask_buffer", "mask_status", "<tensor>",
                "rank masking is not available")

    def low_latency_clean_mask_buffer(self):
        _refuse("low_latency_clean_mask_buffer", "mask", None, "rank masking is not available")


class CombineBuffers:
    """The two zero-copy combine buffers and whose turn it is (DeepEP's
    low_latency_buffer_idx): get_next_low_latency_combine_buffer hands out
    the current one, a zero_copy combine reads it, and each LL dispatch or
    combine passes the turn."""

    def __init__(self):
        self._lock = threading.Lock()
        self._bufs = ()
        self._turn = 0

    def current(self, shape, device):
        with self._lock:
            if not self._bufs or tuple(self._bufs[0].shape) != shape:
                self._bufs = tuple(torch.empty(shape, dtype=torch.bfloat16, device=device)
                                   for _ in range(2))
            return self._bufs[self._turn]

    def pass_turn(self):
        with self._lock:
            self._turn ^= 1

    def source(self, entry, x):
        """The buffer a zero_copy combine reads: the current one, which x
        (DeepEP's callers pass the experts' output or the buffer itself)
        must match in shape. x being the other buffer means it was handed
        out before the last LL operation passed the turn: refused, since
        DeepEP would read the current one and combine stale rows."""
        with self._lock:
            if not self._bufs:
                raise ValueError("%s: zero_copy=True but get_next_low_latency_combine_buffer "
                                 "was never called on this Buffer, so no buffer holds the "
                                 "experts' output" % entry)
            cur, other = self._bufs[self._turn], self._bufs[self._turn ^ 1]
        if x is not cur and x.data_ptr() == other.data_ptr():
            raise ValueError("%s: zero_copy=True with x the combine buffer handed out before the "
                             "last low-latency dispatch or combine passed the turn; the combine "
                             "reads the buffer get_next_low_latency_combine_buffer returns now "
                             "(ask for it after the dispatch, right before its combine)" % entry)
        if tuple(x.shape) != tuple(cur.shape):
            raise ValueError("%s: zero_copy=True with x of shape %s, but the combine buffer is %s "
                             "([num_local_experts, num_ranks * num_max_dispatch_tokens_per_rank, "
                             "hidden])" % (entry, tuple(x.shape), tuple(cur.shape)))
        return cur
