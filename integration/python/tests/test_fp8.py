"""moe_ep's fp8 quantiser (moe_ep._fp8): the e4m3 encoders against the
oracle's encoder over many float32 values, quantize() against the
oracle's per-group quantisation, and against the library's own quantiser
(a 1-rank low-latency dispatch)."""
import numpy as np
import pytest
import torch

import oracle
from moe_ep import _fp8
from spawn import run_ranks

SEED = 1234
ENCODERS = ["bits", "native"]


def encoder(name):
    if name == "native" and _fp8.FP8_DTYPE is None:
        pytest.skip("this torch has no float8_e4m3fn (the integer encoder is used)")
    return _fp8.encode_bits if name == "bits" else _fp8.encode_native


def first_difference(what, values, got, want):
    """None when equal, else a sentence with the first bad index."""
    bad = np.nonzero(got != want)[0]
    if not len(bad):
        return None
    i = bad[0]
    where = "index %d" % i
    if values is not None:
        v = np.asarray(values, np.float32).reshape(-1)[i]
        where += " (input %r, bits 0x%08x)" % (float(v), int(v.view(np.uint32)))
    return "%s, seed %d: %d of %d differ; first at %s: got 0x%02x want 0x%02x" % (
        what, SEED, len(bad), got.size, where, got[i], want[i])


def edge_values():
    """Every e4m3 value, the midpoints between neighbours (ties) and the
    floats just either side of them, both signs; and +-0, f32 subnormals,
    the saturation region around 448, +-inf, NaN of both signs."""
    vals = oracle.e4m3_float(np.arange(0x7F, dtype=np.uint8)).astype(np.float64)
    mids = ((vals[:-1] + vals[1:]) / 2).astype(np.float32)
    near = np.concatenate([np.nextafter(mids, np.float32(0)), np.nextafter(mids, np.float32(1e9))])
    special = np.array([0.0, 1e-45, 2e-45, 1.1754942e-38, 1.17549435e-38, 2.0 ** -10,
                        3 * 2.0 ** -10, 2.0 ** -6, 447.99997, 448.0, 448.00003, 463.99997,
                        464.0, 464.00003, 479.99997, 480.0, 1e5, 3.4028235e38, np.inf],
                       np.float32)
    pos = np.concatenate([vals.astype(np.float32), mids, near, special])
    nans = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF], np.uint32).view(np.float32)
    return np.concatenate([pos, -pos, nans])


def random_values():
    """Random float32 bit patterns (every exponent, NaN and inf included)
    and random values in e4m3's range."""
    rng = np.random.default_rng(SEED)
    raw = rng.integers(0, 2 ** 32, size=1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)
    ranged = (rng.standard_normal(1 << 18) * np.exp2(rng.integers(-12, 10, 1 << 18))) \
        .astype(np.float32)
    return np.concatenate([raw, ranged])


@pytest.mark.parametrize("name", ENCODERS)
@pytest.mark.parametrize("values", ["edge", "random"])
def test_encoder_matches_oracle(name, values):
    enc = encoder(name)
    v = edge_values() if values == "edge" else random_values()
    got = enc(torch.from_numpy(v.copy())).view(torch.uint8).numpy()
    with np.errstate(all="ignore"):
        want = oracle.e4m3_bits(v)
    err = first_difference("%s encoder, %s values" % (name, values), v, got, want)
    assert err is None, err


def rows_with_edges(hidden):
    """bf16 rows: random groups over many binades (some under the 1e-4
    amax floor), a row with +-inf and NaN among finite values, an all-zero
    row and an all-NaN row."""
    rng = np.random.default_rng(SEED)
    f = rng.standard_normal((40, hidden)).astype(np.float32)
    f *= np.exp2(rng.integers(-30, 20, (40, hidden // 128, 1))).repeat(128, axis=2) \
        .reshape(40, hidden).astype(np.float32)
    b = oracle.bf16_bits(f)
    b[1, :4] = [0x7F80, 0xFF80, 0x7FC0, 0xFFC0]
    b[2] = 0
    b[3] = 0xFFC0
    return b


@pytest.mark.parametrize("scale_format", _fp8.SCALE_FORMATS)
def test_quantize_matches_oracle(scale_format):
    hidden = 640  # 5 groups: the packed scales' last word is partly padding
    rows = rows_with_edges(hidden)
    x = torch.from_numpy(rows.view(np.int16)).view(torch.bfloat16)
    q, s = _fp8.quantize(x, scale_format)
    pow2 = scale_format != "f32"
    want = [oracle.fp8_quantize(r, pow2) for r in rows]
    want_q = np.stack([a for a, _ in want])
    want_s = np.stack([oracle.ue8m0_pack(b) if scale_format == "ue8m0_packed" else b
                       for _, b in want])
    got_s = s.numpy()
    assert got_s.dtype == want_s.dtype and got_s.shape == want_s.shape, (got_s.dtype, got_s.shape)
    err = first_difference("quantize codes (%s)" % scale_format, None,
                           q.view(torch.uint8).numpy().reshape(-1), want_q.reshape(-1))
    assert err is None, err
    err = first_difference("quantize scales (%s)" % scale_format, None,
                           got_s.view(np.uint32).reshape(-1), want_s.view(np.uint32).reshape(-1))
    assert err is None, err


def test_quantize_matches_the_library():
    ok, report = run_ranks(1, "fp8_worker.py", ports=1)
    assert ok, report


def test_quantize_refuses_what_it_cannot_quantise():
    with pytest.raises(ValueError, match=r"a1 has shape \(2, 100\); .* multiple of 128"):
        _fp8.quantize(torch.zeros((2, 100), dtype=torch.bfloat16), name="a1")
    with pytest.raises(ValueError, match="x has dtype torch.int32"):
        _fp8.quantize(torch.zeros((2, 128), dtype=torch.int32))
    with pytest.raises(ValueError, match="scale_format='e8m0' must be one of"):
        _fp8.quantize(torch.zeros((2, 128)), "e8m0")


@pytest.mark.parametrize("rows", [1, 3, 4, 6, 8, 13])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_column_major_is_the_layout_deepgemm_reads(rows, dtype):
    """The receive scales' DeepEP view: shape [E, R*N, C], unit stride
    along R*N, a column stride of R*N rounded up to 16 bytes (what
    DeepGEMM's TMA loads require), and the values of the row-major
    scales, also when R*N is not a multiple of 4."""
    e, c = 3, 5
    g = torch.Generator().manual_seed(SEED + rows)
    src = torch.randint(-2**20, 2**20, (e, rows, c), generator=g).to(dtype)
    got = _fp8.column_major(src)
    padded = (rows + 3) // 4 * 4
    assert tuple(got.shape) == (e, rows, c)
    assert got.stride() == (c * padded, 1, padded), \
        "rows %d: stride %s, want %s" % (rows, got.stride(), (c * padded, 1, padded))
    bad = (got != src).nonzero()
    assert not len(bad), "seed %d rows %d: first bad index %s: got %s want %s" % (
        SEED + rows, rows, tuple(bad[0].tolist()), got[tuple(bad[0])].item(),
        src[tuple(bad[0])].item())
    assert _fp8.column_major(None) is None
