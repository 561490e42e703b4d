"""The normal-mode options SGLang's own DeepEP dispatcher uses, read from
SGLang where it is importable: the dispatcher's defaults follow them, so
it is a drop-in for SGLang's _DeepEPDispatcherImplNormal.

SGLang's normal dispatch_a quantises bf16 rows per 128-channel group
before the dispatch when its JIT DeepGEMM is on (ENABLE_JIT_DEEPGEMM),
the MoE runner is not cutlass and SGLANG_DEEPEP_BF16_DISPATCH is not set;
the scales are packed UE8M0 when DEEPGEMM_SCALE_UE8M0, else float32. Its
dispatch asks for expert_alignment 128 with JIT DeepGEMM, else 1."""
from .._optional import optional_module

FROM_SGLANG = "sglang"  # normal_fp8's default: as SGLang's dispatcher does

_DEEP_GEMM = "sglang.srt.layers.quantization.deep_gemm_wrapper"
_MOE_UTILS = "sglang.srt.layers.moe.utils"
_ENVIRON = "sglang.srt.environ"


def _cutlass_runner():
    """Whether SGLang's MoE runner backend is cutlass (False where SGLang
    cannot say: its server arguments are not set up yet)."""
    get = getattr(optional_module(_MOE_UTILS), "get_moe_runner_backend", None)
    if get is None:
        return False
    try:
        backend = get()
    except (AssertionError, AttributeError, RuntimeError, TypeError, ValueError):
        return False
    is_cutlass = getattr(backend, "is_cutlass", None)
    return bool(is_cutlass()) if callable(is_cutlass) else False


def _bf16_dispatch_forced():
    """SGLang's SGLANG_DEEPEP_BF16_DISPATCH, as its envs object reads it."""
    envs = getattr(optional_module(_ENVIRON), "envs", None)
    flag = getattr(envs, "SGLANG_DEEPEP_BF16_DISPATCH", None)
    get = getattr(flag, "get", None)
    return bool(get()) if callable(get) else False


def sglang_normal_options():
    """(normal_fp8, expert_alignment) as SGLang's normal dispatcher would
    use them: (None, 1) (rows as given, no alignment) where SGLang is not
    importable or runs without JIT DeepGEMM."""
    dg = optional_module(_DEEP_GEMM)
    if dg is None or not bool(getattr(dg, "ENABLE_JIT_DEEPGEMM", False)):
        return None, 1
    fp8 = "ue8m0_packed" if bool(getattr(dg, "DEEPGEMM_SCALE_UE8M0", False)) else "f32"
    if _cutlass_runner() or _bf16_dispatch_forced():
        fp8 = None
    return fp8, 128


def resolve(normal_fp8, expert_alignment):
    """The dispatcher's normal_fp8 and expert_alignment: each one not given
    (FROM_SGLANG, None) as SGLang's dispatcher uses it."""
    fp8, align = sglang_normal_options()
    return (fp8 if normal_fp8 == FROM_SGLANG else normal_fp8,
            align if expert_alignment is None else expert_alignment)
