"""What low-latency and high-throughput calls share: the parameter structs
(built once per thread and group; a call only re-points their tensors),
the library call with its error, and combine."""
import ctypes

import torch

from . import _abi
from ._torch import TensorSlot
from .handle import Hook


def hidden_of(t, name):
    """H of an [.., H] tensor; the library checks the rest of the shape."""
    if not isinstance(t, torch.Tensor):
        raise TypeError("%s must be a torch.Tensor, got %s" % (name, type(t).__name__))
    return int(t.shape[-1]) if t.dim() else 0


def split_x(x, x_scales):
    """(x, x_scales) from dispatch's x, which may be the pair (x_fp8,
    scales) DeepEP callers pass."""
    if isinstance(x, tuple):
        if len(x) != 2 or x_scales is not None:
            raise ValueError("dispatch: x must be a tensor or the pair (x_fp8, scales), and "
                             "x_scales is given only with a tensor x")
        return x
    return x, x_scales


class Calls:
    def __init__(self, group):
        self.group = group
        self.lib = group._lib
        self.local = group.num_local_experts
        self.device = group.device
        self.dp = _abi.init(_abi.DispatchParams)
        self.dp_ptr = ctypes.pointer(self.dp)
        self.cp = _abi.init(_abi.CombineParams)
        self.cp_ptr = ctypes.pointer(self.cp)
        self.x = TensorSlot("x", as_fp8=True)  # uint8 storage is fp8 (HT; LL refuses it)
        self.x_scales = TensorSlot("x_scales")
        self.dw = TensorSlot("topk_weights")
        self.recv_count = TensorSlot("recv_count")
        self.y = TensorSlot("y")
        self.cw = TensorSlot("topk_weights")
        self.out = TensorSlot("out")

    def call_dispatch(self, handle):
        """dispatch with self.dp; returns the hook pointer (None unless
        deferred)."""
        hook = ctypes.c_void_p()
        st = self.lib.dispatch(self.group.pointer, handle.pointer, self.dp_ptr, ctypes.byref(hook))
        if st != 0:
            raise self.lib.error(st, "dispatch")
        return hook.value

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
        if defer:  # inputs the deferred receive may still read
            return Hook(self.group, hook.value, out, keep=(y, topk_weights))
        return out
