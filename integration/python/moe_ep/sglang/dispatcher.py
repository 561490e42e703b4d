"""moe_ep.sglang.Dispatcher: SGLang's DeepEP low-latency dispatcher on a
low-latency moe_ep.Group: dispatch / combine, and their halves
(dispatch_a / dispatch_b / combine_a / combine_b) for two-batch overlap,
which keeps two operations in flight: each sub-batch (tbo_subbatch_index
0 or 1) has its own stage, and the group's two buffer sets carry them."""
import collections

import torch

from .._overlap import Once, RecvRing, wait_bound_s
from ..group import Group
from ._types import low_latency_format


class LowLatencyOutput(collections.namedtuple(
        "LowLatencyOutput", "hidden_states hidden_states_scale topk_ids topk_weights masked_m "
        "expected_m")):
    """What dispatch_b returns, in SGLang's order (its DeepEPLLDispatchOutput):
    hidden_states [E_local, R*N, H] (bf16 or fp8), hidden_states_scale (None
    without fp8), the dispatch's topk_ids and topk_weights, masked_m =
    tokens per local expert [E_local] int32, expected_m (a host int: tokens
    per expert if every rank sent as many as this one; a grouped-GEMM
    hint). format is SGLang's DispatchOutputFormat.DEEPEP_LL where SGLang
    is importable (a stand-in with its predicates elsewhere)."""
    __slots__ = ()

    @property
    def format(self):
        return low_latency_format()


def _refuse_overlap(entry, what):
    raise NotImplementedError("%s: %s: single-batch overlap (the combine following the "
                              "experts' GEMM block by block, on another stream) is not "
                              "supported by moe-ep; two-batch overlap is" % (entry, what))


class _Stage:
    __slots__ = ("name", "op", "result")

    def __init__(self):
        self.name, self.op, self.result = "idle", None, None


class _Op:
    __slots__ = ("handle", "recv", "topk_ids", "topk_weights", "expected_m")


def _routing(entry, topk_output, topk_idx, topk_weights):
    """(topk_ids, topk_weights) from SGLang's TopKOutput (attributes
    topk_ids, topk_weights) or the keywords of older SGLang versions."""
    if topk_output is not None:
        if topk_idx is not None or topk_weights is not None:
            raise TypeError("%s: pass topk_output or topk_idx/topk_weights, not both" % entry)
        try:
            topk_idx, topk_weights = topk_output.topk_ids, topk_output.topk_weights
        except AttributeError:
            raise TypeError("%s: topk_output must have topk_ids and topk_weights (SGLang's "
                            "TopKOutput), got %s" % (entry, type(topk_output).__name__)) from None
    for name, t in (("topk_ids", topk_idx), ("topk_weights", topk_weights)):
        if not isinstance(t, torch.Tensor):
            raise TypeError("%s: %s must be a torch.Tensor, got %s" % (entry, name, type(t).__name__))
    if tuple(topk_idx.shape) != tuple(topk_weights.shape):
        raise ValueError("%s: topk_weights has shape %s and topk_ids %s; they pair slot by slot"
                         % (entry, tuple(topk_weights.shape), tuple(topk_idx.shape)))
    return topk_idx, topk_weights


class Dispatcher:
    """SGLang's LL dispatcher over `group` (a moe_ep.Group in low_latency
    mode). weights_at_dispatch (default True): the router weights go with
    the tokens and combine sums on the experts' ranks (one row back per
    (token, rank)); False applies them in combine, as DeepEP does.

    dispatch_b and combine_b may run on any thread; each half checks the
    sub-batch's stage and raises RuntimeError naming it when called out of
    order. hidden_states of dispatch_b are two buffer sets used in turn,
    valid until the dispatch after next (as DeepEP's LL buffers)."""

    def __init__(self, group, *, weights_at_dispatch=True):
        if not isinstance(group, Group):
            raise TypeError("Dispatcher: group must be a moe_ep.Group, got %s"
                            % type(group).__name__)
        if group.mode != "low_latency":
            raise NotImplementedError("Dispatcher: the group's mode is %s; this is SGLang's "
                                      "low-latency dispatcher (mode: low_latency)" % group.mode)
        self.group = group
        # SGLang's BaseDispatcher state (its quant methods and single-batch
        # overlap set them).
        self.quant_config = None
        self.overlap_args = None
        self.meta_overlap_args = None
        self._weights_at_dispatch = bool(weights_at_dispatch)
        self._stages = (_Stage(), _Stage())
        self._ring = RecvRing()
        self._bound_s = wait_bound_s(group)

    def _stage(self, entry, index, want):
        if index is None:
            index = 0
        if index not in (0, 1):
            raise ValueError("%s: tbo_subbatch_index=%r; two-batch overlap has sub-batches 0 "
                             "and 1" % (entry, index))
        st = self._stages[index]
        if st.name != want:
            raise RuntimeError("%s: sub-batch %d is at stage '%s', %s needs '%s'"
                               % (entry, index, st.name, entry, want))
        return st

    def dispatch_a(self, hidden_states, topk_output=None, *, topk_idx=None, topk_weights=None,
                   forward_batch=None, tbo_subbatch_index=None):
        """Sends hidden_states [T, H] bf16 to the experts' ranks.
        forward_batch is accepted for SGLang's call shape (the group's mode
        is fixed)."""
        entry = "dispatch_a"
        st = self._stage(entry, tbo_subbatch_index, "idle")
        ids, w = _routing(entry, topk_output, topk_idx, topk_weights)
        if not isinstance(hidden_states, torch.Tensor):
            raise TypeError("%s: hidden_states must be a torch.Tensor, got %s"
                            % (entry, type(hidden_states).__name__))
        g = self.group
        handle = g.prepare(ids)
        hidden = int(hidden_states.shape[-1])
        index, buffers = self._ring.take(hidden)
        try:
            hook = g.dispatch(handle, hidden_states, out=buffers, defer=True,
                              topk_weights=w if self._weights_at_dispatch else None)
        except BaseException:
            handle.free()
            raise
        self._ring.keep(hidden, index, hook.result)
        op = _Op()
        op.handle, op.recv, op.topk_ids, op.topk_weights = handle, Once(hook, self._bound_s), ids, w
        t, k = (int(n) for n in ids.shape)
        e = g.config.num_experts
        op.expected_m = (t * g.world_size * k + e) // e
        st.name, st.op = "dispatched", op

    def dispatch_b(self, *, tbo_subbatch_index=None):
        """Receives (runs the hook) and returns a LowLatencyOutput."""
        st = self._stage("dispatch_b", tbo_subbatch_index, "dispatched")
        op = st.op
        res = op.recv()
        st.name = "received"
        return LowLatencyOutput(res.recv_x, res.recv_scales, op.topk_ids, op.topk_weights,
                                res.recv_count, op.expected_m)

    def dispatch(self, hidden_states, topk_output=None, *, tbo_subbatch_index=None, **routing):
        """dispatch_a then dispatch_b: SGLang's call without two-batch
        overlap. Returns a LowLatencyOutput."""
        self.dispatch_a(hidden_states, topk_output, tbo_subbatch_index=tbo_subbatch_index,
                        **routing)
        return self.dispatch_b(tbo_subbatch_index=tbo_subbatch_index)

    def combine(self, combine_input=None, *, tbo_subbatch_index=None, **inputs):
        """combine_a then combine_b: SGLang's call without two-batch
        overlap. Returns [T, H] bf16."""
        self.combine_a(combine_input, tbo_subbatch_index=tbo_subbatch_index, **inputs)
        return self.combine_b(tbo_subbatch_index=tbo_subbatch_index)

    def combine_a(self, combine_input=None, topk_ids=None, topk_weights=None, overlap_args=None,
                  *, hidden_states=None, topk_idx=None, forward_batch=None,
                  tbo_subbatch_index=None):
        """Sends the expert outputs [E_local, R*N, H] bf16 back. Takes
        SGLang's combine input (a tuple with hidden_states, topk_ids and
        topk_weights; combine_a(combine_input=...) in current SGLang), the
        keywords of older SGLang (hidden_states=, topk_idx=, topk_weights=,
        forward_batch=), or (hidden_states, topk_ids, topk_weights)
        positionally. topk_ids must repeat the dispatch's routing, which
        the handle carries (a copy is accepted; its shape is checked). With
        weights at dispatch, topk_weights must be the dispatch's tensor;
        with weights at combine, these weights are applied."""
        entry = "combine_a"
        if overlap_args is not None:
            _refuse_overlap(entry, "overlap_args=%r" % (overlap_args,))
        if isinstance(combine_input, torch.Tensor):
            if hidden_states is not None:
                raise TypeError("%s: hidden_states given twice (positionally and by keyword)"
                                % entry)
            hidden_states, combine_input = combine_input, None
        if combine_input is not None:
            if hidden_states is not None or topk_ids is not None or topk_idx is not None or \
                    topk_weights is not None:
                raise TypeError("%s: pass combine_input or hidden_states / topk_ids / "
                                "topk_weights, not both" % entry)
            try:
                hidden_states, topk_ids, topk_weights = (
                    combine_input.hidden_states, combine_input.topk_ids,
                    combine_input.topk_weights)
            except AttributeError:
                raise TypeError("%s: combine_input must have hidden_states, topk_ids and "
                                "topk_weights (SGLang's combine input), got %s"
                                % (entry, type(combine_input).__name__)) from None
        if topk_idx is not None:
            if topk_ids is not None:
                raise TypeError("%s: pass topk_ids or topk_idx, not both" % entry)
            topk_ids = topk_idx
        for name, t in (("hidden_states", hidden_states), ("topk_ids", topk_ids),
                        ("topk_weights", topk_weights)):
            if not isinstance(t, torch.Tensor):
                raise TypeError("%s: %s must be a torch.Tensor, got %s"
                                % (entry, name, type(t).__name__))
        st = self._stage(entry, tbo_subbatch_index, "received")
        op = st.op
        sub = tbo_subbatch_index or 0
        for name, got, want in (("topk_ids", topk_ids, op.topk_ids),
                                ("topk_weights", topk_weights, op.topk_weights)):
            if tuple(got.shape) != tuple(want.shape):
                raise ValueError("%s: %s has shape %s; sub-batch %d's dispatch routed %s"
                                 % (entry, name, tuple(got.shape), sub, tuple(want.shape)))
        if self._weights_at_dispatch:
            w = None
            if topk_weights is not op.topk_weights and \
                    topk_weights.data_ptr() != op.topk_weights.data_ptr():
                raise ValueError("%s: topk_weights is not the tensor dispatch_a got for "
                                 "sub-batch %d; its weights were applied on the experts' ranks "
                                 "(weights_at_dispatch=True)" % (entry, sub))
        else:
            w = topk_weights
        hook = self.group.combine(op.handle, hidden_states, topk_weights=w, defer=True)
        st.name, st.result = "combining", Once(hook, self._bound_s)

    def combine_b(self, *, tbo_subbatch_index=None):
        """Receives the combine; returns [T, H] bf16."""
        st = self._stage("combine_b", tbo_subbatch_index, "combining")
        out = st.result()
        st.op.handle.free()
        st.name, st.op, st.result = "idle", None, None
        return out

    def set_quant_config(self, quant_config):
        """SGLang's quant methods name what they need of the dispatch;
        NVFP4 input (input_global_scale) is refused: rows travel as bf16
        or fp8 e4m3."""
        if not isinstance(quant_config, dict):
            raise TypeError("set_quant_config: quant_config must be a dict, got %s"
                            % type(quant_config).__name__)
        if quant_config.get("input_global_scale") is not None:
            raise NotImplementedError("set_quant_config: input_global_scale (NVFP4 dispatch) is "
                                      "not supported by moe-ep: rows travel as bf16 or fp8 e4m3")
        self.quant_config = quant_config

    def set_overlap_args(self, combine_overlap_args, meta_overlap_args):
        _refuse_overlap("set_overlap_args", "combine_overlap_args=%r" % (combine_overlap_args,))

    def clear_overlap_args(self):
        self.overlap_args = None
        self.meta_overlap_args = None

    def pending_hook(self, tbo_subbatch_index=None):
        """The receive of the sub-batch's latest half, for another thread
        to run (it runs once; dispatch_b / combine_b then only collect)."""
        st = self._stages[tbo_subbatch_index or 0]
        if st.name == "dispatched":
            return st.op.recv
        if st.name == "combining":
            return st.result
        raise RuntimeError("pending_hook: sub-batch %d is at stage '%s' with no receive pending"
                           % (tbo_subbatch_index or 0, st.name))
