"""moe_ep.Group: one expert-parallel group (group_create .. group_destroy)
and its entries on torch tensors."""
import collections
import ctypes
import threading
from threading import get_ident as _thread_id

import torch

from . import _abi, _ht, _ll
from ._rank_named import name_rank_in
from ._library import resolve
from ._torch import TensorSlot, stream_reader
from .config import Config
from ._entries import Entries
from .errors import InvalidArgumentError
from .handle import Handle

_MAX_RANKS = 1024  # kernels/common/limits.h MEP_MAX_RANKS: sizes the first info()'s array

GroupInfo = collections.namedtuple(
    "GroupInfo", "rank world_size num_local_experts backend mode num_sms "
    "bytes_allocated config_hash peer_transports")


def _rank_world(rank, world_size):
    """Explicit values, else torch.distributed when initialised, else -1
    (the library reads MOE_EP_RANK / MOE_EP_WORLD_SIZE)."""
    dist = getattr(torch, "distributed", None)
    live = dist is not None and dist.is_available() and dist.is_initialized()
    if rank is None:
        rank = dist.get_rank() if live else -1
    if world_size is None:
        world_size = dist.get_world_size() if live else -1
    return int(rank), int(world_size)


class _PerThread(threading.local):
    """Each thread builds its own parameter structs once and reuses them:
    two threads may call into one group at the same time."""

    def __init__(self):
        p = self.prepare = _abi.init(_abi.PrepareParams)
        self.prepare_ptr = ctypes.pointer(p)
        self.topk = TensorSlot("topk_idx", False, p, "topk_idx")
        self.layout = tuple(TensorSlot(f, False, p, f) for f in (
            "num_tokens_per_rank", "num_tokens_per_expert", "is_token_in_rank"))
        s = self.slots = _abi.init(_abi.HandleLayoutParams)
        self.slots_ptr = ctypes.pointer(s)
        self.src_info = TensorSlot("src_info", False, s, "src_info")
        self.layout_range = TensorSlot("layout_range", False, s, "layout_range")


class Group:
    """An expert-parallel group over `world_size` ranks (collective to
    create and to close).

    config: an engine YAML path, YAML text, a dict for the `moe_ep:`
    section, or a moe_ep.Config. rank / world_size: default from
    torch.distributed when initialised, else MOE_EP_RANK /
    MOE_EP_WORLD_SIZE. device: the CUDA device of an nccl group (default
    the current one). nccl_comm: an ncclComm_t (int) for the EP group.
    library: a path or moe_ep Library (default: see moe_ep.load).

    close_at_gc (default True): whether the garbage collector closes a
    group nobody closed. Closing is collective (group_destroy waits for
    every rank, up to bootstrap.timeout_ms), so an owner that closes its
    groups itself on every rank sets it False: a group then dropped
    without close() stays allocated until the process ends instead of
    waiting at collection for peers that may never come."""

    def __init__(self, config, rank=None, world_size=None, device=None, nccl_comm=None,
                 library=None):
        self._g = None
        self._entries = Entries()
        # A routing notice read by the package itself (_poll_fatal), kept
        # for the engine's next poll_error: the library reports it once.
        self._kept_notice = None
        self.close_at_gc = True
        self._lib = resolve(library)
        self.config = config if isinstance(config, Config) else Config(config, self._lib)
        rank, world_size = _rank_world(rank, world_size)
        if device is not None and not isinstance(device, int):
            device = torch.device(device)
            if device.type != "cuda":
                raise ValueError("Group: device=%s must be a CUDA device (tensors of a host "
                                 "group are CPU tensors and need no device)" % device)
            device = device.index if device.index is not None else -1
        gp = _abi.init(_abi.GroupParams)
        gp.config = self.config._ptr
        gp.rank = rank
        gp.world_size = world_size
        gp.cuda_device = -1 if device is None else int(device)
        gp.nccl_comm = nccl_comm
        out = ctypes.c_void_p()
        st = self._lib.group_create(ctypes.byref(gp), ctypes.byref(out))
        self._lib.check(st, "group_create")
        self._g = out.value
        info = self.info()
        self.rank = info.rank
        self.world_size = info.world_size
        self.num_local_experts = info.num_local_experts
        self.backend = info.backend
        self.mode = info.mode
        if self.backend == "nccl":
            index = gp.cuda_device if gp.cuda_device >= 0 else torch.cuda.current_device()
            self.device = torch.device("cuda", index)
        else:
            self.device = torch.device("cpu")
        self._is_cuda = self.device.type == "cuda"
        self._stream = stream_reader(self.device)  # cudaStream_t of the current stream, or None
        self._ops_class = _ll.LowLatencyCalls if self.mode == "low_latency" else _ht.HighThroughputCalls
        self._tls = _PerThread()
        self._ops_by_thread = {}

    # ---- lifecycle ---------------------------------------------------------

    @property
    def pointer(self):
        """The moe_ep_group_t* (an int), for calls through the C table."""
        g = self._g
        if g is None:
            raise InvalidArgumentError("moe_ep: this Group is closed")
        return g

    def close(self):
        """group_destroy (collective). Handles and hooks may be freed later.
        Calls on the group running on other threads end first (moe_ep._entries);
        new ones are refused from now on."""
        def destroy():
            g, self._g = self._g, None
            if g is not None:
                self._lib.check(self._lib.group_destroy(g), "group_destroy")

        self._entries.close(self, destroy)

    def _call(self, fn, *args):
        """fn(group pointer, *args), counted as one of the group's entries
        (close waits for it)."""
        return self._entries.call(self, False, fn, args)

    def _call_late(self, fn, *args):
        """fn(*args) on one of the group's handles or hooks, which may come
        after close (moe_ep._entries.Entries.call)."""
        return self._entries.call(self, True, fn, args)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if not getattr(self, "close_at_gc", True):
            return  # the owner closes it (see the class comment); else it is left allocated
        try:
            self.close()
        except Exception:
            pass

    # ---- queries -----------------------------------------------------------

    def info(self):
        gi = _abi.init(_abi.GroupInfo)
        world = getattr(self, "world_size", _MAX_RANKS)
        peers = (ctypes.c_int32 * world)()
        gi.peer_transports = peers
        gi.peer_transports_len = world
        self._lib.check(self._call(self._lib.group_info, ctypes.byref(gi)), "group_info")
        return GroupInfo(gi.rank, gi.world_size, gi.num_local_experts, _abi.BACKENDS[gi.backend],
                         _abi.MODES[gi.mode], gi.num_sms, gi.bytes_allocated, gi.config_hash,
                         [_abi.TRANSPORTS[peers[i]] for i in range(gi.world_size)])

    def set_num_sms(self, num_sms):
        self._lib.check(self._call(self._lib.set_num_sms, int(num_sms)), "set_num_sms")

    def max_sms_used(self):
        n = ctypes.c_int32()
        self._lib.check(self._call(self._lib.max_sms_used, ctypes.byref(n)), "max_sms_used")
        return n.value

    def poll_error(self):
        """Raises the error that failed the group earlier, or one a kernel
        recorded since; returns None when there is none.

        nccl low_latency: TimeoutError, MismatchError (a rank dispatched
        with another hidden, top_k or row format, or ranks combined their
        pending dispatches in different orders) or InternalError, all
        failing the group; or InvalidArgumentError once for a dispatch
        that dropped a topk_idx slot outside -1..num_experts-1 or, from one
        source, the slots of an expert past max_tokens_per_rank (a repeat
        within a token); the group stays usable. nccl high_throughput:
        TimeoutError, MismatchError (ranks called set_num_sms differently)
        or InternalError, all failing the group; or InvalidArgumentError
        once for a dispatch that sent a topk_idx slot outside
        -1..num_experts-1 as -1 (library 0.5.1 or later; a repeated expert
        is carried as given and not reported); the group stays usable.
        Host backend: only the group's failure (its prepare refuses a bad
        topk_idx). A failed group raises the same error from every later
        operation: close it."""
        kept, self._kept_notice = self._kept_notice, None
        if kept is not None:
            raise kept
        self._lib.check(self._call(self._lib.group_poll_error), "group_poll_error")

    def _poll_fatal(self):
        """poll_error for the package's own checks: raises what failed the
        group; a routing notice (InvalidArgumentError, the group usable)
        is kept for the engine's next poll_error instead of raised here."""
        try:
            self.poll_error()
        except InvalidArgumentError as e:
            self._kept_notice = e

    # ---- operations --------------------------------------------------------

    def _ops(self):
        # A dict by thread id: cheaper than a threading.local on this path.
        ops = self._ops_by_thread.get(_thread_id())
        if ops is None:
            ops = self._ops_by_thread[_thread_id()] = self._ops_class(self)
        return ops

    def prepare(self, topk_idx, *, num_tokens_per_rank=None, num_tokens_per_expert=None,
                is_token_in_rank=None, layout=None):
        """The routing layout of one layer call: topk_idx [T, K] int32/int64
        (-1 = no expert). layout=True (default in high_throughput mode)
        also returns the layout in handle.layout: num_tokens_per_rank [R],
        num_tokens_per_expert [E] int32 and is_token_in_rank [T, R] bool;
        pass tensors to fill instead of new ones (uint8 or bool)."""
        shape = topk_idx.shape
        if len(shape) != 2:
            raise InvalidArgumentError("prepare: topk_idx has shape %s; it must be 2-D, "
                                       "[num_tokens, top_k]" % (tuple(shape),))
        tls = self._tls
        p = tls.prepare
        tls.topk.attach(topk_idx)
        p.num_tokens, p.top_k = shape
        p.stream = self._stream()
        if layout is None:
            layout = (self.mode == "high_throughput" or num_tokens_per_rank is not None
                      or num_tokens_per_expert is not None or is_token_in_rank is not None)
        out_layout = None
        if layout:
            out_layout = self._layout_outputs(topk_idx, num_tokens_per_rank,
                                              num_tokens_per_expert, is_token_in_rank)
            slots = tls.layout
            slots[0].attach(out_layout[0])
            slots[1].attach(out_layout[1])
            slots[2].attach(out_layout[2].view(torch.uint8) if out_layout[2].dtype == torch.bool
                            else out_layout[2])
        else:
            for s in tls.layout:
                s.attach(None)
        out = ctypes.c_void_p()
        st = self._call(self._lib.prepare, tls.prepare_ptr, ctypes.byref(out))
        if st != 0:
            raise self._lib.error(st, "prepare")
        return Handle(self, out.value, topk_idx, out_layout)

    def _layout_outputs(self, topk_idx, per_rank, per_expert, in_rank):
        dev = self.device
        t = topk_idx.shape[0] if topk_idx.dim() >= 1 else 0
        if per_rank is None:
            per_rank = torch.empty((self.world_size,), dtype=torch.int32, device=dev)
        if per_expert is None:
            per_expert = torch.empty((self.config.num_experts,), dtype=torch.int32, device=dev)
        if in_rank is None:
            in_rank = torch.empty((t, self.world_size), dtype=torch.bool, device=dev)
        return per_rank, per_expert, in_rank

    def dispatch(self, handle, x, *, topk_weights=None, out=None, defer=False,
                 round_scale=False, recv_capacity=None, format=None, x_scales=None,
                 worst_case=False):
        """Sends x [T, H] bf16 to the ranks of handle's experts.

        Low latency: returns a DispatchResult (recv_x [E_local, R*max_tokens,
        H] bf16 or fp8, recv_scales or None, recv_count [E_local] int32).
        topk_weights [T, K] f32 is optional: given here, the weights travel
        with the tokens and combine takes none (or the same tensor).
        High throughput: topk_weights is required; the result also has
        recv_topk_idx, recv_topk_weights and num_recv_tokens, and recv_x
        has num_recv_tokens rows (buffers hold recv_capacity rows, default
        world_size * max_tokens_per_rank: the ABI does not report the
        receive count before dispatch).
        out: the buffers to fill (a DispatchResult, or the tuple of its
        tensors) instead of new ones. defer=True sends only and returns a
        Hook; hook() receives and returns the result.
        format (low latency): this call's rows, "bf16", "fp8" (f32 scales),
        "fp8_ue8m0" or "fp8_ue8m0_packed"; None keeps the group's
        dispatch_dtype / fp8_scale. A group configured bf16 takes every
        format, one configured fp8 the fp8 ones.
        High throughput, pre-quantised fp8 (as vLLM and SGLang quantise
        before an HT dispatch): x=(x_fp8, scales), or x_fp8 with
        x_scales=scales; x_fp8 [T, H] float8_e4m3fn (uint8 storage before
        torch 2.1), scales [T, H/128] float32, [T, H/512] int32 (UE8M0
        packed) or [T, 1] float32 (one scale per token; moe-ep 0.5). The
        rows and scales arrive verbatim: recv_x is fp8 and recv_scales
        [rows, cols] of the scales' dtype. format defaults to the scales'
        ("fp8" for float32, "fp8_ue8m0_packed" for int32, "fp8_per_token"
        for one float32 column when H is not 128).
        worst_case=True (high throughput): outputs of recv_capacity rows
        (default and minimum world_size * max_tokens_per_rank), returned
        whole: rows from num_recv_tokens on have recv_topk_idx -1 and
        weight 0; no host sync (num_recv_tokens is None on CUDA groups),
        so the call can be captured in a CUDA graph; combine then takes y
        of those rows."""
        ops = self._ops_by_thread.get(_thread_id())
        if ops is None:
            ops = self._ops()
        return ops.dispatch(handle, x, topk_weights, out, defer, round_scale, recv_capacity,
                            format, x_scales, worst_case)

    def handle_layout(self, handle, src_info=None, layout_range=None):
        """An LL handle's slot layout as DeepEP's LL handle has it: returns
        (src_info [E_local, R*max_tokens] int32: the source token of each
        received slot, -1 past recv_count; layout_range [E_local, R] int64:
        begin << 32 | count of each source rank's slots). Slots are ordered
        by source rank, then token. Valid after the dispatch's receive
        (its hook ran) until a later dispatch reuses its buffer set: sets
        alternate per operation, dispatch or combine, so the dispatch after
        next when dispatches follow each other, the next one when a combine
        comes between.
        Pass tensors to fill instead of new ones. UnsupportedError for an
        HT handle, or a library older than 0.3."""
        fn = self._lib.entry("handle_layout")
        dev = self.device
        slots = self.world_size * self.config.max_tokens_per_rank
        if src_info is None:
            src_info = torch.empty((self.num_local_experts, slots), dtype=torch.int32, device=dev)
        if layout_range is None:
            layout_range = torch.empty((self.num_local_experts, self.world_size),
                                       dtype=torch.int64, device=dev)
        tls = self._tls
        p = tls.slots
        tls.src_info.attach(src_info)
        tls.layout_range.attach(layout_range)
        p.stream = self._stream()
        self._lib.check(self._call_late(fn, handle.pointer, tls.slots_ptr), "handle_layout")
        return src_info, layout_range

    def combine(self, handle, y, *, topk_weights=None, out=None, defer=False):
        """Brings expert outputs back: returns out [T, H] bf16. Low latency:
        y [E_local, R*max_tokens, H] bf16, out = sum_k w_k * y_k with
        topk_weights [T, K] f32 unless dispatch carried them. High
        throughput: y [num_recv_tokens, H] bf16 partials, summed over ranks
        (after a worst_case dispatch, y may have that dispatch's rows).
        defer=True returns a Hook whose hook() returns out."""
        ops = self._ops_by_thread.get(_thread_id())
        if ops is None:
            ops = self._ops()
        return ops.combine(handle, y, topk_weights, out, defer)


name_rank_in(Group, lambda g: g.rank)
