"""moe_ep._dropped: a receive left pending through DroppedHooks is
abandoned when the library refuses the group's next operation on its
buffer set as busy for it; a hook made outside the book, or any on a group
with one buffer set, keeps the library's BusyError. One real rank on the
host backend, in this process."""
import pytest
import torch

import moe_ep
from moe_ep._dropped import group_dropped_hooks

E, H, K, T = 4, 128, 2, 6


@pytest.fixture
def group(one_rank_group):
    return one_rank_group(mode="low_latency", num_experts=E, hidden=H, top_k=K,
                          max_tokens_per_rank=16)


def send(g, seed, defer):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((T, H), generator=gen).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)])
    w = torch.rand((T, K), generator=gen)
    handle = g.prepare(ids)
    return handle, x, g.dispatch(handle, x, topk_weights=w, defer=defer)


def test_busy_set_abandons_the_oldest_pending_receive(group):
    book = group_dropped_hooks(group)
    dropped = book.send(lambda: send(group, 1, True)[2])  # buffer set 0, never run
    send(group, 2, False)  # set 1
    handle, x, res = book.send(lambda: send(group, 3, False))  # set 0: busy, then made again
    assert not dropped.pending, "the dropped receive is still pending after the busy set's call"
    assert int(res.recv_count.sum()) == T * K, \
        "the call made after the abandon received %d rows, want %d" % (int(res.recv_count.sum()),
                                                                     T * K)
    with pytest.raises(moe_ep.InvalidArgumentError) as e:
        dropped()
    assert "abandoned before it ran" in str(e.value), str(e.value)


def test_hook_outside_the_book_keeps_busy(group):
    book = group_dropped_hooks(group)
    held = send(group, 1, True)[2]  # set 0, not through the book: its caller keeps the turn
    live = book.send(lambda: send(group, 2, True)[2])  # set 1, recorded
    with pytest.raises(moe_ep.BusyError) as e:
        book.send(lambda: send(group, 3, False))  # set 0
    assert "run that hook first" in str(e.value), str(e.value)
    assert held.pending, "a hook made outside the book was abandoned"
    assert live.pending, "the book abandoned a receive that did not block the call"
    held()
    live()
    book.send(lambda: send(group, 4, False))


def test_one_buffer_set_keeps_busy(one_rank_group):
    g = one_rank_group(mode="low_latency", num_experts=E, hidden=H, top_k=K,
                       max_tokens_per_rank=16, double_buffer=False)
    book = group_dropped_hooks(g)
    first = book.send(lambda: send(g, 1, True)[2])
    with pytest.raises(moe_ep.BusyError) as e:
        book.send(lambda: send(g, 2, True)[2])  # two micro-batches need two sets
    assert "double_buffer=false" in str(e.value), str(e.value)
    assert first.pending, "with one buffer set the book abandoned the first receive"
    first()


def test_library_without_the_entry_keeps_busy(group, monkeypatch):
    """A library older than 0.4 cannot name the blocker: nothing is abandoned."""
    monkeypatch.setattr(group._lib, "group_busy_hook", None)
    book = group_dropped_hooks(group)
    dropped = book.send(lambda: send(group, 1, True)[2])
    send(group, 2, False)
    with pytest.raises(moe_ep.BusyError):
        book.send(lambda: send(group, 3, False))
    assert dropped.pending, "the book abandoned a receive the library could not name"
    dropped()


def test_hooks_that_ran_leave_the_book(group):
    book = group_dropped_hooks(group)
    for seed in range(8):
        book.send(lambda: send(group, seed, True)[2])()
    assert len(book._pending) <= 4, "the book holds %d hooks, most of which ran" % len(book._pending)
