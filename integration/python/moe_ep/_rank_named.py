"""Failure messages that name the rank. The library's own sentences name
it already (moe_ep.Error); what the package raises itself (a ValueError
for a tensor of the wrong shape, a RuntimeError for a call out of turn)
gets "rank N: " in front when it leaves a public method of a Group, a
DeepEP Buffer or an engine adapter, unless the message already names
this rank. The exception keeps its type and traceback."""
import functools
import inspect
import re
import types


def _name(e, rank):
    if rank is None or not e.args or not isinstance(e.args[0], str):
        return
    if re.search(r"\brank %d\b" % rank, e.args[0]):
        return
    e.args = ("rank %d: %s" % (rank, e.args[0]),) + tuple(e.args[1:])


def _naming(fn, rank_of):
    """fn, with what it raises naming rank_of(*args) (asked only then)."""
    @functools.wraps(fn)
    def named(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - re-raised as it is, named
            try:
                rank = rank_of(*args)
            except Exception:  # noqa: BLE001 - an object half made: no rank to name
                rank = None
            _name(e, rank)
            raise
    return named


def naming(fn, rank):
    """fn, with what it raises naming `rank`: for the closures an adapter
    hands an engine (a receiver), which it calls outside any public
    method."""
    return _naming(fn, lambda *args: rank)


def name_rank_in(cls, rank_of):
    """Wraps every public plain method of cls (its own and its bases')
    so that what it raises names rank_of(self) (None: nothing known yet).
    Static and class methods and properties are left alone."""
    for attr in dir(cls):
        if attr.startswith("_"):
            continue
        raw = inspect.getattr_static(cls, attr)
        if isinstance(raw, types.FunctionType):
            setattr(cls, attr, _naming(raw, lambda self, *args: rank_of(self)))
    return cls
