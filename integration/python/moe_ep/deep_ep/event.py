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
    current stream wait for it; as a context manager it waits on exit."""

    def __init__(self, event=None, extra_tensors=None):
        self.event = event
        self.extra_tensors = extra_tensors  # kept alive until the wait

    def current_stream_wait(self):
        if self.event is not None:
            self.event.current_stream_wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.current_stream_wait()


def capture():
    """An EventOverlap on the current stream (Buffer.capture)."""
    return EventOverlap(EventHandle())


def wait_previous(previous_event):
    """previous_event: an EventOverlap (or None) the operation must follow."""
    if previous_event is not None:
        previous_event.current_stream_wait()
