"""ctypes mirror of plugin/include/moe_ep.h (ABI v1, version 0.5).

Field order and types follow the header exactly; tests/abi_layout_test.cc
pins the C side, and test_abi.py checks these sizes against it. Entries
appended after 0.2 (handle_layout, group_busy_hook) may be missing from an
older library's table: _library.Library reads only what the table's
struct_size covers.
"""
import ctypes
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char, c_char_p, c_int,
                    c_int32, c_int64, c_size_t, c_uint8, c_uint16, c_uint32,
                    c_uint64, c_void_p)

ABI_VERSION = 1
SYMBOL = "moe_ep_plugin_v1"

# moe_ep_status_t
OK = 0

# moe_ep_device_type_t
DEVICE_CPU = 1
DEVICE_CUDA = 2

# moe_ep_dtype_code_t
DTYPE_INT = 0
DTYPE_UINT = 1
DTYPE_FLOAT = 2
DTYPE_BFLOAT = 4
DTYPE_FLOAT8_E4M3FN = 10

BACKENDS = ("auto", "host", "nccl")
MODES = ("low_latency", "high_throughput")
DISPATCH_DTYPES = ("bf16", "fp8_e4m3")
FP8_SCALES = ("f32", "ue8m0", "ue8m0_packed")
TRANSPORTS = ("auto", "lsa", "gin", "gin_emulated", "ucx_host")
LOG_LEVELS = ("none", "error", "warn", "info", "debug", "trace")

FLAG_DEFER_RECV = 1 << 0
FLAG_ROUND_SCALE = 1 << 1
FLAG_WORST_CASE = 1 << 2  # 0.3: HT outputs sized world_size * max_tokens_per_rank
# moe_ep_dispatch_format_t: a dispatch's row format, per call.
FORMATS = {None: 0, "bf16": 1, "fp8": 2, "fp8_ue8m0": 3, "fp8_ue8m0_packed": 4,
           "fp8_per_token": 5}  # 5: 0.5, high throughput only
FORMAT_SINCE = {"fp8_per_token": (0, 5)}

ADDRESS_MAX = 256
ENV_NAME_MAX = 64


class Device(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class Tensor(Structure):
    _fields_ = [
        ("data", c_void_p),
        ("device", Device),
        ("ndim", c_int32),
        ("dtype", DataType),
        ("shape", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),
        ("byte_offset", c_uint64),
    ]


class Config(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("backend", c_int32),
        ("mode", c_int32),
        ("num_experts", c_int32),
        ("hidden", c_int32),
        ("top_k", c_int32),
        ("max_tokens_per_rank", c_int32),
        ("dispatch_dtype", c_int32),
        ("fp8_scale", c_int32),
        ("double_buffer", c_int32),
        ("transport", c_int32),
        ("bootstrap_timeout_ms", c_int32),
        ("kernel_timeout_ms", c_int32),
        ("log_level", c_int32),
        ("bootstrap_address", c_char * ADDRESS_MAX),
        ("bootstrap_token_env", c_char * ENV_NAME_MAX),
        # appended in 0.3: reserved0 is the older struct's tail padding
        ("reserved0", c_int32),
        ("ranks_per_node", c_int32),
        ("reserved1", c_int32),
    ]


class GroupParams(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("config", POINTER(Config)),
        ("rank", c_int32),
        ("world_size", c_int32),
        ("cuda_device", c_int32),
        ("reserved0", c_int32),
        ("nccl_comm", c_void_p),
    ]


class GroupInfo(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("rank", c_int32),
        ("world_size", c_int32),
        ("num_local_experts", c_int32),
        ("backend", c_int32),
        ("mode", c_int32),
        ("num_sms", c_int32),
        ("bytes_allocated", c_uint64),
        ("config_hash", c_uint64),
        ("peer_transports", POINTER(c_int32)),
        ("peer_transports_len", c_int32),
        ("reserved0", c_int32),
    ]


class PrepareParams(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("topk_idx", POINTER(Tensor)),
        ("num_tokens", c_int32),
        ("top_k", c_int32),
        ("stream", c_void_p),
        ("num_tokens_per_rank", POINTER(Tensor)),
        ("num_tokens_per_expert", POINTER(Tensor)),
        ("is_token_in_rank", POINTER(Tensor)),
    ]


class DispatchParams(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("flags", c_uint32),
        ("hidden", c_int32),
        ("x", POINTER(Tensor)),
        ("stream", c_void_p),
        ("recv_x", POINTER(Tensor)),
        ("recv_scales", POINTER(Tensor)),
        ("recv_count", POINTER(Tensor)),
        ("topk_weights", POINTER(Tensor)),
        ("recv_topk_idx", POINTER(Tensor)),
        ("recv_topk_weights", POINTER(Tensor)),
        ("num_recv_tokens", POINTER(c_int64)),
        ("format", c_int32),  # moe_ep_dispatch_format_t, appended in 0.2
        ("reserved0", c_int32),
        ("x_scales", POINTER(Tensor)),  # appended in 0.3 (HT pre-quantised fp8)
    ]


class CombineParams(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("flags", c_uint32),
        ("hidden", c_int32),
        ("y", POINTER(Tensor)),
        ("topk_weights", POINTER(Tensor)),
        ("out", POINTER(Tensor)),
        ("stream", c_void_p),
    ]


class HandleLayoutParams(Structure):  # 0.3
    _fields_ = [
        ("struct_size", c_size_t),
        ("src_info", POINTER(Tensor)),
        ("layout_range", POINTER(Tensor)),
        ("stream", c_void_p),
    ]


def init(struct_type):
    """A zeroed params struct with struct_size set (MOE_EP_INIT)."""
    s = struct_type()
    s.struct_size = ctypes.sizeof(struct_type)
    return s


LoggerFn = CFUNCTYPE(None, c_void_p, c_int, c_char_p)
_status = c_int  # enums are int-sized in the C ABI
_G = c_void_p    # opaque group / handle / hook pointers

class PluginV1(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("abi_version", c_uint32),
        ("name", c_char_p),
        ("get_version", CFUNCTYPE(_status, POINTER(c_int), POINTER(c_int), POINTER(c_int))),
        ("last_error", CFUNCTYPE(c_char_p)),
        ("status_string", CFUNCTYPE(c_char_p, _status)),
        ("set_logger", CFUNCTYPE(_status, LoggerFn, c_void_p)),
        ("config_from_yaml", CFUNCTYPE(_status, c_char_p, POINTER(POINTER(Config)))),
        ("config_free", CFUNCTYPE(None, POINTER(Config))),
        ("buffer_size_hint", CFUNCTYPE(_status, POINTER(Config), c_int32, POINTER(c_uint64))),
        ("group_create", CFUNCTYPE(_status, POINTER(GroupParams), POINTER(_G))),
        ("group_destroy", CFUNCTYPE(_status, _G)),
        ("group_info", CFUNCTYPE(_status, _G, POINTER(GroupInfo))),
        ("group_poll_error", CFUNCTYPE(_status, _G)),
        ("set_num_sms", CFUNCTYPE(_status, _G, c_int32)),
        ("max_sms_used", CFUNCTYPE(_status, _G, POINTER(c_int32))),
        ("prepare", CFUNCTYPE(_status, _G, POINTER(PrepareParams), POINTER(_G))),
        ("dispatch", CFUNCTYPE(_status, _G, _G, POINTER(DispatchParams), POINTER(_G))),
        ("combine", CFUNCTYPE(_status, _G, _G, POINTER(CombineParams), POINTER(_G))),
        ("hook_run", CFUNCTYPE(_status, _G, c_void_p)),
        ("hook_free", CFUNCTYPE(None, _G)),
        ("handle_free", CFUNCTYPE(None, _G)),
        # appended in 0.3
        ("handle_layout", CFUNCTYPE(_status, _G, POINTER(HandleLayoutParams))),
        # appended in 0.4
        ("group_busy_hook", CFUNCTYPE(_status, _G, POINTER(_G))),
    ]


# The version that appended each optional entry.
ENTRY_SINCE = {"handle_layout": "0.3", "group_busy_hook": "0.4"}

# The smallest v1 table usable here: everything up to handle_free
# (MOE_EP_LOADER_MIN_V1_SIZE, a 0.2 library); later entries are optional.
MIN_V1_SIZE = PluginV1.handle_free.offset + ctypes.sizeof(c_void_p)


def has_field(s, name):
    """Whether a struct the library filled or owns (of the struct_size it
    reports) holds field `name`: a table entry (MOE_EP_HAS_ENTRY) or a
    config field appended after that library was built."""
    field = getattr(type(s), name)
    return s.struct_size >= field.offset + field.size
