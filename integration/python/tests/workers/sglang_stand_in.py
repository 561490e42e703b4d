"""A stand-in of the SGLang modules moe_ep.sglang reads, written from how
SGLang behaves: token_dispatcher.base (DispatchOutputFormat and its
predicates; BaseDispatcher's constructor state and its hooks wrapping
dispatch() and combine(), called with keywords) and, where asked,
dp_attention (empty, as in SGLang before its get_is_extend_in_batch
global; a test adds the global). install() puts them first on sys.path,
so `import sglang...` finds them before moe_ep is imported."""
import os
import sys
import tempfile

BASE = '''
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

FILES = {
    "sglang/srt/layers/moe/token_dispatcher/base.py": BASE,
    "sglang/srt/layers/dp_attention.py": "",
}


def install(with_dp_attention=False):
    """Writes the stand-in into a new folder and puts it first on
    sys.path; with_dp_attention adds the (empty) dp_attention module."""
    root = tempfile.mkdtemp(prefix="sglang_stand_in_")
    for rel, text in FILES.items():
        if rel.endswith("dp_attention.py") and not with_dp_attention:
            continue
        d = root
        for part in os.path.dirname(rel).split("/"):
            d = os.path.join(d, part)
            os.makedirs(d, exist_ok=True)
            open(os.path.join(d, "__init__.py"), "a").close()
        with open(os.path.join(root, rel), "w") as f:
            f.write(text)
    sys.path.insert(0, root)
