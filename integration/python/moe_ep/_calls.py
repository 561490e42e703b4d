"""What low-latency and high-throughput calls share: the parameter structs
(built once per thread and group; a call only re-points their tensors),
the library call with its error, and combine."""
import ctypes
import weakref

import torch

from . import _abi
from ._torch import CONTIGUOUS, FP8_STORAGE, OutputSpec, TensorSlot, empty_like
from .handle import Hook

# Combine's output specs are cached per (tokens, hidden); a caller whose
# token count keeps changing gets a cache cleared at this size, not one
# that grows.
_MAX_COMBINE_SPECS = 64


def hidden_of(t, name):
    """H of an [.., H] tensor; the library checks the rest of the shape."""
    if not isinstance(t, torch.Tensor):
        raise TypeError("%s must be a torch.Tensor, got %s" % (name, type(t).__name__))
    return int(t.shape[-1]) if t.dim() else 0


def attach_input(slot, t):
    """Attaches a required input tensor and returns its H (the last
    dimension; the library checks the rest of the shape)."""
    key = slot.attach(t)
    if key is None:
        raise TypeError("%s must be a torch.Tensor, got NoneType" % slot.name)
    shape = key[0]
    return int(shape[-1]) if shape else 0


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
        # The group keeps its Calls (one per thread): a strong reference back
        # would put a used Group in a reference cycle, destroyed (a collective
        # barrier) whenever the cycle collector runs instead of when the
        # engine drops it. A Calls is reached only through its live group.
        self.group_ref = weakref.ref(group)
        self.lib = group._lib
        self.local = group.num_local_experts
        self.device = group.device
        # High-throughput outputs are allocated as new_empty of an empty
        # tensor of their dtype on the group's device (the same allocation
        # as torch.empty with dtype= and device=, with less argument
        # parsing); fixed-shape ones through OutputSpec.
        dev = self.device
        self.empty_bf16, self.empty_fp8, self.empty_f32, self.empty_i32 = (
            torch.empty(0, dtype=dt, device=dev)
            for dt in (torch.bfloat16, FP8_STORAGE, torch.float32, torch.int32))
        self.local_shape = (self.local,)
        self.stream = group._stream
        # The entries' hook output, read right after each call (a Calls is
        # one thread's).
        self.hook = ctypes.c_void_p()
        self.hook_ref = ctypes.byref(self.hook)
        self.dp = _abi.init(_abi.DispatchParams)
        self.dp_ptr = ctypes.pointer(self.dp)
        self.cp = _abi.init(_abi.CombineParams)
        self.cp_ptr = ctypes.pointer(self.cp)
        self.out_specs_combine = {}  # (tokens, hidden) -> combine's OutputSpec
        # combine's params fields last written (stored only on a change).
        self.last_combine_flags = self.last_combine_hidden = None
        dp, cp = self.dp, self.cp
        self.x = TensorSlot("x", True, dp, "x")  # uint8 storage is fp8 (HT; LL refuses it)
        self.x_scales = TensorSlot("x_scales", False, dp, "x_scales")
        self.dw = TensorSlot("topk_weights", False, dp, "topk_weights")
        self.recv_x = TensorSlot("recv_x", True, dp, "recv_x")
        self.recv_scales = TensorSlot("recv_scales", False, dp, "recv_scales")
        self.recv_count = TensorSlot("recv_count", False, dp, "recv_count")
        self.y = TensorSlot("y", False, cp, "y")
        self.cw = TensorSlot("topk_weights", False, cp, "topk_weights")
        self.out = TensorSlot("out", False, cp, "out")

    def call_dispatch(self, handle):
        """dispatch with self.dp; returns the hook pointer (None unless
        deferred)."""
        self.hook.value = None
        st = self.group_ref()._call(self.lib.dispatch, handle.pointer, self.dp_ptr, self.hook_ref)
        if st != 0:
            raise self.lib.error(st, "dispatch")
        return self.hook.value

    def combine(self, handle, y, topk_weights, out, defer):
        hidden = attach_input(self.y, y)
        if out is None:
            shape = (handle.num_tokens, hidden)
            spec = self.out_specs_combine.get(shape)
            if spec is None:
                if len(self.out_specs_combine) >= _MAX_COMBINE_SPECS:
                    self.out_specs_combine.clear()
                spec = self.out_specs_combine[shape] = OutputSpec(shape, torch.bfloat16,
                                                                  self.device)
            out = empty_like(spec.template, memory_format=CONTIGUOUS)
            self.out.attach_new(out, spec.key)
        else:
            self.out.attach(out)
        p = self.cp
        flags = _abi.FLAG_DEFER_RECV if defer else 0
        if flags != self.last_combine_flags:
            p.flags = self.last_combine_flags = flags
        if hidden != self.last_combine_hidden:
            p.hidden = self.last_combine_hidden = hidden
        if topk_weights is not None or self.cw.attached:
            self.cw.attach(topk_weights)
        p.stream = stream = self.stream()  # (a c_void_p field reads 0 as None)
        hook = self.hook
        hook.value = None
        st = self.group_ref()._call(self.lib.combine, handle.pointer, self.cp_ptr, self.hook_ref)
        if st != 0:
            raise self.lib.error(st, "combine")
        if defer:  # the handle and inputs the deferred receive still reads
            return Hook(self.group_ref(), hook.value, out, keep=(handle, y, topk_weights),
                        sent_on=stream)
        return out
