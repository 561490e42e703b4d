"""Handles (one routing layout per layer call) and hooks (a deferred
receive). Both own a library object and free it exactly once."""
import threading

import torch

from ._bound import bound_words, wait_bound_s
from .errors import InvalidArgumentError, TimeoutError as MoeEpTimeoutError


class Handle:
    """The routing layout prepare() built. It keeps the tensors the library
    reads until combine completes (topk_idx, the dispatch's recv_count and
    weights), so they cannot be freed under it. Free it with free(), a
    `with` block, or by dropping it; keep it alive while a CUDA graph that
    used it may still be replayed."""

    __slots__ = ("_lock", "_group", "_ptr", "topk_idx", "num_tokens", "top_k", "layout",
                 "recv_count", "dispatch_weights", "hidden", "__weakref__")

    def __init__(self, group, ptr, topk_idx, layout):
        # Two threads may free one handle (an adapter giving up a layer call
        # while another thread's failing call frees it too). The pointer is
        # taken under the lock, so only one of them frees it: a second
        # handle_free could free another handle the library has since
        # placed at that address.
        self._lock = threading.Lock()
        self._group = group
        self._ptr = ptr
        self.topk_idx = topk_idx
        self.num_tokens, self.top_k = topk_idx.shape
        self.layout = layout  # HT layout outputs (or None)
        self.recv_count = None
        self.dispatch_weights = None
        self.hidden = None

    @property
    def pointer(self):
        """The moe_ep_handle_t* (an int) for calls through the C table."""
        if self._ptr is None:
            raise InvalidArgumentError("moe_ep: this handle was freed")
        return self._ptr

    def free(self):
        with self._lock:
            ptr, self._ptr = self._ptr, None
        if ptr is not None:
            self._group._call_late(self._group._lib.handle_free, ptr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    def __del__(self):
        try:
            self.free()
        except Exception:  # interpreter shutdown: ctypes may be gone
            pass


def _used_on(stream, *objs):
    """Marks the CUDA tensors among objs (and one level into tuples, lists
    and objects with __slots__: a Handle, a DispatchResult) as used by work
    on `stream` (a cudaStream_t), which a receive run there reads or writes:
    the caching allocator then reuses their memory only once that work has
    ended, not as soon as the stream that allocated them moves on."""
    on = {}  # device -> the stream as a torch Stream of that device
    seen = set()

    def mark(t):
        if isinstance(t, torch.Tensor) and t.is_cuda and id(t) not in seen:
            seen.add(id(t))
            s = on.get(t.device)
            if s is None:
                s = on[t.device] = torch.cuda.ExternalStream(stream, device=t.device)
            t.record_stream(s)

    for obj in objs:
        for item in obj if isinstance(obj, (tuple, list)) else (obj,):
            mark(item)
            for name in getattr(type(item), "__slots__", ()):
                value = getattr(item, name, None)
                for v in value if isinstance(value, (tuple, list)) else (value,):
                    mark(v)


class Hook:
    """A deferred receive. hook() runs it on the current stream of the
    calling thread (any thread) and returns `result`, the outputs the
    receive fills. A hook runs once; dropping one that never ran abandons
    its receive (the nccl backend then marks the group failed). A thread
    that finds another running it waits at most the group's wait bound
    (moe_ep._bound), then raises moe_ep.TimeoutError."""

    __slots__ = ("_group", "_ptr", "result", "_finish", "_lock", "_keep", "_failed", "_sent_on",
                 "__weakref__")

    def __init__(self, group, ptr, result, finish=None, keep=None, sent_on=None):
        self._group = group
        self._ptr = ptr
        self.result = result
        self._finish = finish
        self._keep = keep  # inputs the receive still reads
        self._failed = None  # the error of a run that failed, raised again by later calls
        self._sent_on = sent_on  # the send's stream (cudaStream_t), None on the host
        self._lock = threading.Lock()

    def __call__(self, stream=None):
        """stream: a cudaStream_t (int) or torch.cuda.Stream; default the
        current stream of the group's device (None on the host backend)."""
        self._hold("hook_run")
        try:
            ptr = self._ptr
            if ptr is None:
                if self._failed is not None:
                    raise self._failed
                raise InvalidArgumentError(
                    "hook_run: this hook already ran; a hook runs exactly once")
            group = self._group
            if stream is None:
                stream = group._stream()
            elif not isinstance(stream, int):
                stream = stream.cuda_stream
            lib = group._lib
            st = group._call_late(lib.hook_run, ptr, stream)
            # Run or refused, the hook is spent (the library runs a hook at
            # most once, and abandons one it cannot run).
            self._ptr = None
            if st != 0:
                self._failed = lib.error(st, "hook_run")
                self._keep = None
                group._call_late(lib.hook_free, ptr)
                raise self._failed
            keep, self._keep = self._keep, None
            group._call_late(lib.hook_free, ptr)
            if self._sent_on is not None and stream != self._sent_on:
                _used_on(stream, keep, self.result)
        finally:
            self._lock.release()
        if self._finish is not None:
            self._finish()
        return self.result

    @property
    def pending(self):
        """Whether the receive has neither run nor been abandoned."""
        return self._ptr is not None

    def abandon(self):
        """Gives up a receive that never ran, as dropping the hook would
        (see the class); later calls raise saying so. Nothing happens to a
        hook that ran."""
        self._hold("hook_abandon")
        try:
            ptr, self._ptr = self._ptr, None
            if ptr is None:
                return
            self._keep = None
            self._failed = InvalidArgumentError(
                "hook_run: this hook's receive was abandoned before it ran; it cannot run now")
            self._group._call_late(self._group._lib.hook_free, ptr)
        finally:
            self._lock.release()

    def _hold(self, entry):
        """Takes the hook's lock, waiting at most the group's wait bound: a
        receive another thread runs under it ends within the library's own
        bounds, so a longer wait means that thread is stuck, and waiting on
        would hang this one too (a caller giving up after its own bounded
        wait expired)."""
        bound_s = wait_bound_s(self._group)
        if not self._lock.acquire(timeout=bound_s):
            raise MoeEpTimeoutError(
                "rank %d: %s: another thread has been running this hook's receive for more "
                "than %s" % (self._group.rank, entry, bound_words(bound_s)))

    def __del__(self):
        ptr = getattr(self, "_ptr", None)
        if ptr is not None:
            self._ptr = None
            try:
                self._group._call_late(self._group._lib.hook_free, ptr)
            except Exception:
                pass
