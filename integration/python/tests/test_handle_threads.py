"""Handles and hooks used from two threads: a handle two threads free at
once is freed once, and a hook's or the group's book's lock held past the
wait bound (its holder stuck in a receive) raises moe_ep.TimeoutError
naming the rank and the bound instead of hanging the waiter too. The
interleavings are forced (interleave); the hooks are one real rank's on
the host backend, in this process."""
import threading

import pytest
import torch

import moe_ep
import moe_ep.handle
from moe_ep._dropped import group_dropped_hooks
from interleave import Runner, second_while_first_stopped, wait_for, watch_locks

E, H, K, T = 4, 128, 2, 6
BOUND_WORDS = "(bootstrap.timeout_ms plus four timeouts.kernel_ms, plus 5 s)"


class _Library:
    def __init__(self):
        self.freed = []

    def handle_free(self, ptr):
        self.freed.append(ptr)


class _Group:
    """What a Handle uses of its group."""

    def __init__(self):
        self._lib = _Library()

    def _call_late(self, fn, *args):
        return fn(*args)


class PausingHandle(moe_ep.Handle):
    """A Handle whose pointer, read by the thread `pause_in` while it is
    still set, stops that thread there until `go` is set: the moment the
    interpreter may switch threads between free()'s read of the pointer
    and its clearing of it."""

    def __init__(self, group, ptr, go):
        self.pause_in, self.read, self.go = None, threading.Event(), go
        super().__init__(group, ptr, torch.zeros((2, 1), dtype=torch.int64), None)

    @property
    def _ptr(self):
        value = self.__dict__["ptr"]
        if value is not None and threading.current_thread() is self.pause_in:
            self.read.set()
            wait_for(self.go, "the second free returning or waiting")
        return value

    @_ptr.setter
    def _ptr(self, value):
        self.__dict__["ptr"] = value


def test_two_threads_free_one_handle_once(monkeypatch):
    """The first free stops right after reading the pointer; a second free
    from another thread meanwhile must not free it again (the library may
    have placed another live handle at that address by then)."""
    either = threading.Event()  # the second free returned, or waits for the first
    watch_locks(monkeypatch, moe_ep.handle, either)
    group = _Group()
    handle = PausingHandle(group, 0x5a0, go=either)
    first = Runner(handle.free)
    handle.pause_in = first
    second_while_first_stopped(first, handle.free, handle.read, either, "free")
    assert group._lib.freed == [0x5a0], \
        "rank 0: handle_free was called with %s, want the pointer once" % group._lib.freed


@pytest.fixture
def group(one_rank_group):
    return one_rank_group(mode="low_latency", num_experts=E, hidden=H, top_k=K,
                          max_tokens_per_rank=16)


def send(g, seed):
    """A deferred dispatch: (its handle, its hook)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((T, H), generator=gen).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)])
    handle = g.prepare(ids)
    return handle, g.dispatch(handle, x, topk_weights=torch.rand((T, K), generator=gen),
                              defer=True)


@pytest.mark.parametrize("entry", ["hook_run", "hook_abandon"])
def test_hook_waits_for_another_thread_within_the_bound(group, monkeypatch, entry):
    """Another thread holds the hook's lock (its receive hangs): running or
    abandoning the hook gives up after the bound instead of waiting for
    good, and the hook stays pending for whoever holds it."""
    monkeypatch.setattr(moe_ep.handle, "wait_bound_s", lambda g: 0.05, raising=False)
    handle, hook = send(group, 1)
    assert hook._lock.acquire(blocking=False)  # another thread, stuck in the receive
    try:
        waiter = Runner(hook if entry == "hook_run" else hook.abandon)
        waiter.start()
        with pytest.raises(moe_ep.TimeoutError) as e:
            waiter.outcome(entry)
    finally:
        hook._lock.release()
    assert str(e.value) == ("rank 0: %s: another thread has been running this hook's receive "
                            "for more than 0 s %s" % (entry, BOUND_WORDS)), str(e.value)
    assert hook.pending, "rank 0: a hook whose wait timed out is no longer pending"
    hook()
    handle.free()


def test_book_waits_for_another_send_within_the_bound(group):
    """Another thread holds the group's book of pending receives (its send
    is stuck abandoning a hook): a send gives up after the bound, and the
    book takes sends again once it is free."""
    book = group_dropped_hooks(group)
    book._bound_s = 0.05
    sent = []
    assert book._lock.acquire(blocking=False)  # another thread's send, stuck
    try:
        waiter = Runner(lambda: book.send(lambda: sent.append(send(group, 1)) or sent[-1][1]))
        waiter.start()
        with pytest.raises(moe_ep.TimeoutError) as e:
            waiter.outcome("the send")
    finally:
        book._lock.release()
    assert str(e.value) == ("rank 0: another thread's dispatch or combine on this group held its "
                            "turn for more than 0 s %s" % BOUND_WORDS), str(e.value)
    assert not sent, "rank 0: a send that timed out made its dispatch"
    handle, hook = send(group, 2)
    book.send(lambda: hook)()
    handle.free()
