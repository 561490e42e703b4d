"""The tests' own reference: expected dispatch and combine results computed
with numpy from every rank's inputs, written from the documented semantics
(README "weights", docs/DESIGN.md LL and HT), not from the library's code.

Numbers follow the library's documented rounding: bf16 round-to-nearest-
even, f32 accumulation from 0.0f in the stated order, e4m3fn with
satfinite (NaN -> 0x7F), fp8 group scale = max(amax of the finite values,
1e-4) / 448 over 128 channels (power of two rounded up when asked)."""
import numpy as np

FP8_GROUP = 128


# ---- numbers ----------------------------------------------------------------

def bf16_bits(f):
    """float32 array -> bf16 bit patterns (uint16), round to nearest even."""
    u = np.asarray(f, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    r = np.where(nan, (u >> 16) | 0x40, r)
    return r.astype(np.uint16)


def bf16_float(bits):
    """bf16 bit patterns -> float32."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def e4m3_bits(a):
    """float32 array -> e4m3fn codes, ties to even, satfinite (+-inf ->
    +-448); NaN of either sign -> 0x7F (moe_ep.h, "fp8 and non-finite
    input")."""
    a = np.asarray(a, dtype=np.float32)
    sign = np.signbit(a).astype(np.uint8) << 7
    nan = np.isnan(a)
    mag = np.where(nan | np.isinf(a), np.float32(0), np.abs(a))  # decided below
    _, e = np.frexp(mag)
    unb = np.maximum(e.astype(np.int32) - 1, -6)
    quantum = np.ldexp(np.ones_like(mag), unb - 3).astype(np.float32)
    q = (np.rint(mag / quantum) * quantum).astype(np.float32)
    qm, qe = np.frexp(q)
    exp_field = qe.astype(np.int32) - 1 + 7
    sub = exp_field <= 0
    man_sub = np.ldexp(q, 9).astype(np.int32)
    man_norm = ((qm * 2 - 1) * 8).astype(np.int32)
    code = np.where(sub, man_sub, (exp_field << 3) | man_norm)
    code = np.where(q == 0, 0, code)
    code = np.where(np.isinf(a) | (mag >= 448) | (q >= 448), 0x7E, code)
    code = code.astype(np.uint8) | sign
    return np.where(nan, np.uint8(0x7F), code).astype(np.uint8)


def fp8_group_scales(row_f32, pow2):
    """[H] float32 -> per-128-channel scales [H/128] float32; a group's
    amax is over its finite values only."""
    a = np.abs(row_f32.reshape(-1, FP8_GROUP))
    g = np.where(np.isfinite(a), a, np.float32(0)).max(axis=1).astype(np.float32)
    g = np.where(g >= np.float32(1e-4), g, np.float32(1e-4)).astype(np.float32)
    s = (g / np.float32(448.0)).astype(np.float32)
    if pow2:
        m, e = np.frexp(s)
        s = np.where(m == 0.5, np.ldexp(np.float32(1), e - 1),
                     np.ldexp(np.float32(1), e)).astype(np.float32)
    return s


def fp8_quantize(x_bits, pow2):
    """bf16 row -> (e4m3 codes [H], scales [H/128])."""
    f = bf16_float(x_bits)
    s = fp8_group_scales(f, pow2)
    with np.errstate(invalid="ignore", over="ignore"):  # inf / s, NaN / s
        q = e4m3_bits((f.reshape(-1, FP8_GROUP) / s[:, None]).astype(np.float32).reshape(-1))
    return q, s


def e4m3_float(codes):
    """e4m3fn codes -> float32, exactly (0x7F / 0xFF are NaN)."""
    c = np.asarray(codes, dtype=np.uint8).astype(np.int64)
    e, m = (c >> 3) & 0xF, (c & 7).astype(np.float64)
    mag = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1.0 + m / 8.0) * np.exp2(e - 7.0))
    mag = np.where((c & 0x7F) == 0x7F, np.nan, mag)
    return np.where(c & 0x80, -mag, mag).astype(np.float32)


def ue8m0_unpack(words, groups):
    """[ceil(G/4)] int32 -> the [G] power-of-two float32 scales they encode."""
    b = np.asarray(words, dtype=np.int32).view(np.uint8)[:groups].astype(np.int64)
    return np.exp2(b - 127.0).astype(np.float32)


def fp8_dequantize(q, scales):
    """e4m3 codes [H] and f32 scales [H/128] -> the float32 row they encode."""
    return (e4m3_float(q).reshape(-1, FP8_GROUP) * np.asarray(scales, np.float32)[:, None]) \
        .astype(np.float32).reshape(-1)


def ue8m0_pack(scales):
    """[G] power-of-two float32 scales -> [ceil(G/4)] int32, exponent byte
    of group g in byte g % 4 of word g / 4."""
    _, e = np.frexp(scales)
    codes = (e.astype(np.int64) - 1 + 127).astype(np.uint32)
    words = np.zeros((len(codes) + 3) // 4, dtype=np.uint32)
    for g, c in enumerate(codes):
        words[g // 4] |= np.uint32(c) << np.uint32(8 * (g % 4))
    return words.view(np.int32)


# ---- inputs -----------------------------------------------------------------

class Problem:
    def __init__(self, world, num_experts, hidden, top_k, max_tokens):
        self.world, self.num_experts, self.hidden = world, num_experts, hidden
        self.top_k, self.max_tokens = top_k, max_tokens
        self.local = num_experts // world

    def rank_of(self, e):
        return e // self.local


def make_inputs(p, seed, rank, num_tokens=None, masked=0.1):
    """Rank `rank`'s inputs: x bf16 bits [T, H], topk_idx int64 [T, K]
    (distinct experts, some -1), weights float32 [T, K]."""
    rng = np.random.default_rng(seed * 7919 + rank)
    t = int(rng.integers(0, p.max_tokens + 1)) if num_tokens is None else num_tokens
    x = bf16_bits(rng.standard_normal((t, p.hidden)).astype(np.float32) * np.float32(2.0))
    idx = np.argsort(rng.random((t, p.num_experts)), axis=1)[:, :p.top_k].astype(np.int64)
    idx[rng.random((t, p.top_k)) < masked] = -1
    w = rng.random((t, p.top_k)).astype(np.float32)
    return {"x": x, "topk_idx": idx, "weights": w}


def all_inputs(p, seed, **kw):
    return [make_inputs(p, seed, r, **kw) for r in range(p.world)]


# ---- LL -----------------------------------------------------------------------

def ll_dispatch(p, inputs, rank):
    """Expected LL receive of `rank`: per local expert the (source rank,
    token) list in receive order (source rank, then token ascending)."""
    rows = []
    for l in range(p.local):
        e = rank * p.local + l
        rows.append([(s, t) for s in range(p.world)
                     for t in range(len(inputs[s]["topk_idx"]))
                     if e in inputs[s]["topk_idx"][t]])
    return rows


def ll_layout(p, inputs, rank):
    """DeepEP's view of `rank`'s LL receive (its handle's first two
    elements): src_info [E_local, R*N] int32, the source token of each slot
    (-1 past the expert's count), and layout_range [E_local, R] int64,
    begin << 32 | count of each source rank's slots (begin = the counts of
    the lower source ranks)."""
    src = np.full((p.local, p.world * p.max_tokens), -1, dtype=np.int32)
    ranges = np.zeros((p.local, p.world), dtype=np.int64)
    for l, lrows in enumerate(ll_dispatch(p, inputs, rank)):
        begin = 0
        for s in range(p.world):
            n = sum(1 for src_rank, _ in lrows if src_rank == s)
            ranges[l, s] = (begin << 32) | n
            begin += n
        for i, (_, t) in enumerate(lrows):
            src[l, i] = t
    return src, ranges


def dispatch_layout(topk_idx, num_experts, world):
    """DeepEP's get_dispatch_layout of one rank's topk_idx [T, K]:
    (num_tokens_per_rank [R], num_tokens_per_expert [E], is_token_in_rank
    [T, R]). A token counts once per rank that holds one of its experts
    (ranks own num_experts / world consecutive experts) and once per expert
    slot; ids outside [0, num_experts) count nowhere."""
    local = num_experts // world
    per_rank = np.zeros(world, dtype=np.int32)
    per_expert = np.zeros(num_experts, dtype=np.int32)
    in_rank = np.zeros((len(topk_idx), world), dtype=bool)
    for t, row in enumerate(topk_idx):
        for e in row:
            if 0 <= e < num_experts:
                per_expert[e] += 1
                in_rank[t, e // local] = True
        per_rank += in_rank[t]
    return per_rank, per_expert, in_rank


def expert_scale(e):
    """The tests' expert function: y = bf16(x * (1 + (e % 8) / 8)); the
    product is exact in f32, so the only rounding is to bf16."""
    return np.float32(1.0 + (e % 8) / 8.0)


def expert_row(x_bits, e):
    return bf16_bits(bf16_float(x_bits) * expert_scale(e))


def fma32(a, b, c):
    """float32 fma(a, b, c) elementwise, rounded once (the combine rule).
    a*b is exact in float64; s = a*b + c rounds to float64, and the exact
    error e of that sum (TwoSum) decides the one case where rounding s to
    float32 would round twice: s exactly halfway between two float32s."""
    prod = np.float64(a) * np.asarray(b, dtype=np.float64)
    c64 = np.asarray(c, dtype=np.float64)
    s = prod + c64
    bb = s - prod
    e = (prod - (s - bb)) + (c64 - bb)
    halfway = (s.view(np.uint64) & np.uint64((1 << 29) - 1)) == np.uint64(1 << 28)
    fix = halfway & (e != 0)
    if fix.any():
        s = np.where(fix, np.nextafter(s, np.where(e > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


def ll_combine(p, inp, expert_out=None):
    """LL combine, wherever the weights were given: per rank the f32 fma sum
    in k order of that rank's w_k * y_k, rounded to bf16; then the partials
    summed in f32 in the order the token's ranks first appear in its top-k,
    then bf16.
    expert_out(t, e) gives y (bf16 bits) for token t at expert e; default
    the experts' rule on the token's own row."""
    x, idx, w = inp["x"], inp["topk_idx"], inp["weights"]
    if expert_out is None:
        def expert_out(t, e):
            return expert_row(x[t], e)
    out = np.zeros(x.shape, dtype=np.uint16)
    for t in range(len(x)):
        order = []
        for e in idx[t]:
            if e >= 0 and p.rank_of(e) not in order:
                order.append(p.rank_of(e))
        acc = np.zeros(p.hidden, dtype=np.float32)
        for r in order:
            part = np.zeros(p.hidden, dtype=np.float32)
            for k in range(p.top_k):
                e = idx[t, k]
                if e >= 0 and p.rank_of(e) == r:
                    part = fma32(w[t, k], bf16_float(expert_out(t, e)), part)
            acc = (acc + bf16_float(bf16_bits(part))).astype(np.float32)
        out[t] = bf16_bits(acc)
    return out


# ---- HT -----------------------------------------------------------------------

def ht_dispatch(p, inputs, rank):
    """Expected HT receive: one row per (source rank, token) with an expert
    on `rank`, source rank then token ascending; local ids (or -1) and the
    weights there (0 elsewhere); per-local-expert counts."""
    src, idx_rows, w_rows = [], [], []
    counts = np.zeros(p.local, dtype=np.int32)
    for s in range(p.world):
        idx, w = inputs[s]["topk_idx"], inputs[s]["weights"]
        for t in range(len(idx)):
            mine = (idx[t] >= 0) & (idx[t] // p.local == rank)
            if not mine.any():
                continue
            lids = np.where(mine, idx[t] - rank * p.local, -1).astype(np.int32)
            src.append((s, t))
            idx_rows.append(lids)
            w_rows.append(np.where(mine, w[t], np.float32(0)).astype(np.float32))
            for l in lids[lids >= 0]:
                counts[l] += 1
    k = p.top_k
    return (src, np.array(idx_rows, dtype=np.int32).reshape(-1, k),
            np.array(w_rows, dtype=np.float32).reshape(-1, k), counts)


def ht_partial_scale(r):
    """The tests' HT expert side on rank r: y = bf16(x * (1 + r / 8))."""
    return np.float32(1.0 + (r % 8) / 8.0)


def ht_combine(p, inp, seen=None):
    """out [T, H]: per token, the receiving ranks' partials summed in f32
    over ranks ascending, then bf16; +0 for a token no rank received. Rank
    r's partial is bf16(row * ht_partial_scale(r)) of the row its experts
    saw: `seen[t]` (float32, e.g. a pre-quantised fp8 row dequantised),
    by default the bf16 x."""
    x, idx = inp["x"], inp["topk_idx"]
    out = np.zeros(x.shape, dtype=np.uint16)
    for t in range(len(x)):
        ranks = sorted({int(e) // p.local for e in idx[t] if e >= 0})
        row = bf16_float(x[t]) if seen is None else seen[t]
        acc = np.zeros(p.hidden, dtype=np.float32)
        for r in ranks:
            acc = (acc + bf16_float(bf16_bits(row * ht_partial_scale(r)))).astype(np.float32)
        out[t] = bf16_bits(acc)
    return out


def fp8_quantize_per_token(x_bits):
    """bf16 row -> (e4m3 codes [H], its one scale [1]): the per-group rule
    taken over the whole row (amax of the finite values, floored at 1e-4,
    over 448)."""
    f = bf16_float(x_bits)
    a = np.abs(f)
    amax = np.float32(np.where(np.isfinite(a), a, np.float32(0)).max()) if len(f) else 0
    s = np.float32(max(amax, np.float32(1e-4)) / np.float32(448.0))
    with np.errstate(invalid="ignore", over="ignore"):
        q = e4m3_bits((f / s).astype(np.float32))
    return q, np.array([s], np.float32)


def ht_fp8_inputs(p, inp, fmt):
    """What an engine that quantises before an HT dispatch passes for rank
    inputs `inp`, with fmt "fp8" (f32 scales), "fp8_ue8m0" (power-of-two
    scales as f32), "fp8_ue8m0_packed" or "fp8_per_token": (e4m3 codes
    [T, H] uint8, scales [T, H/128] float32, [T, H/512] int32 or [T, 1]
    float32), and the rows as its experts will see them (dequantised,
    [T, H] float32)."""
    if fmt == "fp8_per_token":
        t = len(inp["x"])
        q = np.zeros((t, p.hidden), dtype=np.uint8)
        scales = np.zeros((t, 1), dtype=np.float32)
        for i in range(t):
            q[i], scales[i] = fp8_quantize_per_token(inp["x"][i])
        seen = (e4m3_float(q) * scales).astype(np.float32)
        return q, scales, seen
    packed = fmt == "fp8_ue8m0_packed"
    pow2 = fmt != "fp8"
    t = len(inp["x"])
    q = np.zeros((t, p.hidden), dtype=np.uint8)
    groups = p.hidden // FP8_GROUP
    scales = np.zeros((t, groups), dtype=np.float32)
    for i in range(t):
        q[i], scales[i] = fp8_quantize(inp["x"][i], pow2)
    seen = np.stack([fp8_dequantize(q[i], scales[i]) for i in range(t)]) if t else \
        np.zeros((0, p.hidden), np.float32)
    if packed:
        words = np.stack([ue8m0_pack(scales[i]) for i in range(t)]) if t else \
            np.zeros((0, (groups + 3) // 4), np.int32)
        return q, words, seen
    return q, scales, seen
