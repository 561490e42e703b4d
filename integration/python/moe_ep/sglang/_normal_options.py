"""The normal-mode options SGLang's own DeepEP dispatcher uses, read from
SGLang where it is importable (_sglang): the dispatcher's defaults follow
them, so it is a drop-in for SGLang's _DeepEPDispatcherImplNormal.

SGLang's normal dispatch_a quantises bf16 rows per 128-channel group
before the dispatch when its JIT DeepGEMM is on (ENABLE_JIT_DEEPGEMM) and
it dispatches fp8 (_sglang.output_dtype: its server argument, the quant
method's dispatcher_output_dtype, the MoE runner, or
SGLANG_DEEPEP_BF16_DISPATCH); the scales are packed UE8M0 when
DEEPGEMM_SCALE_UE8M0, else float32. Its dispatch asks for
expert_alignment 128 with JIT DeepGEMM, else 1."""
from . import _sglang

FROM_SGLANG = "sglang"  # normal_fp8's default: as SGLang's dispatcher does


def sglang_normal_options(quant_config=None):
    """(normal_fp8, expert_alignment) as SGLang's normal dispatcher would
    use them under quant_config (set_quant_config's): (None, 1) (rows as
    given, no alignment) where SGLang is not importable or runs without JIT
    DeepGEMM."""
    if not _sglang.deep_gemm_flag("ENABLE_JIT_DEEPGEMM"):
        return None, 1
    if _sglang.output_dtype(quant_config, low_latency=False) != "fp8":
        return None, 128
    return ("ue8m0_packed" if _sglang.deep_gemm_flag("DEEPGEMM_SCALE_UE8M0") else "f32"), 128


def resolve(normal_fp8, expert_alignment, quant_config=None):
    """The dispatcher's normal_fp8 and expert_alignment: each one not given
    (FROM_SGLANG, None) as SGLang's dispatcher uses it."""
    fp8, align = sglang_normal_options(quant_config)
    return (fp8 if normal_fp8 == FROM_SGLANG else normal_fp8,
            align if expert_alignment is None else expert_alignment)
