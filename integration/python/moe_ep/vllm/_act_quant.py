"""vLLM's fp8 e4m3 activation quantisers in torch, for hosts without vLLM
(moe_ep.vllm._received uses vLLM's own where vLLM and CUDA are there). The
arithmetic is that of vLLM's CUDA kernels (csrc/quantization/w8a8/fp8:
common.cu, common.cuh, per_token_group_quant.cu), in float32:

- per tensor, dynamic (dynamic_scaled_fp8_quant): scale = max|x| / 448, no
  floor; static (static_scaled_fp8_quant): the given scale. Both multiply
  by the inverted scale: q = e4m3(clamp(x * (1 / scale))).
- per token (dynamic_per_token_scaled_fp8_quant): scale = max(max|x_row| /
  448, 1 / (448 * 512)); q = e4m3(clamp(x / scale)) (a division, "to
  match FBGemm").
- per group of k channels (per_token_group_quant_fp8, what
  moe_kernel_quantize_input calls for a block_shape): scale = max(max|x_g|,
  1e-10) / 448; q = e4m3(clamp(x / scale)). Scales stay float32 (vLLM
  rounds them to powers of two only for DeepGEMM's UE8M0, which needs
  vLLM).

max|x| skips NaN (the kernels' fmaxf does). clamp is to +-448 with the
kernels' fminf / fmaxf order, which decides where a NaN goes: the per
tensor and per token kernels take fmax(-448, fmin(v, 448)), so NaN -> +448;
the group kernel fmin(fmax(v, -448), 448), so NaN -> -448. e4m3 rounds to
nearest even (moe_ep._fp8.encode). Codes come in the package's fp8 storage
(float8_e4m3fn, uint8 before torch 2.1)."""
import torch

from .. import _fp8

FP8_MAX = 448.0
MIN_TOKEN_SCALE_DIVISOR = 448.0 * 512.0  # exact in float32
GROUP_EPS = 1e-10

_constants = {}  # (name, device) -> [1] float32


def _constant(name, value, device):
    """A [1] float32 tensor on device: tensor operands keep CUDA torch from
    turning a division by a host scalar into a multiplication by its
    reciprocal, which is not the kernels' IEEE division."""
    key = (name, device)
    t = _constants.get(key)
    if t is None:
        t = _constants[key] = torch.full((1,), value, dtype=torch.float32, device=device)
    return t


def _abs_skipping_nan(x):
    a = x.abs()
    return a.masked_fill(torch.isnan(a), 0.0)


def _saturate(v, nan_to):
    return v.clamp(-FP8_MAX, FP8_MAX).masked_fill(torch.isnan(v), nan_to)


def per_tensor_scale(rows, valid=None):
    """[1] float32: max|x| / 448 over rows [N, H] (N > 0), over the rows
    where `valid` [N] is True when it is given."""
    a = _abs_skipping_nan(rows.float())
    if valid is not None:
        a = a.masked_fill(~valid.reshape(-1, 1), 0.0)
    return a.amax().reshape(1) / _constant("fp8_max", FP8_MAX, rows.device)


def per_tensor(rows, scale):
    """codes [N, H] of rows quantised with one scale (a one-element tensor)."""
    x = rows.float()
    one = _constant("one", 1.0, x.device)
    inverted = one / scale.to(device=x.device, dtype=torch.float32).reshape(1)
    return _fp8.encode(_saturate(x * inverted, FP8_MAX))


def per_token(rows):
    """(codes [N, H], scales [N, 1] float32), one scale per row."""
    x = rows.float()
    dev = x.device
    amax = _abs_skipping_nan(x).amax(dim=1, keepdim=True)
    floor = _constant("one", 1.0, dev) / _constant("token_floor", MIN_TOKEN_SCALE_DIVISOR, dev)
    scale = torch.maximum(amax / _constant("fp8_max", FP8_MAX, dev), floor)
    return _fp8.encode(_saturate(x / scale, FP8_MAX)), scale


def per_group(rows, k):
    """(codes [N, H], scales [N, H/k] float32), one scale per k channels."""
    n, h = rows.shape
    x = rows.float().reshape(n, h // k, k)
    dev = x.device
    amax = torch.maximum(_abs_skipping_nan(x).amax(dim=2), _constant("eps", GROUP_EPS, dev))
    scale = amax / _constant("fp8_max", FP8_MAX, dev)
    codes = _fp8.encode(_saturate(x / scale[:, :, None], -FP8_MAX))
    return codes.reshape(n, h), scale


def quantize(rows, a1_scale, per_act_token_quant, block_shape):
    """vLLM's moe_kernel_quantize_input for float8_e4m3fn, rows [N, H]:
    (codes, scales) with scales [N, H/k] (block_shape [*, k]), [N, 1]
    (per token, dynamic) or the static a1_scale / a [1] dynamic scale."""
    if block_shape is not None:
        return per_group(rows, int(block_shape[-1]))
    if a1_scale is None and per_act_token_quant:
        return per_token(rows)
    scale = per_tensor_scale(rows) if a1_scale is None else a1_scale
    return per_tensor(rows, scale), scale
