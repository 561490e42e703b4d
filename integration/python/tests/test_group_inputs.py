"""Group.prepare names the caller's argument when topk_idx is not
[num_tokens, top_k] (the library would only see the counts it is given),
and the group stays usable. One real rank on the host backend."""
import pytest
import torch

import moe_ep

E, H, K = 4, 128, 2


@pytest.mark.parametrize("shape", [(6,), (2, 3, 2), ()])
def test_prepare_names_a_topk_idx_that_is_not_2d(one_rank_group, shape):
    g = one_rank_group(mode="low_latency", num_experts=E, hidden=H, top_k=K,
                       max_tokens_per_rank=8)
    with pytest.raises(moe_ep.InvalidArgumentError,
                       match=r"rank 0: prepare: topk_idx has shape %s; it must be 2-D"
                       % __import__("re").escape(str(shape))):
        g.prepare(torch.zeros(shape, dtype=torch.int64))
    x = torch.ones((3, H), dtype=torch.bfloat16)
    idx = torch.tensor([[0, 1], [2, 3], [1, -1]])
    with g.prepare(idx) as h:
        res = g.dispatch(h, x)
        assert res.recv_count.tolist() == [1, 2, 1, 1], \
            "rank 0: counts after the refusal %s, want [1, 2, 1, 1]" % res.recv_count.tolist()


def test_routing_notice_read_by_the_package_waits_for_poll_error(one_rank_group, monkeypatch):
    """The Buffer's worst-case check polls the group for failures; a routing
    notice it meets there (the library reports one once, the group usable)
    is not raised on that rank alone but handed to the engine's next
    poll_error, and only once; a failure is still raised at once."""
    g = one_rank_group(mode="high_throughput", num_experts=E, hidden=H, top_k=K,
                       max_tokens_per_rank=8)
    answers = [moe_ep.InvalidArgumentError.status, 0]
    real_call = g._call

    def call(fn, *args):
        if fn is g._lib.group_poll_error and answers:
            return answers.pop(0)
        return real_call(fn, *args)
    monkeypatch.setattr(g, "_call", call)
    g._poll_fatal()  # the notice is kept, not raised
    with pytest.raises(moe_ep.InvalidArgumentError):
        g.poll_error()
    assert g.poll_error() is None, "rank 0: the kept notice was raised twice"
    answers[:] = [moe_ep.TimeoutError.status]
    with pytest.raises(moe_ep.TimeoutError):
        g._poll_fatal()
