"""The low-latency half of the SGLang dispatcher (SGLang's
_DeepEPDispatcherImplLowLatency) on a low_latency moe_ep.Group: rows land
per local expert, [E_local, R*N, H]; the group's two receive-buffer sets
(one ring per group, shared with every other adapter on it) carry two
sub-batches in flight."""
import collections

import torch

from .. import _fp8
from .._dropped import group_dropped_hooks
from .._overlap import Once, column_major_receive, group_recv_ring
from . import _sglang
from ._inputs import same_shape
from ._types import low_latency_format


class LowLatencyOutput(collections.namedtuple(
        "LowLatencyOutput", "hidden_states hidden_states_scale topk_ids topk_weights masked_m "
        "expected_m")):
    """What dispatch_b returns in low-latency mode, in SGLang's order (its
    DeepEPLLDispatchOutput): hidden_states [E_local, R*N, H] (bf16 or
    fp8), hidden_states_scale (None without fp8), the dispatch's topk_ids
    and topk_weights, masked_m = tokens per local expert [E_local] int32,
    expected_m (a host int: tokens per expert if every rank sent as many as
    this one; a grouped-GEMM hint). format is SGLang's
    DispatchOutputFormat.DEEPEP_LL where SGLang is importable (a stand-in
    with its predicates elsewhere)."""
    __slots__ = ()

    @property
    def format(self):
        return low_latency_format()


class LowLatencyOp:
    """One layer call from dispatch_a to combine_b."""
    __slots__ = ("mode", "handle", "sent", "recv", "combine_sent", "topk_ids", "topk_weights",
                 "expected_m")


def sglang_scale_format():
    """The fp8 scales SGLang's DeepEP dispatcher asks a low-latency dispatch
    for (round_scale and use_ue8m0 both ENABLE_JIT_DEEPGEMM and
    DEEPGEMM_BLACKWELL): "ue8m0_packed" when its JIT DeepGEMM runs on
    Blackwell, else "f32"; None where SGLang's deep_gemm_wrapper is not
    importable."""
    if _sglang.deep_gemm() is None:
        return None
    blackwell = _sglang.deep_gemm_flag("ENABLE_JIT_DEEPGEMM") and \
        _sglang.deep_gemm_flag("DEEPGEMM_BLACKWELL")
    return "ue8m0_packed" if blackwell else "f32"


class LowLatencyPath:
    """weights_at_dispatch: the router weights travel with the tokens and
    combine sums on the experts' ranks (one row back per (token, rank));
    False applies them in combine, as DeepEP does."""
    mode = "low_latency"

    def __init__(self, group, weights_at_dispatch, bound_s, fp8_scale=None):
        """fp8_scale: the scales of fp8 rows (_fp8.SCALE_FORMATS); None:
        what SGLang asks DeepEP for (sglang_scale_format), or the group's
        fp8_scale where SGLang is not importable."""
        self.group = group
        self.weights_at_dispatch = bool(weights_at_dispatch)
        self._given_scale = fp8_scale
        self._ring = group_recv_ring(group)
        self._sends = group_dropped_hooks(group)
        self._bound_s = bound_s
        self.follow(None)

    def follow(self, quant_config):
        """This path's row format as SGLang's low-latency dispatcher would
        send under quant_config (_sglang.output_dtype): fp8 or bf16 as
        SGLang chooses where it is importable, else the group's
        dispatch_dtype. fp8 rows fit a group of either dtype; bf16 rows on
        a group that dispatches fp8 are refused by the next dispatch (its
        buffers hold fp8 rows), with the reason kept here."""
        cfg = self.group.config
        dtype = _sglang.output_dtype(quant_config, low_latency=True)
        fp8 = cfg.fp8 if dtype is None else dtype == "fp8"
        self._refusal = None
        self.format = None  # the group's
        if fp8:
            scale = self._given_scale or sglang_scale_format()
            if scale is not None or not cfg.fp8:
                self.format = _fp8.ROW_FORMATS[scale or "f32"]
        elif cfg.fp8:
            self._refusal = (
                "SGLang dispatches bf16 rows here (its --deepep-dispatcher-output-dtype, the "
                "quant method's dispatcher_output_dtype, its MoE runner or "
                "SGLANG_DEEPEP_BF16_DISPATCH), but the low-latency group dispatches fp8 "
                "(dispatch_dtype: fp8_e4m3), whose buffers hold fp8 rows only; configure the "
                "group with dispatch_dtype: bf16, which carries either")

    def send(self, entry, hidden_states, ids, w):
        if isinstance(hidden_states, tuple):
            raise NotImplementedError(
                "%s: hidden_states=(x_fp8, scales) in low_latency mode: low-latency dispatch "
                "takes bf16 rows and quantises them itself (a group with dispatch_dtype: "
                "fp8_e4m3); pre-quantised rows go through normal mode" % entry)
        if not isinstance(hidden_states, torch.Tensor):
            raise TypeError("%s: hidden_states must be a torch.Tensor, got %s"
                            % (entry, type(hidden_states).__name__))
        if self._refusal is not None:
            raise ValueError("%s: %s" % (entry, self._refusal))
        g = self.group
        handle = g.prepare(ids)
        weights = w if self.weights_at_dispatch else None
        try:
            hook = self._ring.send(
                (int(hidden_states.shape[-1]), self.format),
                lambda buffers: self._sends.send(
                    lambda: g.dispatch(handle, hidden_states, out=buffers, defer=True,
                                       topk_weights=weights, format=self.format)),
                self._bound_s, entry)
        except BaseException:
            handle.free()
            raise
        op = LowLatencyOp()
        op.mode = self.mode
        # fp8 scales in DeepEP's column-major layout, as SGLang's masked
        # grouped GEMM takes them from DeepEP.
        # The output's topk_ids are int64, as SGLang's DeepEP dispatcher
        # gives them (SGLang's router makes int32); the prepare keeps ids.
        op.handle, op.topk_ids, op.topk_weights = handle, ids.to(torch.int64), w
        op.sent, op.combine_sent = hook, None  # the Hooks, for a give-up (dispatcher._give_up)
        op.recv = Once(column_major_receive(hook), self._bound_s, self.group)
        t, k = (int(n) for n in ids.shape)
        e = g.config.num_experts
        op.expected_m = (t * g.world_size * k + e) // e
        return op

    def output(self, op, res):
        return LowLatencyOutput(res.recv_x, res.recv_scales, op.topk_ids, op.topk_weights,
                                res.recv_count, op.expected_m)

    def combine(self, entry, op, sub, hidden_states, topk_ids, topk_weights):
        """Sends the expert outputs [E_local, R*N, H] bf16 back; returns the
        receive (a Once). topk_ids must repeat the dispatch's routing (the
        handle carries it). With weights at dispatch, topk_weights must be
        the dispatch's tensor; with weights at combine, they are applied."""
        same_shape(entry, sub, topk_ids=(topk_ids, op.topk_ids),
                   topk_weights=(topk_weights, op.topk_weights))
        if self.weights_at_dispatch:
            w = None
            if topk_weights is not op.topk_weights and \
                    topk_weights.data_ptr() != op.topk_weights.data_ptr():
                raise ValueError("%s: topk_weights is not the tensor dispatch_a got for "
                                 "sub-batch %d; its weights were applied on the experts' ranks "
                                 "(weights_at_dispatch=True)" % (entry, sub))
        else:
            w = topk_weights
        hook = self._sends.send(
            lambda: self.group.combine(op.handle, hidden_states, topk_weights=w, defer=True))
        op.combine_sent = hook
        return Once(hook, self._bound_s, self.group)
