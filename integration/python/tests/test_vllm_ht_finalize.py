"""vLLM's high-throughput finalize where vLLM's experts wrote their
output into finalize's `output` (vLLM aliases the two when N_recv == T and
a no-op reducer returns the experts' buffer), the inputs vLLM's HT path
cannot combine, and the library's refusal of a combine whose out shares
memory with its y. One real rank on the host backend; values bit-exact."""
import types

import pytest
import torch

import moe_ep
import moe_ep.vllm

E, H, K, T = 4, 128, 2, 6
SEED = 29


@pytest.fixture
def group(one_rank_group):
    return one_rank_group(mode="high_throughput", num_experts=E, hidden=H, top_k=K,
                          max_tokens_per_rank=16)


def routing(seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((T, H), generator=gen).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)])
    w = torch.rand((T, K), generator=gen)
    return gen, x, idx, w


def test_finalize_into_the_experts_own_buffer(group):
    """fused_expert_output is `output` itself: the combine gets a copy of
    it, and with one rank every token's result is its row as the experts
    wrote it (one f32 term from +0, rounded once)."""
    pf = moe_ep.vllm.PrepareAndFinalize(group)
    gen, x, idx, w = routing(SEED)
    a1q, _, _, ids, wts = pf.prepare(x, w, idx, E, None, False, None)
    assert a1q.shape[0] == T, "seed %d: %d rows received, want %d" % (SEED, a1q.shape[0], T)
    output = torch.randn((T, H), generator=gen).to(torch.bfloat16)  # the experts' result
    want = output.clone()
    pf.finalize(output, output, wts, ids, False, None)
    bad = (output.view(torch.int16) != want.view(torch.int16)).nonzero()
    assert not len(bad), "rank 0, seed %d: first bad %s: got %r want %r" % (
        SEED, tuple(bad[0].tolist()), output[tuple(bad[0])].item(), want[tuple(bad[0])].item())


def test_combine_into_its_own_y_is_refused_and_the_group_goes_on(group):
    gen, x, idx, w = routing(SEED + 1)
    h = group.prepare(idx)
    res = group.dispatch(h, x, topk_weights=w)
    y = torch.randn((res.num_recv_tokens, H), generator=gen).to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"combine: params->y \(bytes .* share memory; the call "
                                         r"writes params->out while it reads params->y"):
        group.combine(h, y, out=y[:T])
    out = group.combine(h, y)
    bad = (out.view(torch.int16) != y.view(torch.int16)).nonzero()
    assert not len(bad), "rank 0, seed %d: first bad %s" % (SEED + 1, tuple(bad[0].tolist()))
    h.free()


def test_ht_prepare_refuses_a_non_bf16_a1_even_when_it_quantises(group):
    """vLLM makes output like a1 and the combine writes bf16: an fp16 a1
    cannot be finalized, so prepare refuses it before anything is sent."""
    pf = moe_ep.vllm.PrepareAndFinalize(group)
    _, x, idx, w = routing(SEED + 2)
    quant = types.SimpleNamespace(quant_dtype=moe_ep.FP8_STORAGE, block_shape=[128, 128],
                                  per_act_token_quant=False, a1_scale=None)
    with pytest.raises(TypeError, match="prepare: a1 has dtype torch.float16"):
        pf.prepare(x.to(torch.float16), w, idx, E, None, False, quant)
    a1q, _, _, ids, wts = pf.prepare(x, w, idx, E, None, False, quant)  # still usable
    pf.finalize(torch.empty_like(x), torch.zeros((len(ids), H), dtype=torch.bfloat16), wts, ids,
                False, None)


class Experts:
    def __init__(self, packed):
        self.packed = packed

    def supports_packed_ue8m0_act_scales(self):
        return self.packed


def test_ht_packed_scales_need_experts_that_take_them(group):
    pf = moe_ep.vllm.PrepareAndFinalize(group, scale_format="ue8m0_packed")
    with pytest.raises(ValueError, match="post_init_setup: scale_format='ue8m0_packed', but "
                                         "Experts does not take packed UE8M0"):
        pf.post_init_setup(Experts(False))
    pf.post_init_setup(Experts(True))
    moe_ep.vllm.PrepareAndFinalize(group).post_init_setup(Experts(False))  # f32: nothing asked
