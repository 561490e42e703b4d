"""moe_ep.vllm: vLLM's native modular fused-MoE interface over moe-ep.

    import moe_ep, moe_ep.vllm
    pf = moe_ep.vllm.PrepareAndFinalize(moe_ep.Group(cfg))
    a1q, a1q_scale, meta, _, _ = pf.prepare(a1, w, ids, E, None, False, quant_config)
    pf.finalize(out, experts(a1q, meta), w, ids, False, None)

Importing it never imports vLLM; vLLM's own enum and metadata types are
used when vLLM is importable. engine_class() gives the same class as a
subclass of vLLM's abstract prepare/finalize, for vLLM's isinstance checks.
"""
from ._types import ExpertTokensMetadata, FusedMoEActivationFormat, engine_types
from .prepare_finalize import PrepareAndFinalize

_engine_class = None


def engine_class():
    """PrepareAndFinalize deriving from vLLM's FusedMoEPrepareAndFinalize
    (the Modular variant where vLLM has one). Raises ImportError when vLLM
    is not importable."""
    global _engine_class
    if _engine_class is None:
        from ._types import modular_kernel
        mk = modular_kernel()
        if mk is None:
            raise ImportError("moe_ep.vllm.engine_class: vLLM is not importable here; "
                              "PrepareAndFinalize works without it")
        base = getattr(mk, "FusedMoEPrepareAndFinalizeModular", None) or \
            mk.FusedMoEPrepareAndFinalize
        _engine_class = type("MoeEpPrepareAndFinalize", (PrepareAndFinalize, base), {})
    return _engine_class


__all__ = ["ExpertTokensMetadata", "FusedMoEActivationFormat", "PrepareAndFinalize",
           "engine_class", "engine_types"]
