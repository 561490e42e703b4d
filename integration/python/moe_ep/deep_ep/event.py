"""EventOverlap: DeepEP's wrapper of a CUDA event. moe-ep runs every
operation on the caller's current stream, so an event is only recorded
where a caller asks for one (async_finish, capture) and only on GPUs."""
import torch


def _cuda_live():
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def record_event(on_cuda):
    """A torch.cuda.Event recorded on the current stream (None on CPU)."""
    if not on_cuda:
        return None
    ev = torch.cuda.Event()
    ev.record(torch.cuda.current_stream())
    return ev


class EventOverlap:
    """event: a torch.cuda.Event or None. current_stream_wait() makes the
    current stream wait for it; as a context manager it waits on exit."""

    def __init__(self, event=None, extra_tensors=None):
        self.event = event
        self.extra_tensors = extra_tensors  # kept alive until the wait

    def current_stream_wait(self):
        if self.event is not None:
            torch.cuda.current_stream().wait_event(self.event)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.current_stream_wait()


def capture():
    """An EventOverlap on the current stream (Buffer.capture)."""
    return EventOverlap(record_event(_cuda_live()))


def wait_previous(previous_event):
    """previous_event: an EventOverlap (or None) the operation must follow."""
    if previous_event is not None:
        previous_event.current_stream_wait()
