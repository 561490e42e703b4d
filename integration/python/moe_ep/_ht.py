"""High-throughput dispatch and combine. The receive count reaches the host
only with the receive (num_recv_tokens), so outputs are sized by capacity
and returned as views of the valid rows."""
import ctypes

import torch

from . import _abi
from ._calls import Calls, hidden_of
from ._results import DispatchResult
from ._torch import TensorSlot
from .handle import Hook


class HighThroughputCalls(Calls):
    def __init__(self, group):
        super().__init__(group)
        self.capacity = group.world_size * group.config.max_tokens_per_rank
        self.recv_x = TensorSlot("recv_x")
        self.recv_idx = TensorSlot("recv_topk_idx")
        self.recv_w = TensorSlot("recv_topk_weights")

    def dispatch(self, handle, x, topk_weights, out, defer, round_scale, recv_capacity, fmt):
        if round_scale:
            raise NotImplementedError("dispatch: round_scale=True needs fp8 dispatch, which "
                                      "high_throughput mode does not have (bf16 rows)")
        if fmt not in (None, "bf16"):
            raise NotImplementedError("dispatch: format=%r: high_throughput mode sends bf16 "
                                      "rows (format None or 'bf16')" % (fmt,))
        hidden = hidden_of(x, "x")
        k = handle.top_k
        if out is None:
            cap = self.capacity if recv_capacity is None else int(recv_capacity)
            dev = self.device
            out = (torch.empty((cap, hidden), dtype=torch.bfloat16, device=dev),
                   torch.empty((cap, k), dtype=torch.int32, device=dev),
                   torch.empty((cap, k), dtype=torch.float32, device=dev),
                   torch.empty((self.local,), dtype=torch.int32, device=dev))
        elif isinstance(out, DispatchResult):
            out = out.buffers
        rx, ri, rw, rc = out
        n = ctypes.c_int64(-1)
        p = self.dp
        p.flags = _abi.FLAG_DEFER_RECV if defer else 0
        p.hidden = hidden
        p.x = self.x.bind(x)
        p.topk_weights = self.dw.bind(topk_weights) if topk_weights is not None else None
        p.recv_x = self.recv_x.bind(rx)
        p.recv_topk_idx = self.recv_idx.bind(ri)
        p.recv_topk_weights = self.recv_w.bind(rw)
        p.recv_count = self.recv_count.bind(rc)
        p.num_recv_tokens = ctypes.pointer(n)
        p.stream = self.group._stream()
        hook = self.call_dispatch(handle)
        handle.recv_count = rc
        handle.dispatch_weights = topk_weights
        handle.hidden = hidden
        res = DispatchResult(None, None, rc, buffers=out)

        def finish():
            rows = n.value
            res.num_recv_tokens = rows
            res.recv_x, res.recv_topk_idx, res.recv_topk_weights = rx[:rows], ri[:rows], rw[:rows]

        if defer:
            return Hook(self.group, hook, res, finish=finish, keep=(x, topk_weights, n))
        finish()
        return res

    def combine(self, handle, y, topk_weights, out, defer):
        if topk_weights is not None:
            raise ValueError("combine: topk_weights must be None in high_throughput mode: the "
                             "partials y are already weighted and are summed over ranks")
        return super().combine(handle, y, None, out, defer)
