"""moe_ep.sglang: SGLang's DeepEP-style dispatcher halves over moe-ep.

    import moe_ep, moe_ep.sglang
    d = moe_ep.sglang.Dispatcher(moe_ep.Group(cfg))
    d.dispatch_a(hidden_states, topk_output)        # TopKOutput: topk_ids, topk_weights
    out = d.dispatch_b()                             # LowLatencyOutput
    d.combine_a(experts(out), out.topk_ids, out.topk_weights)
    hidden_states = d.combine_b()

Importing it never imports SGLang.
"""
from .dispatcher import Dispatcher, LowLatencyOutput

__all__ = ["Dispatcher", "LowLatencyOutput"]
