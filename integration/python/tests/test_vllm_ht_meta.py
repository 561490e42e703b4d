"""vLLM's high-throughput prepare hands its experts the receive counts on
the host (expert_num_tokens_cpu), as vLLM's DeepEP HT path does: the
receive has already waited for them. One real rank, in this process."""
import pytest
import torch

import moe_ep
import moe_ep.vllm

E, H, K = 4, 128, 2


@pytest.fixture
def group(one_rank_group):
    return one_rank_group(mode="high_throughput", num_experts=E, hidden=H, top_k=K,
                          max_tokens_per_rank=16)


def test_ht_meta_has_host_counts(group):
    """(The GPU suite's run_python.sh covers a CUDA group.)"""
    pf = moe_ep.vllm.PrepareAndFinalize(group)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn((6, H), generator=gen).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(6)])
    w = torch.rand((6, K), generator=gen)
    _, _, meta, ids, wts = pf.prepare(x, w, idx, E, None, False, None)
    want = torch.bincount(idx.reshape(-1), minlength=E).int()
    assert meta.expert_num_tokens_cpu is not None
    assert meta.expert_num_tokens_cpu.device.type == "cpu"
    assert torch.equal(meta.expert_num_tokens_cpu, want)
    assert torch.equal(meta.expert_num_tokens, want)
    pf.finalize(torch.empty_like(x), torch.zeros((len(ids), H), dtype=torch.bfloat16), wts, ids,
                False, None)


class TopKWeightAndReduceContiguous:
    """vLLM's reducer of a flat [N * top_k, H] expert output: views the
    weights as [N, top_k, 1], which fails on zero rows (as vLLM's does)."""

    def __init__(self):
        self.calls = 0

    def apply(self, output, fused_expert_output, topk_weights, topk_ids,
              apply_router_weight_on_input):
        self.calls += 1
        n, k = topk_ids.shape
        w = topk_weights.view(n, -1, 1)
        return (fused_expert_output.view(n, k, -1).float() * w).sum(1).to(torch.bfloat16)


def test_ht_finalize_of_an_empty_receive_calls_no_reducer(group):
    """A rank that received no tokens (a data-parallel rank with an empty
    batch) finalizes without calling the reducer, as vLLM's DeepEP HT
    finalize does: its reshape of zero rows raises."""
    pf = moe_ep.vllm.PrepareAndFinalize(group)
    x = torch.empty((0, H), dtype=torch.bfloat16)
    idx = torch.empty((0, K), dtype=torch.int64)
    w = torch.empty((0, K), dtype=torch.float32)
    a1q, _, meta, ids, wts = pf.prepare(x, w, idx, E, None, False, None)
    assert a1q.shape[0] == 0 and ids.shape[0] == 0
    impl = TopKWeightAndReduceContiguous()
    out = torch.empty_like(x)
    pf.finalize(out, torch.empty((0, H), dtype=torch.bfloat16), wts, ids, False, impl)
    assert impl.calls == 0, "rank 0: the reducer ran %d times on an empty receive, want 0" \
        % impl.calls
    assert out.shape == (0, H)


@pytest.mark.parametrize("what", ["a1", "topk_weights", "topk_ids"])
def test_prepare_names_a_wrong_dtype_in_vllms_terms(group, what):
    """An fp16 a1 (or bf16 weights, int16 ids) is refused naming vLLM's
    argument and the dtype, before anything is sent; the adapter stays
    usable."""
    pf = moe_ep.vllm.PrepareAndFinalize(group)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn((4, H), generator=gen).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(4)])
    w = torch.rand((4, K), generator=gen)
    bad = {"a1": (x.half(), w, idx), "topk_weights": (x, w.to(torch.bfloat16), idx),
           "topk_ids": (x, w, idx.to(torch.int16))}[what]
    want = {"a1": "a1 has dtype torch.float16", "topk_weights": "topk_weights has dtype "
            "torch.bfloat16", "topk_ids": "topk_ids has dtype torch.int16"}[what]
    with pytest.raises(TypeError, match=want):
        pf.prepare(*bad, E, None, False, None)
    _, _, _, ids, wts = pf.prepare(x, w, idx, E, None, False, None)
    pf.finalize(torch.empty_like(x), torch.zeros((len(ids), H), dtype=torch.bfloat16), wts, ids,
                False, None)
