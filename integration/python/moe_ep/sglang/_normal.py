"""The normal (high-throughput, prefill) half of the SGLang dispatcher
(SGLang's _DeepEPDispatcherImplNormal) on a high_throughput moe_ep.Group:
each token travels once per destination rank into packed rows [N_recv, H]
with its top-k ids (local, -1 elsewhere) and weights; the experts apply
the weights, and combine sums the returned rows back onto their source
tokens (over ranks ascending, f32, one bf16 rounding; with ranks_per_node
set, each node's rows first, then the node sums: moe_ep.h)."""
import collections

import torch

from .. import _fp8
from .._dropped import group_dropped_hooks
from .._overlap import Once
from ._inputs import same_shape
from ._types import normal_format


class NormalOutput(collections.namedtuple(
        "NormalOutput", "hidden_states hidden_states_scale topk_ids topk_weights "
        "num_recv_tokens_per_expert")):
    """What dispatch_b returns in normal mode, in SGLang's order (its
    DeepEPNormalDispatchOutput): hidden_states [N_recv, H] (bf16, or fp8
    e4m3 when the rows were quantised), hidden_states_scale (None for bf16;
    [N_recv, H/128] float32 or [N_recv, H/512] int32 UE8M0-packed),
    topk_ids [N_recv, K] int64 (local expert ids, -1 for a slot whose
    expert is on another rank), topk_weights [N_recv, K] float32 (0 where
    the id is -1), num_recv_tokens_per_expert (a host list of E_local
    ints, each rounded up to the dispatcher's expert_alignment). format is
    SGLang's DispatchOutputFormat.DEEPEP_NORMAL where SGLang is importable
    (a stand-in with its predicates elsewhere)."""
    __slots__ = ()

    @property
    def format(self):
        return normal_format()


class NormalOp:
    """One layer call from dispatch_a to combine_b."""
    __slots__ = ("mode", "handle", "sent", "recv", "combine_sent", "num_recv", "recv_ids",
                 "recv_weights")


def _pair(entry, rows):
    """(x_fp8, scales) the caller quantised. The library takes row-major
    scales, so a column-major view (SGLang's quantiser makes one for
    DeepGEMM's UE8M0 path) is copied."""
    if len(rows) != 2:
        raise ValueError("%s: hidden_states is a tuple of %d; pre-quantised rows are the pair "
                         "(x_fp8, scales)" % (entry, len(rows)))
    x, scales = rows
    for name, t in (("hidden_states[0]", x), ("hidden_states[1]", scales)):
        if not isinstance(t, torch.Tensor):
            raise TypeError("%s: %s must be a torch.Tensor, got %s"
                            % (entry, name, type(t).__name__))
    return x, scales if scales.is_contiguous() else scales.contiguous()


class NormalPath:
    """fp8: None sends rows as dispatch gets them (bf16, or the pair
    (x_fp8, scales) quantised by the caller); "f32", "ue8m0" or
    "ue8m0_packed" quantises bf16 rows to fp8 e4m3 per 128-channel group
    first (the library's rule, moe_ep._fp8), with scales of that format, as
    SGLang's normal dispatcher does before DeepGEMM. expert_alignment
    rounds the per-expert counts up (SGLang passes 128 for DeepGEMM)."""
    mode = "normal"

    def __init__(self, group, fp8, expert_alignment, bound_s):
        self.group = group
        self.follow(fp8, expert_alignment)
        self._bound_s = bound_s
        self._sends = group_dropped_hooks(group)

    def follow(self, fp8, expert_alignment):
        """The options of the dispatches from now on (the dispatcher's
        set_quant_config changes what SGLang would choose)."""
        self.fp8 = fp8
        self.expert_alignment = expert_alignment
        self._row_format = _fp8.ROW_FORMATS[fp8] if fp8 is not None else None

    def _rows(self, entry, hidden_states):
        """(x, scales or None, format or None) to dispatch."""
        if isinstance(hidden_states, tuple):
            x, scales = _pair(entry, hidden_states)
            return x, scales, None  # the format follows the scales' dtype
        if not isinstance(hidden_states, torch.Tensor):
            raise TypeError("%s: hidden_states must be a torch.Tensor or the pair (x_fp8, "
                            "scales), got %s" % (entry, type(hidden_states).__name__))
        if self.fp8 is None:
            return hidden_states, None, None
        x, scales = _fp8.quantize(hidden_states, self.fp8, name="%s: hidden_states" % entry)
        return x, scales, self._row_format

    def send(self, entry, hidden_states, ids, w):
        x, scales, fmt = self._rows(entry, hidden_states)
        g = self.group
        handle = g.prepare(ids, layout=False)  # DeepEP's layout tensors: nobody reads them here
        try:
            hook = self._sends.send(
                lambda: g.dispatch(handle, x, x_scales=scales, topk_weights=w, format=fmt,
                                   defer=True))
        except BaseException:
            handle.free()
            raise
        op = NormalOp()
        op.mode = self.mode
        op.handle, op.recv = handle, Once(hook, self._bound_s, self.group)
        op.sent, op.combine_sent = hook, None  # the Hooks, for a give-up (dispatcher._give_up)
        op.num_recv = op.recv_ids = op.recv_weights = None
        return op

    def output(self, op, res):
        # SGLang dispatches int64 ids and its experts index with the
        # received ones; the library returns int32.
        ids = res.recv_topk_idx.to(torch.int64)
        op.num_recv = res.num_recv_tokens
        op.recv_ids, op.recv_weights = ids, res.recv_topk_weights
        a = self.expert_alignment
        counts = [(c + a - 1) // a * a for c in res.recv_count.tolist()]
        return NormalOutput(res.recv_x, res.recv_scales, ids, res.recv_topk_weights, counts)

    def combine(self, entry, op, sub, hidden_states, topk_ids, topk_weights):
        """Sends the experts' output [N_recv, H] bf16 (one row per received
        token, weights applied) back; returns the receive (a Once). topk_ids
        and topk_weights are the dispatch's received ones (checked by
        shape; combine reads neither)."""
        rows = int(hidden_states.shape[0]) if hidden_states.dim() else -1
        if op.num_recv is not None and rows != op.num_recv:
            raise ValueError("%s: hidden_states has %d rows; sub-batch %d's normal dispatch "
                             "received %d tokens, and combine takes one row per received "
                             "token, in the order dispatch returned them"
                             % (entry, rows, sub, op.num_recv))
        same_shape(entry, sub, topk_ids=(topk_ids, op.recv_ids),
                   topk_weights=(topk_weights, op.recv_weights))
        hook = self._sends.send(lambda: self.group.combine(op.handle, hidden_states, defer=True))
        op.combine_sent = hook
        return Once(hook, self._bound_s, self.group)
