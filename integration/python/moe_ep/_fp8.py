"""fp8 e4m3 block quantisation as the library does it (moe_ep.h, "fp8
dispatch"), for callers that quantise before a high-throughput dispatch:
per 128-channel group, scale = max(amax over the finite values, 1e-4) /
448 (one f32 division), rounded up to a power of two for UE8M0;
q = e4m3(x / scale), round to nearest even, saturating at +-448, NaN of
either sign -> 0x7F. Bit-exact with the library's quantiser, so rows
quantised here equal the rows its low-latency dispatch would produce."""
import torch

from ._torch import FP8_DTYPE, FP8_STORAGE

GROUP = 128
AMAX_FLOOR = 1e-4  # as float32 0x38D1B717, the library's 1e-4f
FP8_MAX = 448.0
SCALE_FORMATS = ("f32", "ue8m0", "ue8m0_packed")  # the group config's fp8_scale values
ROW_FORMATS = {"f32": "fp8", "ue8m0": "fp8_ue8m0", "ue8m0_packed": "fp8_ue8m0_packed"}

# float32 bit patterns (magnitudes) the integer encoder compares with.
_F32_MIN_NORMAL_E4M3 = 0x3C800000  # 2^-6: below it e4m3 is subnormal
_F32_448 = 0x43E00000
_F32_INF = 0x7F800000
_MANT = 0x7FFFFF

_divisors = {}  # device -> a [1] float32 448


def _fp8_max(device):
    """448 as a tensor on `device`: CUDA torch divides by a host scalar as
    a multiplication by its reciprocal, which is not the IEEE division the
    library's scale is."""
    t = _divisors.get(device)
    if t is None:
        t = _divisors[device] = torch.full((1,), FP8_MAX, dtype=torch.float32, device=device)
    return t


def encode_bits(v):
    """float32 tensor -> e4m3fn codes (uint8) from its bit patterns with
    integer operations only: what torch without float8_e4m3fn uses."""
    u = v.contiguous().view(torch.int32)
    sign = (u >> 24) & 0x80  # arithmetic shift: bit 31 lands in bit 7
    a = u & 0x7FFFFFFF
    big = a >= _F32_448  # +-448 and past it, +-inf and NaN: set below
    a_fin = a.masked_fill(big, 0)  # keeps the additions below inside int32
    # Normal e4m3: drop 20 mantissa bits, ties to even (+0x7FFFF plus the
    # kept lsb), then rebias the exponent from 127 to 7; a carry out of the
    # mantissa moves to the next binade as it should.
    code = ((a_fin + 0x7FFFF + ((a_fin >> 20) & 1)) >> 20) - (120 << 3)
    # Subnormal e4m3 (|v| < 2^-6): count units of 2^-9. |v| = m * 2^(e-150)
    # with m the 24-bit significand, so units = m >> (141 - e), rounded to
    # even; from a shift of 25 up every value rounds to 0.
    e = a_fin >> 23
    m = (a_fin & _MANT) | 0x800000
    shift = (141 - e).clamp(0, 25)
    units = m >> shift
    rem = m - (units << shift)
    half = (torch.ones_like(shift) << shift) >> 1
    units = units + ((rem > half) | ((rem == half) & ((units & 1) == 1))).to(torch.int32)
    code = torch.where(a < _F32_MIN_NORMAL_E4M3, units, code)
    code = code.masked_fill(big, 0x7E) | sign  # satfinite, +-inf included
    code = code.masked_fill(a > _F32_INF, 0x7F)  # NaN, whatever its sign
    return code.to(torch.uint8)


def encode_native(v):
    """float32 tensor -> e4m3fn codes through torch's float8_e4m3fn (RNE).
    torch turns values past 464 and inf into NaN and keeps a NaN's sign, so
    the values are clamped to +-448 first (clamp keeps NaN) and a negative
    NaN (0xFF) becomes 0x7F."""
    b = v.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).view(torch.uint8)
    return b.masked_fill(b == 0xFF, 0x7F)


def encode(v, native=None):
    """float32 tensor -> e4m3fn codes in FP8_STORAGE (float8_e4m3fn where
    torch has it, uint8 before torch 2.1). native: torch's conversion
    (default where torch has float8_e4m3fn) or, False, the integer one."""
    if native is None:
        native = FP8_DTYPE is not None
    codes = encode_native(v) if native else encode_bits(v)
    return codes.view(FP8_STORAGE)


def round_pow2(s):
    """2^ceil(log2(s)) of positive normal float32 scales, exactly: a scale
    with mantissa bits set goes up to the next power of two."""
    b = s.view(torch.int32)
    up = ((b >> 23) + 1) << 23
    return torch.where((b & _MANT) == 0, b, up).view(torch.float32)


def scale_columns(hidden, packed):
    """The scale columns of rows of `hidden` channels (a multiple of GROUP):
    one float32 per GROUP channels, or, packed, four UE8M0 exponents per
    int32."""
    groups = hidden // GROUP
    return (groups + 3) // 4 if packed else groups


def quantize(x, scale_format="f32", name="x", native=None):
    """x [T, H] bf16 (or float16 / float32; H a multiple of 128) ->
    (codes [T, H] FP8_STORAGE, scales): [T, H/128] float32 for "f32",
    the same as powers of two for "ue8m0", or [T, ceil(H/512)] int32 for
    "ue8m0_packed" (group g's exponent byte in byte g % 4 of word g / 4).
    native: as encode()'s (the checks compare both encoders)."""
    if scale_format not in SCALE_FORMATS:
        raise ValueError("quantize: scale_format=%r must be one of %s"
                         % (scale_format, ", ".join(repr(f) for f in SCALE_FORMATS)))
    if not isinstance(x, torch.Tensor):
        raise TypeError("%s must be a torch.Tensor, got %s" % (name, type(x).__name__))
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError("%s has dtype %s; fp8 quantisation takes bfloat16, float16 or float32 "
                         "rows" % (name, x.dtype))
    if x.dim() != 2 or x.shape[1] % GROUP:
        raise ValueError("%s has shape %s; fp8 quantisation takes [T, H] rows with H a multiple "
                         "of %d (one scale per %d channels)"
                         % (name, tuple(x.shape), GROUP, GROUP))
    t, h = x.shape
    groups = h // GROUP
    f = x.float().reshape(t, groups, GROUP)
    a = f.abs()
    amax = a.masked_fill(~torch.isfinite(a), 0.0).amax(dim=2)
    s = amax.clamp_min(AMAX_FLOOR) / _fp8_max(x.device)
    if scale_format != "f32":
        s = round_pow2(s)
    q = encode(f / s[:, :, None], native).view(t, h)
    if scale_format != "ue8m0_packed":
        return q, s
    words = scale_columns(h, packed=True)
    exps = torch.zeros((t, 4 * words), dtype=torch.uint8, device=x.device)
    exps[:, :groups] = (s.view(torch.int32) >> 23).to(torch.uint8)  # UE8M0: the biased exponent
    return q, exps.view(torch.int32)


def tma_aligned_rows(rows, element_size):
    """rows rounded up to a whole 16 bytes of elements: the column stride
    DeepGEMM requires of scales stored column-major (a TMA copy's strides
    are multiples of 16 bytes)."""
    per = max(1, 16 // element_size)
    return (rows + per - 1) // per * per


def column_major_like(scales):
    """An empty tensor of scales' shape [E, R*N, C] in DeepEP's layout for
    low-latency receive scales: transposed storage (each expert's [C, R*N]
    block contiguous), the view DeepGEMM's masked grouped GEMM reads, with
    each column's stride R*N rounded up to 16 bytes so the view is the one
    DeepGEMM's TMA loads take as it is whatever R*N is (DeepEP instead
    refuses an R*N that is not a multiple of 4). The library's own are
    row-major; fill it with .copy_(scales) once the receive has completed.
    None for None."""
    if scales is None:
        return None
    e, s, c = scales.shape
    padded = tma_aligned_rows(s, scales.element_size())
    store = torch.empty((e, c, padded), dtype=scales.dtype, device=scales.device)
    return store[:, :, :s].transpose(1, 2)


def column_major(scales):
    """scales (a completed receive's) in DeepEP's column-major layout."""
    out = column_major_like(scales)
    return None if out is None else out.copy_(scales)
