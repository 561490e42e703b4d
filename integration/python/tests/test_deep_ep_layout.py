"""The DeepEP Buffer's torch layout (moe_ep.deep_ep._normal._torch_layout),
which get_dispatch_layout returns before a normal-mode group exists (the
first dispatch makes it, from x's hidden), against the oracle: the counts
per rank and per expert and the token-in-rank mask, with -1 slots, ids past
the experts, repeated experts and tokens with no expert at all."""
import numpy as np
import pytest
import torch

import oracle
from moe_ep.deep_ep._normal import _torch_layout


@pytest.mark.parametrize("seed,tokens,top_k,experts,world", [
    (1, 64, 8, 256, 2), (2, 33, 4, 64, 4), (3, 1, 1, 8, 8), (4, 0, 2, 16, 2),
    (5, 200, 6, 96, 3), (6, 17, 8, 8, 1)])
def test_torch_layout_matches_the_oracle(seed, tokens, top_k, experts, world):
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(-1, experts + 3, (tokens, top_k), generator=gen)  # -1 and past the end
    if tokens > 2:
        idx[1] = -1  # a token with no expert
        idx[2, :] = idx[2, 0].clamp(min=0)  # one expert repeated
    for dtype in (torch.int64, torch.int32):
        got = _torch_layout(idx.to(dtype), experts, world)
        want = oracle.dispatch_layout(idx.numpy(), experts, world)
        for name, g, w in zip(("num_tokens_per_rank", "num_tokens_per_expert",
                               "is_token_in_rank"), got, want):
            g = g.numpy()
            assert g.dtype == w.dtype and g.shape == w.shape, \
                "rank 0 seed %d %s %s: dtype/shape %s %s, want %s %s" % (
                    seed, dtype, name, g.dtype, g.shape, w.dtype, w.shape)
            bad = np.flatnonzero(g.reshape(-1) != w.reshape(-1))
            assert bad.size == 0, "rank 0 seed %d %s %s: first bad index %d: want %s, got %s" % (
                seed, dtype, name, bad[0], w.reshape(-1)[bad[0]], g.reshape(-1)[bad[0]])
