"""DeepEP V1-compatible API over moe-ep: `Buffer`, `EventOverlap`,
`Config`. Import it as moe_ep.deep_ep, or as `deep_ep` by putting
integration/python/alias on PYTHONPATH (opt-in)."""
from .buffer import Buffer
from .config import Config
from .event import EventOverlap

__all__ = ["Buffer", "Config", "EventOverlap"]
