"""SGLang's deepep_mode: which dispatcher a layer call uses. 'low_latency'
and 'normal' are fixed; 'auto' picks normal for a batch that extends
(prefill) and low_latency for decode, as SGLang's DeepEPMode.resolve does.
SGLang has told the dispatcher in three ways over its versions: a global
(current: dp_attention.get_is_extend_in_batch()), forward_batch
(.is_extend_in_batch) and forward_mode (.is_decode()); the keywords win,
the global is the fallback where SGLang is importable."""
from .._optional import optional_module

MODES = ("low_latency", "normal", "auto")
_DP_ATTENTION = "sglang.srt.layers.dp_attention"


def parse_mode(value):
    """'low_latency', 'normal' or 'auto' from that string or SGLang's
    DeepEPMode (whose values are those strings in every version)."""
    raw = getattr(value, "value", value)
    if not isinstance(raw, str) or raw not in MODES:
        raise ValueError("Dispatcher: deepep_mode=%r must be one of %s (or SGLang's DeepEPMode)"
                         % (value, ", ".join(repr(m) for m in MODES)))
    return raw


def _flag(entry, name, value):
    # bool, or an int / numpy bool that SGLang may have computed; a string
    # or a tensor is a mistake, not a truth value.
    if isinstance(value, (bool, int)) or type(value).__name__ in ("bool_", "bool"):
        return bool(value)
    raise TypeError("%s: %s=%r must be a bool" % (entry, name, value))


def _extends(entry, is_extend_in_batch, forward_batch, forward_mode):
    """True for an extend (prefill) batch, False for decode, None when no
    keyword says."""
    if is_extend_in_batch is not None:
        return _flag(entry, "is_extend_in_batch", is_extend_in_batch)
    if forward_batch is not None and _is_forward_mode(forward_batch):
        # SGLang of the forward_mode era passed its ForwardMode positionally
        # where later versions pass the forward batch.
        if forward_mode is not None:
            raise TypeError("%s: forward_mode given twice (positionally and by keyword)" % entry)
        forward_batch, forward_mode = None, forward_batch
    if forward_batch is not None:
        if hasattr(forward_batch, "is_extend_in_batch"):
            return _flag(entry, "forward_batch.is_extend_in_batch",
                         forward_batch.is_extend_in_batch)
        forward_mode = getattr(forward_batch, "forward_mode", None)
        if forward_mode is None:
            raise TypeError("%s: forward_batch (%s) has neither is_extend_in_batch nor "
                            "forward_mode, which deepep_mode='auto' reads"
                            % (entry, type(forward_batch).__name__))
    if forward_mode is not None:
        if not callable(getattr(forward_mode, "is_decode", None)):
            raise TypeError("%s: forward_mode (%s) has no is_decode(), which deepep_mode='auto' "
                            "reads" % (entry, type(forward_mode).__name__))
        return not forward_mode.is_decode()
    return None


def _is_forward_mode(value):
    """Whether value is SGLang's ForwardMode (it has is_decode(), and none
    of a forward batch's fields)."""
    return callable(getattr(value, "is_decode", None)) and \
        not hasattr(value, "forward_mode") and not hasattr(value, "is_extend_in_batch")


def is_mode_hint(value):
    """Whether value is a forward batch or a ForwardMode: what older SGLang
    passes fourth to dispatch and combine."""
    return hasattr(value, "forward_mode") or hasattr(value, "is_extend_in_batch") or \
        _is_forward_mode(value)


def resolve(mode, entry, is_extend_in_batch=None, forward_batch=None, forward_mode=None):
    """The mode of one call: a fixed mode as it is; 'auto' from the
    keywords, else SGLang's global. Raises ValueError when 'auto' cannot
    tell."""
    if mode != "auto":
        return mode
    extends = _extends(entry, is_extend_in_batch, forward_batch, forward_mode)
    if extends is None:
        dp = optional_module(_DP_ATTENTION)
        read = getattr(dp, "get_is_extend_in_batch", None) if dp is not None else None
        if read is None:
            raise ValueError("%s: deepep_mode='auto' needs to know whether the batch extends "
                             "(normal mode) or decodes (low_latency): pass is_extend_in_batch=, "
                             "forward_batch= or forward_mode=, or run inside SGLang (its "
                             "dp_attention.get_is_extend_in_batch())" % entry)
        extends = _flag(entry, "get_is_extend_in_batch()", read())
    return "normal" if extends else "low_latency"


def hinted(mode, entry, is_extend_in_batch=None, forward_batch=None, forward_mode=None):
    """The mode the keywords alone name (for combine, which follows its
    dispatch), or None when none is given or the mode is fixed."""
    if mode != "auto":
        return None
    extends = _extends(entry, is_extend_in_batch, forward_batch, forward_mode)
    if extends is None:
        return None
    return "normal" if extends else "low_latency"
