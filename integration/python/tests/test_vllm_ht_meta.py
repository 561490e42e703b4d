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


@pytest.mark.parametrize("on_cuda", [False, True])
def test_ht_meta_has_host_counts(group, on_cuda):
    """Whatever device the group's tensors are on (a CUDA group is stood in
    for by its flag: the counts are host tensors here either way)."""
    group._is_cuda = on_cuda
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
