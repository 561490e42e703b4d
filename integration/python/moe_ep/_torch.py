"""The torch side of the bridge: tensor descriptors built from data_ptr(),
shape and strides (no DLPack round trip), fp8 dtypes, current streams."""
import ctypes
import functools

import torch

from . import _abi

# torch.float8_e4m3fn exists from torch 2.1; before that fp8 lives in
# uint8 storage and the descriptor's dtype code says what it is.
FP8_DTYPE = getattr(torch, "float8_e4m3fn", None)
FP8_STORAGE = FP8_DTYPE if FP8_DTYPE is not None else torch.uint8

_DTYPES = {
    torch.bfloat16: (_abi.DTYPE_BFLOAT, 16),
    torch.float32: (_abi.DTYPE_FLOAT, 32),
    torch.float16: (_abi.DTYPE_FLOAT, 16),
    torch.float64: (_abi.DTYPE_FLOAT, 64),
    torch.int32: (_abi.DTYPE_INT, 32),
    torch.int64: (_abi.DTYPE_INT, 64),
    torch.int16: (_abi.DTYPE_INT, 16),
    torch.int8: (_abi.DTYPE_INT, 8),
    torch.uint8: (_abi.DTYPE_UINT, 8),
    torch.bool: (_abi.DTYPE_UINT, 8),  # the ABI's uint8 flags
}
if FP8_DTYPE is not None:
    _DTYPES[FP8_DTYPE] = (_abi.DTYPE_FLOAT8_E4M3FN, 8)

MAX_NDIM = 8

# OutputSpec's allocation, bound once: the per-call paths that inline it
# (_ll, _calls) skip the attribute lookups of torch.empty_like.
empty_like = torch.empty_like
CONTIGUOUS = torch.contiguous_format
_NULL_STRIDES = ctypes.POINTER(ctypes.c_int64)()


def dtype_code(dtype, as_fp8=False):
    """(code, bits) of a torch dtype. Unknown dtypes get a code the library
    rejects with its own sentence, rather than a second rule here."""
    if as_fp8 and dtype == torch.uint8:
        return _abi.DTYPE_FLOAT8_E4M3FN, 8
    got = _DTYPES.get(dtype)
    if got is not None:
        return got
    return 255, torch.empty((), dtype=dtype).element_size() * 8


class TensorSlot:
    """One reusable moe_ep_tensor_t for one pointer field of a params
    struct. attach() re-fills shape, dtype and device only when they differ
    from the previous tensor's, so at a fixed shape a call only writes the
    data pointer, and writes the struct's field only when it changes
    between NULL and this descriptor (a ctypes pointer store costs about as
    much as the rest)."""

    __slots__ = ("desc", "ptr", "_shape", "_strides", "_key", "_as_fp8", "name", "_params",
                 "_field", "attached")

    def __init__(self, name, as_fp8, params, field):
        self.name = name
        self.desc = _abi.Tensor()
        self.ptr = ctypes.pointer(self.desc)
        self._shape = (ctypes.c_int64 * MAX_NDIM)()
        self._strides = (ctypes.c_int64 * MAX_NDIM)()
        self._key = None
        self._as_fp8 = as_fp8
        self.desc.shape = self._shape
        self.desc.dtype.lanes = 1
        self._params, self._field = params, field
        self.attached = False

    def attach(self, t):
        """Points the params field at this descriptor describing tensor t,
        or sets it NULL when t is None. Returns t's (shape, dtype, device,
        contiguous), None for None."""
        if t is None:
            if self.attached:
                setattr(self._params, self._field, None)
                self.attached = False
            return None
        try:
            key = (t.shape, t.dtype, t.device, t.is_contiguous())
        except AttributeError:
            raise TypeError("%s must be a torch.Tensor, got %s"
                            % (self.name, type(t).__name__)) from None
        if key != self._key or not key[3]:
            self._refill(t, key)
        self.desc.data = t.data_ptr()
        if not self.attached:
            setattr(self._params, self._field, self.ptr)
            self.attached = True
        return key

    def attach_new(self, t, key):
        """attach() for a tensor an OutputSpec just allocated, whose key is
        the spec's: reading shape, dtype, device and contiguity back from
        the tensor would cost more than the rest of the call's binding."""
        if key is not self._key and key != self._key:
            self._refill(t, key)
        self.desc.data = t.data_ptr()
        if not self.attached:
            setattr(self._params, self._field, self.ptr)
            self.attached = True

    def _refill(self, t, key):
        d = self.desc
        shape = key[0]
        if len(shape) > MAX_NDIM:
            raise ValueError("%s has %d dimensions; moe_ep tensors have at most %d"
                             % (self.name, len(shape), MAX_NDIM))
        d.ndim = len(shape)
        for i, n in enumerate(shape):
            self._shape[i] = n
        if key[3]:
            d.strides = _NULL_STRIDES  # compact row-major
        else:  # the library names the offending stride in its sentence
            for i, s in enumerate(t.stride()):
                self._strides[i] = s
            d.strides = self._strides
        d.dtype.code, d.dtype.bits = dtype_code(key[1], self._as_fp8)
        if key[2].type == "cuda":
            d.device.device_type = _abi.DEVICE_CUDA
            d.device.device_id = key[2].index
        else:
            d.device.device_type = _abi.DEVICE_CPU
            d.device.device_id = 0
        self._key = key


class OutputSpec:
    """One output's shape and dtype on a device. new() allocates it as
    torch.empty_like of a zero-dim tensor expanded to the shape: the same
    allocation as torch.empty(shape, dtype=, device=) on the current
    stream, without a size list to parse per call. key is what
    TensorSlot.attach() would read back from the new tensor."""

    __slots__ = ("template", "key")

    def __init__(self, shape, dtype, device):
        self.template = torch.empty((), dtype=dtype, device=device).expand(shape)
        self.key = (torch.Size(shape), dtype, self.template.device, True)

    def new(self):
        # contiguous_format, not the default preserve_format: for a shape
        # with a zero dimension the latter gives all-zero strides.
        return empty_like(self.template, memory_format=CONTIGUOUS)


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _no_stream():
    return None


def stream_reader(device):
    """A function of no arguments returning the cudaStream_t (an int) of
    the current stream on CUDA device `device`, or None for host tensors;
    built once per group, so a call does not inspect the device again."""
    if device.type != "cuda":
        return _no_stream
    index = device.index if device.index is not None else torch.cuda.current_device()
    if _raw_stream is not None:
        return functools.partial(_raw_stream, index)
    return lambda: torch.cuda.current_stream(index).cuda_stream
