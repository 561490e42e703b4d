"""An interrupt (a KeyboardInterrupt raised by a signal handler) landing
anywhere in a call on a group leaves the group's count of calls right:
the count's lock is free afterwards, and close() finds no call running;
one landing anywhere in close() leaves the group destroyed, or open and
destroyed by the next close(), never marked as being destroyed.
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

import moe_ep
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


def _each_point(what, run, check):
    """run(n) with an interrupt at its n-th point, for n = 0, 1, ... until
    a run has no n-th point, with the garbage collector off (a
    collection's frees would add points of their own); after each,
    another thread must be able to take the count's lock (entries of the
    group run returns) and check(where, n) holds. Returns the points
    interrupted, at least 4."""
    points = []
    gc.disable()
    try:
        for n in itertools.count():
            assert n < MAX_POINTS, "rank 0: %s has more than %d points" % (what, MAX_POINTS)
            g, where = run(n)
            assert _lock_free_on_another_thread(g._entries), \
                "rank 0: an interrupt at %s (point %d of %s) left the count's lock held" \
                % (where, n, what)
            check(g, where, n)
            if where is None:
                break
            points.append(where)
    finally:
        gc.enable()
    assert len(points) >= 4, "rank 0: only %d points of %s interrupted: %s" % (len(points), what,
                                                                              points)
    return points


def _make(one_rank_group):
    return one_rank_group(mode="low_latency", num_experts=E, hidden=H, top_k=K,
                          max_tokens_per_rank=16)


@pytest.mark.parametrize("late", [False, True], ids=["call", "call_late"])
def test_an_interrupt_at_any_point_of_a_call_leaves_the_count_right(one_rank_group, monkeypatch,
                                                                    late):
    """Every point of one call, each interrupted once: then close() (with a
    short bound) destroys at once instead of waiting for a call that has
    left, and each time another thread can take the count's lock."""
    group = _make(one_rank_group)
    pointer = group.pointer
    if late:
        call, want = (lambda: group._call_late(lambda: "late")), "late"
    else:
        call, want = (lambda: group._call(lambda g: g)), pointer
    points = _each_point("a call", lambda n: (group, _interrupted_at(n, call)),
                         lambda g, where, n: None)
    assert call() == want, "rank 0: the group does not work after the interrupts"
    monkeypatch.setattr(moe_ep._entries, "wait_bound_s", lambda g: 0.05)
    try:
        group.close()
    except moe_ep.TimeoutError as e:
        pytest.fail("rank 0: after interrupts at %s: %s" % (points, e))


def test_an_interrupt_at_any_point_of_close_leaves_the_group_closable(one_rank_group):
    """Every point of close(), each interrupted once on a group of its own:
    afterwards the count's lock is free, no destroy is marked as running
    (a free on another thread would wait for it until its bound), and the
    group is destroyed, by that close() or by the next."""
    def run(n):
        g = _make(one_rank_group)
        return g, _interrupted_at(n, g.close)

    def check(g, where, n):
        assert not g._entries._destroying, \
            "rank 0: an interrupt at %s (point %d of close) left a destroy marked as running" \
            % (where, n)
        if g._g is not None:
            g.close()
            assert g._g is None, \
                "rank 0: after an interrupt at %s (point %d), the next close() did not destroy " \
                "the group" % (where, n)

    _each_point("close()", run, check)


def test_an_interrupt_while_close_waits_leaves_the_group_open(one_rank_group, monkeypatch):
    """A call held inside the library on another thread, and close() (its
    bound cut to 0.05 s) interrupted at each of its points in turn, those of
    its wait included: each time close() raises the interrupt or gives up
    (moe_ep.TimeoutError), never a RuntimeError of a lock it no longer
    holds; the group stays open, the count's lock free, and once the call
    returns close() destroys the group."""
    from test_close_threads import _call_held_inside
    monkeypatch.setattr(moe_ep._entries, "wait_bound_s", lambda g: 0.05)
    group = _make(one_rank_group)
    caller, go = _call_held_inside(group)

    def close_or_give_up():
        try:
            group.close()
        except moe_ep.TimeoutError:
            pass

    def check(g, where, n):
        assert not g._entries._closed and g._g is not None, \
            "rank 0: an interrupt at %s (point %d of close) left the group closed under a " \
            "running call" % (where, n)

    try:
        points = _each_point("close() while a call runs",
                             lambda n: (group, _interrupted_at(n, close_or_give_up)), check)
    finally:
        go.set()
    assert caller.outcome("the held call") == 0
    group.close()
    assert group._g is None, "rank 0: close() after the interrupts did not destroy the group"
    assert any("wait" in p for p in points), "rank 0: no point inside the wait: %s" % points
