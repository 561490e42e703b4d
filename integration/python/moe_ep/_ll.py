"""Low-latency dispatch: outputs [E_local, R*max_tokens, H] (bf16, or fp8
with scales), filled in place; combine is the shared one."""
from . import _abi
from ._calls import Calls, hidden_of, split_x
from ._results import DispatchResult
from .handle import Hook


class LowLatencyCalls(Calls):
    def __init__(self, group):
        super().__init__(group)
        cfg = group.config
        self.fp8 = cfg.fp8
        self.packed = cfg.fp8_scale == "ue8m0_packed"
        self.slots = group.world_size * cfg.max_tokens_per_rank
        self.out_specs = {}  # (hidden, format) -> what new_dispatch_outputs allocates

    def row_format(self, fmt):
        """(fp8, packed scales) of a call's format (None: the group's)."""
        if fmt not in _abi.FORMATS:
            raise ValueError("dispatch: format=%r must be one of %s"
                             % (fmt, ", ".join(repr(f) for f in _abi.FORMATS)))
        if fmt is None:
            return self.fp8, self.packed
        return fmt != "bf16", fmt == "fp8_ue8m0_packed"

    def out_spec(self, hidden, fmt):
        """(recv_x template, shape, recv_scales template or None, shape)."""
        fp8, packed = self.row_format(fmt)
        rx = (self.empty_fp8 if fp8 else self.empty_bf16, (self.local, self.slots, hidden))
        if not fp8:
            return rx + (None, None)
        cols = (hidden // 128 + 3) // 4 if packed else hidden // 128
        return rx + (self.empty_i32 if packed else self.empty_f32, (self.local, self.slots, cols))

    def new_dispatch_outputs(self, hidden, fmt=None):
        spec = self.out_specs.get((hidden, fmt))
        if spec is None:
            spec = self.out_specs[(hidden, fmt)] = self.out_spec(hidden, fmt)
        rx, rx_shape, rs, rs_shape = spec
        return DispatchResult(rx.new_empty(rx_shape),
                              rs.new_empty(rs_shape) if rs is not None else None,
                              self.empty_i32.new_empty(self.local_shape))

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
        self.x.attach(x)
        self.x_scales.attach(x_scales)
        self.recv_x.attach(res.recv_x)
        self.recv_scales.attach(res.recv_scales)
        self.recv_count.attach(res.recv_count)
        self.dw.attach(topk_weights)
        p.stream = self.stream()
        hook = self.call_dispatch(handle)
        # The library reads these until combine completes.
        handle.recv_count = res.recv_count
        handle.dispatch_weights = topk_weights
        handle.hidden = hidden
        if defer:
            return Hook(self.group, hook, res)
        return res
