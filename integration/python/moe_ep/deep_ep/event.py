"""EventHandle and EventOverlap as DeepEP defines them. moe-ep runs every
operation on the caller's current stream, so an event is only recorded
where a caller asks for one (async_finish, capture), and only on GPUs."""
import torch


def _cuda_live():
    return torch.cuda.is_available() and torch.cuda.is_initialized()


class EventHandle:
    """An event recorded on the current stream when made (no CUDA event in
    a process that has not initialised CUDA: nothing there to wait for)."""

    def __init__(self):
        self.event = None
        if _cuda_live():
            self.event = torch.cuda.Event()
            self.event.record(torch.cuda.current_stream())

    def current_stream_wait(self):
        if self.event is not None:
            torch.cuda.current_stream().wait_event(self.event)


def record_event(on_cuda):
    """An EventHandle on the current stream, or None off GPUs."""
    return EventHandle() if on_cuda else None


class EventOverlap:
    """event: an EventHandle or None. current_stream_wait() makes the
    current stream wait for it, then runs the hook registered with
    register_hook_after_wait (once) and returns its result, as DeepEP's
    does; wait() is the same. As a context manager it waits on exit (when
    there is an event); `with overlap(release_handle=True):` also drops the
    event after the wait. With no event (no async_finish, or no CUDA)
    current_stream_wait() has nothing to wait for and only runs the hook."""

    def __init__(self, event=None, extra_tensors=None):
        self.event = event
        self.extra_tensors = extra_tensors  # kept alive until the wait
        self.hook_after_wait = None
        self._release_on_exit = False

    def current_stream_wait(self, release_handle=False):
        if self.event is not None:
            self.event.current_stream_wait()
        hook, self.hook_after_wait = self.hook_after_wait, None
        result = hook() if hook is not None else None
        if release_handle:
            self.event = None
        return result

    def wait(self):
        return self.current_stream_wait()

    def register_hook_after_wait(self, hook_after_wait):
        if self.hook_after_wait is not None:
            raise RuntimeError("EventOverlap.register_hook_after_wait: a hook is already "
                               "registered and has not run (current_stream_wait runs it)")
        self.hook_after_wait = hook_after_wait

    def __call__(self, release_handle=False):
        self._release_on_exit = bool(release_handle)
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        release, self._release_on_exit = self._release_on_exit, False
        if self.event is not None:  # as DeepEP: no event, no wait and no hook
            self.current_stream_wait(release_handle=release)


def operation_event(async_finish, on_cuda, *tensors):
    """The EventOverlap an operation returns: with async_finish on a GPU,
    an event on the current stream that keeps `tensors` (the operation's
    inputs and outputs; None entries skipped) alive until it is waited on
    or dropped, as DeepEP's does; else one with no event."""
    if not (async_finish and on_cuda):
        return EventOverlap(None)
    kept = tuple(t for t in tensors if t is not None)
    return EventOverlap(record_event(True), extra_tensors=kept)


def capture():
    """An EventOverlap on the current stream (Buffer.capture)."""
    return EventOverlap(EventHandle())


def wait_previous(previous_event):
    """previous_event: an EventOverlap (or None) the operation must follow.
    Only its event is waited for: a hook registered on it stays for its
    owner's own current_stream_wait(), as in DeepEP."""
    event = getattr(previous_event, "event", None)
    if event is not None:
        event.current_stream_wait()
