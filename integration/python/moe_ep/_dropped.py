"""Deferred receives that the engine adapters and the DeepEP Buffer hand
out on one group, and what happens to one the engine never runs.

DeepEP's low-latency buffers are simply overwritten by a later operation,
whether or not the hook of the earlier one ran. The library instead keeps a
buffer set whose receive has not run, and refuses the operation that needs
that set next (BusyError: "run that hook first"). An engine that dropped
the hook (an exception between a layer call's two halves) could never run
it, and every adapter on the group would be refused from then on. So an
operation made through DroppedHooks.send that the library refuses as busy
abandons the oldest receive still pending on the group (moe_ep.Hook.abandon:
on the nccl backend in low-latency mode that fails the group with
MismatchError, as dropping the hook would; elsewhere the group goes on)
and is made again. A flow that runs its hooks in time is never refused, so
it never gets here."""
import threading
import weakref

from .errors import BusyError
from ._per_group import kept_on
from .handle import Hook

_SETS = 2  # buffer sets a group alternates: at most this many receives pending


class DroppedHooks:
    """The pending receives made through send() on one group, oldest
    first. Held weakly: a hook the engine lets go abandons its own receive
    when collected (moe_ep.Hook); a hook that ran leaves at the next send."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pending = []  # weakref(Hook), oldest first

    def send(self, call):
        """Returns call() (a group's dispatch or combine), made again after
        abandoning the oldest pending receive each time the library
        refuses it as busy; a Hook it returns is recorded."""
        for _ in range(_SETS):
            try:
                result = call()
                break
            except BusyError:
                if not self._abandon_oldest():
                    raise
        else:
            result = call()  # every pending receive abandoned: the library's verdict stands
        if isinstance(result, Hook):
            with self._lock:
                self._prune()
                self._pending.append(weakref.ref(result))
        return result

    def _prune(self):
        self._pending = [r for r in self._pending if r() is not None and r().pending]

    def _abandon_oldest(self):
        with self._lock:
            self._prune()
            if not self._pending:
                return False
            hook = self._pending.pop(0)()
        if hook is not None:
            hook.abandon()
        return True


def group_dropped_hooks(group):
    """The DroppedHooks of a moe_ep.Group: one book for every adapter and
    Buffer on it."""
    return kept_on(group, "_moe_ep_dropped_hooks", DroppedHooks)
