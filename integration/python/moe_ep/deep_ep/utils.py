"""deep_ep.utils' names (some engines import EventOverlap and EventHandle
from there)."""
from .event import EventHandle, EventOverlap

__all__ = ["EventHandle", "EventOverlap"]
