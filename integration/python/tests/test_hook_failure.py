"""A hook whose run failed raises that failure again on every later call,
not "already ran", so the thread that calls it second (the engine's other
micro-batch) sees the cause; the group stays usable where the backend
allows it. One real rank on the host backend, in this process."""
import pytest
import torch

import moe_ep

E, H, K = 4, 128, 2


@pytest.fixture
def group(one_rank_group):
    return one_rank_group(mode="low_latency", num_experts=E, hidden=H, top_k=K,
                          max_tokens_per_rank=8)


def inputs(seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((5, H), generator=gen).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(5)])
    return x, idx


def test_failed_hook_raises_its_own_error_again(group):
    x, idx = inputs(7)
    handle = group.prepare(idx)
    hook = group.dispatch(handle, x, defer=True)
    handle.free()  # before the hook ran: its receive is abandoned (host backend: safe)
    with pytest.raises(moe_ep.InvalidArgumentError, match="freed before the hook ran") as first:
        hook()
    with pytest.raises(moe_ep.InvalidArgumentError) as again:
        hook()
    assert str(again.value) == str(first.value), \
        "rank 0: a second call raised %r, want the first failure %r" % (str(again.value),
                                                                         str(first.value))
    # The group goes on: a whole round trip after the abandoned receive.
    x, idx = inputs(8)
    with group.prepare(idx) as h:
        res = group.dispatch(h, x)
        out = group.combine(h, res.recv_x, topk_weights=torch.ones((5, K)))
    assert out.shape == (5, H)
