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

from ._bound import bound_words, wait_bound_s
from .errors import InvalidArgumentError, TimeoutError as MoeEpTimeoutError


class Entries:
    """One group's count of calls into the library."""

    __slots__ = ("_cond", "_running", "_closed", "_destroying", "_closer")

    def __init__(self):
        # Re-entrant: the garbage collector may run a Handle's or Hook's
        # __del__ (a free, counted here) on a thread while it holds this lock.
        self._cond = threading.Condition(threading.RLock())
        self._running = 0
        self._closed = False  # no new entry (close began)
        self._destroying = False  # group_destroy is running, or about to
        self._closer = None  # the thread running close()

    def enter(self, pointer):
        """Counts an entry in; returns the group pointer it may use. A
        closing or closed group refuses it."""
        with self._cond:
            if self._closed or pointer is None:
                raise InvalidArgumentError("moe_ep: this Group is closed")
            self._running += 1
        return pointer

    def enter_late(self, group):
        """Counts in an entry on a handle or hook (handle_free, hook_run,
        hook_free), which may come at any time: before close it delays
        close, after close it goes ahead (handles and hooks outlive their
        group, and a hook of a destroyed group says so), and while
        group_destroy runs it waits for it."""
        with self._cond:
            # The closing thread itself runs Python only outside the
            # library's group_destroy (a free the collector runs there
            # comes before or after it), so it never waits for itself.
            if self._destroying and self._closer != _thread_id():
                bound_s = wait_bound_s(group)
                if not self._cond.wait_for(lambda: not self._destroying, bound_s):
                    raise MoeEpTimeoutError(
                        "rank %d: an entry on a handle or hook: group_destroy has been running "
                        "on another thread for more than %s" % (_rank(group), bound_words(bound_s)))
            self._running += 1

    def _reopen(self):
        """close() gave up before group_destroy (lock held)."""
        self._closed = False
        self._closer = None
        self._cond.notify_all()

    def leave(self):
        with self._cond:
            self._running -= 1
            if self._running == 0:
                self._cond.notify_all()

    def close(self, group, destroy):
        """Stops new entries, waits for the running ones within the group's
        wait bound, then calls destroy() (group_destroy) and returns what it
        returns. Entries still running after the bound are stuck in the
        library: the group is then reopened, and moe_ep.TimeoutError says
        so (destroying under them would free what they use). Returns None
        when the group was already closed; a close while another thread's
        is under way waits for it, and closes the group itself if that one
        gave up."""
        with self._cond:
            me = _thread_id()
            if self._closed and self._closer not in (None, me):
                # Another thread's close is under way: its outcome is this one's.
                bound_s = 2 * wait_bound_s(group)
                if not self._cond.wait_for(lambda: self._closer is None, bound_s):
                    raise MoeEpTimeoutError(
                        "rank %d: close: another thread's close of this group has not "
                        "ended within %.0f s" % (_rank(group), bound_s))
            if self._closed:
                return None
            self._closed = True
            self._closer = me
            try:
                bound_s = wait_bound_s(group) if self._running else 0.0
                drained = self._cond.wait_for(lambda: self._running == 0, bound_s)
            except BaseException:  # ^C while waiting: the group stays open, as before
                self._reopen()
                raise
            if not drained:
                self._reopen()
                raise MoeEpTimeoutError(
                    "rank %d: close: %d call(s) on this group on other threads were still "
                    "running after %s; the group stays open (close it again once they "
                    "return)" % (_rank(group), self._running, bound_words(bound_s)))
            self._destroying = True
        try:
            return destroy()
        finally:
            with self._cond:
                self._destroying = False
                self._closer = None
                self._cond.notify_all()


def _rank(group):
    return getattr(group, "rank", -1)  # -1: a Group whose creation failed part way
