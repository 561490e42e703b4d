"""Low-latency dispatch: outputs [E_local, R*max_tokens, H] (bf16, or fp8
with scales), filled in place; combine is the shared one."""
import torch

from . import _abi
from ._calls import Calls, split_x
from ._results import DispatchResult
from ._torch import CONTIGUOUS, FP8_STORAGE, OutputSpec, empty_like
from .handle import Hook

_UNSET = object()


class LowLatencyCalls(Calls):
    def __init__(self, group):
        super().__init__(group)
        cfg = group.config
        self.fp8 = cfg.fp8
        self.packed = cfg.fp8_scale == "ue8m0_packed"
        self.slots = group.world_size * cfg.max_tokens_per_rank
        self.out_specs = {}  # (hidden, format) -> (recv_x's OutputSpec, recv_scales')
        self.count_spec = OutputSpec((self.local,), torch.int32, self.device)
        # The params fields last written: a field is stored only when the
        # call's value differs (a ctypes store costs about a dict lookup).
        self.last_flags = self.last_hidden = self.last_format = _UNSET

    def row_format(self, fmt):
        """(fp8, packed scales) of a call's format (None: the group's)."""
        if fmt not in _abi.FORMATS:
            raise ValueError("dispatch: format=%r must be one of %s"
                             % (fmt, ", ".join(repr(f) for f in _abi.FORMATS)))
        if fmt is None:
            return self.fp8, self.packed
        return fmt != "bf16", fmt == "fp8_ue8m0_packed"

    def out_spec(self, hidden, fmt):
        """(recv_x's OutputSpec, recv_scales' or None) of a call's format."""
        fp8, packed = self.row_format(fmt)
        dev = self.device
        rx = OutputSpec((self.local, self.slots, hidden), FP8_STORAGE if fp8 else torch.bfloat16,
                        dev)
        if not fp8:
            return rx, None
        cols = (hidden // 128 + 3) // 4 if packed else hidden // 128
        return rx, OutputSpec((self.local, self.slots, cols),
                              torch.int32 if packed else torch.float32, dev)

    def new_dispatch_outputs(self, hidden, fmt=None):
        """Outputs allocated and attached to the call's descriptors."""
        spec = self.out_specs.get((hidden, fmt))
        if spec is None:
            spec = self.out_specs[(hidden, fmt)] = self.out_spec(hidden, fmt)
        rx_spec, rs_spec = spec
        # torch.empty_like inline rather than OutputSpec.new(): at decode
        # sizes each Python call level is a measurable part of the call.
        rx = empty_like(rx_spec.template, memory_format=CONTIGUOUS)
        self.recv_x.attach_new(rx, rx_spec.key)
        if rs_spec is None:
            rs = None
            if self.recv_scales.attached:
                self.recv_scales.attach(None)
        else:
            rs = empty_like(rs_spec.template, memory_format=CONTIGUOUS)
            self.recv_scales.attach_new(rs, rs_spec.key)
        cs = self.count_spec
        rc = empty_like(cs.template, memory_format=CONTIGUOUS)
        self.recv_count.attach_new(rc, cs.key)
        return DispatchResult(rx, rs, rc)

    def dispatch(self, handle, x, topk_weights, out, defer, round_scale, recv_capacity, fmt,
                 x_scales=None, worst_case=False):
        # x_scales and worst_case go to the library, which refuses them in
        # LL with its own sentence. The common decode call (a tensor x, no
        # scales) takes the fewest Python steps: this path is the package's
        # per-call cost.
        if x.__class__ is tuple:
            x, x_scales = split_x(x, x_scales)
        if recv_capacity is not None:
            raise ValueError("dispatch: recv_capacity=%r is a high_throughput argument; "
                             "low-latency outputs are [E_local, R*max_tokens, H]" % (recv_capacity,))
        key = self.x.attach(x)
        if key is None:
            raise TypeError("x must be a torch.Tensor, got NoneType")
        shape = key[0]
        hidden = shape[-1] if shape else 0
        if out is None:
            res = self.new_dispatch_outputs(hidden, fmt)
        else:
            res = out if isinstance(out, DispatchResult) else DispatchResult(*out)
            self.recv_x.attach(res.recv_x)
            self.recv_scales.attach(res.recv_scales)
            self.recv_count.attach(res.recv_count)
        p = self.dp
        flags = (_abi.FLAG_DEFER_RECV if defer else 0) | (_abi.FLAG_ROUND_SCALE if round_scale else 0) \
            | (_abi.FLAG_WORST_CASE if worst_case else 0)
        if flags != self.last_flags:
            p.flags = self.last_flags = flags
        if hidden != self.last_hidden:
            p.hidden = self.last_hidden = hidden
        if fmt is not self.last_format:
            code = _abi.FORMATS.get(fmt)
            if code is None:
                self.row_format(fmt)  # raises, naming the formats
            p.format = code
            self.last_format = fmt
        if x_scales is not None or self.x_scales.attached:
            self.x_scales.attach(x_scales)
        if topk_weights is not None or self.dw.attached:
            self.dw.attach(topk_weights)
        p.stream = stream = self.stream()  # (a c_void_p field reads 0 as None)
        hook = self.hook
        hook.value = None
        st = self.group_ref()._call(self.lib.dispatch, handle.pointer, self.dp_ptr, self.hook_ref)
        if st != 0:
            raise self.lib.error(st, "dispatch")
        # The library reads these until combine completes.
        handle.recv_count = res.recv_count
        handle.dispatch_weights = topk_weights
        handle.hidden = hidden
        if defer:  # the receive runs on the handle: an engine may drop its own reference first
            return Hook(self.group_ref(), hook.value, res, keep=(handle,),
                        sent_on=stream)
        return res
