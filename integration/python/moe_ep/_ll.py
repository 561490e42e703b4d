"""Low-latency dispatch and combine: the parameter structs are built once
per thread and group, and a call only re-points their tensors."""
import ctypes

import torch

from . import _abi
from ._results import DispatchResult
from ._torch import FP8_STORAGE, TensorSlot
from .handle import Hook


def hidden_of(t, name):
    """H of an [.., H] tensor; the library checks the rest of the shape."""
    if not isinstance(t, torch.Tensor):
        raise TypeError("%s must be a torch.Tensor, got %s" % (name, type(t).__name__))
    return int(t.shape[-1]) if t.dim() else 0


class LowLatencyCalls:
    def __init__(self, group):
        self.group = group
        self.lib = group._lib
        cfg = group.config
        self.fp8 = cfg.fp8
        self.packed = cfg.fp8_scale == "ue8m0_packed"
        self.slots = group.world_size * cfg.max_tokens_per_rank
        self.local = group.num_local_experts
        self.device = group.device
        self.dp = _abi.init(_abi.DispatchParams)
        self.dp_ptr = ctypes.pointer(self.dp)
        self.cp = _abi.init(_abi.CombineParams)
        self.cp_ptr = ctypes.pointer(self.cp)
        self.x = TensorSlot("x")
        self.recv_x = TensorSlot("recv_x", as_fp8=True)
        self.recv_scales = TensorSlot("recv_scales")
        self.recv_count = TensorSlot("recv_count")
        self.dw = TensorSlot("topk_weights")
        self.y = TensorSlot("y")
        self.cw = TensorSlot("topk_weights")
        self.out = TensorSlot("out")

    def new_dispatch_outputs(self, hidden):
        dev = self.device
        rx = torch.empty((self.local, self.slots, hidden),
                         dtype=FP8_STORAGE if self.fp8 else torch.bfloat16, device=dev)
        rs = None
        if self.fp8:
            cols = (hidden // 128 + 3) // 4 if self.packed else hidden // 128
            rs = torch.empty((self.local, self.slots, cols),
                             dtype=torch.int32 if self.packed else torch.float32, device=dev)
        rc = torch.empty((self.local,), dtype=torch.int32, device=dev)
        return DispatchResult(rx, rs, rc)

    def dispatch(self, handle, x, topk_weights, out, defer, round_scale, recv_capacity):
        if recv_capacity is not None:
            raise ValueError("dispatch: recv_capacity=%r is a high_throughput argument; "
                             "low-latency outputs are [E_local, R*max_tokens, H]" % (recv_capacity,))
        hidden = hidden_of(x, "x")
        if out is None:
            res = self.new_dispatch_outputs(hidden)
        elif isinstance(out, DispatchResult):
            res = out
        else:
            res = DispatchResult(*out)
        p = self.dp
        p.flags = (_abi.FLAG_DEFER_RECV if defer else 0) | (_abi.FLAG_ROUND_SCALE if round_scale else 0)
        p.hidden = hidden
        p.x = self.x.bind(x)
        p.recv_x = self.recv_x.bind(res.recv_x)
        p.recv_scales = self.recv_scales.bind(res.recv_scales) if res.recv_scales is not None else None
        p.recv_count = self.recv_count.bind(res.recv_count)
        p.topk_weights = self.dw.bind(topk_weights) if topk_weights is not None else None
        p.stream = self.group._stream()
        hook = ctypes.c_void_p()
        st = self.lib.dispatch(self.group.pointer, handle.pointer, self.dp_ptr, ctypes.byref(hook))
        if st != 0:
            raise self.lib.error(st, "dispatch")
        # The library reads these until combine completes.
        handle.recv_count = res.recv_count
        handle.dispatch_weights = topk_weights
        handle.hidden = hidden
        if defer:
            return Hook(self.group, hook.value, res)
        return res

    def combine(self, handle, y, topk_weights, out, defer):
        hidden = hidden_of(y, "y")
        if out is None:
            out = torch.empty((handle.num_tokens, hidden), dtype=torch.bfloat16, device=self.device)
        p = self.cp
        p.flags = _abi.FLAG_DEFER_RECV if defer else 0
        p.hidden = hidden
        p.y = self.y.bind(y)
        p.topk_weights = self.cw.bind(topk_weights) if topk_weights is not None else None
        p.out = self.out.bind(out)
        p.stream = self.group._stream()
        hook = ctypes.c_void_p()
        st = self.lib.combine(self.group.pointer, handle.pointer, self.cp_ptr, ctypes.byref(hook))
        if st != 0:
            raise self.lib.error(st, "combine")
        if defer:
            return Hook(self.group, hook.value, out, keep=(y, topk_weights))
        return out
