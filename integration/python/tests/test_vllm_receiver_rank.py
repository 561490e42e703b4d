"""What the package raises inside the vLLM adapter's receiver closures,
which vLLM calls outside any public method, names the rank as a public
method's errors do. One real rank on the host backend, in this process."""
import pytest
import torch

import moe_ep
import moe_ep.vllm
from moe_ep.vllm import _received

E, H, K = 4, 128, 2


class PerTensorFp8:
    """vLLM's quant_config for fp8 activations quantised after the receive."""
    quant_dtype = moe_ep.FP8_STORAGE
    per_act_token_quant = False
    block_shape = None
    a1_scale = None


@pytest.fixture
def group(one_rank_group):
    return one_rank_group(mode="low_latency", num_experts=E, hidden=H, top_k=K,
                          max_tokens_per_rank=16)


def test_receiver_error_names_the_rank(group, monkeypatch):
    def refuse(*args, **kwargs):
        raise ValueError("the quantiser refused the rows")
    monkeypatch.setattr(_received, "batched", refuse)
    pf = moe_ep.vllm.PrepareAndFinalize(group)
    gen = torch.Generator().manual_seed(9)
    x = torch.randn((6, H), generator=gen).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(6)])
    w = torch.rand((6, K), generator=gen)
    hook, receiver = pf.prepare_async(x, w, ids, E, None, False, PerTensorFp8())
    hook()
    with pytest.raises(ValueError) as e:
        receiver()
    assert str(e.value) == "rank 0: the quantiser refused the rows", \
        "rank 0: the receiver raised %r, want it to name rank 0" % str(e.value)
