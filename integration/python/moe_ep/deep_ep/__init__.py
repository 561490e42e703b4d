"""DeepEP V1-compatible API over moe-ep: `Buffer`, `EventOverlap`,
`EventHandle`, `Config`, `topk_idx_t`. Import it as moe_ep.deep_ep, or as `deep_ep` by
putting integration/python/alias on PYTHONPATH (opt-in)."""
import torch

from . import utils
from .buffer import Buffer
from .config import Config
from .event import EventHandle, EventOverlap

# The dtype DeepEP's kernels take topk_idx in (moe-ep also takes int32).
topk_idx_t = torch.int64

__all__ = ["Buffer", "Config", "EventHandle", "EventOverlap", "topk_idx_t", "utils"]
