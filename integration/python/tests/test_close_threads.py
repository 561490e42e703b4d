"""Group.close() against calls on the group running on other threads
(moe_ep._entries): close waits for a call inside the library before it
destroys, refuses new calls meanwhile, gives up after the bound with the
group left open, and a handle freed while group_destroy runs waits for it.
The group is one real rank on the host backend in this process; the calls
inside the library are stopped at chosen points, and every wait is bounded
(interleave.WAIT_S)."""
import gc
import threading
import time

import pytest
import torch

import moe_ep
import moe_ep._entries
from interleave import WAIT_S, Runner, wait_for

E, H, K, T = 4, 128, 2, 6
BOUND_WORDS = "(bootstrap.timeout_ms plus four timeouts.kernel_ms, plus 5 s)"


class _Recording:
    """The group's library, recording group_destroy and handle_free (with
    what was already recorded when each began), and stopping
    group_destroy until `release_destroy` is set when `hold_destroy` is."""

    def __init__(self, real):
        self._real = real
        self.log = []
        self.hold_destroy = False
        self.collect_in_destroy = False
        self.in_destroy = threading.Event()
        self.release_destroy = threading.Event()

    def group_destroy(self, g):
        self.log.append("group_destroy")
        if self.collect_in_destroy:
            gc.collect()  # on the closing thread, with group_destroy about to run
        if self.hold_destroy:
            self.in_destroy.set()
            wait_for(self.release_destroy, "the test releasing group_destroy")
        st = self._real.group_destroy(g)
        self.log.append("group_destroy returned")
        return st

    def handle_free(self, ptr):
        self.log.append("handle_free")
        return self._real.handle_free(ptr)

    def __getattr__(self, name):
        return getattr(self._real, name)


def poll(cond, what):
    """Waits (bounded) for a state another thread reaches."""
    deadline = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < deadline, "%s did not happen within %.0f s" % (what, WAIT_S)
        time.sleep(0.001)


def _close_waiting(g):
    """True once close() waits on the group's condition for calls to leave
    (a thread is inside Condition.wait)."""
    return len(g._entries._cond._waiters) == 1


def _record_close_waits(g, monkeypatch):
    """Records each Condition.wait of the group's entries as (timeout, what
    it returned), and for each notify_all how many threads waited: what
    close()'s wait did, read without a clock."""
    cond, waits, notified = g._entries._cond, [], []
    real_wait, real_notify = cond.wait, cond.notify_all

    def wait(timeout=None):
        got = real_wait(timeout)
        waits.append((timeout, got))
        return got

    def notify_all():
        notified.append(len(cond._waiters))  # the threads it wakes
        return real_notify()
    monkeypatch.setattr(cond, "wait", wait)
    monkeypatch.setattr(cond, "notify_all", notify_all)
    return waits, notified


def _check_waits_look_again(waits):
    """Every wait of close() lasted at most 50 ms (it looks again that
    often, so a lost wake-up costs at most that, not its bound)."""
    assert waits, "rank 0: close() never waited (the call left before it began to)"
    long = [t for t, _ in waits if t is None or t > 0.05]
    assert not long, "rank 0: close() waited %s s at a time; it looks again every 0.05 s" % long


def _call_held_inside(g):
    """A call on `g` from another thread, held inside the library until the
    returned Event is set: (its Runner, that Event)."""
    inside, go = threading.Event(), threading.Event()

    def stuck_call(ptr):
        inside.set()
        wait_for(go, "the test letting the call return")
        return 0

    caller = Runner(lambda: g._call(stuck_call))
    caller.start()
    wait_for(inside, "the call entering the library")
    return caller, go


@pytest.fixture
def group(one_rank_group):
    g = one_rank_group(mode="low_latency", num_experts=E, hidden=H, top_k=K,
                       max_tokens_per_rank=16)
    g._lib = _Recording(g._lib)
    return g


def test_close_waits_for_a_call_inside_the_library(group, monkeypatch):
    """A call stopped inside the library on another thread: close() does not
    destroy under it, a new call meanwhile is refused, the call leaving
    wakes close(), and the group is destroyed once the call has returned."""
    lib = group._lib
    inside, seen = threading.Event(), []
    waits, notified = _record_close_waits(group, monkeypatch)

    def stuck_call(g):
        inside.set()
        poll(lambda: _close_waiting(group), "close() waiting for the call")
        seen.append(list(lib.log))  # what close had done while this call was inside
        try:
            group.info()
        except moe_ep.InvalidArgumentError as e:
            seen.append(str(e))
        return lib.group_poll_error(g)

    caller = Runner(lambda: group._call(stuck_call))
    caller.start()
    wait_for(inside, "the call entering the library")
    group.close()
    assert caller.outcome("the call") == 0, "rank 0: the call inside the library failed"
    # The call leaving wakes close() (a notify while it waited), and each
    # of close()'s waits is short whatever happens to that wake-up.
    assert any(notified), "rank 0: the call left while close() waited and woke nobody " \
        "(notifies reached %s waiting threads)" % notified
    _check_waits_look_again(waits)
    assert seen[0] == [], \
        "rank 0: group_destroy ran while another thread's call was inside the library " \
        "(log %s)" % seen[0]
    assert seen[1] == "rank 0: moe_ep: this Group is closed", \
        "rank 0: a call started while close() waited got %r, want the closed sentence" % seen[1]
    assert lib.log == ["group_destroy", "group_destroy returned"], lib.log


def test_close_looks_again_without_a_wake_up(group, monkeypatch):
    """A wake-up lost (an interrupt can swallow the one a leaving call
    sends): close() still sees the call has left within moments, not at
    the end of its bound."""
    monkeypatch.setattr(moe_ep._entries.Entries, "_wake", lambda self: None)
    waits, _ = _record_close_waits(group, monkeypatch)
    caller, go = _call_held_inside(group)
    closer = Runner(group.close)
    closer.start()
    poll(lambda: _close_waiting(group), "close() waiting for the call")
    go.set()
    assert caller.outcome("the held call") == 0
    closer.outcome("close()")
    # No wake-up came: close() saw the call gone by looking again after a
    # wait of at most 50 ms that timed out.
    _check_waits_look_again(waits)
    assert not any(got for _, got in waits), \
        "rank 0: a wait of close() was woken (%s) with every wake-up dropped" % waits
    assert group._lib.log == ["group_destroy", "group_destroy returned"], group._lib.log


def test_close_gives_up_after_the_bound_and_the_group_stays_open(group, monkeypatch):
    """A call stuck inside the library past the bound: close() raises
    TimeoutError naming the rank, the count and the bound, the group still
    works, and a later close() destroys it."""
    monkeypatch.setattr(moe_ep._entries, "wait_bound_s", lambda g: 0.05)
    caller, go = _call_held_inside(group)
    with pytest.raises(moe_ep.TimeoutError) as e:
        group.close()
    want = ("rank 0: close: 1 call(s) on this group on other threads were still running after "
            "0 s %s; the group stays open (close it again once they return)" % BOUND_WORDS)
    assert str(e.value) == want, "rank 0: got %r, want %r" % (str(e.value), want)
    assert group._lib.log == [], "rank 0: group_destroy ran: %s" % group._lib.log
    assert group.info().world_size == 1  # still open
    go.set()
    caller.outcome("the call")
    group.close()
    assert group._lib.log == ["group_destroy", "group_destroy returned"], group._lib.log


def test_handle_freed_during_group_destroy_waits_for_it(group):
    """A handle dropped on another thread while group_destroy runs is freed
    after group_destroy has returned, as moe_ep.h requires."""
    lib = group._lib
    gen = torch.Generator().manual_seed(7)
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)])
    handle = group.prepare(ids)
    lib.hold_destroy = True
    closer = Runner(group.close)
    closer.start()
    wait_for(lib.in_destroy, "group_destroy starting")
    freer = Runner(handle.free)
    freer.start()
    # The free waits for group_destroy (one waiter on the group's count) or,
    # without the order, runs now; the log says which came first.
    cond = getattr(getattr(group, "_entries", None), "_cond", None)
    poll(lambda: "handle_free" in lib.log or not freer.is_alive() or
         len(getattr(cond, "_waiters", ())) == 1, "the free waiting or running")
    lib.release_destroy.set()
    closer.outcome("close")
    freer.outcome("the free")
    assert lib.log == ["group_destroy", "group_destroy returned", "handle_free"], \
        "rank 0: handle_free ran during group_destroy: %s" % lib.log


def _collectable_handle(g):
    """A handle only a reference cycle keeps: freed by the next gc.collect()."""
    gen = torch.Generator().manual_seed(9)
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)])
    cycle = [g.prepare(ids)]
    cycle.append(cycle)


def test_handle_collected_while_close_holds_its_lock(group, monkeypatch):
    """The collector frees a handle on the closing thread while close()
    holds the group's count lock: the free goes ahead (before the
    destroy) instead of waiting for a lock its own thread holds."""
    lib = group._lib

    def collect_then_thread_id():  # close() asks it with the lock held
        gc.collect()
        return threading.get_ident()

    gc.disable()  # the collection comes where the test puts it
    try:
        _collectable_handle(group)
        monkeypatch.setattr(moe_ep._entries, "_thread_id", collect_then_thread_id)
        closer = Runner(group.close)
        closer.start()
        closer.outcome("close with a collection under its lock")
    finally:
        gc.enable()
    assert lib.log == ["handle_free", "group_destroy", "group_destroy returned"], \
        "rank 0: %s" % lib.log


def test_handle_collected_on_the_closing_thread_in_destroy_is_freed(group, monkeypatch):
    """The collector frees a handle on the closing thread once close() has
    started group_destroy: the free does not wait for its own thread (and
    so is not given up after the bound, leaking the handle)."""
    lib = group._lib
    monkeypatch.setattr(moe_ep._entries, "wait_bound_s", lambda g: 0.05)
    gc.disable()
    try:
        _collectable_handle(group)
        lib.collect_in_destroy = True
        group.close()
    finally:
        gc.enable()
    assert "handle_free" in lib.log, "rank 0: the collected handle was never freed: %s" % lib.log


def test_second_close_waits_for_the_first(group):
    """A close() while another thread's close waits for a call: it returns
    only once the group is destroyed, not at once as if it were."""
    lib = group._lib
    caller, go = _call_held_inside(group)
    first = Runner(group.close)
    first.start()
    poll(lambda: getattr(group._entries, "_closer", None) is not None, "the first close starting")
    second = Runner(lambda: list(group.close() or lib.log))  # the log when it returned
    second.start()
    poll(lambda: len(group._entries._cond._waiters) == 2 or not second.is_alive(),
         "the second close waiting or returning")
    go.set()
    caller.outcome("the call")
    first.outcome("the first close")
    seen = second.outcome("the second close")
    assert seen == ["group_destroy", "group_destroy returned"], \
        "rank 0: the second close returned with the log %s, before the group was destroyed" % seen


class _Interrupt(BaseException):
    """Stands in for a KeyboardInterrupt that lands while close() waits."""


def test_close_interrupted_while_waiting_leaves_the_group_open(group, monkeypatch):
    """An interrupt while close() waits for a call leaves the group open
    (not marked closed with group_destroy never run): calls work, and a
    later close() destroys it."""
    def interrupted(g):
        raise _Interrupt()

    caller, go = _call_held_inside(group)
    monkeypatch.setattr(moe_ep._entries, "wait_bound_s", interrupted)
    with pytest.raises(_Interrupt):
        group.close()
    monkeypatch.undo()
    go.set()
    caller.outcome("the call")
    assert group.info().world_size == 1, "rank 0: the group is not usable after the interrupt"
    group.close()
    assert group._lib.log == ["group_destroy", "group_destroy returned"], group._lib.log
