"""The vLLM adapter's quantisation rules in one process: the torch copy of
vLLM's fp8 activation quantisers (moe_ep.vllm._act_quant) bit-exact
against the tests' numpy reference (workers/vllm_quant_expected.py) on
random rows, edge rows (zero, tiny, huge, +-inf, NaN) and rows built so
that x * (1 / scale) and x / scale round to different e4m3 codes (the
kernels differ there); which quant_config goes where (_quant.plan); and
the hand-over to vLLM's moe_kernel_quantize_input (_received), with a
stand-in for vLLM."""
import os
import sys

import numpy as np
import pytest
import torch

import oracle
from moe_ep import FP8_STORAGE
from moe_ep.vllm import _act_quant, _quant, _received

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers"))
import vllm_quant_expected as expected  # noqa: E402
from vllm_quant_expected import Config  # noqa: E402

SEED = 4321
HIDDEN = 256
STATIC = np.float32(0.0123)


def e4m3_ties():
    """The midpoints between neighbouring positive e4m3 values below 448."""
    v = np.unique(oracle.e4m3_float(np.arange(0x7F, dtype=np.uint8)))
    v = v[np.isfinite(v)]
    return ((v[:-1].astype(np.float64) + v[1:]) / 2).astype(np.float32)


def sensitive(scale):
    """float32 x near scale * tie whose codes differ between x / scale and
    x * (1 / scale); scale is float32."""
    ties = e4m3_ties()
    near = [np.float32(t * np.float64(scale)) for t in ties]
    cand = np.array([np.nextafter(n, np.float32(np.inf) if d > 0 else np.float32(0))
                     for n in near for d in (1, -1)] + near, np.float32)
    cand = np.concatenate([cand, -cand])
    with np.errstate(all="ignore"):
        by_div = oracle.e4m3_bits(np.clip(cand / scale, -448, 448).astype(np.float32))
        by_mul = oracle.e4m3_bits(np.clip(cand * (np.float32(1) / scale), -448, 448)
                                  .astype(np.float32))
    return cand[by_div != by_mul]


def rows_of_groups(amax, values, width):
    """[N, HIDDEN] float32 made of groups of `width` values: each group
    starts with amax (fixing its scale), then takes values in turn; zeros
    fill the rest."""
    per_group = width - 1
    groups = max(1, -(-len(values) // per_group))
    groups += -groups % (HIDDEN // width)
    out = np.zeros((groups, width), np.float32)
    out[:, 0] = amax
    tail = out[:, 1:].reshape(-1)
    tail[:len(values)] = values
    out[:, 1:] = tail.reshape(groups, per_group)
    return out.reshape(-1, HIDDEN)


def random_rows():
    rng = np.random.default_rng(SEED)
    return (rng.standard_normal((40, HIDDEN)) * 3).astype(np.float32)


def random_and_edge_rows():
    rows = random_rows()
    rows[0] = 0
    rows[1] *= np.float32(2.0 ** -30)
    rows[2, 5], rows[3, 7], rows[4, 9] = np.nan, np.inf, -np.inf
    rows[5, :128] = 0  # one group of zeros, one of values
    rows[6] *= np.float32(1e30)
    return rows


def compare(what, got, want):
    got = got.contiguous().view(torch.uint8).numpy() if got.dtype == FP8_STORAGE and \
        got.element_size() == 1 else got.numpy()
    want = np.asarray(want)
    assert got.shape == want.shape, "%s: shape %s, want %s" % (what, got.shape, want.shape)
    g, w = got.reshape(-1).view(np.uint8 if got.itemsize == 1 else np.uint32), \
        want.reshape(-1).view(np.uint8 if want.itemsize == 1 else np.uint32)
    bad = np.nonzero(g != w)[0]
    assert not len(bad), "%s, seed %d: %d of %d differ; first at %d: got 0x%x want 0x%x" % (
        what, SEED, len(bad), g.size, bad[0], g[bad[0]], w[bad[0]])


def quantized(rows, cfg):
    scale = None if cfg.a1_scale is None else cfg.a1_scale
    return _act_quant.quantize(torch.from_numpy(rows), scale, cfg.per_act_token_quant,
                               cfg.block_shape)


@pytest.mark.parametrize("cfg", [
    Config(FP8_STORAGE, name="per tensor dynamic"),
    Config(FP8_STORAGE, a1_scale=torch.tensor([STATIC]), name="per tensor static"),
    Config(FP8_STORAGE, per_act_token_quant=True, name="per token"),
    Config(FP8_STORAGE, block_shape=[128, 32], name="block 32"),
    Config(FP8_STORAGE, block_shape=[128, 64], name="block 64"),
    Config(FP8_STORAGE, block_shape=[128, 128], name="block 128"),
], ids=repr)
@pytest.mark.parametrize("make_rows", [random_rows, random_and_edge_rows],
                         ids=["random", "with edge rows"])
def test_act_quant_matches_reference(cfg, make_rows):
    rows = make_rows()
    codes, scales = quantized(rows, cfg)
    want_codes, want_scales = expected.quantize(rows, cfg)
    compare("%r codes" % cfg, codes, want_codes)
    compare("%r scales" % cfg, scales, want_scales)


def test_inverted_scale_for_per_tensor():
    """Static and dynamic per-tensor scales multiply by 1 / scale."""
    xs = sensitive(STATIC)
    assert len(xs) > 10, "no rows where division and inverted scale differ"
    rows = rows_of_groups(0, xs, HIDDEN)
    cfg = Config(FP8_STORAGE, a1_scale=torch.tensor([STATIC]))
    compare("static codes", quantized(rows, cfg)[0], expected.quantize(rows, cfg)[0])
    amax = np.float32(1.7)  # dynamic scale 1.7 / 448, whose inverse is inexact
    scale = np.float32(amax / np.float32(448))
    xs = sensitive(scale)
    assert len(xs) > 10, "no rows where division and inverted scale differ"
    rows = rows_of_groups(amax, xs, HIDDEN)
    cfg = Config(FP8_STORAGE)
    compare("dynamic codes", quantized(rows, cfg)[0], expected.quantize(rows, cfg)[0])


@pytest.mark.parametrize("block", [None, [128, 64]], ids=["per token", "block 64"])
def test_division_for_per_token_and_groups(block):
    amax = np.float32(1.7)
    scale = np.float32(amax / np.float32(448))
    xs = sensitive(scale)
    assert len(xs) > 10, "no rows where division and inverted scale differ"
    rows = rows_of_groups(amax, xs, HIDDEN if block is None else block[1])
    cfg = Config(FP8_STORAGE, block_shape=block, per_act_token_quant=block is None)
    codes, scales = quantized(rows, cfg)
    want_codes, want_scales = expected.quantize(rows, cfg)
    compare("codes", codes, want_codes)
    compare("scales", scales, want_scales)


# ---- where each quant_config is quantised ----------------------------------------

def plan(cfg, low_latency=False, group_fp8=False, defer=False):
    return _quant.plan("prepare", cfg, defer, low_latency, group_fp8, "f32", HIDDEN)


def test_plan():
    block128 = Config(FP8_STORAGE, block_shape=[128, 128])
    assert plan(None) == (None, None)
    assert plan(block128, defer=True) == (None, None)
    assert plan(block128) == ("f32", None)  # HT: before the dispatch
    assert plan(block128, low_latency=True, group_fp8=True) == (None, None)  # in the dispatch
    for cfg in (Config(FP8_STORAGE), Config(FP8_STORAGE, per_act_token_quant=True),
                Config(FP8_STORAGE, a1_scale=torch.ones(1)),
                Config(FP8_STORAGE, block_shape=[128, 64])):
        for ll in (False, True):
            p = plan(cfg, low_latency=ll)
            # HT's dynamic per-token rows are quantised before the dispatch,
            # with the rule they would get after the receive.
            before = _quant.PER_TOKEN if cfg.per_act_token_quant and not ll else None
            assert p.before == before and p.after is not None, (cfg, ll, p)
            assert p.after.dynamic_per_tensor == (cfg.block_shape is None and
                                                  cfg.a1_scale is None and
                                                  not cfg.per_act_token_quant)
    # fp8 rows need whole 128-channel groups: at hidden 2880 per-token rows
    # cross bf16 and are quantised after the receive.
    per_token = Config(FP8_STORAGE, per_act_token_quant=True)
    p = _quant.plan("prepare", per_token, False, False, False, "f32", 2880)
    assert p.before is None and p.after is not None and p.after.per_act_token_quant, p
    # A library older than 0.5 carries no per-token scales: bf16 rows too.
    p = _quant.plan("prepare", per_token, False, False, False, "f32", HIDDEN,
                    per_token_rows=False)
    assert p.before is None and p.after is not None and p.after.per_act_token_quant, p


def test_ht_rows_follow_the_plan():
    """What a receive hands vLLM under each plan: rows sent quantised as
    received (an empty per-token receive as empty bf16, no scale, as the
    after-receive rule hands out an empty receive); bf16 rows quantised
    after the receive where the plan says so."""
    per_token = plan(Config(FP8_STORAGE, per_act_token_quant=True))
    codes = torch.arange(3 * HIDDEN, dtype=torch.int32).remainder(120).to(torch.uint8) \
        .view(FP8_STORAGE).reshape(3, HIDDEN)
    scales = torch.tensor([[0.5], [2.0], [1.0]])
    got = _received.ht_rows(codes, scales, per_token)
    assert got[0] is codes and got[1] is scales
    empty = _received.ht_rows(codes[:0], scales[:0], per_token)
    assert empty[0].dtype == torch.bfloat16 and tuple(empty[0].shape) == (0, HIDDEN)
    assert empty[1] is None
    block = plan(Config(FP8_STORAGE, block_shape=[128, 128]))
    got = _received.ht_rows(codes, scales, block)
    assert got[0] is codes and got[1] is scales
    rows = torch.linspace(-3, 3, 2 * HIDDEN).reshape(2, HIDDEN).to(torch.bfloat16)
    per_tensor = plan(Config(FP8_STORAGE))
    want = _received.standard(rows, per_tensor.after)
    got = _received.ht_rows(rows, None, per_tensor)
    assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8))
    assert torch.equal(got[1], want[1])
    got = _received.ht_rows(rows, None, plan(None))
    assert got[0] is rows and got[1] is None


@pytest.mark.parametrize("cfg, kw, fragment", [
    (Config(torch.int8), {}, "quant_dtype=torch.int8"),
    (Config(FP8_STORAGE, block_shape=[128, 128], per_act_token_quant=True), {},
     "per_act_token_quant=True with block_shape=[128, 128]"),
    (Config(FP8_STORAGE, block_shape=[128, 128], a1_scale=torch.ones(1)), {}, "a1_scale is set"),
    (Config(FP8_STORAGE, a1_scale=torch.ones(3)), {}, "a1_scale has 3 elements"),
    (Config(FP8_STORAGE, block_shape=[128, 0]), {}, "block_shape=[128, 0]"),
    (Config(FP8_STORAGE, block_shape=["a", 64]), {}, "block_shape=['a', 64]"),
    (Config(FP8_STORAGE, block_shape=[128, 128]), {"low_latency": True},
     "configure dispatch_dtype: fp8_e4m3"),
    (Config(FP8_STORAGE), {"low_latency": True, "group_fp8": True}, "use a bf16 group"),
    (None, {"low_latency": True, "group_fp8": True}, "use a bf16 group for experts"),
], ids=str)
def test_plan_refusals(cfg, kw, fragment):
    with pytest.raises(NotImplementedError) as e:
        plan(cfg, **kw)
    assert fragment in str(e.value)


# ---- handing the rows to vLLM's quantiser -----------------------------------------

class StandIn:
    """Records moe_kernel_quantize_input's arguments and answers with the
    package's own quantisation."""

    def __init__(self):
        self.calls = []

    def __call__(self, a, a_scale, quant_dtype, per_act_token_quant, block_shape):
        self.calls.append((tuple(a.shape), a_scale, quant_dtype, per_act_token_quant,
                           block_shape))
        return _act_quant.quantize(a, a_scale, per_act_token_quant, block_shape)


def after(cfg):
    return _quant.plan("prepare", cfg, False, False, False, "f32", HIDDEN).after


def test_vllm_quantiser_only_for_cuda_rows():
    assert _received._vllm_quantiser(torch.device("cpu")) is None


def test_batched_hands_vllm_one_matrix(monkeypatch):
    stand_in = StandIn()
    monkeypatch.setattr(_received, "_vllm_quantiser", lambda device: stand_in)
    rng = np.random.default_rng(SEED)
    e, slots = 3, 8
    recv = torch.from_numpy(rng.standard_normal((e, slots, HIDDEN)).astype(np.float32)) \
        .to(torch.bfloat16)
    count = torch.tensor([2, 0, 5], dtype=torch.int32)
    recv[0, 2:] = 1e4  # stale slots must not set a dynamic per-tensor scale
    for cfg, scale_shape in ((Config(FP8_STORAGE, per_act_token_quant=True), (e, slots, 1)),
                             (Config(FP8_STORAGE, block_shape=[128, 64]), (e, slots, 4)),
                             (Config(FP8_STORAGE), (e, 1, 1))):
        stand_in.calls.clear()
        codes, scales = _received.batched(recv, count, after(cfg))
        (shape, a_scale, qd, per_token, block), = stand_in.calls
        assert shape == (e * slots, HIDDEN) and qd == FP8_STORAGE
        assert (per_token, block) == (cfg.per_act_token_quant, cfg.block_shape)
        assert tuple(codes.shape) == (e, slots, HIDDEN) and tuple(scales.shape) == scale_shape
        if cfg.block_shape is None and not cfg.per_act_token_quant:
            valid = np.concatenate([recv[0, :2].float().numpy(), recv[2, :5].float().numpy()])
            compare("per-tensor scale over received slots", a_scale,
                    expected.per_tensor_scale(valid))
            assert bool((scales == a_scale.reshape(1)).all())
        else:
            assert a_scale is None


def test_standard_hands_vllm_the_receive(monkeypatch):
    stand_in = StandIn()
    monkeypatch.setattr(_received, "_vllm_quantiser", lambda device: stand_in)
    rows = torch.from_numpy(random_and_edge_rows()[7:]).to(torch.bfloat16)
    static = torch.tensor([STATIC])
    codes, scales = _received.standard(rows, after(Config(FP8_STORAGE, a1_scale=static)))
    assert stand_in.calls[-1][1] is static and scales is static
    codes, scales = _received.standard(rows[:0], after(Config(FP8_STORAGE)))
    assert scales is None and codes.dtype == torch.bfloat16 and len(stand_in.calls) == 1
