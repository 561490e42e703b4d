"""High-throughput dispatch and combine. The receive count reaches the host
only with the receive (num_recv_tokens), so outputs are sized by capacity
and returned as views of the valid rows; with worst_case they are returned
whole (fixed size, no count needed). Rows are bf16, or fp8 the caller
quantised (x_scales), carried verbatim."""
import ctypes

import torch

from . import _abi
from ._calls import Calls, hidden_of, split_x
from ._results import DispatchResult
from ._torch import FP8_STORAGE, TensorSlot
from .errors import UnsupportedError
from .handle import Hook


def scale_format(x, x_scales, fmt):
    """The call's format: the caller's, else for an fp8 x the scales'
    (f32 and UE8M0 scales travel alike: as f32; one f32 column is one
    scale per token unless H is 128, where the two formats are the same
    bytes). Anything else is left to the library, whose sentence names the
    rule."""
    if fmt is not None:
        if fmt not in _abi.FORMATS:
            raise ValueError("dispatch: format=%r must be one of %s"
                             % (fmt, ", ".join(repr(f) for f in _abi.FORMATS)))
        return fmt
    if x_scales is None or getattr(x, "dtype", None) not in (torch.uint8, FP8_STORAGE):
        return None
    if x_scales.dtype == torch.int32:
        return "fp8_ue8m0_packed"
    if x_scales.dim() == 2 and x_scales.shape[1] == 1 and x.dim() == 2 and x.shape[1] != 128:
        return "fp8_per_token"
    return "fp8"


def check_format_supported(lib, fmt):
    """A format the loaded library predates is refused here, naming the
    version it needs (the library itself would say only that the value is
    out of range)."""
    since = _abi.FORMAT_SINCE.get(fmt)
    if since is not None and tuple(lib.version[:2]) < since:
        raise UnsupportedError(
            "dispatch: format=%r needs moe-ep %d.%d or later; the library '%s' is version "
            "%d.%d.%d"
            % ((fmt,) + since + (lib.path,) + tuple(lib.version)), "dispatch")


class HighThroughputCalls(Calls):
    def __init__(self, group):
        super().__init__(group)
        self.capacity = group.world_size * group.config.max_tokens_per_rank
        self.recv_idx = TensorSlot("recv_topk_idx", False, self.dp, "recv_topk_idx")
        self.recv_w = TensorSlot("recv_topk_weights", False, self.dp, "recv_topk_weights")

    def new_outputs(self, hidden, k, cap, x_scales):
        rs = None
        if x_scales is not None:
            cols = x_scales.shape[-1] if x_scales.dim() else 0
            rs = torch.empty((cap, cols), dtype=x_scales.dtype, device=self.device)
        rx = (self.empty_fp8 if x_scales is not None else self.empty_bf16).new_empty((cap, hidden))
        return (rx, self.empty_i32.new_empty((cap, k)), self.empty_f32.new_empty((cap, k)),
                self.empty_i32.new_empty(self.local_shape), rs)

    def dispatch(self, handle, x, topk_weights, out, defer, round_scale, recv_capacity, fmt,
                 x_scales=None, worst_case=False):
        if round_scale:
            raise NotImplementedError("dispatch: round_scale=True: high_throughput dispatch never "
                                      "quantises (pass x already quantised, with x_scales)")
        x, x_scales = split_x(x, x_scales)
        fmt = scale_format(x, x_scales, fmt)
        check_format_supported(self.lib, fmt)
        hidden = hidden_of(x, "x")
        if out is None:
            cap = self.capacity if recv_capacity is None else int(recv_capacity)
            out = self.new_outputs(hidden, handle.top_k, cap, x_scales)
        elif isinstance(out, DispatchResult):
            out = out.buffers
        if len(out) == 4:
            out = tuple(out) + (None,)
        rx, ri, rw, rc, rs = out
        # A CUDA group's worst-case dispatch reports no count: no host sync.
        count = not (worst_case and self.group_ref()._is_cuda)
        n = ctypes.c_int64(-1)
        p = self.dp
        p.flags = (_abi.FLAG_DEFER_RECV if defer else 0) | (_abi.FLAG_WORST_CASE if worst_case else 0)
        p.hidden = hidden
        p.format = _abi.FORMATS[fmt]
        self.x.attach(x)
        self.x_scales.attach(x_scales)
        self.dw.attach(topk_weights)
        self.recv_x.attach(rx)
        self.recv_scales.attach(rs)
        self.recv_idx.attach(ri)
        self.recv_w.attach(rw)
        self.recv_count.attach(rc)
        p.num_recv_tokens = ctypes.pointer(n) if count else None
        p.stream = stream = self.stream()  # (a c_void_p field reads 0 as None)
        hook = self.call_dispatch(handle)
        handle.recv_count = rc
        handle.dispatch_weights = topk_weights
        handle.hidden = hidden
        res = DispatchResult(None, None, rc, buffers=out)

        def finish():
            res.num_recv_tokens = n.value if count else None
            if worst_case or n.value == rx.shape[0]:  # whole: no views to make
                res.recv_x, res.recv_topk_idx, res.recv_topk_weights, res.recv_scales = \
                    rx, ri, rw, rs
                return
            rows = n.value
            res.recv_x, res.recv_topk_idx, res.recv_topk_weights = rx[:rows], ri[:rows], rw[:rows]
            res.recv_scales = rs[:rows] if rs is not None else None

        if defer:
            return Hook(self.group_ref(), hook, res, finish=finish,
                        keep=(handle, x, x_scales, topk_weights, n),
                        sent_on=stream)
        finish()
        return res

    def combine(self, handle, y, topk_weights, out, defer):
        if topk_weights is not None:
            raise ValueError("combine: topk_weights must be None in high_throughput mode: the "
                             "partials y are already weighted and are summed over ranks")
        return super().combine(handle, y, None, out, defer)
