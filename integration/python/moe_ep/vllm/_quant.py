"""Which vLLM quant_configs the prepare/finalize honours: bf16 rows, or
fp8 e4m3 with one scale per 128 channels (vLLM's block_shape [*, 128]).
Low latency quantises in the library's dispatch (an fp8_e4m3 group); high
throughput quantises here, before the dispatch, as vLLM's DeepEP HT
prepare does, with the library's own rule (moe_ep._fp8)."""
from .. import _fp8
from .._torch import FP8_STORAGE


def check(entry, quant_config, defer_input_quant, low_latency, group_fp8, scale_format):
    """The scale format ("f32", "ue8m0", "ue8m0_packed") to quantise a1 to
    before a high-throughput dispatch, or None (rows go as given). Raises
    NotImplementedError naming the attribute the adapter cannot honour."""
    qd = getattr(quant_config, "quant_dtype", None) if quant_config is not None else None
    if qd is None or defer_input_quant:
        if low_latency and group_fp8:
            raise NotImplementedError(
                "%s: quant_config.quant_dtype=%r with defer_input_quant=%s asks for bf16 "
                "rows, but the group dispatches fp8_e4m3 (dispatch_dtype in its moe_ep "
                "config); use a bf16 group for experts that quantise themselves"
                % (entry, qd, defer_input_quant))
        return None
    # float8_e4m3fn; before torch 2.1 the package's fp8 storage, uint8.
    if qd != FP8_STORAGE:
        raise NotImplementedError("%s: quant_config.quant_dtype=%r: moe-ep dispatches bf16 "
                                  "or float8_e4m3fn with 128-channel group scales"
                                  % (entry, qd))
    if low_latency and not group_fp8:
        raise NotImplementedError("%s: quant_config.quant_dtype=float8_e4m3fn but the group "
                                  "dispatches bf16; configure dispatch_dtype: fp8_e4m3" % entry)
    if getattr(quant_config, "per_act_token_quant", False):
        raise NotImplementedError("%s: quant_config.per_act_token_quant=True: moe-ep's fp8 "
                                  "scales are one per 128-channel group" % entry)
    block = getattr(quant_config, "block_shape", None)
    if not block or int(block[-1]) != _fp8.GROUP:
        raise NotImplementedError("%s: quant_config.block_shape=%r: moe-ep's fp8 scales are "
                                  "one per 128-channel group (block_shape [*, 128])"
                                  % (entry, block))
    if getattr(quant_config, "a1_scale", None) is not None:
        raise NotImplementedError("%s: quant_config.a1_scale is set: moe-ep computes each "
                                  "128-channel group's scale from the rows (dynamic block "
                                  "quantisation) and takes no static activation scale" % entry)
    return None if low_latency else scale_format
