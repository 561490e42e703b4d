"""moe_ep.vllm.PrepareAndFinalize: vLLM's modular fused-MoE
prepare/finalize (FusedMoEPrepareAndFinalize) over a moe_ep.Group.

Low latency gives vLLM's BatchedExperts format: a1q [E_local, R*N, H]
(bf16, or fp8 with its scales) and the tokens per local expert; the
router weights travel with the dispatch, so finalize's combine sums each
token's experts on the experts' rank and returns one row per (token,
rank). High throughput gives the Standard format: the received rows
[N_recv, H] (bf16, or fp8 with their scales) with their top-k ids
(global) and weights; finalize sums the per-rank partials. Where fp8 rows
are quantised (in, before or after the dispatch) is _quant's rule."""
import threading

import torch

from .. import _fp8
from .._bound import bound_words, wait_bound_s
from .._overlap import ExpertMapCheck, InFlight, Once, column_major_receive, group_recv_ring
from .._dropped import group_dropped_hooks
from ..errors import TimeoutError as MoeEpTimeoutError
from ..group import Group
from .._rank_named import name_rank_in, naming
from . import _quant, _received, _types


def _tensor(name, t, entry):
    if not isinstance(t, torch.Tensor):
        raise TypeError("%s: %s must be a torch.Tensor, got %s" % (entry, name, type(t).__name__))


class _Op:
    """One layer call between prepare and finalize: sent, its moe_ep.Hook;
    recv, the Once that runs it (stamp: InFlight's)."""
    __slots__ = ("handle", "sent", "recv", "combine_weights", "on_input", "keys", "finalized",
                 "stamp", "given_up")

    def __init__(self, handle, sent, recv, combine_weights, on_input, keys):
        self.handle, self.sent, self.recv = handle, sent, recv
        self.combine_weights, self.on_input = combine_weights, on_input
        self.keys = list(keys)
        self.finalized = False
        self.stamp = None
        self.given_up = False


class PrepareAndFinalize:
    """vLLM's FusedMoEPrepareAndFinalize over `group` (a moe_ep.Group; its
    mode picks the format). weights_at_dispatch (low latency; default
    True): the router weights go with the dispatch and combine sums on the
    experts' ranks; False sends them with the combine instead, as DeepEP
    (over NVLink they are pushed to the experts' ranks, which still
    pre-reduce; over the network transports one row per (token, expert)
    comes back; the sum is the same). scale_format: the fp8 scales the
    experts get, "f32", "ue8m0" (powers of two in f32, for UE8M0 experts)
    or "ue8m0_packed" (four exponents per int32). High throughput: of rows
    an fp8 quant_config has quantised before the dispatch; default as
    vLLM's DeepEP HT prepare quantises ("ue8m0" where vLLM's
    is_deep_gemm_e8m0_used(), else "f32"), or the group's fp8_scale where
    vLLM is not importable. Low latency (a group dispatching fp8): default as
    vLLM's DeepEP LL prepare, settled by post_init_setup: "ue8m0_packed"
    for experts whose supports_packed_ue8m0_act_scales() is True (DeepGEMM
    on Blackwell), else "f32"; the group's fp8_scale until then.
    moe_config and quant_config are kept for vLLM, which reads them from
    its prepare/finalize objects. An fp8 quant_config other than
    one scale per 128 channels (per tensor, per token, other block widths)
    has its rows dispatched bf16 and quantised after the receive, as
    vLLM's DeepEP prepares do (_quant, _received), but for dynamic per-token
    rows in high throughput, quantised before the dispatch to the same bits.

    Every operation between prepare and finalize is found again by the
    topk_ids tensor vLLM passes to both, so two micro-batches may be in
    flight at once (the group's double_buffer); one tensor given to two
    prepares is finalized oldest first. A prepare that finds two
    operations in flight gives up the older: the engine dropped that layer
    call (the library refuses a combine once a later dispatch lands on its
    buffer set). Its handle is freed, and a receive of it that never ran
    is abandoned as a dropped hook is (moe_ep.Hook: on the nccl backend in
    low-latency mode that fails the group); receives the engine dropped
    are mostly abandoned earlier, by the group's book (moe_ep._dropped). The LL receive buffers
    (a1q, its scale, when the dispatch delivers them) are the group's two
    sets, used in turn by every prepare/finalize (one per MoE layer) and
    SGLang dispatcher on the group: valid until a later dispatch on the
    group reuses the receive's buffer set (sets alternate per operation,
    dispatch or combine: the dispatch after next when dispatches follow
    each other, the next one when a combine comes between), as DeepEP's
    are."""

    def __init__(self, group, *, weights_at_dispatch=True, scale_format=None, moe_config=None,
                 quant_config=None):
        if not isinstance(group, Group):
            raise TypeError("PrepareAndFinalize: group must be a moe_ep.Group, got %s"
                            % type(group).__name__)
        given = scale_format is not None
        if scale_format is None:
            scale_format = group.config.fp8_scale
            if group.mode != "low_latency":  # as vLLM's DeepEP HT prepare quantises
                scale_format = _quant.vllm_ht_scale_format(scale_format)
        if scale_format not in _fp8.SCALE_FORMATS:
            raise ValueError("PrepareAndFinalize: scale_format=%r must be one of %s"
                             % (scale_format, ", ".join(repr(f) for f in _fp8.SCALE_FORMATS)))
        self._scale_format = scale_format
        # Per-token fp8 rows cross a high-throughput dispatch quantised
        # where the library carries one scale per row (0.5), else bf16.
        self._per_token_rows = tuple(group._lib.version[:2]) >= (0, 5)
        self._scale_format_given = given
        self._ll_format = None  # the LL dispatch's per-call format; None: the group's
        self.group = group
        self.moe_config = moe_config
        self.quant_config = quant_config
        self._ll = group.mode == "low_latency"
        if not self._ll and not weights_at_dispatch:
            raise ValueError("PrepareAndFinalize: weights_at_dispatch=False is a low_latency "
                             "choice; high_throughput dispatch always carries the weights")
        self._weights_at_dispatch = bool(weights_at_dispatch)
        self._inflight = InFlight()
        self._sends = group_dropped_hooks(group)
        self._ring = group_recv_ring(group) if self._ll else None
        self._expert_map = ExpertMapCheck(group)
        self._bound_s = wait_bound_s(group)
        # Held by a prepare from its stale check to its InFlight add: InFlight
        # stamps ops in add order, and stale() must give up the op the library
        # dispatched first (the next dispatch overwrites that one's buffer set).
        self._turn = threading.Lock()

    # ---- what vLLM asks of a prepare/finalize -------------------------------

    @property
    def activation_format(self):
        fmt = _types.engine_types()[0]
        return fmt.BatchedExperts if self._ll else fmt.Standard

    def topk_indices_dtype(self):
        return None  # the library takes int32 and int64 ids alike

    def max_num_tokens_per_rank(self):
        return self.group.config.max_tokens_per_rank if self._ll else None

    def num_dispatchers(self):
        return self.group.world_size

    def output_is_reduced(self):
        return True

    def supports_async(self):
        return True

    def post_init_setup(self, fused_experts):
        """Settles the LL dispatch's fp8 scales as vLLM's DeepEP LL prepare
        does: packed UE8M0 for experts that take them, f32 otherwise (see
        the class). ValueError for packed scales (given as scale_format, in
        either mode) that the experts do not take: they would read int32
        words as f32."""
        ask = getattr(fused_experts, "supports_packed_ue8m0_act_scales", None)
        packed_ok = bool(ask()) if callable(ask) else False
        fp8_ll = self._ll and self.group.config.fp8
        if self._scale_format_given:
            fmt = self._scale_format
        else:
            fmt = ("ue8m0_packed" if packed_ok else "f32") if fp8_ll else None
        if fmt == "ue8m0_packed" and not packed_ok:
            raise ValueError("post_init_setup: scale_format='ue8m0_packed', but %s does not take "
                             "packed UE8M0 activation scales (supports_packed_ue8m0_act_scales() "
                             "is not True); give scale_format 'f32' or 'ue8m0', or none"
                             % type(fused_experts).__name__)
        if fp8_ll:
            self._ll_format = fmt
        return None

    # ---- prepare --------------------------------------------------------------

    def prepare(self, a1, topk_weights, topk_ids, num_experts, expert_map,
                apply_router_weight_on_input, quant_config, defer_input_quant=False):
        """Returns (a1q, a1q_scale, expert_tokens_meta, topk_ids, topk_weights);
        the last two are None in low latency (vLLM keeps its own)."""
        hook, receiver = self.prepare_async(a1, topk_weights, topk_ids, num_experts, expert_map,
                                            apply_router_weight_on_input, quant_config,
                                            defer_input_quant)
        hook()
        return receiver()

    def prepare_async(self, a1, topk_weights, topk_ids, num_experts, expert_map,
                      apply_router_weight_on_input, quant_config, defer_input_quant=False):
        """Sends, and returns (hook, receiver): hook() receives (any thread,
        once, on this call's stream); receiver() returns prepare's tuple,
        running the hook first if nobody has."""
        entry = "prepare"
        x, w_dispatch, w_combine, quant = self._check_prepare(
            entry, a1, topk_weights, topk_ids, num_experts, expert_map,
            bool(apply_router_weight_on_input), quant_config, bool(defer_input_quant))
        fmt = None
        if quant.before == _quant.PER_TOKEN:
            # HT: rows quantised as the receive would, sent at one byte a channel
            x, fmt = _received.before_dispatch(x, quant.after), "fp8_per_token"
        elif quant.before is not None:
            # HT: quantise, then send (x_fp8, scales) verbatim
            x = _fp8.quantize(x, quant.before, name="a1")
            fmt = _fp8.ROW_FORMATS[quant.before]
        g = self.group
        # Lock order: _turn, then the ring, the group's DroppedHooks, a Hook;
        # none of those is held by anything that then waits for _turn.
        if not self._turn.acquire(timeout=self._bound_s):
            raise MoeEpTimeoutError(
                "rank %d: %s: another thread's prepare on this PrepareAndFinalize held its turn "
                "(from giving up stale operations to recording its dispatch) for more than %s"
                % (g.rank, entry, bound_words(self._bound_s)))
        try:
            op = self._dispatch(x, topk_ids, w_dispatch, w_combine, fmt,
                                bool(apply_router_weight_on_input), entry)
        finally:
            self._turn.release()
        receiver = self._ll_receiver(op, quant.after) if self._ll else \
            self._ht_receiver(op, topk_ids.dtype, quant)
        return op.recv, naming(receiver, g.rank)

    def _dispatch(self, x, topk_ids, w_dispatch, w_combine, fmt, on_input, entry):
        """Gives up what InFlight holds beyond the live operations, sends,
        and records the new operation (in _turn: see __init__)."""
        g = self.group
        for old in self._inflight.stale():
            self._give_up(old)
        handle = g.prepare(topk_ids)
        try:
            if self._ll:
                ll_fmt = _fp8.ROW_FORMATS.get(self._ll_format)
                hook = self._ring.send(
                    (int(x.shape[-1]), ll_fmt),
                    lambda buffers: self._sends.send(
                        lambda: g.dispatch(handle, x, topk_weights=w_dispatch, out=buffers,
                                           defer=True, format=ll_fmt)),
                    self._bound_s, entry)
            else:
                hook = self._sends.send(
                    lambda: g.dispatch(handle, x, topk_weights=w_dispatch, defer=True, format=fmt))
        except BaseException:
            handle.free()
            raise
        sent = hook
        if self._ll:  # as received: fp8 scales in DeepEP's column-major layout
            hook = column_major_receive(hook)
        op = _Op(handle, sent, Once(hook, self._bound_s, g), w_combine, on_input, [topk_ids])
        self._inflight.add(op, topk_ids)
        return op

    @staticmethod
    def _give_up(op):
        """Frees a layer call the engine gave up (InFlight.stale). A
        receive it never ran is abandoned, as dropping its hook would
        (moe_ep.Hook): left pending, it would hold its buffer set, and the
        group would refuse every later operation there. Running it here
        instead would race the other ranks, which may already be sending
        the next operation into that set."""
        op.sent.abandon()
        op.handle.free()

    def _ll_receiver(self, op, after):
        """after: the received rows' quantisation (_quant.AfterReceive), or
        None when they are a1q as received."""
        meta_cls = _types.engine_types()[1]
        on_host = not self.group._is_cuda
        box = []
        filling = threading.Lock()  # the engine's two micro-batch threads may both call receiver

        def receiver():
            res = op.recv()
            with filling:
                if not box:
                    box.append((res.recv_x, res.recv_scales) if after is None else
                               _received.batched(res.recv_x, res.recv_count, after))
            meta = meta_cls(expert_num_tokens=res.recv_count,
                            expert_num_tokens_cpu=res.recv_count if on_host else None)
            return box[0][0], box[0][1], meta, None, None
        return receiver

    def _ht_receiver(self, op, ids_dtype, quant):
        """quant: the prepare's _quant.Plan, which says how the received
        rows become vLLM's (a1q, a1q_scale) (_received.ht_rows)."""
        meta_cls = _types.engine_types()[1]
        box = []
        filling = threading.Lock()  # the engine's two micro-batch threads may both call receiver

        def receiver():
            res = op.recv()
            with filling:
                if not box:
                    rows = _received.ht_rows(res.recv_x, res.recv_scales, quant)
                    ids = self._global_ids(res.recv_topk_idx, ids_dtype)
                    # The HT receive has already waited for the dispatch on
                    # the host (it learnt N_recv), so the counts are final:
                    # the host copy vLLM's DeepEP HT path gives its experts
                    # (make_from_list), which size their workspace from it.
                    box.extend((rows, ids, res.recv_count.cpu()))
                    if not op.finalized:  # vLLM hands these back to finalize
                        op.keys += [ids, res.recv_topk_weights]
                        self._inflight.add(op, ids, res.recv_topk_weights)
            meta = meta_cls(expert_num_tokens=res.recv_count, expert_num_tokens_cpu=box[2])
            return box[0][0], box[0][1], meta, box[1], res.recv_topk_weights
        return receiver

    def _global_ids(self, local_ids, dtype):
        """The library's local ids (or -1) as global ids, as vLLM's experts
        map them through expert_map. A slot for no local expert gets an
        expert of another rank, which expert_map sends nowhere (-1 where
        there is no other rank)."""
        g = self.group
        first = g.rank * g.num_local_experts
        if g.world_size == 1:
            elsewhere = -1
        else:
            elsewhere = g.config.num_experts - 1 if g.rank == 0 else 0
        return (local_ids + first).masked_fill(local_ids < 0, elsewhere).to(dtype)

    def _check_prepare(self, entry, a1, topk_weights, topk_ids, num_experts, expert_map,
                       on_input, quant_config, defer_input_quant):
        """(rows to send, weights for dispatch, weights for combine, where
        the rows are quantised: a _quant.Plan)."""
        for name, t in (("a1", a1), ("topk_weights", topk_weights), ("topk_ids", topk_ids)):
            _tensor(name, t, entry)
        # Named in vLLM's terms here; the library would name params->x.
        if topk_weights.dtype != torch.float32:
            raise TypeError("%s: topk_weights has dtype %s; it must be torch.float32"
                            % (entry, topk_weights.dtype))
        if topk_ids.dtype not in (torch.int32, torch.int64):
            raise TypeError("%s: topk_ids has dtype %s; it must be torch.int32 or torch.int64"
                            % (entry, topk_ids.dtype))
        cfg = self.group.config
        if int(num_experts) != cfg.num_experts:
            raise ValueError("%s: num_experts=%d differs from the group's num_experts=%d"
                             % (entry, int(num_experts), cfg.num_experts))
        if tuple(topk_weights.shape) != tuple(topk_ids.shape):
            raise ValueError("%s: topk_weights has shape %s and topk_ids %s; they pair slot "
                             "by slot" % (entry, tuple(topk_weights.shape), tuple(topk_ids.shape)))
        self._expert_map(expert_map, entry)
        quant = _quant.plan(entry, quant_config, defer_input_quant, self._ll, cfg.fp8,
                            self._scale_format, int(a1.shape[-1]) if a1.dim() else 0,
                            self._per_token_rows)
        if a1.dtype != torch.bfloat16:
            # Also where a1 is quantised first: vLLM's output is made like
            # a1, and the combine writes bf16.
            raise TypeError("%s: a1 has dtype %s; moe-ep dispatches bf16 activations (and "
                            "quantises them to fp8 where quant_config asks for 128-channel "
                            "block fp8), and combines into a bf16 output like a1"
                            % (entry, a1.dtype))
        carried = not self._ll or self._weights_at_dispatch
        if not on_input:
            return (a1, (topk_weights if carried else None), (None if carried else topk_weights),
                    quant)
        if topk_ids.dim() != 2 or topk_ids.shape[1] != 1:
            raise ValueError("%s: apply_router_weight_on_input=True needs top_k == 1 (the weight "
                             "scales the token's row before dispatch), got topk_ids of shape %s"
                             % (entry, tuple(topk_ids.shape)))
        # The weight goes into the row; the experts' sum then weighs it by one.
        x = (a1.float() * topk_weights.float()).to(a1.dtype)
        ones = torch.ones_like(topk_weights, dtype=torch.float32)
        return x, (ones if carried else None), (None if carried else ones), quant

    # ---- finalize -------------------------------------------------------------

    def finalize(self, output, fused_expert_output, topk_weights, topk_ids,
                 apply_router_weight_on_input, weight_and_reduce_impl):
        """Combines into output [T, H] bf16 (in place)."""
        hook, receiver = self.finalize_async(output, fused_expert_output, topk_weights, topk_ids,
                                             apply_router_weight_on_input, weight_and_reduce_impl)
        hook()
        receiver()

    def finalize_async(self, output, fused_expert_output, topk_weights, topk_ids,
                       apply_router_weight_on_input, weight_and_reduce_impl):
        """Sends the expert outputs back; returns (hook, receiver): hook()
        receives into output (any thread, once, on this call's stream); receiver() runs the hook
        if nobody has, frees the routing and returns output."""
        entry = "finalize"
        _tensor("fused_expert_output", fused_expert_output, entry)
        op = self._inflight.take(topk_ids, entry)
        try:
            if bool(apply_router_weight_on_input) != op.on_input:
                raise ValueError("%s: apply_router_weight_on_input=%s but prepare got %s"
                                 % (entry, bool(apply_router_weight_on_input), op.on_input))
            if self._ll:
                if weight_and_reduce_impl is not None and not _types.is_delegate(weight_and_reduce_impl):
                    raise NotImplementedError(
                        "%s: weight_and_reduce_impl=%s: in low_latency mode the combine weighs "
                        "and sums each token's experts, so it takes "
                        "TopKWeightAndReduceDelegate or None"
                        % (entry, type(weight_and_reduce_impl).__name__))
                y = fused_expert_output
            else:
                y = self._ht_partials(op, fused_expert_output, weight_and_reduce_impl)
                if _shares_memory(y, output):
                    # vLLM hands the experts `output` as their buffer when the
                    # shapes match (N_recv == T) and a no-op reducer returns it;
                    # the combine reads y while it writes out (the library
                    # refuses the two sharing memory), so y gets its own.
                    y = y.clone()
            hook = self._sends.send(
                lambda: self.group.combine(op.handle, y, topk_weights=op.combine_weights,
                                           out=output, defer=True))
        except BaseException:
            self._inflight.add(op, *op.keys)  # bad input: the layer call stays finalizable
            raise
        op.finalized = True
        done = Once(hook, self._bound_s, self.group)

        def receiver():
            out = done()
            op.handle.free()
            return out
        return done, naming(receiver, self.group.rank)

    def _ht_partials(self, op, fused, impl):
        """[N_recv, H] bf16 partials. impl None: fused as given when the
        experts reduced it (2-D). TopKWeightAndReduceDelegate (vLLM's "the
        finalize decides", whose DeepEP finalize then weighs and sums as
        TopKWeightAndReduceContiguous does): a 2-D fused is the flat
        [N_recv * top_k, H] expert output. 3-D [N_recv, top_k, H]: weighted
        and summed over the received top-k."""
        res = op.recv()
        if res.recv_topk_idx.shape[0] == 0:
            # Nothing received: no partial to form, and a reducer's reshape
            # of zero rows raises (vLLM's DeepEP HT finalize skips it too).
            return torch.empty((0, fused.shape[-1]), dtype=torch.bfloat16, device=fused.device)
        if impl is not None and not _types.is_delegate(impl):
            ids = self._global_ids(res.recv_topk_idx, torch.int64)
            return impl.apply(None, fused, res.recv_topk_weights, ids, op.on_input)
        n, k = res.recv_topk_idx.shape
        if fused.dim() == 2 and impl is None:
            return fused
        if fused.dim() == 2:
            if fused.shape[0] != n * k:
                raise ValueError(
                    "finalize: fused_expert_output has shape %s; with "
                    "TopKWeightAndReduceDelegate a 2-D output is the flat [N_recv * top_k = "
                    "%d, H] expert output (N_recv=%d, top_k=%d), or pass [N_recv, top_k, H]"
                    % (tuple(fused.shape), n * k, n, k))
            fused = fused.view(n, k, fused.shape[1])
        if fused.dim() != 3 or fused.shape[1] != res.recv_topk_idx.shape[1]:
            raise ValueError("finalize: fused_expert_output has shape %s; high_throughput takes "
                             "[N_recv, H] partials or [N_recv, top_k=%d, H] expert outputs"
                             % (tuple(fused.shape), res.recv_topk_idx.shape[1]))
        valid = res.recv_topk_idx >= 0
        w = res.recv_topk_weights  # ones when prepare applied them to the rows
        acc = torch.zeros((fused.shape[0], fused.shape[2]), dtype=torch.float32, device=fused.device)
        for k in range(fused.shape[1]):  # k order, f32
            acc += (fused[:, k].float() * w[:, k:k + 1]).masked_fill(~valid[:, k:k + 1], 0.0)
        return acc.to(torch.bfloat16)


def _shares_memory(a, b):
    """Whether two tensors' bytes overlap (both dense, as the library takes
    them)."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or \
            a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


name_rank_in(PrepareAndFinalize, lambda p: p.group.rank)
