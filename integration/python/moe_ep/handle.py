"""Handles (one routing layout per layer call) and hooks (a deferred
receive). Both own a library object and free it exactly once."""
import threading

from .errors import InvalidArgumentError


class Handle:
    """The routing layout prepare() built. It keeps the tensors the library
    reads until combine completes (topk_idx, the dispatch's recv_count and
    weights), so they cannot be freed under it. Free it with free(), a
    `with` block, or by dropping it; keep it alive while a CUDA graph that
    used it may still be replayed."""

    __slots__ = ("_group", "_ptr", "topk_idx", "num_tokens", "top_k", "layout",
                 "recv_count", "dispatch_weights", "hidden", "__weakref__")

    def __init__(self, group, ptr, topk_idx, layout):
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
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            self._group._lib.handle_free(ptr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    def __del__(self):
        try:
            self.free()
        except Exception:  # interpreter shutdown: ctypes may be gone
            pass


class Hook:
    """A deferred receive. hook() runs it on the current stream of the
    calling thread (any thread) and returns `result`, the outputs the
    receive fills. A hook runs once; dropping one that never ran abandons
    its receive (the nccl backend then marks the group failed)."""

    __slots__ = ("_group", "_ptr", "result", "_finish", "_lock", "_keep")

    def __init__(self, group, ptr, result, finish=None, keep=None):
        self._group = group
        self._ptr = ptr
        self.result = result
        self._finish = finish
        self._keep = keep  # inputs the receive still reads
        self._lock = threading.Lock()

    def __call__(self, stream=None):
        """stream: a cudaStream_t (int) or torch.cuda.Stream; default the
        current stream of the group's device (None on the host backend)."""
        with self._lock:
            ptr = self._ptr
            if ptr is None:
                raise InvalidArgumentError(
                    "hook_run: this hook already ran; a hook runs exactly once")
            group = self._group
            if stream is None:
                stream = group._stream()
            elif not isinstance(stream, int):
                stream = stream.cuda_stream
            lib = group._lib
            st = lib.hook_run(ptr, stream)
            if st != 0:
                raise lib.error(st, "hook_run")
            self._ptr = None
            self._keep = None
            lib.hook_free(ptr)
        if self._finish is not None:
            self._finish()
        return self.result

    def __del__(self):
        ptr = getattr(self, "_ptr", None)
        if ptr is not None:
            self._ptr = None
            try:
                self._group._lib.hook_free(ptr)
            except Exception:
                pass
