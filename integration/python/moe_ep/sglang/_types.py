"""SGLang's dispatch-output formats, so outputs pass SGLang's checks
(`output.format.is_deepep_ll()`, `.is_deepep_normal()`): SGLang's own enum
when it is importable, else stand-ins with the same predicates. SGLang is
imported on first use, never when moe_ep.sglang is imported."""
from .._optional import optional_module

_BASE = "sglang.srt.layers.moe.token_dispatcher.base"


def sglang_base():
    """SGLang's token_dispatcher.base module, or None where SGLang is not
    importable."""
    return optional_module(_BASE)


class _FormatStandIn:
    """A DispatchOutputFormat member's stand-in: the predicates SGLang's
    DispatchOutputChecker calls."""
    name = value = None

    def is_standard(self):
        return False

    def is_deepep_normal(self):
        return self.value == "deepep_normal"

    def is_deepep_ll(self):
        return self.value == "deepep_ll"

    def is_deepep(self):
        return True

    def __repr__(self):
        return "<%s %s>" % (type(self).__name__, self.value)


class LowLatencyFormat(_FormatStandIn):
    """DispatchOutputFormat.DEEPEP_LL's stand-in."""
    name = value = "deepep_ll"


class NormalFormat(_FormatStandIn):
    """DispatchOutputFormat.DEEPEP_NORMAL's stand-in."""
    name = value = "deepep_normal"


_formats = {}  # member name -> SGLang's member or the stand-in, resolved once


def _format(member, stand_in):
    fmt = _formats.get(member)
    if fmt is None:
        base = sglang_base()
        enum = getattr(base, "DispatchOutputFormat", None) if base is not None else None
        fmt = _formats[member] = getattr(enum, member, None) or stand_in()
    return fmt


def low_latency_format():
    """SGLang's DispatchOutputFormat.DEEPEP_LL, or the stand-in."""
    return _format("DEEPEP_LL", LowLatencyFormat)


def normal_format():
    """SGLang's DispatchOutputFormat.DEEPEP_NORMAL, or the stand-in."""
    return _format("DEEPEP_NORMAL", NormalFormat)
