"""Low-latency dispatch: outputs [E_local, R*max_tokens, H] (bf16, or fp8
with scales), filled in place; combine is the shared one."""
import torch

from . import _abi
from ._calls import Calls, hidden_of, split_x
from ._results import DispatchResult
from ._torch import FP8_STORAGE, TensorSlot
from .handle import Hook


class LowLatencyCalls(Calls):
    def __init__(self, group):
        super().__init__(group)
        cfg = group.config
        self.fp8 = cfg.fp8
        self.packed = cfg.fp8_scale == "ue8m0_packed"
        self.slots = group.world_size * cfg.max_tokens_per_rank
        self.recv_x = TensorSlot("recv_x", as_fp8=True)
        self.recv_scales = TensorSlot("recv_scales")

    def row_format(self, fmt):
        """(fp8, packed scales) of a call's format (None: the group's)."""
        if fmt not in _abi.FORMATS:
            raise ValueError("dispatch: format=%r must be one of %s"
                             % (fmt, ", ".join(repr(f) for f in _abi.FORMATS)))
        if fmt is None:
            return self.fp8, self.packed
        return fmt != "bf16", fmt == "fp8_ue8m0_packed"

    def new_dispatch_outputs(self, hidden, fmt=None):
        dev = self.device
        fp8, packed = self.row_format(fmt)
        rx = torch.empty((self.local, self.slots, hidden),
                         dtype=FP8_STORAGE if fp8 else torch.bfloat16, device=dev)
        rs = None
        if fp8:
            cols = (hidden // 128 + 3) // 4 if packed else hidden // 128
            rs = torch.empty((self.local, self.slots, cols),
                             dtype=torch.int32 if packed else torch.float32, device=dev)
        rc = torch.empty((self.local,), dtype=torch.int32, device=dev)
        return DispatchResult(rx, rs, rc)

    def dispatch(self, handle, x, topk_weights, out, defer, round_scale, recv_capacity, fmt,
                 x_scales=None, worst_case=False):
        # x_scales and worst_case go to the library, which refuses them in
        # LL with its own sentence.
        x, x_scales = split_x(x, x_scales)
        if recv_capacity is not None:
            raise ValueError("dispatch: recv_capacity=%r is a high_throughput argument; "
                             "low-latency outputs are [E_local, R*max_tokens, H]" % (recv_capacity,))
        hidden = hidden_of(x, "x")
        if out is None:
            res = self.new_dispatch_outputs(hidden, fmt)
        elif isinstance(out, DispatchResult):
            res = out
        else:
            res = DispatchResult(*out)
        p = self.dp
        p.flags = (_abi.FLAG_DEFER_RECV if defer else 0) | (_abi.FLAG_ROUND_SCALE if round_scale else 0) \
            | (_abi.FLAG_WORST_CASE if worst_case else 0)
        p.hidden = hidden
        p.format = _abi.FORMATS[fmt]
        p.x = self.x.bind(x)
        p.x_scales = self.x_scales.bind(x_scales) if x_scales is not None else None
        p.recv_x = self.recv_x.bind(res.recv_x)
        p.recv_scales = self.recv_scales.bind(res.recv_scales) if res.recv_scales is not None else None
        p.recv_count = self.recv_count.bind(res.recv_count)
        p.topk_weights = self.dw.bind(topk_weights) if topk_weights is not None else None
        p.stream = self.group._stream()
        hook = self.call_dispatch(handle)
        # The library reads these until combine completes.
        handle.recv_count = res.recv_count
        handle.dispatch_weights = topk_weights
        handle.hidden = hidden
        if defer:
            return Hook(self.group, hook, res)
        return res
