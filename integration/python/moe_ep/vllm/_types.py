"""Stand-ins for the vLLM types a prepare/finalize returns, so this package
imports without vLLM; when vLLM is importable its own types are used, so
the engine's identity and isinstance checks hold."""
import dataclasses
import enum
from typing import Optional

import torch

from .._optional import optional_module

_MODULAR_KERNEL = "vllm.model_executor.layers.fused_moe.modular_kernel"


class FusedMoEActivationFormat(enum.Enum):
    """Standard: [tokens, hidden]; BatchedExperts: [experts, max tokens,
    hidden] (the values vLLM uses)."""
    Standard = ("standard",)
    BatchedExperts = ("batched_experts",)


@dataclasses.dataclass
class ExpertTokensMetadata:
    """Tokens received per local expert: a device tensor, and the same on
    the host when it is there without a copy."""
    expert_num_tokens: Optional[torch.Tensor]
    expert_num_tokens_cpu: Optional[torch.Tensor]
    psum_recv_per_rank: Optional[torch.Tensor] = None


_resolved = None


def modular_kernel():
    """vLLM's modular_kernel module, or None when vLLM is not importable.
    Imported on first use (never when moe_ep.vllm is imported)."""
    return optional_module(_MODULAR_KERNEL)


def engine_types():
    """(activation format enum, ExpertTokensMetadata class): vLLM's when it
    is importable, else the stand-ins above. Resolved once."""
    global _resolved
    if _resolved is None:
        mk = modular_kernel()
        fmt = getattr(mk, "FusedMoEActivationFormat", None) if mk is not None else None
        meta = getattr(mk, "ExpertTokensMetadata", None) if mk is not None else None
        _resolved = (fmt or FusedMoEActivationFormat, meta or ExpertTokensMetadata)
    return _resolved


def is_delegate(weight_and_reduce_impl):
    """vLLM's TopKWeightAndReduceDelegate means "the prepare/finalize
    decides"; matched by class name so vLLM need not be imported."""
    return type(weight_and_reduce_impl).__name__ == "TopKWeightAndReduceDelegate"
