"""moe_ep.sglang.engine_class() against a stand-in of SGLang's
token_dispatcher.base module, written here from how SGLang behaves:
BaseDispatcher's constructor state, its hooks wrapping dispatch() and
combine() (called with keywords), DispatchOutputFormat's predicates. On a
host group: the class is a BaseDispatcher, dispatch's output carries
SGLang's own enum, a post-dispatch and a pre-combine hook run around
moe-ep's calls, values against the oracle."""
import collections

import sglang_stand_in  # noqa: E402

sglang_stand_in.install()

import common  # noqa: E402
import moe_ep  # noqa: E402
import moe_ep.sglang  # noqa: E402
import oracle  # noqa: E402
from common import RANK, bits, fail, same  # noqa: E402
from ll_worker import P, check_dispatch, expert_outputs, torch_inputs  # noqa: E402

from sglang.srt.layers.moe.token_dispatcher import base  # noqa: E402


class TopKOutput(collections.namedtuple("TopKOutput", "topk_weights topk_ids router_logits")):
    pass


class CombineInput(collections.namedtuple("CombineInput", "hidden_states topk_ids topk_weights")):
    pass


def main():
    cls = moe_ep.sglang.engine_class()
    with moe_ep.Group(common.config(0, num_experts=P.num_experts, hidden=P.hidden, top_k=P.top_k,
                                    max_tokens_per_rank=P.max_tokens)) as g:
        d = cls(g)
        if not isinstance(d, base.BaseDispatcher) or d.quant_config is not None:
            fail("engine class", "-", "%r is not a BaseDispatcher with its state" % (type(d),))
        seen = []
        d.register_post_dispatch_hook(lambda disp, out: seen.append(out.format))
        d.register_pre_combine_hook(lambda disp, ci: seen.append(type(ci).__name__))
        for seed in (241, 242):
            inp = oracle.make_inputs(P, seed, RANK)
            x, idx, w = torch_inputs(inp)
            o = d.dispatch(x, TopKOutput(w, idx, None))
            if o.format is not base.DispatchOutputFormat.DEEPEP_LL:
                fail("sglang format", seed, "format %r, want SGLang's DEEPEP_LL" % (o.format,))
            check_dispatch(seed, oracle.all_inputs(P, seed),
                           moe_ep.DispatchResult(o.hidden_states, None, o.masked_m), P.hidden)
            out = d.combine(CombineInput(expert_outputs(g, o.hidden_states), idx, w))
            same("sglang engine combine", seed, bits(out), oracle.ll_combine(P, inp))
        if seen != [base.DispatchOutputFormat.DEEPEP_LL, "CombineInput"] * 2:
            fail("sglang hooks", "-", "hooks saw %r" % (seen,))
    common.finish()


if __name__ == "__main__":
    main()
