"""moe_ep: Python front end of libmoe_ep.so (expert-parallel dispatch and
combine for MoE inference), over the library's C table with ctypes.

    import moe_ep
    with moe_ep.Group("engine.yaml") as g:
        h = g.prepare(topk_idx)
        recv = g.dispatch(h, x)
        out = g.combine(h, experts(recv), topk_weights=w)
"""
from ._library import Library, candidate_paths, load
from ._results import DispatchResult
from ._torch import FP8_DTYPE, FP8_STORAGE
from .config import Config
from .errors import (BootstrapError, BusyError, ConfigError, CudaError, Error, InternalError,
                     InvalidArgumentError, LoadError, MismatchError, NcclError, NoMemoryError,
                     PeerFailedError, TimeoutError, UcxError, UnsupportedError)
from .group import Group, GroupInfo
from .handle import Handle, Hook

__all__ = [
    "BootstrapError", "BusyError", "Config", "ConfigError", "CudaError", "DispatchResult",
    "Error", "FP8_DTYPE", "FP8_STORAGE", "Group", "GroupInfo", "Handle", "Hook",
    "InternalError", "InvalidArgumentError", "Library", "LoadError", "MismatchError",
    "NcclError", "NoMemoryError", "PeerFailedError", "TimeoutError", "UcxError",
    "UnsupportedError", "candidate_paths", "load",
]
