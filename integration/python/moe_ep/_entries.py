"""The order of a Group's close against its entries on other threads.

moe_ep.h lets every entry of a group run on any thread, but group_destroy
must not race any of them, handle_free and hook_free of the group's
handles and hooks included. An engine's micro-batch thread may be inside
dispatch, or the garbage collector may free a handle on another thread,
while the engine thread closes the group. So every call into the library
on a group is counted here, and close() first stops new entries, then waits
(bounded) for the counted ones to leave, and only then destroys."""
import threading
from threading import get_ident as _thread_id
from time import monotonic as _monotonic

from ._bound import bound_words, wait_bound_s
from .errors import InvalidArgumentError, TimeoutError as MoeEpTimeoutError


# How often a wait on a group's entries looks again without a wake-up.
WAKE_S = 0.05


class Entries:
    """One group's count of calls into the library.

    An interrupt (a KeyboardInterrupt a signal handler raises) must not
    leave a call counted in after it has left, nor the lock held: close()
    would then wait out its bound and refuse. CPython raises it only where
    a Python function starts, right after a C function returns, and at a
    loop's backward jump. So a call is counted in by putting its own ticket
    in a set, inside a try whose finally takes the ticket out: an interrupt
    after the put is inside the try, and the take-out is the finally's
    first step, done before its first such point (a ticket never put in
    is taken out as a no-op). The lock is the C RLock itself, whose
    __exit__ releases before the point after it returns (Condition's
    __enter__ and __exit__ are Python functions: an interrupt at their
    start or end would leave it held). close() changes its state by stores
    alone where an interrupt could otherwise leave it half done (the group
    marked closed or being destroyed with group_destroy never run), and
    takes the lock back when one lands inside Condition.wait. An interrupt
    in the wake-up after the take-out loses that wake-up; the waits look
    again every WAKE_S anyway, so a lost one costs at most that."""

    __slots__ = ("_lock", "_cond", "_inside", "_closed", "_destroying", "_closer")

    def __init__(self):
        # Re-entrant: the garbage collector may run a Handle's or Hook's
        # __del__ (a free, counted here) on a thread while it holds this lock.
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._inside = set()  # the tickets of the calls counted in
        self._closed = False  # no new entry (close began)
        self._destroying = False  # group_destroy is running, or about to
        self._closer = None  # the thread running close()

    def call(self, group, late, fn, args):
        """fn(group's pointer, *args), counted in as one of the group's
        entries (close waits for it); a closing or closed group refuses it.
        late: fn(*args) on one of the group's handles or hooks instead
        (handle_free, hook_run, hook_free), which may come at any time:
        before close it delays close, after close it goes ahead (handles
        and hooks outlive their group, and a hook of a destroyed group says
        so), and while group_destroy runs it waits for it."""
        ticket = object()
        try:
            if late:
                self._enter_late(ticket, group)
                return fn(*args)
            return fn(self._enter(ticket, group), *args)
        finally:
            self._inside.discard(ticket)  # first: see the class comment
            self._wake()

    def _enter(self, ticket, group):
        with self._lock:
            pointer = group._g
            if self._closed or pointer is None:
                raise InvalidArgumentError("moe_ep: this Group is closed")
            self._inside.add(ticket)
        return pointer

    def _enter_late(self, ticket, group):
        with self._lock:
            # The closing thread itself runs Python only outside the
            # library's group_destroy (a free the collector runs there
            # comes before or after it), so it never waits for itself.
            if self._destroying and self._closer != _thread_id():
                bound_s = wait_bound_s(group)
                if not self._wait_for(lambda: not self._destroying, bound_s):
                    raise MoeEpTimeoutError(
                        "rank %d: an entry on a handle or hook: group_destroy has been running "
                        "on another thread for more than %s" % (_rank(group), bound_words(bound_s)))
            self._inside.add(ticket)

    def _wake(self):
        with self._lock:
            if not self._inside:
                self._cond.notify_all()

    def _wait_for(self, predicate, bound_s):
        """Condition.wait_for(predicate, bound_s), looking again at least
        every WAKE_S (a wake-up an interrupt swallowed is not waited for),
        with the lock held again whatever it raises: an interrupt that
        lands in Condition.wait between its release of the lock and its
        re-acquire (both Python code) would otherwise leave the caller's
        `with` releasing a lock it no longer holds (a RuntimeError in place
        of the interrupt)."""
        try:
            deadline = _monotonic() + bound_s
            while not predicate():
                left = deadline - _monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, WAKE_S))
            return True
        except BaseException:
            if not self._lock._is_owned():
                self._lock.acquire()
            raise

    def close(self, group, destroy):
        """Stops new entries, waits for the running ones within the group's
        wait bound, then calls destroy() (group_destroy) and returns what it
        returns. Entries still running after the bound are stuck in the
        library: the group is then reopened, and moe_ep.TimeoutError says
        so (destroying under them would free what they use). Returns None
        when the group was already closed; a close while another thread's
        is under way waits for it, and closes the group itself if that one
        gave up."""
        # armed: group_destroy may be under way, so whatever ends close()
        # from here on (an interrupt included: it can land right after the
        # lock's release) must clear _destroying, or frees on other threads
        # would wait for a destroy that never comes. Set by a store, which
        # no interrupt can split from the one it goes with.
        armed = False
        try:
            with self._lock:
                me = _thread_id()
                if self._closed and self._closer not in (None, me):
                    # Another thread's close is under way: its outcome is this one's.
                    bound_s = 2 * wait_bound_s(group)
                    if not self._wait_for(lambda: self._closer is None, bound_s):
                        raise MoeEpTimeoutError(
                            "rank %d: close: another thread's close of this group has not "
                            "ended within %.0f s" % (_rank(group), bound_s))
                if self._closed:
                    return None
                self._closed = True
                self._closer = me
                try:
                    bound_s = wait_bound_s(group) if self._inside else 0.0
                    drained = self._wait_for(lambda: not self._inside, bound_s)
                except BaseException:  # ^C while waiting: the group stays open, as before
                    # Open again by stores alone (an interrupt can land at
                    # the start of any function called here), then wake a
                    # close() on another thread that waits for this one.
                    self._closed, self._closer = False, None
                    self._cond.notify_all()
                    raise
                if not drained:
                    self._closed, self._closer = False, None
                    self._cond.notify_all()
                    raise MoeEpTimeoutError(
                        "rank %d: close: %d call(s) on this group on other threads were still "
                        "running after %s; the group stays open (close it again once they "
                        "return)" % (_rank(group), len(self._inside), bound_words(bound_s)))
                self._destroying = armed = True
            return destroy()
        finally:
            if armed:
                with self._lock:
                    # Stores first, as above. destroy() never took the group
                    # (an interrupt came first): open again, so that a later
                    # close() runs it.
                    self._destroying, self._closer = False, None
                    if group._g is not None:
                        self._closed = False
                    self._cond.notify_all()


def _rank(group):
    return getattr(group, "rank", -1)  # -1: a Group whose creation failed part way
