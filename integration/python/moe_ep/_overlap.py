"""What the engine adapters (moe_ep.vllm, moe_ep.sglang) share: a receive
hook that either the engine's other micro-batch thread or the receiver
itself may run first, the operations in flight between an engine's
prepare and finalize, LL receive buffers reused in turn (one ring per
group, whichever adapters use it), and the check that the engine places
experts the way moe-ep does."""
import copy
import threading

import torch

from . import _fp8
from ._bound import bound_words
from ._per_group import kept_on
from .errors import TimeoutError as MoeEpTimeoutError


def on_send_stream(group, hook):
    """hook, run with the stream that is current now (its send's) as the
    calling thread's current stream, whichever thread calls it later: a
    DeepEP receive hook launches on the stream its dispatch or combine was
    issued on, so the micro-batch's later work on that stream is ordered
    after the receive even when the other micro-batch's thread, with
    another stream current, runs the hook (vLLM's dual-batch overlap). Work
    chained in the same call (the scales' copy, statistics) lands on that
    stream too. A group whose tensors live on the host gets its hook back
    as it is."""
    if group.device.type != "cuda":
        return hook
    stream = torch.cuda.current_stream(group.device)

    def run():
        # The device first: a stream context alone would restore the
        # calling thread's stream of its own current device on exit, which
        # can create a CUDA context on a GPU the process never used.
        with torch.cuda.device(stream.device), torch.cuda.stream(stream):
            return hook()
    return run


def column_major_receive(hook):
    """hook, whose result's fp8 scales are then copied, in the same call
    (so on the stream its receive ran on), into DeepEP's column-major
    layout: a low-latency receive as DeepEP hands it to the engines'
    grouped GEMMs. The result is otherwise the hook's."""
    def run():
        res = hook()
        if res.recv_scales is None:
            return res
        out = copy.copy(res)  # res may be a ring's reused output: left as it is
        out.recv_scales = _fp8.column_major(res.recv_scales)
        return out
    return run


class Once:
    """A moe_ep.Hook that runs exactly once, from whichever thread calls
    first (the engine's other micro-batch, or the receiver when the engine
    ran nothing), on the stream that was current when the Once was made
    (its send's: on_send_stream); later calls wait for that run and return
    its result."""

    __slots__ = ("_hook", "_lock", "_done", "_bound_s", "_rank", "result")

    def __init__(self, hook, bound_s, group):
        self._hook = on_send_stream(group, hook)
        self._lock = threading.Lock()
        self._done = False
        self._bound_s = bound_s
        self._rank = group.rank
        self.result = None

    def __call__(self):
        if not self._lock.acquire(timeout=self._bound_s):
            raise MoeEpTimeoutError("rank %d: hook: another thread has run this receive for "
                                    "more than %s" % (self._rank, bound_words(self._bound_s)))
        try:
            if not self._done:
                self.result = self._hook()  # raises with the library's sentence, stays not done
                self._done = True
        finally:
            self._lock.release()
        return self.result

    @property
    def done(self):
        return self._done


class InFlight:
    """Operations between prepare and finalize, found again by the topk_ids
    tensor the engine hands to both (vLLM passes the prepare's result on,
    so an operation may be registered under more than one tensor). Two
    operations registered under one tensor are taken oldest first.

    An adapter needs at most two operations in flight (two micro-batches;
    the library fails a combine once a later dispatch lands on its buffer
    set, and sets alternate), so one it holds when a third prepare starts
    is a layer call the engine gave up (an exception between its prepare
    and its finalize). stale() hands that one out to be given up, so what
    an adapter holds stays bounded whatever the engine drops."""

    def __init__(self, live=2):
        self._lock = threading.Lock()
        self._live = live
        self._made = 0  # operations added so far: an operation's stamp is its place among them
        self._order = []  # operations, oldest (lowest stamp) first
        self._ops = {}  # id(tensor) -> [(tensor, op), ...] oldest first; the tensor pins the id

    def add(self, op, *tensors):
        """Registers op under tensors. An op added again (a finalize that
        was refused puts it back) keeps its place: op.stamp, given on its
        first add, orders it."""
        with self._lock:
            if getattr(op, "given_up", False):
                return  # stale() handed it out: a late receiver or refused finalize brings it back
            if op.stamp is None:
                op.stamp = self._made
                self._made += 1
            if not any(o is op for o in self._order):
                self._order.append(op)
                self._order.sort(key=lambda o: o.stamp)
            for t in tensors:
                if t is not None:
                    self._ops.setdefault(id(t), []).append((t, op))

    def take(self, topk_ids, entry, arg="topk_ids"):
        """Removes and returns the oldest operation registered under
        topk_ids (the same object, else a tensor with the same storage and
        shape)."""
        with self._lock:
            op = _oldest(o for t, o in self._ops.get(id(topk_ids), ()) if t is topk_ids)
            if op is None:
                op = self._by_storage(topk_ids)
            if op is None:
                raise ValueError(
                    "%s: %s (shape %s) is not a tensor that a pending prepare got or returned; "
                    "%d operation(s) are in flight (a prepare gives up the oldest of two it "
                    "finds in flight: finalize each before the prepare after next)"
                    % (entry, arg, tuple(getattr(topk_ids, "shape", ())), len(self._order)))
            self._remove(op)
            return op

    def stale(self):
        """Removes and returns, oldest first, the operations a prepare
        about to dispatch finds beyond the newest live - 1: once it has
        dispatched they could no longer be combined."""
        with self._lock:
            old = self._order[:max(0, len(self._order) - self._live + 1)]
            for op in old:
                self._remove(op)
                op.given_up = True
            return old

    def _remove(self, op):
        self._order = [o for o in self._order if o is not op]
        for key in list(self._ops):
            kept = [(t, o) for t, o in self._ops[key] if o is not op]
            if kept:
                self._ops[key] = kept
            else:
                del self._ops[key]

    def _by_storage(self, t):
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            return None
        return _oldest(o for entries in self._ops.values() for held, o in entries
                       if held.data_ptr() == t.data_ptr() and held.shape == t.shape)

    def __len__(self):
        with self._lock:
            return len(self._order)


def _oldest(ops):
    """The operation of lowest stamp among ops, or None."""
    return min(ops, key=lambda o: o.stamp, default=None)


class RecvRing:
    """Two sets of LL receive buffers per key (the hidden size, and the row
    format where adapters may differ in it), used in turn by every
    dispatch that goes through the ring: the library requires a handle's
    combine before a later dispatch on its group reuses the library's
    buffer set of its dispatch (those sets alternate per operation,
    dispatch or combine: the dispatch after next when dispatches follow
    each other, the next one when a combine comes between): at the latest
    before the dispatch after next. The experts have read the receive by
    then, so the ring's set two dispatches back is free (as DeepEP's LL
    receive buffers are). That rule is per group, so one ring
    serves every adapter on a group (group_recv_ring): a model's MoE
    layers share two sets instead of holding two each. No allocation after
    the first two dispatches of a key, so a CUDA graph can hold it."""

    def __init__(self):
        self._lock = threading.Lock()  # the turn and its dispatch go together
        self._sets = {}  # key -> [DispatchResult or None, DispatchResult or None, next]

    def send(self, key, dispatch, bound_s, entry):
        """Runs dispatch(buffers) -> Hook with the set whose turn it is
        (None the first two times: "let dispatch allocate") and keeps the
        hook's result as that set. The ring is held from the turn to the
        dispatch, so two threads (two micro-batches, two adapters) never
        take one set; the turn passes only when dispatch returned, so a
        refused dispatch does not skip a set."""
        if not self._lock.acquire(timeout=bound_s):
            raise MoeEpTimeoutError("%s: another thread held this group's receive buffers for "
                                    "more than %s" % (entry, bound_words(bound_s)))
        try:
            s = self._sets.get(key)
            if s is None:
                s = self._sets[key] = [None, None, 0]
            index = s[2]
            hook = dispatch(s[index])
            s[index] = hook.result
            s[2] = 1 - index
            return hook
        finally:
            self._lock.release()


def group_recv_ring(group):
    """The RecvRing of a moe_ep.Group, kept on the group (every adapter on
    it uses the one ring)."""
    return kept_on(group, "_moe_ep_recv_ring", RecvRing)


def contiguous_expert_map(group):
    """moe-ep's placement as an engine expert_map: rank r holds global
    experts [r*L, (r+1)*L) as local 0..L-1, -1 elsewhere."""
    e, local, r = group.config.num_experts, group.num_local_experts, group.rank
    m = torch.full((e,), -1, dtype=torch.int64)
    m[r * local:(r + 1) * local] = torch.arange(local)
    return m


class ExpertMapCheck:
    """Refuses an expert_map other than moe-ep's placement. A map is read
    once per tensor (a device-to-host copy), not per call: engines build it
    once; a placement changed in place later (load balancing) is not seen."""

    def __init__(self, group):
        self._group = group
        self._want = contiguous_expert_map(group)
        self._seen = None

    def __call__(self, expert_map, entry):
        if expert_map is None:
            return
        if not isinstance(expert_map, torch.Tensor):
            raise TypeError("%s: expert_map must be a torch.Tensor or None, got %s"
                            % (entry, type(expert_map).__name__))
        key = (id(expert_map), expert_map.data_ptr(), tuple(expert_map.shape))
        if key == self._seen:
            return
        got = expert_map.detach().to("cpu", torch.int64).reshape(-1)
        if tuple(expert_map.shape) != tuple(self._want.shape):
            raise NotImplementedError(
                "%s: expert_map has shape %s; moe-ep places %d experts contiguously (rank %d "
                "holds [%d, %d)) and needs expert_map=None or that placement"
                % (entry, tuple(expert_map.shape), self._want.numel(), self._group.rank,
                   self._group.rank * self._group.num_local_experts,
                   (self._group.rank + 1) * self._group.num_local_experts))
        bad = (got != self._want).nonzero()
        if bad.numel():
            e = int(bad[0])
            raise NotImplementedError(
                "%s: expert_map maps global expert %d to %d, but moe-ep's placement maps it to "
                "%d (rank r holds experts [r*L, (r+1)*L) as local 0..L-1, L=%d); other "
                "placements (round robin, load balancing) are not supported"
                % (entry, e, int(got[e]), int(self._want[e]), self._group.num_local_experts))
        self._seen = key
