"""fp8 worker (1 rank): the library's quantiser and moe_ep's Python one
(moe_ep._fp8, what the vLLM adapter uses before an HT dispatch), each
against the tests' oracle (oracle.fp8_quantize): rows with ties,
subnormals, +-0, values that saturate, +-inf, NaN of either sign (a
signalling one too), groups under the amax floor and groups of NaN alone
go through a low-latency dispatch with each per-call fp8 format (the
library quantises) and through quantize(); both codes and scales must
equal the oracle's bit for bit."""
import numpy as np
import torch

import common
import moe_ep
import oracle
from common import bf16_tensor, bits, same
from moe_ep import _fp8

HIDDEN = 640  # five 128-channel groups: the packed scales end in a padded word
SEED = 7
FORMATS = (("f32", "fp8"), ("ue8m0", "fp8_ue8m0"), ("ue8m0_packed", "fp8_ue8m0_packed"))


def expected(rows, scale_format):
    """The oracle's (codes [T, H] uint8, scales) of bf16 rows: f32 scales
    [T, H/128], powers of two for the UE8M0 formats, packed four exponents
    to an int32 [T, ceil(H/512)] for ue8m0_packed."""
    pow2 = scale_format != "f32"
    q = [oracle.fp8_quantize(r, pow2) for r in rows]
    scales = [oracle.ue8m0_pack(s) if scale_format == "ue8m0_packed" else s for _, s in q]
    return np.stack([c for c, _ in q]), np.stack(scales)


def special_rows():
    """bf16 bit patterns [rows, HIDDEN]: the edge cases first, then random
    rows whose groups span many binades (some under the 1e-4 floor)."""
    f = oracle.bf16_bits
    r0 = np.zeros(HIDDEN, np.uint16)
    # group 0: amax 448 gives scale 1, so these values reach the encoder
    # unscaled: e4m3 ties (1.0625, 1.1875, 2^-10, 3 * 2^-10), exact
    # subnormals, -0.
    g0 = np.array([448.0, 1.0625, -1.0625, 1.1875, 2.0 ** -10, 3 * 2.0 ** -10, -(2.0 ** -10),
                   2.0 ** -7, 5 * 2.0 ** -11, 0.0, 240.0, 232.0, 0.0078125, -0.013671875],
                  np.float32)
    r0[:len(g0)] = f(g0)
    r0[9] = 0x8000  # -0
    # group 1: +-inf and NaN of both signs next to finite values
    r0[128:132] = [0x7F80, 0xFF80, 0x7FC0, 0xFFC0]
    r0[132:135] = f(np.array([3.5, -7.25, 1e-3], np.float32))
    r0[135] = 0x7F81  # a signalling NaN
    # groups 2 and 4 stay all zero (the floor's scale); group 3 is all NaN
    r0[384:512] = 0xFFC0
    rng = np.random.default_rng(SEED)
    rand = rng.standard_normal((15, HIDDEN)).astype(np.float32)
    mag = np.float32(10.0) ** rng.integers(-7, 5, size=(15, HIDDEN // 128, 1)).astype(np.float32)
    rand = (rand.reshape(15, -1, 128) * mag).reshape(15, HIDDEN)
    return np.concatenate([r0[None], f(rand)])


def main():
    rows = special_rows()
    t = len(rows)
    x = bf16_tensor(rows)
    idx = torch.zeros((t, 1), dtype=torch.int64)  # every token to expert 0, token order
    with moe_ep.Group(common.config(0, num_experts=2, hidden=HIDDEN, top_k=1,
                                    max_tokens_per_rank=t)) as g:
        for scale_format, fmt in FORMATS:
            want_q, want_s = expected(rows, scale_format)
            h = g.prepare(idx)
            res = g.dispatch(h, x, format=fmt)
            same("library codes (%s)" % fmt, SEED, bits(res.recv_x[0, :t]), want_q)
            same("library scales (%s)" % fmt, SEED, bits(res.recv_scales[0, :t]), want_s)
            h.free()
            q, s = _fp8.quantize(x, scale_format)
            same("quantize() codes (%s)" % scale_format, SEED, bits(q), want_q)
            same("quantize() scales (%s)" % scale_format, SEED, bits(s), want_s)
    common.finish()


if __name__ == "__main__":
    main()
