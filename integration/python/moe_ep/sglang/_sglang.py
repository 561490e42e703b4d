"""SGLang's own settings, read where SGLang is importable, so that the
dispatcher makes the choices SGLang's DeepEP dispatcher makes: its
DeepGEMM flags, and the dtype of the rows it dispatches."""
import types

from .._optional import optional_module

# SGLang moved deep_gemm_wrapper out of layers/quantization/ (the later
# location first; either is read).
DEEP_GEMM_MODULES = ("sglang.srt.layers.deep_gemm_wrapper",
                     "sglang.srt.layers.quantization.deep_gemm_wrapper")
MOE_UTILS = "sglang.srt.layers.moe.utils"
ENVIRON = "sglang.srt.environ"

# Dispatch dtypes SGLang may choose that moe-ep carries: bf16 rows, or fp8
# e4m3 rows with block scales. SGLang itself turns int8 into fp8 on GPUs.
CARRIED = {"bf16": "bf16", "fp8": "fp8", "int8": "fp8"}

# What SGLang can raise while it cannot answer yet (its server arguments
# or MoE flags not set up): the older rules then apply.
_NOT_READY = (AssertionError, AttributeError, LookupError, RuntimeError, TypeError, ValueError)


def deep_gemm():
    """SGLang's deep_gemm_wrapper module, or None."""
    for name in DEEP_GEMM_MODULES:
        mod = optional_module(name)
        if mod is not None:
            return mod
    return None


def deep_gemm_flag(name):
    """deep_gemm_wrapper's flag `name` (False where SGLang is absent)."""
    return bool(getattr(deep_gemm(), name, False))


def _cutlass_runner():
    """Whether SGLang's MoE runner backend is cutlass (False where SGLang
    cannot say: its server arguments are not set up yet)."""
    get = getattr(optional_module(MOE_UTILS), "get_moe_runner_backend", None)
    if get is None:
        return False
    try:
        backend = get()
    except _NOT_READY:
        return False
    is_cutlass = getattr(backend, "is_cutlass", None)
    return bool(is_cutlass()) if callable(is_cutlass) else False


def bf16_dispatch_forced():
    """SGLang's SGLANG_DEEPEP_BF16_DISPATCH, as its envs object reads it."""
    envs = getattr(optional_module(ENVIRON), "envs", None)
    flag = getattr(envs, "SGLANG_DEEPEP_BF16_DISPATCH", None)
    get = getattr(flag, "get", None)
    return bool(get()) if callable(get) else False


def sglang_present():
    """Whether any SGLang module the dispatcher reads is importable."""
    return deep_gemm() is not None or optional_module(MOE_UTILS) is not None or \
        optional_module(ENVIRON) is not None


def output_dtype(quant_config, low_latency):
    """The rows SGLang's DeepEP dispatcher sends, "bf16" or "fp8"; None
    where SGLang is not importable. Where SGLang has get_deepep_output_dtype
    (its --deepep-dispatcher-output-dtype, SGLANG_DEEPEP_BF16_DISPATCH, the
    quant method's dispatcher_output_dtype given to set_quant_config, then
    its MoE runner), that decides; older SGLang sends bf16 when
    SGLANG_DEEPEP_BF16_DISPATCH is set, or in normal mode with the cutlass
    runner, else fp8. A dtype moe-ep does not carry (nvfp4, mxfp4, ...)
    raises NotImplementedError naming it."""
    get = getattr(optional_module(MOE_UTILS), "get_deepep_output_dtype", None)
    if get is not None:
        try:
            choice = get(types.SimpleNamespace(quant_config=quant_config))
        except _NOT_READY:
            choice = None
        if choice is not None:
            value = str(getattr(choice, "value", choice)).lower()
            if value not in CARRIED:
                raise NotImplementedError(
                    "SGLang asks its DeepEP dispatcher for %s rows (get_deepep_output_dtype); "
                    "moe-ep dispatches bf16 or fp8 e4m3 rows with block scales" % value)
            return CARRIED[value]
    if not sglang_present():
        return None
    if bf16_dispatch_forced() or (not low_latency and _cutlass_runner()):
        return "bf16"
    return "fp8"
