"""The package's output allocation: OutputSpec must give exactly what
torch.empty gives (TensorSlot.attach_new trusts its key instead of reading
the tensor back)."""
import ctypes

import pytest
import torch

from moe_ep import _abi
from moe_ep._torch import OutputSpec, TensorSlot

SHAPES = [(7,), (3, 5), (4, 2, 256), (0, 7168), (2, 0, 3), (0,)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int32, torch.uint8])
def test_output_spec_allocates_what_torch_empty_does(shape, dtype):
    spec = OutputSpec(shape, dtype, torch.device("cpu"))
    a, b = spec.new(), spec.new()
    ref = torch.empty(shape, dtype=dtype)
    assert (a.shape, a.dtype, a.stride()) == (ref.shape, ref.dtype, ref.stride()), \
        "shape %s dtype %s: got strides %s, torch.empty has %s" % (shape, dtype, a.stride(), ref.stride())
    assert a.is_contiguous()
    if a.numel():
        assert a.data_ptr() != b.data_ptr(), "two calls returned one storage"


@pytest.mark.parametrize("shape", SHAPES)
def test_attach_new_describes_the_tensor_as_attach_does(shape):
    params = _abi.init(_abi.CombineParams)
    spec = OutputSpec(shape, torch.bfloat16, torch.device("cpu"))
    t = spec.new()
    fresh, read_back = TensorSlot("out", False, params, "out"), TensorSlot("out", False, params, "out")
    fresh.attach_new(t, spec.key)
    key = read_back.attach(t)
    assert key == spec.key
    for f in ("data", "ndim"):
        assert getattr(fresh.desc, f) == getattr(read_back.desc, f), f
    nd = fresh.desc.ndim
    assert list(fresh.desc.shape[:nd]) == list(read_back.desc.shape[:nd])
    # NULL strides mean compact row-major, as in DLPack.
    assert bool(fresh.desc.strides) == bool(read_back.desc.strides)
    if fresh.desc.strides:
        assert list(fresh.desc.strides[:nd]) == list(read_back.desc.strides[:nd])
    assert (fresh.desc.dtype.code, fresh.desc.dtype.bits) == (read_back.desc.dtype.code, read_back.desc.dtype.bits)
    assert ctypes.addressof(params.out.contents) == ctypes.addressof(read_back.desc)
