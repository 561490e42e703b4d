"""Deferred receives that the engine adapters and the DeepEP Buffer hand
out on one group, and what happens to one the engine never runs.

DeepEP's low-latency buffers are simply overwritten by a later operation,
whether or not the hook of the earlier one ran. The library instead keeps a
buffer set whose receive has not run, and refuses the operation that needs
that set next (BusyError: "run that hook first"). An engine that dropped
the hook (an exception between a layer call's two halves) could never run
it, and every adapter on the group would be refused from then on. So when
the library refuses an operation made through DroppedHooks.send as busy,
and the hook it waits for (group_busy_hook) is one that send recorded, that
receive is abandoned (moe_ep.Hook.abandon: on the nccl backend in
low-latency mode that fails the group with MismatchError, as dropping the
hook would; elsewhere the group goes on) and the operation is made again.
Only receives an adapter holds on the engine's behalf are recorded (the
vLLM and SGLang adapters keep their layer calls' hooks, so one the engine
dropped stays alive in the adapter). A hook the engine holds itself (the
Buffer's return_recv_hook, Group.dispatch or Group.combine called
directly) is never abandoned: its holder may still run it, and keeps the
BusyError; one it lets go abandons its own receive when collected. Nor is
anything abandoned with double_buffer false: there one set serves every
operation, so two micro-batches in flight is a turn error to report, not a
dropped hook."""
import ctypes
import threading
import weakref

from ._bound import bound_words, wait_bound_s
from ._per_group import kept_on
from .errors import BusyError, TimeoutError as MoeEpTimeoutError
from .handle import Hook

_SETS = 2  # buffer sets a double-buffered group alternates: so many blockers at most


class DroppedHooks:
    """The pending receives made through send() on one group. Held weakly:
    a hook the engine lets go abandons its own receive when collected
    (moe_ep.Hook); hooks that ran leave once a few have gathered (at most
    _SETS are pending in the library at once)."""

    def __init__(self, group):
        self._group = weakref.ref(group)  # the group keeps the book, not the other way
        self._lock = threading.Lock()  # one send at a time: the library serialises them anyway
        self._bound_s = wait_bound_s(group)  # the longest wait for another thread's send
        self._rank = group.rank
        self._pending = []  # weakref(Hook)

    def send(self, call, record=True):
        """Returns call() (a dispatch or combine on the group), made again
        after abandoning the recorded receive the library refused it for.
        A Hook it returns is recorded when record is true (the adapter
        holds it for the engine); False for one handed to the engine to
        hold and run itself."""
        # Bounded: the holder may be stuck abandoning a hook whose receive
        # hangs on a third thread; every send on the group would hang too.
        if not self._lock.acquire(timeout=self._bound_s):
            raise MoeEpTimeoutError(
                "rank %d: another thread's dispatch or combine on this group held its turn for "
                "more than %s" % (self._rank, bound_words(self._bound_s)))
        try:
            try:
                result = call()
            except BusyError as busy:
                result = self._again(call, busy)
            if record and result.__class__ is Hook:
                if len(self._pending) >= 2 * _SETS:  # receives that ran leave now and then
                    self._pending = [r for r in self._pending if _pending(r)]
                self._pending.append(weakref.ref(result))
            return result
        finally:
            self._lock.release()

    def _again(self, call, busy):
        """call() once the receive it was refused for is abandoned (one per
        buffer set at most); the BusyError stands where no recorded receive
        blocks it."""
        for _ in range(_SETS):
            if not self._abandon_blocker():
                raise busy from None  # the last refusal alone: the earlier ones were retried
            try:
                return call()
            except BusyError as e:
                busy = e
        raise busy from None

    def _abandon_blocker(self):
        """Whether the operation may be made again: the hook the group's
        next operation waits for was recorded here and is now abandoned,
        or the set was freed meanwhile."""
        group = self._group()
        if group is None or not group.config.double_buffer:
            return False
        fn = group._lib.group_busy_hook  # None: a library older than 0.4 cannot say
        if fn is None:
            return False
        out = ctypes.c_void_p()
        for _ in range(2):  # twice: a blocker run by another thread meanwhile matches nothing
            if group._call(fn, ctypes.byref(out)) != 0:
                return False
            if out.value is None:
                return True  # its receive ran meanwhile
            for ref in self._pending:
                hook = ref()
                if hook is not None and hook._ptr == out.value:
                    hook.abandon()
                    return True
        return False


def _pending(ref):
    hook = ref()
    return hook is not None and hook.pending


def group_dropped_hooks(group):
    """The DroppedHooks of a moe_ep.Group: one book for every adapter and
    Buffer on it."""
    return kept_on(group, "_moe_ep_dropped_hooks", lambda: DroppedHooks(group))
