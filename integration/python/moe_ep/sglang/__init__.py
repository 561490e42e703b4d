"""moe_ep.sglang: SGLang's DeepEP dispatcher over moe-ep, in low-latency
(decode), normal (prefill) and auto mode.

    import moe_ep, moe_ep.sglang
    d = moe_ep.sglang.Dispatcher(moe_ep.Group(ll_cfg),                 # deepep_mode 'auto'
                                 normal_group=moe_ep.Group(ht_cfg))
    out = d.dispatch(hidden_states, topk_output, is_extend_in_batch=True)
    hidden_states = d.combine(combine_input)         # (experts' output, out.topk_ids,
                                                     #  out.topk_weights); or combine_a/_b

Importing it never imports SGLang. engine_class() gives the same class as
a subclass of SGLang's BaseDispatcher (its hook registration, isinstance
checks), where SGLang is importable.
"""
from ._mode import MODES
from ._types import low_latency_format, normal_format
from .dispatcher import Dispatcher, LowLatencyOutput, NormalOutput

_engine_class = None


def engine_class():
    """Dispatcher deriving from SGLang's BaseDispatcher, whose pre/post
    dispatch and combine hooks then wrap dispatch() and combine(). Raises
    ImportError where SGLang is not importable."""
    global _engine_class
    if _engine_class is None:
        from ._types import sglang_base
        base = sglang_base()
        if base is None:
            raise ImportError("moe_ep.sglang.engine_class: SGLang is not importable here; "
                              "Dispatcher works without it")

        def __init__(self, group=None, **kwargs):
            base.BaseDispatcher.__init__(self)
            Dispatcher.__init__(self, group, **kwargs)

        _engine_class = type("MoeEpDispatcher", (Dispatcher, base.BaseDispatcher),
                             {"__init__": __init__})
    return _engine_class


__all__ = ["Dispatcher", "LowLatencyOutput", "MODES", "NormalOutput", "engine_class",
           "low_latency_format", "normal_format"]
