#!/usr/bin/env python3
"""The package's fp8 quantiser (moe_ep._fp8, used by the vLLM adapter before
an HT dispatch) against the library's own on the device: rows with e4m3
ties, subnormals, +-0, saturating values, +-inf, NaN of either sign,
groups under the amax floor and all-NaN groups go through a 1-rank
low-latency dispatch in each per-call fp8 format (the library's kernel
quantises them), and quantize() of the same rows, with torch's
float8_e4m3fn conversion and with the integer encoder, must give the same
codes and scales bit for bit; then the two encoders are compared over
random float32 bit patterns on the device. Not run by CI.

  python3 integration/python/gpu/fp8_check.py [--address 127.0.0.1:29651]

Prints one line per check and "rank 0: ok" (exit 0) or its failures.
Without a GPU it runs on the host backend (CPU tensors)."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("MOE_EP_RANK", "0")
os.environ.setdefault("MOE_EP_WORLD_SIZE", "1")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402

import moe_ep  # noqa: E402
from moe_ep import _fp8  # noqa: E402

HIDDEN = 640  # five 128-channel groups: the packed scales end in a padded word
FORMATS = (("f32", "fp8"), ("ue8m0", "fp8_ue8m0"), ("ue8m0_packed", "fp8_ue8m0_packed"))
failures = []


def bf16(values):
    return torch.tensor(values, dtype=torch.float32).to(torch.bfloat16)


def edge_rows(seed):
    """[33, HIDDEN] bf16: row 0 holds the edge cases (group 0 has amax 448,
    so scale 1 and its values reach the encoder as they are; group 1 mixes
    +-inf and NaN with finite values; group 2 is zero, group 3 NaN, group 4
    zero); the rest are random rows whose groups span 2^-40 .. 2^20."""
    r0 = torch.zeros(HIDDEN, dtype=torch.bfloat16)
    r0[:13] = bf16([448.0, 1.0625, -1.0625, 1.1875, 2.0 ** -10, 3 * 2.0 ** -10, -(2.0 ** -10),
                    2.0 ** -7, 5 * 2.0 ** -11, -0.0, 240.0, 232.0, -0.013671875])
    words = r0.view(torch.int16)
    words[128:132] = torch.tensor([0x7F80, 0xFF80, 0x7FC0, 0xFFC0], dtype=torch.int32) \
        .to(torch.int16)  # +inf, -inf, NaN, -NaN
    r0[132:135] = bf16([3.5, -7.25, 1e-3])
    words[384:512] = torch.tensor(0xFFC0, dtype=torch.int32).to(torch.int16)
    g = torch.Generator().manual_seed(seed)
    mag = torch.pow(2.0, torch.randint(-40, 20, (32, HIDDEN // 128, 1), generator=g).float())
    rand = (torch.randn(32, HIDDEN // 128, 128, generator=g) * mag).reshape(32, HIDDEN)
    return torch.cat([r0[None], rand.to(torch.bfloat16)])


def compare(what, got, want):
    g, w = got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)
    bad = (g != w).nonzero()
    if bad.numel():
        i = int(bad[0])
        failures.append("rank 0 %s: %d of %d bytes differ; first at byte %d: got 0x%02x want "
                        "0x%02x" % (what, bad.numel(), g.numel(), i, int(g[i]), int(w[i])))
        print(failures[-1], flush=True)
    else:
        print("%-60s ok" % what, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--address", default="127.0.0.1:29651", help="bootstrap host:port")
    ap.add_argument("--seed", type=int, default=5)
    a = ap.parse_args()
    gpu = torch.cuda.is_available()
    x_host = edge_rows(a.seed)
    t = x_host.shape[0]
    cfg = {"backend": "nccl" if gpu else "host", "num_experts": 2, "hidden": HIDDEN, "top_k": 1,
           "max_tokens_per_rank": t, "bootstrap": {"address": a.address}}
    with moe_ep.Group(cfg) as grp:
        dev = grp.device
        x = x_host.to(dev)
        idx = torch.zeros((t, 1), dtype=torch.int64, device=dev)  # every token to expert 0
        encoders = [("integer", False)] + ([("float8_e4m3fn", True)] if _fp8.FP8_DTYPE else [])
        for scale_format, fmt in FORMATS:
            h = grp.prepare(idx)
            res = grp.dispatch(h, x, format=fmt)
            for name, native in encoders:
                q, s = _fp8.quantize(x, scale_format, native=native)
                what = "%s %s encoder vs the library (%s)" % (dev.type, name, fmt)
                compare(what + " codes", q, res.recv_x[0, :t])
                compare(what + " scales", s, res.recv_scales[0, :t])
            h.free()
    if len(encoders) == 2:
        g = torch.Generator().manual_seed(a.seed)
        bits = torch.randint(-2 ** 31, 2 ** 31, (1 << 22,), generator=g, dtype=torch.int64)
        v = bits.to(torch.int32).view(torch.float32).to(dev)
        compare("%s float8_e4m3fn encoder vs the integer one (random f32)" % dev.type,
                _fp8.encode_native(v), _fp8.encode_bits(v))
    print("rank 0: %s" % ("ok" if not failures else "%d failures" % len(failures)), flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
