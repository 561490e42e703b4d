"""moe_ep.sglang.engine_class() against a stand-in of SGLang's
token_dispatcher.base module, written here from how SGLang behaves:
BaseDispatcher's constructor state, its hooks wrapping dispatch() and
combine() (called with keywords), DispatchOutputFormat's predicates. On a
host group: the class is a BaseDispatcher, dispatch's output carries
SGLang's own enum, a post-dispatch and a pre-combine hook run around
moe-ep's calls, values against the oracle."""
import collections
import os
import sys
import tempfile

STAND_IN = '''
import abc
import enum


class DispatchOutputFormat(enum.Enum):
    STANDARD = "standard"
    DEEPEP_NORMAL = "deepep_normal"
    DEEPEP_LL = "deepep_ll"

    def is_standard(self):
        return self is DispatchOutputFormat.STANDARD

    def is_deepep_normal(self):
        return self is DispatchOutputFormat.DEEPEP_NORMAL

    def is_deepep_ll(self):
        return self is DispatchOutputFormat.DEEPEP_LL

    def is_deepep(self):
        return self in (DispatchOutputFormat.DEEPEP_NORMAL, DispatchOutputFormat.DEEPEP_LL)


class BaseDispatcher(abc.ABC):
    def __init__(self):
        self.quant_config = None
        self.overlap_args = None
        self.meta_overlap_args = None
        self.post_dispatch_hooks = []
        self.pre_combine_hooks = []

    @abc.abstractmethod
    def dispatch(self, hidden_states, topk_output):
        pass

    @abc.abstractmethod
    def combine(self, combine_input):
        pass

    def register_post_dispatch_hook(self, hook):
        if not self.post_dispatch_hooks:
            inner = self.dispatch

            def dispatch(hidden_states, topk_output):
                out = inner(hidden_states=hidden_states, topk_output=topk_output)
                for h in self.post_dispatch_hooks:
                    out = h(self, out) or out
                return out
            self.dispatch = dispatch
        self.post_dispatch_hooks.append(hook)

    def register_pre_combine_hook(self, hook):
        if not self.pre_combine_hooks:
            inner = self.combine

            def combine(combine_input):
                for h in self.pre_combine_hooks:
                    combine_input = h(self, combine_input) or combine_input
                return inner(combine_input=combine_input)
            self.combine = combine
        self.pre_combine_hooks.append(hook)
'''


def install_stand_in():
    root = tempfile.mkdtemp(prefix="sglang_stand_in_")
    path = root
    for part in ("sglang", "srt", "layers", "moe", "token_dispatcher"):
        path = os.path.join(path, part)
        os.makedirs(path)
        open(os.path.join(path, "__init__.py"), "w").close()
    with open(os.path.join(path, "base.py"), "w") as f:
        f.write(STAND_IN)
    sys.path.insert(0, root)


install_stand_in()

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
            same("sglang engine combine", seed, bits(out), oracle.ll_combine_at_dispatch(P, inp))
        if seen != [base.DispatchOutputFormat.DEEPEP_LL, "CombineInput"] * 2:
            fail("sglang hooks", "-", "hooks saw %r" % (seen,))
    common.finish()


if __name__ == "__main__":
    main()
