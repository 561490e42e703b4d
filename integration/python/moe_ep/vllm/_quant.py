"""Which vLLM quant_configs the prepare/finalize honours, and where it
quantises, following vLLM's DeepEP prepares (deepep_ht_prepare_finalize,
deepep_ll_prepare_finalize): fp8 with one scale per 128 channels (block_shape
[*, 128], what DeepEP's kernels carry) is quantised in the dispatch (a low
latency group with dispatch_dtype fp8_e4m3) or before it (high throughput,
with the library's rule, moe_ep._fp8). Dynamic per-token fp8 in high
throughput is quantised before the dispatch too, with the rule it would
have after the receive (moe_ep.vllm._received): a row's scale is its own,
so the codes and scales are the same bits either way, and the rows cross
at one byte a channel with one f32 scale (a library of 0.5 or later, and
a hidden size that is a multiple of 128, as every fp8 row's).
Every other fp8 format (per tensor, dynamic or with a static a1_scale; per
token in low latency; groups of another width) is dispatched bf16 and
quantised after the receive. A static a1_scale stays after the receive:
under expert parallelism vLLM takes it as the largest input scale of the
rank's own experts, so ranks can hold different ones, and the receiving
rank's is the one its experts dequantise with."""
import collections

from .. import _fp8
from .._optional import optional_module
from .._torch import FP8_STORAGE

_DEEP_GEMM = "vllm.utils.deep_gemm"


def vllm_ht_scale_format(fallback):
    """The scales vLLM's DeepEP HT prepare quantises a1 with: its
    per_token_group_quant_fp8 rounds them to powers of two (f32, "ue8m0")
    where is_deep_gemm_e8m0_used() (DeepGEMM with E8M0 scales), else keeps
    them plain ("f32"). `fallback` where vLLM is not importable."""
    used = getattr(optional_module(_DEEP_GEMM), "is_deep_gemm_e8m0_used", None)
    if not callable(used):
        return fallback
    return "ue8m0" if used() else "f32"


class Plan(collections.namedtuple("Plan", "before after")):
    """before: the scale format ("f32", "ue8m0", "ue8m0_packed") to quantise
    a1 to before a high-throughput dispatch with the library's rule, or
    PER_TOKEN (quantised with `after`'s rule before the dispatch instead of
    after the receive), else None. after: an AfterReceive when the received
    rows are quantised (or, with PER_TOKEN, the rule), else None."""
    __slots__ = ()


PER_TOKEN = "per_token"


class AfterReceive(collections.namedtuple(
        "AfterReceive", "quant_dtype per_act_token_quant block_shape a1_scale")):
    """vLLM's moe_kernel_quantize_input arguments for the received rows:
    block_shape None (per tensor or, per_act_token_quant, per token) or
    [*, k] (one scale per k channels); a1_scale a static per-tensor scale
    (one element) or None (scales from the rows)."""
    __slots__ = ()

    @property
    def block_k(self):
        return None if self.block_shape is None else int(self.block_shape[-1])

    @property
    def dynamic_per_tensor(self):
        return self.block_shape is None and self.a1_scale is None and \
            not self.per_act_token_quant


ROWS_AS_GIVEN = Plan(None, None)


def plan(entry, quant_config, defer_input_quant, low_latency, group_fp8, scale_format, hidden,
         per_token_rows=True):
    """The Plan for a prepare of rows `hidden` wide. per_token_rows: the
    library carries fp8 rows with one scale per token (0.5 or later).
    Raises NotImplementedError naming the attribute the adapter cannot
    honour."""
    qd = getattr(quant_config, "quant_dtype", None) if quant_config is not None else None
    if qd is None or defer_input_quant:
        if low_latency and group_fp8:
            raise NotImplementedError(
                "%s: quant_config.quant_dtype=%r with defer_input_quant=%s asks for bf16 "
                "rows, but the group dispatches fp8_e4m3 (dispatch_dtype in its moe_ep "
                "config); use a bf16 group for experts that quantise themselves"
                % (entry, qd, defer_input_quant))
        return ROWS_AS_GIVEN
    # float8_e4m3fn; before torch 2.1 the package's fp8 storage, uint8.
    if qd != FP8_STORAGE:
        raise NotImplementedError(
            "%s: quant_config.quant_dtype=%r: moe-ep's vLLM adapter quantises to "
            "float8_e4m3fn only (int8 is not offered: vLLM's int8 activation quantisers round "
            "differently from kernel to kernel, so there is no one rule to follow)"
            % (entry, qd))
    per_token = bool(getattr(quant_config, "per_act_token_quant", False))
    block = getattr(quant_config, "block_shape", None)
    a1_scale = getattr(quant_config, "a1_scale", None)
    if block is not None:
        block = _block_shape(entry, block, hidden)
        if per_token:
            raise NotImplementedError(
                "%s: quant_config.per_act_token_quant=True with block_shape=%r: vLLM takes "
                "one or the other (per-token scales, or one per group of block_shape[1] "
                "channels)" % (entry, list(block)))
        if a1_scale is not None:
            raise NotImplementedError(
                "%s: quant_config.a1_scale is set with block_shape=%r: block quantisation "
                "computes each group's scale from the rows (vLLM's per_token_group_quant_fp8 "
                "takes no static activation scale)" % (entry, list(block)))
    elif a1_scale is not None and a1_scale.numel() != 1:
        raise NotImplementedError(
            "%s: quant_config.a1_scale has %d elements: a static activation scale is one "
            "per tensor here (per-token static scales belong to the sending rank's tokens, "
            "not to the rows a rank receives)" % (entry, a1_scale.numel()))
    if block is not None and int(block[-1]) == _fp8.GROUP:
        if low_latency and not group_fp8:
            raise NotImplementedError(
                "%s: quant_config.quant_dtype=float8_e4m3fn with block_shape=%r is quantised "
                "in the dispatch, but the group dispatches bf16; configure dispatch_dtype: "
                "fp8_e4m3" % (entry, list(block)))
        return Plan(None if low_latency else scale_format, None)
    if low_latency and group_fp8:
        raise NotImplementedError(
            "%s: quant_config %s is quantised after the receive from bf16 rows, but the group "
            "dispatches fp8_e4m3 with 128-channel scales (dispatch_dtype in its moe_ep "
            "config); use a bf16 group" % (entry, _describe(per_token, block, a1_scale)))
    after = AfterReceive(qd, per_token, block, a1_scale)
    # fp8 rows need a hidden size of whole 128-channel groups (the library's
    # rule for every fp8 format); others cross bf16, as on an older library.
    if not low_latency and per_token_rows and per_token and block is None and \
            a1_scale is None and hidden % _fp8.GROUP == 0:
        return Plan(PER_TOKEN, after)
    return Plan(None, after)


def _block_shape(entry, given, hidden):
    """given as a list of two ints, the second dividing hidden."""
    try:
        block = [int(b) for b in given]
    except (TypeError, ValueError):
        block = []
    if len(block) != 2 or block[1] <= 0 or hidden % block[1]:
        raise NotImplementedError(
            "%s: quant_config.block_shape=%r with hidden %d: block quantisation takes [n, k] "
            "with k dividing the hidden size" % (entry, given, hidden))
    return block


def _describe(per_token, block, a1_scale):
    if block is not None:
        return "block_shape=%r" % (list(block),)
    if a1_scale is not None:
        return "a1_scale (static, per tensor)"
    return "per_act_token_quant=True" if per_token else "per tensor (no block_shape)"
