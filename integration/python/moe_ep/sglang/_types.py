"""SGLang's dispatch-output format, so outputs pass SGLang's checks
(`output.format.is_deepep_ll()`): SGLang's own enum when it is
importable, else a stand-in with the same predicates. SGLang is imported
on first use, never when moe_ep.sglang is imported."""
from .._optional import optional_module

_BASE = "sglang.srt.layers.moe.token_dispatcher.base"


def sglang_base():
    """SGLang's token_dispatcher.base module, or None where SGLang is not
    importable."""
    return optional_module(_BASE)


class LowLatencyFormat:
    """DispatchOutputFormat.DEEPEP_LL's stand-in: the predicates SGLang's
    DispatchOutputChecker calls."""
    name = value = "deepep_ll"

    def is_standard(self):
        return False

    def is_deepep_normal(self):
        return False

    def is_deepep_ll(self):
        return True

    def is_deepep(self):
        return True

    def __repr__(self):
        return "<LowLatencyFormat deepep_ll>"


_format = None


def low_latency_format():
    """SGLang's DispatchOutputFormat.DEEPEP_LL, or the stand-in. Resolved
    once."""
    global _format
    if _format is None:
        base = sglang_base()
        fmt = getattr(base, "DispatchOutputFormat", None) if base is not None else None
        _format = getattr(fmt, "DEEPEP_LL", None) or LowLatencyFormat()
    return _format
