"""The library's refusals in the words of the DeepEP call that led to
them. A Buffer hands DeepEP's arguments to the library under the C ABI's
field names (low_latency_combine's x is the library's params->y), so the
library's sentence names a field the caller never wrote. `in_deepep_words`
puts the DeepEP argument in place of the field and the DeepEP entry in
place of the library's, and leaves the rest of the sentence (value, rule,
the rank named) as the library wrote it. A sentence naming no field of the
table (a peer's failure, a timeout) is left as it is."""
import functools
import re

from ..errors import Error

# DeepEP's argument behind each library field, per Buffer entry (the
# library's params->hidden is the width of the Buffer's x, its num_tokens
# the rows of topk_idx).
_ROUTING = {"topk_idx": "topk_idx", "num_tokens": "topk_idx.shape[0]"}
LOW_LATENCY_DISPATCH = dict(_ROUTING, x="x", hidden="x.shape[-1]")
LOW_LATENCY_COMBINE = {"y": "x", "hidden": "x.shape[-1]", "topk_weights": "topk_weights",
                       "out": "out"}
GET_DISPATCH_LAYOUT = dict(_ROUTING)
DISPATCH = dict(_ROUTING, x="x", hidden="x.shape[-1]", x_scales="x[1] (scales)",
                topk_weights="topk_weights")
COMBINE = {"y": "x", "hidden": "x.shape[-1]"}

_LIBRARY_ENTRY = re.compile(r"^(rank \d+: )?(prepare|dispatch|combine): ")


def reworded(message, entry, fields):
    """message with each params-><field> of `fields` renamed to its DeepEP
    argument and the library's entry to `entry`; None when it names none."""
    pattern = r"\bparams->(%s)\b" % "|".join(re.escape(f) for f in fields)
    text, renamed = re.subn(pattern, lambda m: fields[m.group(1)], message)
    if not renamed:
        return None
    return _LIBRARY_ENTRY.sub(lambda m: "%s%s: " % (m.group(1) or "", entry), text, count=1)


def in_deepep_words(entry, fields):
    """A decorator for the Buffer entry `entry`: a moe_ep.Error it raises
    names DeepEP's arguments (same exception, status and traceback)."""
    def wrap(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except Error as e:
                if e.args and isinstance(e.args[0], str):
                    text = reworded(e.args[0], entry, fields)
                    if text is not None:
                        e.args = (text,) + tuple(e.args[1:])
                raise
        return call
    return wrap
