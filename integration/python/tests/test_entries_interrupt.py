"""An interrupt (a KeyboardInterrupt raised by a signal handler) landing
anywhere in a call on a group leaves the group's count of calls right:
the count's lock is free afterwards, and close() finds no call running.
CPython runs a signal handler, raising its exception, only where a Python
function starts, right after a call to a C function returns, and at a
loop's backward jump (these paths have no loop). A profile hook
(sys.setprofile) sees the first two as its 'call' and 'c_return' events;
it raises at each of them in turn, one per call, on this thread only."""
import gc
import itertools
import sys
import threading

import pytest

import moe_ep._entries
from interleave import Runner

E, H, K = 4, 128, 2
MAX_POINTS = 1000  # far more than a call's points: a loop past it is a test bug


class _Interrupt(BaseException):
    """Stands in for the KeyboardInterrupt."""


def _interrupted_at(n, call):
    """Runs call() with an interrupt at its n-th point (counted from 0).
    Returns the point's words, or None when call() has fewer points and
    ran to its end."""
    seen, where = [0], []

    def hook(frame, event, arg):
        if not where and event in ("call", "c_return"):
            if seen[0] == n:
                where.append("%s %s in %s" % (event, getattr(arg, "__name__", ""),
                                              frame.f_code.co_name))
                raise _Interrupt()
            seen[0] += 1

    def run():  # the points counted are the ones inside call()
        sys.setprofile(hook)
        try:
            call()
        finally:
            sys.setprofile(None)

    try:
        run()
    except _Interrupt:
        return where[0]
    assert not where, "rank 0: the interrupt at %s did not reach the caller" % where
    return None


def _lock_free_on_another_thread(entries):
    def take():
        if not entries._cond.acquire(False):
            return False
        entries._cond.release()
        return True
    taker = Runner(take)
    taker.start()
    return taker.outcome("taking the count's lock")


@pytest.fixture
def group(one_rank_group):
    return one_rank_group(mode="low_latency", num_experts=E, hidden=H, top_k=K,
                          max_tokens_per_rank=16)


@pytest.mark.parametrize("late", [False, True], ids=["call", "call_late"])
def test_an_interrupt_at_any_point_of_a_call_leaves_the_count_right(group, monkeypatch, late):
    """Every point of one call, each interrupted once: then close() (with a
    short bound) destroys at once instead of waiting for a call that has
    left, and each time another thread can take the count's lock."""
    pointer = group.pointer
    if late:
        call, want = (lambda: group._call_late(lambda: "late")), "late"
    else:
        call, want = (lambda: group._call(lambda g: g)), pointer
    points = []
    gc.disable()  # a collection's frees would add points of their own
    try:
        for n in itertools.count():
            assert n < MAX_POINTS, "rank 0: a call with more than %d points" % MAX_POINTS
            where = _interrupted_at(n, call)
            assert _lock_free_on_another_thread(group._entries), \
                "rank 0: an interrupt at %s (point %d) left the count's lock held" % (where, n)
            if where is None:
                break
            points.append(where)
    finally:
        gc.enable()
    assert len(points) >= 4, "rank 0: only %d points interrupted: %s" % (len(points), points)
    assert call() == want, "rank 0: the group does not work after the interrupts"
    monkeypatch.setattr(moe_ep._entries, "wait_bound_s", lambda g: 0.05)
    try:
        group.close()
    except moe_ep.TimeoutError as e:
        pytest.fail("rank 0: after interrupts at %s: %s" % (points, e))
