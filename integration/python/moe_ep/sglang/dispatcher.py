"""moe_ep.sglang.Dispatcher: SGLang's DeepEP dispatcher over moe-ep groups:
low-latency mode on a low_latency group, normal (prefill) mode on a
high_throughput group, and SGLang's deepep_mode 'auto' choosing between
them per batch. dispatch / combine, and their halves (dispatch_a /
dispatch_b / combine_a / combine_b) for two-batch overlap, which keeps two
operations in flight: each sub-batch (tbo_subbatch_index 0 or 1) has its
own stage, and each group's two buffer sets carry them."""
import torch

from .._bound import wait_bound_s
from .._rank_named import name_rank_in
from . import _inputs, _mode, _setup
from ._low_latency import LowLatencyOutput, LowLatencyPath
from ._normal import NormalOutput, NormalPath
from ._normal_options import FROM_SGLANG, resolve

__all__ = ["Dispatcher", "LowLatencyOutput", "NormalOutput"]


def _refuse_overlap(entry, what):
    raise NotImplementedError("%s: %s: single-batch overlap (the combine following the "
                              "experts' GEMM block by block, on another stream) is not "
                              "supported by moe-ep; two-batch overlap is" % (entry, what))


class _Stage:
    __slots__ = ("name", "op", "result")

    def __init__(self):
        self.name, self.op, self.result = "idle", None, None


class Dispatcher:
    """SGLang's DeepEP dispatcher.

    group: a moe_ep.Group in low_latency mode (decode). normal_group: a
    moe_ep.Group in high_throughput mode (prefill; SGLang's normal mode).
    deepep_mode: 'low_latency', 'normal' or 'auto' (or SGLang's
    DeepEPMode); default 'auto' with both groups, else the one group's.
    'auto' runs a batch that extends in normal mode and a decode batch in
    low_latency mode, told per dispatch by is_extend_in_batch=,
    forward_batch= or forward_mode=, else by SGLang's
    dp_attention.get_is_extend_in_batch(); combine follows its dispatch.

    weights_at_dispatch (low latency; default True): the router weights go
    with the tokens and combine sums on the experts' ranks; False applies
    them in combine, as DeepEP does. In normal mode the weights always go
    with the tokens and the experts apply them.
    normal_fp8 (normal mode): None sends rows as given (bf16, or the pair
    (x_fp8, scales) the caller quantised); "f32", "ue8m0" or
    "ue8m0_packed" quantises bf16 rows to fp8 per 128-channel group first,
    as SGLang does before DeepGEMM (with UE8M0 scales where DeepGEMM takes
    them); "sglang" (the default) does what SGLang's own normal dispatcher
    does (_normal_options: packed UE8M0 or float32 scales with its JIT
    DeepGEMM where SGLang dispatches fp8; rows as given otherwise, and
    where SGLang is not importable). expert_alignment (normal mode):
    per-expert counts rounded up to it; None (the default) as SGLang's
    dispatcher asks, 128 with JIT DeepGEMM, else 1. Low-latency rows are
    fp8 or bf16 as SGLang's dispatcher chooses (_sglang.output_dtype: its
    --deepep-dispatcher-output-dtype, SGLANG_DEEPEP_BF16_DISPATCH, the
    dispatcher_output_dtype its quant method gives set_quant_config, its
    MoE runner), or the group's dispatch_dtype where SGLang is not
    importable; a group that dispatches fp8 cannot carry bf16 rows (the
    dispatch says so), one that dispatches bf16 carries both.
    ll_fp8_scale: the scales of low-latency fp8 rows, "f32", "ue8m0" or
    "ue8m0_packed" (a group dispatching fp8); None asks as SGLang asks
    DeepEP (packed UE8M0 when its JIT DeepGEMM runs on Blackwell, else
    f32), or keeps the group's fp8_scale where SGLang is not importable.

    dispatch_b and combine_b may run on any thread; dispatch_b, combine_a
    and combine_b check the sub-batch's stage and raise RuntimeError
    naming it when called out of order. A dispatch_a on a sub-batch that is
    not idle gives up the layer call the sub-batch holds (the engine
    dropped it, as a vLLM prepare gives up the older of two pending
    calls), and so does a receive that raises, whose call cannot go on: a
    receive of it that never ran is abandoned (moe_ep.Hook: on the nccl
    backend in low-latency mode that fails the group), its handle freed,
    and the sub-batch is idle again. Low-latency hidden_states are two
    buffer sets used in turn; a receive is valid until a later dispatch on
    the group reuses its library buffer set (sets alternate per operation,
    dispatch or combine: the dispatch after next when dispatches follow
    each other, the next one when a combine comes between), as DeepEP's
    LL buffers are."""

    def __init__(self, group=None, *, normal_group=None, deepep_mode=None,
                 weights_at_dispatch=True, normal_fp8=FROM_SGLANG, expert_alignment=None,
                 ll_fp8_scale=None):
        mode = _setup.settle(group, normal_group, deepep_mode, weights_at_dispatch,
                             normal_fp8, expert_alignment, ll_fp8_scale)
        self._normal_given = (normal_fp8, expert_alignment)
        normal_fp8, expert_alignment = resolve(normal_fp8, expert_alignment)
        self.group = group
        self.normal_group = normal_group
        self.deepep_mode = mode
        # SGLang's BaseDispatcher state (its quant methods and single-batch
        # overlap set them).
        self.quant_config = None
        self.overlap_args = None
        self.meta_overlap_args = None
        self._paths = {
            "low_latency": None if group is None else
            LowLatencyPath(group, weights_at_dispatch, wait_bound_s(group), ll_fp8_scale),
            "normal": None if normal_group is None else
            NormalPath(normal_group, normal_fp8, expert_alignment, wait_bound_s(normal_group)),
        }
        self._stages = (_Stage(), _Stage())

    @staticmethod
    def _index(entry, index):
        if index is None:
            return 0
        if index not in (0, 1):
            raise ValueError("%s: tbo_subbatch_index=%r; two-batch overlap has sub-batches 0 "
                             "and 1" % (entry, index))
        return index

    def _stage(self, entry, index, want):
        index = self._index(entry, index)
        st = self._stages[index]
        if st.name != want:
            raise RuntimeError("%s: sub-batch %d is at stage '%s', %s needs '%s'"
                               % (entry, index, st.name, entry, want))
        return st

    def dispatch_a(self, hidden_states, topk_output=None, topk_weights=None, forward_batch=None,
                   *, topk_idx=None, is_extend_in_batch=None, forward_mode=None,
                   tbo_subbatch_index=None):
        """Sends hidden_states to the experts' ranks: [T, H] bf16, or in
        normal mode the pair (x_fp8 [T, H], scales [T, H/128] float32 or
        [T, H/512] int32) quantised by the caller. The routing is SGLang's
        TopKOutput (topk_ids, topk_weights), the keywords topk_idx=,
        topk_weights= of older SGLang, or its positional form
        (hidden_states, topk_idx, topk_weights, forward_batch). With
        deepep_mode 'auto', is_extend_in_batch / forward_batch /
        forward_mode (or SGLang's global) choose the mode; with a fixed
        mode they are accepted and not read."""
        entry = "dispatch_a"
        if isinstance(topk_output, torch.Tensor):  # older SGLang's positional topk_idx
            if topk_idx is not None:
                raise TypeError("%s: topk_idx given twice (positionally and by keyword)" % entry)
            topk_output, topk_idx = None, topk_output
        st = self._stages[self._index(entry, tbo_subbatch_index)]
        ids, w = _inputs.routing(entry, topk_output, topk_idx, topk_weights)
        mode = _mode.resolve(self.deepep_mode, entry, is_extend_in_batch, forward_batch,
                             forward_mode)
        if st.name != "idle":
            _give_up(st)
        op = self._paths[mode].send(entry, hidden_states, ids, w)
        st.name, st.op = "dispatched", op

    def dispatch_b(self, *, tbo_subbatch_index=None):
        """Receives (runs the hook, unless another thread did) and returns a
        LowLatencyOutput or a NormalOutput, per the dispatch's mode."""
        st = self._stage("dispatch_b", tbo_subbatch_index, "dispatched")
        op = st.op
        try:
            res = op.recv()
        except BaseException:
            _give_up(st)
            raise
        st.name = "received"
        return self._paths[op.mode].output(op, res)

    def dispatch(self, hidden_states, *args, tbo_subbatch_index=None, **keywords):
        """dispatch_a then dispatch_b: SGLang's call without two-batch
        overlap, in any of dispatch_a's forms."""
        self.dispatch_a(hidden_states, *args, tbo_subbatch_index=tbo_subbatch_index, **keywords)
        return self.dispatch_b(tbo_subbatch_index=tbo_subbatch_index)

    def combine(self, *args, tbo_subbatch_index=None, **inputs):
        """combine_a then combine_b: SGLang's call without two-batch
        overlap, in any of combine_a's forms. Returns [T, H] bf16."""
        self.combine_a(*args, tbo_subbatch_index=tbo_subbatch_index, **inputs)
        return self.combine_b(tbo_subbatch_index=tbo_subbatch_index)

    def combine_a(self, combine_input=None, topk_ids=None, topk_weights=None, overlap_args=None,
                  *, hidden_states=None, topk_idx=None, forward_batch=None,
                  is_extend_in_batch=None, forward_mode=None, tbo_subbatch_index=None):
        """Sends the experts' outputs back. Takes SGLang's combine input (a
        tuple with hidden_states, topk_ids and topk_weights), the keywords
        of older SGLang (hidden_states=, topk_idx=, topk_weights=,
        forward_batch=), or its positional form (hidden_states, topk_idx,
        topk_weights, forward_batch).

        Low latency: hidden_states [E_local, R*N, H] bf16; topk_ids must
        repeat the dispatch's routing (a copy is accepted; its shape is
        checked); with weights at dispatch topk_weights must be the
        dispatch's tensor, with weights at combine they are applied.
        Normal: hidden_states [N_recv, H] bf16, one row per received token
        with the router weights applied; topk_ids / topk_weights are the
        dispatch's received ones (checked by shape).
        The mode is the sub-batch's dispatch's; under 'auto' a mode hint
        given here must agree with it."""
        entry = "combine_a"
        if overlap_args is not None and _mode.is_mode_hint(overlap_args):
            # The fourth positional is older SGLang's ForwardBatch or
            # ForwardMode (later versions pass their combine overlap
            # arguments there).
            if forward_batch is not None:
                raise TypeError("%s: forward_batch given twice (positionally and by keyword)"
                                % entry)
            forward_batch, overlap_args = overlap_args, None
        if overlap_args is not None:
            _refuse_overlap(entry, "overlap_args=%r" % (overlap_args,))
        hidden_states, topk_ids, topk_weights = _inputs.combine_input(
            entry, combine_input, topk_ids, topk_weights, hidden_states, topk_idx)
        st = self._stage(entry, tbo_subbatch_index, "received")
        op = st.op
        sub = tbo_subbatch_index or 0
        hint = _mode.hinted(self.deepep_mode, entry, is_extend_in_batch, forward_batch,
                            forward_mode)
        if hint is not None and hint != op.mode:
            raise ValueError("%s: the mode hint says %s, but sub-batch %d was dispatched in %s "
                             "mode; a combine follows its dispatch's mode" % (entry, hint, sub,
                                                                              op.mode))
        result = self._paths[op.mode].combine(entry, op, sub, hidden_states, topk_ids,
                                              topk_weights)
        st.name, st.result = "combining", result

    def combine_b(self, *, tbo_subbatch_index=None):
        """Receives the combine; returns [T, H] bf16."""
        st = self._stage("combine_b", tbo_subbatch_index, "combining")
        try:
            out = st.result()
        finally:
            _give_up(st)  # the receive ran (or failed): only the handle is left to free
        return out

    def set_quant_config(self, quant_config):
        """SGLang's quant methods name what they need of the dispatch: the
        rows' dtype (dispatcher_output_dtype) then follows what SGLang's
        own dispatcher chooses under it, in both modes, for each option not
        given to the constructor. NVFP4 input (input_global_scale), or a
        dtype other than bf16 and fp8, is refused: rows travel as bf16 or
        fp8 e4m3."""
        if not isinstance(quant_config, dict):
            raise TypeError("set_quant_config: quant_config must be a dict, got %s"
                            % type(quant_config).__name__)
        if quant_config.get("input_global_scale") is not None:
            raise NotImplementedError("set_quant_config: input_global_scale (NVFP4 dispatch) is "
                                      "not supported by moe-ep: rows travel as bf16 or fp8 e4m3")
        try:
            normal = resolve(*self._normal_given, quant_config=quant_config)
            ll = self._paths["low_latency"]
            if ll is not None:
                ll.follow(quant_config)
        except NotImplementedError as e:
            raise NotImplementedError("set_quant_config: %s" % e) from None
        if self._paths["normal"] is not None:
            self._paths["normal"].follow(*normal)
        self.quant_config = quant_config

    def set_overlap_args(self, combine_overlap_args, meta_overlap_args):
        _refuse_overlap("set_overlap_args", "combine_overlap_args=%r" % (combine_overlap_args,))

    def register_deepep_dispatch_hook(self, hook):
        """SGLang registers one for single-batch overlap (shared experts
        run between the dispatch's send and its receive, the combine then
        overlapped with the down GEMM): refused as set_overlap_args is."""
        _refuse_overlap("register_deepep_dispatch_hook", "hook=%r" % (hook,))

    def clear_overlap_args(self):
        self.overlap_args = None
        self.meta_overlap_args = None

    def pending_hook(self, tbo_subbatch_index=None):
        """The receive of the sub-batch's latest half, for another thread
        to run (it runs once; dispatch_b / combine_b then only collect)."""
        index = self._index("pending_hook", tbo_subbatch_index)
        st = self._stages[index]
        if st.name == "dispatched":
            return st.op.recv
        if st.name == "combining":
            return st.result
        raise RuntimeError("pending_hook: sub-batch %d is at stage '%s' with no receive pending"
                           % (index, st.name))


def _give_up(st):
    """Frees the layer call a sub-batch holds and makes it idle: a receive
    of it that never ran is abandoned (left pending, it would hold its
    buffer set; running it here would race the other ranks, which may be
    sending the next operation into that set already)."""
    op, st.name, st.op, st.result = st.op, "idle", None, None
    if op is None:
        return
    for hook in (op.sent, op.combine_sent):
        if hook is not None:
            hook.abandon()  # nothing happens to one that ran or failed
    op.handle.free()


name_rank_in(Dispatcher, lambda d: (d.group or d.normal_group).rank)
