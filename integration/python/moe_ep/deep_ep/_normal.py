"""Buffer's normal-mode entries (DeepEP's get_dispatch_layout / dispatch /
combine) on a moe-ep high-throughput group, and the growth of that group
when its token cap was derived by the Buffer (NormalMixin._ht_fit)."""
import threading
import weakref

import torch

from .. import _fp8
from .. import errors as moe_ep_errors
from .._ht import check_format_supported, scale_format
from . import _agree as agreement
from .event import operation_event, wait_previous
from ._arg_names import COMBINE, DISPATCH, GET_DISPATCH_LAYOUT, in_deepep_words
from ._refuse import refuse as _refuse


class NormalHandle:
    """The handle of a normal-mode dispatch: what its combine (or a cached
    dispatch) needs. DeepEP's own handle holds its kernels' prefix
    matrices, which moe-ep does not have."""

    __slots__ = ("moe_ep", "topk_idx", "topk_weights", "recv_topk_weights", "recv_weights_version",
                 "worst_rows", "__weakref__")

    def __init__(self, ep_handle, topk_idx, topk_weights, recv_topk_weights, worst_rows):
        self.moe_ep = ep_handle
        self.topk_idx = topk_idx
        self.topk_weights = topk_weights
        self.recv_topk_weights = recv_topk_weights
        # torch counts in-place writes: combine returns the dispatch's own
        # weights, so it must know whether the caller changed them since.
        self.recv_weights_version = _version_or_none(recv_topk_weights)
        self.worst_rows = worst_rows  # rows of the latest dispatch's worst-case outputs, or 0

    def __getitem__(self, i):
        # DeepEP's handle is a tuple whose first entries are its kernels'
        # prefix matrices (its tests read handle[0]); this one has none.
        _refuse("handle[%r]" % (i,), "index", i, "moe-ep's normal-mode handle holds no prefix "
                "matrices (DeepEP's rank_prefix_matrix, channel_prefix_matrix, ...): pass it "
                "back as dispatch(handle=) or combine(handle=) only")


def _version_or_none(t):
    """t's count of in-place writes, or None for no tensor or one made under
    torch.inference_mode() (engines run their forward pass so), which keeps
    no such count."""
    if t is None or (hasattr(t, "is_inference") and t.is_inference()):
        return None
    return t._version


def _split_x(entry, x):
    """(x, scales or None, whether the scales were DeepEP's one-dimensional
    per-token [T]) of DeepEP's x or (x_fp8, scales); the library takes
    row-major 2-D scales, so DeepGEMM's column-major view is copied and [T]
    is viewed as [T, 1]."""
    if not isinstance(x, tuple):
        return x, None, False
    if len(x) != 2:
        raise ValueError("%s: x must be a tensor or (x_fp8, scales), got a tuple of %d"
                         % (entry, len(x)))
    x_fp8, scales = x
    for name, t in (("x[0] (x_fp8)", x_fp8), ("x[1] (scales)", scales)):
        if not isinstance(t, torch.Tensor):
            raise TypeError("%s: %s must be a torch.Tensor, got %s; pre-quantised x is the pair "
                            "(x_fp8, scales)" % (entry, name, type(t).__name__))
    one_d = scales.dim() == 1 and scales.dtype == torch.float32
    if one_d:
        scales = scales.view(-1, 1)
    per_token = scales.dim() == 2 and scales.dtype == torch.float32 and scales.shape[1] == 1
    if scales.dim() != 2 or (not per_token and
                             _scale_columns(x_fp8, scales) not in (None, scales.shape[1])):
        # Refused here, before prepare's collective runs.
        _refuse(entry, "x[1] (scales) of shape", tuple(scales.shape), "scales are [num_tokens, "
                "hidden/128] float32, [num_tokens, ceil(hidden/512)] int32 (UE8M0 packed), or "
                "one float32 per token ([num_tokens] or [num_tokens, 1])")
    return x_fp8, scales if scales.is_contiguous() else scales.contiguous(), one_d


def _scale_columns(x_fp8, scales):
    """The scale columns x_fp8's hidden size takes in scales' dtype, or
    None where the library's own checks name the fault (x_fp8 not [T, H],
    H not a multiple of 128, scales of another dtype)."""
    if x_fp8.dim() != 2 or x_fp8.shape[1] % _fp8.GROUP or \
            scales.dtype not in (torch.float32, torch.int32):
        return None
    return _fp8.scale_columns(int(x_fp8.shape[1]), packed=scales.dtype == torch.int32)


def _capturing():
    """Whether the current CUDA stream is being captured into a graph
    (torch >= 1.10 says; older torch cannot capture through this path).
    Nothing captures before CUDA is initialised (and a torch built without
    CUDA raises when asked)."""
    fn = getattr(torch.cuda, "is_current_stream_capturing", None)
    if fn is None or not torch.cuda.is_initialized():
        return False
    return bool(fn())


def _batch(topk_idx):
    """The tokens of a layer call's topk_idx [T, K] (0 for another shape,
    which prepare refuses with the library's sentence)."""
    shape = getattr(topk_idx, "shape", ())
    return int(shape[0]) if len(shape) == 2 else 0


def _ranks(rs):
    return "rank%s %s" % ("s" if len(rs) > 1 else "", ", ".join(map(str, rs)))


def _receive_fits(buf, g, res, num_worst_tokens, rows):
    """After a worst-case dispatch of `rows` > num_worst_tokens rows: raises
    ValueError on every rank when any rank received more than
    num_worst_tokens, so that no rank goes on to a combine its peers skip.
    A host group reports its count; a CUDA group's count stays on the
    device, read here with a host sync on an eager stream and not at all
    while the stream is being captured (a graph cannot sync: the caller's
    num_worst_tokens is then trusted, as DeepEP trusts it). The ranks
    compare over the Buffer's torch group or comm; without either, only
    the rank that overflowed raises (its peers then time out in combine)."""
    n = res.num_recv_tokens
    failure = None
    if n is None:  # CUDA group
        if _capturing():
            return
        over = bool((res.recv_topk_idx[num_worst_tokens:] >= 0).any())
        # A dispatch whose kernel timed out (a peer that never called)
        # raises its recorded error here, as its peers' do, rather than
        # enter a round the missing peer never reaches. Another failure
        # waits for the round; a routing notice (an id sent as -1 on this
        # rank only, the dispatch good on every rank) stays for the
        # engine's poll_error.
        try:
            g._poll_fatal()
        except (moe_ep_errors.TimeoutError, moe_ep_errors.PeerFailedError):
            raise
        except moe_ep_errors.Error as e:
            failure = e
    else:
        over = n > num_worst_tokens
    ranks = agreement.ranks_with(buf._channel(), over, buf.rank)
    if failure is not None and not ranks:
        raise failure
    if ranks:
        raise ValueError(
            "dispatch: %s received more than num_worst_tokens=%d tokens (this rank: %s); "
            "num_worst_tokens must bound every rank's receive (world_size * the most tokens a "
            "rank sends; %d rows, world_size * max_tokens_per_rank, always do); every rank "
            "raises, and none combines this dispatch"
            % (_ranks(ranks), num_worst_tokens,
               ("more" if n is None else n) if over else "within it", rows))


def _worst_case(buf, g, ep_handle, x, x_scales, topk_weights, num_worst_tokens):
    """(recv_x, recv_scales, recv_topk_idx, recv_topk_weights) of
    num_worst_tokens rows, and the rows the library's worst-case dispatch
    filled: world_size * max_tokens_per_rank (or more), of which these are
    the first; the rows past the receive name no expert."""
    rows = max(num_worst_tokens, g.world_size * g.config.max_tokens_per_rank)
    res = g.dispatch(ep_handle, x, x_scales=x_scales, topk_weights=topk_weights, worst_case=True,
                     recv_capacity=rows)
    if num_worst_tokens < rows:
        _receive_fits(buf, g, res, num_worst_tokens, rows)
    k = slice(0, num_worst_tokens)
    scales = res.recv_scales[k] if res.recv_scales is not None else None
    return res.recv_x[k], scales, res.recv_topk_idx[k], res.recv_topk_weights[k], rows


def _library_rows(y, rows):
    """y as combine hands it to the library after a worst-case dispatch of
    `rows` rows: a GPU group never learns the receive count on the host, so
    it takes y of all those rows. A y of num_worst_tokens rows holds the
    receive (dispatch checked it, or, under graph capture, the caller
    promised it); the rows added past it are zeros, so a receive that broke
    that promise adds nothing rather than stale memory."""
    if y.shape[0] >= rows:
        return y
    full = y.new_zeros((rows,) + tuple(y.shape[1:]))
    full[:y.shape[0]] = y
    return full


def _bias_parts(entry, bias, shape, device):
    """The tensors of DeepEP's bias: a tensor, or the pair (bias_0, bias_1)
    where either may be None; each must be [T, H] bf16 like the combined x."""
    if isinstance(bias, tuple):
        if len(bias) != 2:
            raise ValueError("%s: bias is a tuple of %d; DeepEP's bias is a tensor or the pair "
                             "(bias_0, bias_1)" % (entry, len(bias)))
        named = (("bias[0]", bias[0]), ("bias[1]", bias[1]))
    else:
        named = (("bias", bias),)
    parts = []
    for name, b in named:
        if b is None:
            continue
        if not isinstance(b, torch.Tensor):
            raise TypeError("%s: %s must be a torch.Tensor, got %s" % (entry, name, type(b).__name__))
        if b.dtype != torch.bfloat16 or tuple(b.shape) != shape or b.device != device:
            raise ValueError("%s: %s is %s %s on %s; a bias is [num_tokens, hidden] = %s bfloat16 "
                             "on %s, like the combined x" % (entry, name, tuple(b.shape), b.dtype,
                                                              b.device, shape, device))
        parts.append(b)
    return parts


def _max_tokens(t):
    n = 1024
    while n < t:
        n *= 2
    return n


def _torch_layout(topk_idx, num_experts, world):
    """get_dispatch_layout's (num_tokens_per_rank [R] int32,
    num_tokens_per_expert [E] int32, is_token_in_rank [T, R] bool) in torch,
    for the Buffer's first normal-mode call: the high-throughput group is
    created by the first dispatch, which sees x's hidden. Ids outside
    [0, num_experts) count nowhere here; the dispatch's prepare refuses
    them with the library's sentence."""
    idx = topk_idx.long()
    valid = (idx >= 0) & (idx < num_experts)
    experts = torch.where(valid, idx, torch.full_like(idx, num_experts))
    per_expert = torch.zeros(num_experts + 1, dtype=torch.int32, device=idx.device)
    per_expert.scatter_add_(0, experts.reshape(-1), torch.ones_like(experts.reshape(-1),
                                                                    dtype=torch.int32))
    ranks = torch.where(valid, idx // (num_experts // world), torch.full_like(idx, world))
    in_rank = torch.zeros((idx.shape[0], world + 1), dtype=torch.bool, device=idx.device)
    in_rank.scatter_(1, ranks, True)
    in_rank = in_rank[:, :world].contiguous()
    return in_rank.sum(0, dtype=torch.int32), per_expert[:num_experts], in_rank


class NormalMixin:

    def _ht_group(self, entry, num_experts, hidden, topk_idx, num_worst_tokens=0):
        """The normal-mode group, created from the first call's shapes. Its
        token cap: with num_worst_tokens (world_size * the most tokens a
        rank sends), ceil(num_worst_tokens / world_size), or the batch when
        larger, so that the library's world_size * max_tokens_per_rank rows
        are num_worst_tokens rows and the dispatch needs no host check
        (CUDA-graph capturable); else the batch rounded up (_max_tokens).
        The ranks then agree on the largest; moe_ep_config,
        MOE_EP_HT_MAX_TOKENS_PER_RANK or MOE_EP_MAX_TOKENS_PER_RANK override
        it. A derived cap may grow later (_ht_fit), a given one never."""
        t = int(topk_idx.shape[0])
        if num_worst_tokens > 0:
            tokens = max(t, -(-int(num_worst_tokens) // self.group_size), 1)
        else:
            tokens = _max_tokens(t)
        derived = {"num_experts": int(num_experts), "hidden": int(hidden),
                   "top_k": int(topk_idx.shape[-1]), "max_tokens_per_rank": tokens}
        return self._group_for("high_throughput", derived)

    def _ht_made(self, derived):
        """The state of a first normal-mode group, set by the call that
        creates it (Buffer._create_group, in self._create) before another
        thread can find the group: a second thread's first call, which waited
        for it, leaves it alone."""
        self._ht_derived = derived
        self._ht_grows = self._ht_given_tokens() is None
        self._ht_pending = weakref.WeakSet()
        self._ht_captured = False

    def _ht_fit(self, entry, topk_idx):
        """The normal-mode group for a call that starts a new layout (a
        get_dispatch_layout, or a dispatch that does not reuse one): when
        the Buffer derived its cap and has a channel (torch group or comm),
        the ranks first agree on their largest batch (one all-reduce of one
        integer); above the cap, every rank grows the group (_ht_grow).
        Nothing is agreed for a given cap, without a channel (a batch above
        the cap is then refused by the library, as for a given cap), or
        while the current CUDA stream is being captured (a graph cannot
        take a collective with a host read)."""
        g = self._ht_ep
        if not self._ht_grows:
            return g
        ch = self._channel()
        if ch is None or _capturing():
            return g
        t = _batch(topk_idx)
        largest = ch.max(t)
        if self._ht_retired:
            self._ht_reap(ch)
        if largest <= g.config.max_tokens_per_rank:
            return g
        return self._ht_grow(entry, ch, g, t, largest)

    def _ht_reap(self, ch):
        """Closes each retired group (_ht_grow) none of whose dispatches
        still waits for its combine on any rank: one round over the channel,
        taken by every rank alike (the retired list is the same everywhere),
        so the collective closes run at the same call on every rank."""
        everyone = ch.gather([len(pending) for _, pending in self._ht_retired])
        keep = []
        for i, (old, pending) in enumerate(self._ht_retired):
            if any(e[i] for e in everyone):
                keep.append((old, pending))
            else:
                old.close()
        self._ht_retired = keep

    def _ht_grow(self, entry, ch, g, t, largest):
        """Replaces the normal-mode group with one of max_tokens_per_rank =
        `largest` rounded up (_max_tokens), the other keys as before, its
        address agreed again (or the configured one reused), on every rank
        alike. The old group is closed, or, while any rank holds a dispatch
        of it whose combine has not run (two-batch overlap's other
        micro-batch), retired: that combine still runs on it, and the group
        is closed at the first agreement after every rank's last such
        combine (_ht_reap). A retired group's rank 0 keeps its address's
        port bound (not listening) until it is closed, and each live group
        needs a port of its own, so a configured address then gets a port
        rank 0 picks.
        Refused on every rank (RuntimeError, the group unchanged) while any
        rank has captured a normal-mode call of the group in a CUDA graph (a
        replay would use the replaced group's buffers)."""
        cap = g.config.max_tokens_per_rank
        new_cap = _max_tokens(largest)
        everyone = ch.gather((t, len(self._ht_pending), bool(self._ht_captured),
                              agreement.free_port() if ch.rank == 0 else None))
        over = [r for r, e in enumerate(everyone) if e[0] > cap]
        held = any(e[1] for e in everyone)
        captured = [r for r, e in enumerate(everyone) if e[2]]
        if captured:
            raise RuntimeError(
                "%s: topk_idx has %s (this rank: %d), above the normal-mode group's "
                "max_tokens_per_rank=%d, which the Buffer derived from an earlier batch; it "
                "grows such a group (replaces it with one of max_tokens_per_rank=%d, every "
                "rank alike), but %s captured normal-mode calls of it in a CUDA graph, whose "
                "replay would use the replaced group's buffers; give every rank the cap of the "
                "largest batch (moe_ep_config={'high_throughput': {'max_tokens_per_rank': %d}} "
                "or %s=%d). Every rank raises; the group is unchanged"
                % (entry, ", ".join("%d tokens on rank %d" % (everyone[r][0], r) for r in over),
                   t, cap, new_cap, _ranks(captured), new_cap, agreement.HT_TOKENS_ENV, new_cap))
        for cached in self._layouts_take_all():
            if cached[1] is not None:
                cached[1].free()  # prepared, never dispatched: nothing waits on it
        keep = None
        if not self._ht_address_agreed:
            keep = g.config.bootstrap_address
            if held:
                keep = "%s:%d" % (keep.rpartition(":")[0], everyone[0][3])
        derived = dict(self._ht_derived, max_tokens_per_rank=new_cap)
        with self._create:  # a thread finding no group meanwhile waits for this one (_group_for)
            self._ht_ep = None
            if held:
                self._ht_retired.append((g, self._ht_pending))
            else:
                g.close()
            self._ht_pending = weakref.WeakSet()
            g = self._group_for("high_throughput", derived, keep_address=keep)
        self._ht_derived = derived
        return g

    def _ht_owns(self, entry, g, handle, retired_ok=False):
        """The group `handle` belongs to: `g`, or with retired_ok a retired
        one (_ht_grow) whose combine of it has still to run. Raises
        RuntimeError when it comes from a normal-mode group this Buffer has
        since replaced (grown) and closed, or, for a cached dispatch,
        retired."""
        mine = handle.moe_ep._group
        if mine is g:
            return g
        if retired_ok and any(old is mine for old, _ in self._ht_retired):
            return mine
        raise RuntimeError(
            "%s: handle comes from the normal-mode group this Buffer replaced when a batch "
            "outgrew its derived max_tokens_per_rank (now %d)%s; dispatch afresh with "
            "topk_idx= and use that dispatch's handle"
            % (entry, g.config.max_tokens_per_rank,
               "" if retired_ok else " (a replaced group runs only the combines of the "
               "dispatches it had made)"))

    def _note_capture(self):
        """Records a normal-mode call made while the current CUDA stream is
        being captured (its graph may replay on the group: _ht_grow)."""
        if self._ht_grows and not self._ht_captured and _capturing():
            self._ht_captured = True

    def _ht_sms(self, g, config):
        """DeepEP sizes each normal dispatch by config.num_sms, else by
        get_dispatch_config's (Buffer.num_sms, which set_num_sms writes):
        the group follows when that changes (its combine repeats its
        dispatch's split, so only dispatch applies it). Engines change it
        on every rank alike, as DeepEP needs too."""
        if config is None:
            config = self.get_dispatch_config(self.group_size)
        want = int(config.num_sms)
        if g.backend == "nccl" and want != getattr(self, "_ht_num_sms", None):
            g.set_num_sms(want)
            self._ht_num_sms = want

    # get_dispatch_layout's handle, kept for the next dispatch of the same
    # topk_idx on the same thread: two micro-batch threads each get their
    # own (one slot shared by both would make one thread's dispatch miss
    # and prepare again, a count exchange its peers do not make).
    def _layouts(self):
        return self._layout_by_thread  # made in Buffer.__init__

    def _layout_put(self, cached):
        self._layouts()[threading.get_ident()] = cached

    def _layout_peek(self):
        return self._layouts().get(threading.get_ident())

    def _layout_take(self):
        return self._layouts().pop(threading.get_ident(), None)

    def _layouts_take_all(self):
        layouts = self._layouts()
        taken = list(layouts.values())
        layouts.clear()
        return taken

    def _ht_prepare(self, g, topk_idx):
        """The handle prepared by get_dispatch_layout for this very topk_idx,
        else a new one (prepare exchanges counts: every rank must take the
        same branch, as engines call both entries symmetrically)."""
        cached = self._layout_take()
        if cached is not None and cached[0] is topk_idx and cached[1] is not None:
            return cached[1]
        return g.prepare(topk_idx)

    @in_deepep_words("get_dispatch_layout", GET_DISPATCH_LAYOUT)
    def get_dispatch_layout(self, topk_idx, num_experts, previous_event=None, async_finish=False,
                            allocate_on_comm_stream=False):
        """Returns (num_tokens_per_rank [R] int32, None, num_tokens_per_expert
        [E] int32, is_token_in_rank [T, R] bool, event). Before the Buffer's
        first normal-mode dispatch the layout is computed in torch (that
        dispatch creates the group, with x's hidden); afterwards by the
        group's prepare, whose handle the next dispatch of this topk_idx
        reuses. A group whose cap the Buffer derived first grows when some
        rank's batch exceeds it (_ht_fit)."""
        entry = "get_dispatch_layout"
        self._check_live(entry)
        wait_previous(previous_event)
        g = self._ht_ep
        user = self._mode_config("high_throughput")
        if g is None and "hidden" not in user:
            if num_experts % self.group_size != 0:
                raise ValueError("%s: num_experts=%d must be a multiple of the group's %d ranks"
                                 % (entry, num_experts, self.group_size))
            if user.get("num_experts", num_experts) != num_experts:
                raise ValueError("%s: num_experts=%d differs from moe_ep_config's num_experts=%d"
                                 % (entry, num_experts, user["num_experts"]))
            per_rank, per_expert, in_rank = _torch_layout(topk_idx, num_experts,
                                                          self.group_size)
            self._layout_put((topk_idx, None, num_experts))
            event = operation_event(async_finish, topk_idx.is_cuda, topk_idx, per_rank,
                                    per_expert, in_rank)
            return per_rank, None, per_expert, in_rank, event
        if g is None:  # moe_ep_config names the hidden size: the group can be made now
            g = self._ht_group(entry, num_experts, user["hidden"], topk_idx)
        elif num_experts == g.config.num_experts:
            g = self._ht_fit(entry, topk_idx)
        if num_experts != g.config.num_experts:
            raise ValueError("%s: num_experts=%d differs from the group's num_experts=%d"
                             % (entry, num_experts, g.config.num_experts))
        self._note_capture()
        handle = g.prepare(topk_idx, layout=True)
        self._layout_put((topk_idx, handle, num_experts))
        per_rank, per_expert, in_rank = handle.layout
        event = operation_event(async_finish, g._is_cuda, topk_idx, per_rank, per_expert, in_rank)
        return per_rank, None, per_expert, in_rank, event

    @in_deepep_words("dispatch", DISPATCH)
    def dispatch(self, x, handle=None, num_tokens_per_rank=None, num_tokens_per_rdma_rank=None,
                 is_token_in_rank=None, num_tokens_per_expert=None, topk_idx=None,
                 topk_weights=None, expert_alignment=1, num_worst_tokens=0, config=None,
                 previous_event=None, async_finish=False, allocate_on_comm_stream=False):
        """Returns (recv_x, recv_topk_idx, recv_topk_weights,
        num_recv_tokens_per_expert_list, handle, event). moe-ep derives the
        layout from topk_idx; the layout tensors get_dispatch_layout
        returned are accepted as DeepEP callers pass them. config tunes
        DeepEP's chunking, which moe-ep does not have. moe-ep runs on the
        current stream, which is what allocate_on_comm_stream protects.

        x may be (x_fp8, scales), pre-quantised as vLLM and SGLang do:
        scales [T, H/128] float32 or [T, H/512] int32 (a column-major view
        is copied to row-major); recv_x is then (recv_x_fp8, recv_scales),
        rows and scales exactly as sent. num_worst_tokens > 0: outputs of
        num_worst_tokens rows, padding rows with recv_topk_idx -1 and
        weight 0, and an empty per-expert list, as DeepEP's. A dispatch
        that creates the group sizes it so that world_size *
        max_tokens_per_rank is num_worst_tokens where it can (_ht_group);
        at that many rows or more it takes no host sync (a CUDA graph can
        capture the dispatch and its combine). A smaller num_worst_tokens
        gets views of the library's rows, and combine copies its x into
        rows of the library's size; whether every rank's receive fits is
        checked on every rank alike (_receive_fits: a host sync on an eager
        CUDA stream, nothing while capturing). handle= repeats the
        handle's dispatch layout (DeepEP's cached dispatch) with this x and
        returns (recv_x, None, None, None, None, event), as DeepEP's cached
        dispatch does (the handle passed in serves its combine). A dispatch
        that starts a new layout on a group whose cap the Buffer derived
        first grows it when some rank's batch exceeds it (_ht_fit); a
        cached or num_worst_tokens dispatch does not."""
        entry = "dispatch"
        x, x_scales, scales_1d = _split_x(entry, x)
        if num_worst_tokens < 0:
            raise ValueError("%s: num_worst_tokens=%d must be >= 0" % (entry, num_worst_tokens))
        if expert_alignment < 1:
            raise ValueError("%s: expert_alignment=%d must be >= 1" % (entry, expert_alignment))
        wait_previous(previous_event)
        cached = handle is not None
        if cached:
            if not isinstance(handle, NormalHandle):
                raise TypeError("%s: handle must be one dispatch returned, got %s"
                                % (entry, type(handle).__name__))
            for name, given in (("topk_idx", topk_idx), ("topk_weights", topk_weights)):
                if given is not None:  # DeepEP asserts the same: the handle routes
                    raise ValueError("%s: %s is given with handle=; a cached dispatch repeats "
                                     "the handle's layout, so pass neither (or no handle for a "
                                     "new routing)" % (entry, name))
            topk_idx, topk_weights = handle.topk_idx, handle.topk_weights
        elif topk_idx is None:
            # is_token_in_rank alone would route the rows, but DeepEP then
            # returns the per-expert list from every rank's
            # num_tokens_per_expert, which moe-ep never exchanges.
            _refuse(entry, "topk_idx", None, "high-throughput dispatch routes by expert ids "
                    "(topk_idx), from which it counts the received tokens per expert; it cannot "
                    "route by is_token_in_rank and num_tokens_per_expert alone")
        elif topk_weights is None:
            _refuse(entry, "topk_weights", None, "high-throughput dispatch carries the weights "
                    "with topk_idx (zeros where the caller has none)")
        g = self._ht_ep
        layout_cache = self._layout_peek()
        if g is None:
            user = self._mode_config("high_throughput")
            if layout_cache is not None and layout_cache[0] is topk_idx:
                num_experts = layout_cache[2]
            elif num_tokens_per_expert is not None:
                num_experts = int(num_tokens_per_expert.shape[0])
            elif "num_experts" in user:
                num_experts = user["num_experts"]
            else:
                raise ValueError("%s: the Buffer's first normal-mode call must show num_experts: "
                                 "call get_dispatch_layout first, pass num_tokens_per_expert, or "
                                 "give moe_ep_config={'num_experts': ...}" % entry)
            g = self._ht_group(entry, num_experts, x.shape[-1], topk_idx, num_worst_tokens)
        elif cached:
            self._ht_owns(entry, g, handle)
        elif not num_worst_tokens and not (layout_cache is not None and layout_cache[0] is topk_idx
                                           and layout_cache[1] is not None):
            # A new layout (get_dispatch_layout's would have agreed already);
            # num_worst_tokens sized the group that serves it.
            g = self._ht_fit(entry, topk_idx)
        self._ht_sms(g, config)
        self._note_capture()
        if x_scales is not None:  # per-token scales need a 0.5 library: said before prepare
            check_format_supported(g._lib, scale_format(x, x_scales, None))
        ep_handle = handle.moe_ep if cached else self._ht_prepare(g, topk_idx)
        worst_rows = 0
        try:
            if num_worst_tokens:
                recv_x, recv_scales, recv_idx, recv_w, worst_rows = _worst_case(
                    self, g, ep_handle, x, x_scales, topk_weights, num_worst_tokens)
                per_expert_list = []
            else:
                res = g.dispatch(ep_handle, x, x_scales=x_scales, topk_weights=topk_weights)
                recv_x, recv_scales, recv_idx, recv_w = (res.recv_x, res.recv_scales,
                                                         res.recv_topk_idx, res.recv_topk_weights)
                counts = res.recv_count.tolist()  # DeepEP returns this list on the host too
                a = expert_alignment
                per_expert_list = [(c + a - 1) // a * a for c in counts]
        except BaseException:
            if not cached:  # a handle the caller passed in stays the caller's
                ep_handle.free()
            raise
        if not cached:
            # Before the event: a stream that waits on it reads the ids as
            # returned (DeepEP's dtype, the library's are int32).
            recv_idx = recv_idx.to(topk_idx.dtype)
        event = operation_event(async_finish, g._is_cuda, x, x_scales, topk_idx, topk_weights,
                                recv_x, recv_scales, recv_idx, recv_w)
        if x_scales is not None:
            # DeepEP's received scales keep the rank of the scales sent.
            recv_x = (recv_x, recv_scales.view(-1) if scales_1d else recv_scales)
        if cached:
            handle.worst_rows = worst_rows  # combine follows the latest dispatch
            if self._ht_grows:
                self._ht_pending.add(handle)
            return recv_x, None, None, None, None, event
        new_handle = NormalHandle(ep_handle, topk_idx, topk_weights, recv_w, worst_rows)
        if self._ht_grows:
            self._ht_pending.add(new_handle)  # until its combine: the group must not grow
        return recv_x, recv_idx, recv_w, per_expert_list, new_handle, event

    @in_deepep_words("combine", COMBINE)
    def combine(self, x, handle, topk_weights=None, bias=None, config=None, previous_event=None,
                async_finish=False, allocate_on_comm_stream=False):
        """Returns (combined_x [T, H] bf16, combined_topk_weights, event):
        the partials x summed over ranks ascending in f32, then bf16 (with
        ranks_per_node set, each node's first, then the node sums: moe_ep.h).
        bias (a [T, H] bf16 tensor, or DeepEP's pair (bias_0, bias_1)) is
        then added: bf16((bias_0 + bias_1) + combined) in f32. DeepEP adds
        the bias inside its f32 sum and rounds once; here the sum of the
        partials was rounded to bf16 first, so a value can differ from
        DeepEP's by that rounding (half a bf16 ulp of the unbiased sum,
        more than an ulp of the result where the bias cancels the sum)."""
        entry = "combine"
        if not isinstance(handle, NormalHandle):
            raise TypeError("%s: handle must be the one dispatch returned, got %s"
                            % (entry, type(handle).__name__))
        bias = () if bias is None else _bias_parts(  # checked before the collective combine
            entry, bias, (handle.topk_idx.shape[0], x.shape[-1]), x.device)
        combined_w = None
        if topk_weights is not None:
            if topk_weights is not handle.recv_topk_weights:
                _refuse(entry, "topk_weights", "<tensor>", "only the recv_topk_weights this "
                        "handle's dispatch returned can be combined (they come back as the "
                        "dispatch's weights); moe-ep's combine carries no weights")
            now = _version_or_none(topk_weights)
            if now is not None and handle.recv_weights_version is not None and \
                    now != handle.recv_weights_version:
                _refuse(entry, "topk_weights", "<recv_topk_weights written in place>",
                        "moe-ep's combine carries no weights: it returns the weights the "
                        "dispatch sent, which no longer match the tensor after that write "
                        "(DeepEP would reduce the written values); pass topk_weights=None and "
                        "reduce them yourself, or combine the weights unchanged")
            w = handle.topk_weights
            combined_w = torch.where(handle.topk_idx >= 0, w, torch.zeros_like(w))
        wait_previous(previous_event)
        g = self._ht_owns(entry, self._live_group("high_throughput", entry), handle,
                          retired_ok=True)
        self._note_capture()
        out = g.combine(handle.moe_ep, _library_rows(x, handle.worst_rows))
        self._ht_pending.discard(handle)
        for _, pending in self._ht_retired:
            pending.discard(handle)
        if bias:
            acc = bias[0].float()
            for b in bias[1:]:
                acc = acc + b.float()
            out = (acc + out.float()).to(torch.bfloat16)
        event = operation_event(async_finish, g._is_cuda, x, topk_weights, out, combined_w)
        return out, combined_w, event
