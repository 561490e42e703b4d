"""Quantising the rows a prepare received, for the quant_configs dispatched
bf16 (moe_ep.vllm._quant.AfterReceive), as vLLM's DeepEP prepares do after
their receive: with vLLM's moe_kernel_quantize_input where vLLM is
importable and the rows are on a CUDA device (its kernels are CUDA
kernels), else with the package's torch copy of its rule (_act_quant).
vLLM is imported on first use only."""
import torch

from .._optional import optional_module
from .._torch import FP8_STORAGE
from . import _act_quant
from ._quant import PER_TOKEN

_VLLM_MOE_UTILS = "vllm.model_executor.layers.fused_moe.utils"
_vllm = []  # [moe_kernel_quantize_input or None], looked up once


def _vllm_quantiser(device):
    """vLLM's moe_kernel_quantize_input for rows on `device`, or None."""
    if device.type != "cuda":
        return None
    if not _vllm:
        mod = optional_module(_VLLM_MOE_UTILS)
        _vllm.append(getattr(mod, "moe_kernel_quantize_input", None) if mod is not None else None)
    return _vllm[0]


def _quantize(rows, scale, after):
    """(codes, scales) of rows [N, H]; scale: the static or already
    computed per-tensor scale, or None."""
    fn = _vllm_quantiser(rows.device)
    if fn is None:
        return _act_quant.quantize(rows, scale, after.per_act_token_quant, after.block_shape)
    return fn(rows, scale, after.quant_dtype, after.per_act_token_quant, after.block_shape)


def standard(recv_x, after):
    """High throughput: recv_x [N_recv, H] -> (a1q, a1q_scale), scales
    [N, H/k] (block), [N, 1] (per token) or one element (per tensor: the
    static a1_scale as given, or the dynamic scale over the received rows,
    [1]). An empty receive stays as it is with no scale, as in vLLM's
    DeepEP HT prepare (there is nothing to take a scale from)."""
    if recv_x.shape[0] == 0:
        return recv_x, None
    scale = _act_quant.per_tensor_scale(recv_x) if after.dynamic_per_tensor else after.a1_scale
    return _quantize(recv_x, scale, after)


def before_dispatch(a1, after):
    """Dynamic per-token fp8 quantised before a high-throughput dispatch:
    (codes [T, H], scales [T, 1] float32), each row's scale its own, so the
    rows arrive as standard() would make them from the received bf16 rows
    (the quantiser is the same, and it reads nothing beyond the row)."""
    if a1.shape[0] == 0:
        return (torch.empty(tuple(a1.shape), dtype=FP8_STORAGE, device=a1.device),
                torch.empty((0, 1), dtype=torch.float32, device=a1.device))
    codes, scales = _quantize(a1, None, after)
    return codes, scales.reshape(-1, 1).to(torch.float32).contiguous()


def ht_rows(recv_x, recv_scales, plan):
    """High throughput: the (a1q, a1q_scale) vLLM's experts get from a
    receive made under `plan` (moe_ep.vllm._quant.Plan). Rows sent
    quantised (plan.before: a block format, or PER_TOKEN) are handed out
    as received, except that an empty PER_TOKEN receive is empty bf16 rows
    with no scale, as standard() would hand out the same receive; rows sent
    bf16 are quantised by standard() where plan.after asks."""
    if plan.before == PER_TOKEN:
        if recv_x.shape[0] == 0:
            return recv_x.new_empty(tuple(recv_x.shape), dtype=torch.bfloat16), None
        return recv_x, recv_scales
    if plan.after is not None:
        return standard(recv_x, plan.after)
    return recv_x, recv_scales


def batched(recv_x, recv_count, after):
    """Low latency: recv_x [E_local, R*N, H] -> (a1q [E_local, R*N, H],
    a1q_scale) quantised as one [E_local*R*N, H] matrix, as vLLM's DeepEP LL
    prepare does; scales in vLLM's batched shapes (its
    normalize_batched_scales_shape): [E_local, R*N, H/k], [E_local, R*N, 1],
    or a per-tensor scale repeated to [E_local, 1, 1]. Slots past an
    expert's recv_count hold stale rows: they get codes nobody reads, and a
    dynamic per-tensor scale is taken over the received slots only (vLLM
    takes it over the whole buffer, where stale rows could set it)."""
    e, slots, h = recv_x.shape
    rows = recv_x.reshape(e * slots, h)
    scale = after.a1_scale
    if after.dynamic_per_tensor:
        received = torch.arange(slots, device=recv_count.device)[None, :] < \
            recv_count.to(torch.int64)[:, None]
        scale = _act_quant.per_tensor_scale(rows, received.reshape(-1).to(rows.device))
    codes, scales = _quantize(rows, scale, after)
    codes = codes.reshape(e, slots, h)
    if scales.numel() == 1:
        return codes, scales.reshape(1).repeat_interleave(e, dim=0).reshape(e, 1, 1)
    return codes, scales.reshape(e, slots, scales.shape[-1])
