"""DeepEP V1-compatible API over moe-ep: `Buffer`, `EventOverlap`,
`EventHandle`, `Config`. Import it as moe_ep.deep_ep, or as `deep_ep` by
putting integration/python/alias on PYTHONPATH (opt-in)."""
from . import utils
from .buffer import Buffer
from .config import Config
from .event import EventHandle, EventOverlap

__all__ = ["Buffer", "Config", "EventHandle", "EventOverlap", "utils"]
