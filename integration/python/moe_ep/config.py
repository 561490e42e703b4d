"""The `moe_ep:` configuration: from an engine YAML file, YAML text or a
dict, parsed by the library itself (config_from_yaml), so the rules, the
MOE_EP_<KEY> overrides and the error sentences are the library's."""
import ctypes
import json
import os

from . import _abi
from ._library import load


def _scalar(value, key):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # a double-quoted YAML scalar
    raise TypeError("moe_ep config: key '%s' has a %s value %r; values are str, int "
                    "or bool (nested sections are dicts)" % (key, type(value).__name__, value))


def dict_to_yaml(section):
    """YAML text of an engine file whose `moe_ep:` section is `section`
    (one level of nesting: bootstrap, timeouts)."""
    if "moe_ep" in section and len(section) == 1 and isinstance(section["moe_ep"], dict):
        section = section["moe_ep"]
    lines = ["moe_ep:"]
    if not section:
        return "moe_ep: {}\n"
    for key, value in section.items():
        if isinstance(value, dict):
            lines.append("  %s:" % key)
            for sub, v in value.items():
                lines.append("    %s: %s" % (sub, _scalar(v, "%s.%s" % (key, sub))))
        else:
            lines.append("  %s: %s" % (key, _scalar(value, key)))
    return "\n".join(lines) + "\n"


class Config:
    """An effective configuration (defaults filled in, MOE_EP_* overrides
    applied). Attributes use the YAML names and values."""

    def __init__(self, source=None, library=None):
        """source: an engine YAML path, YAML text, a dict for the moe_ep:
        section, or None for every default."""
        self._lib = library or load()
        if source is None:
            text = "moe_ep: {}\n"
        elif isinstance(source, dict):
            text = dict_to_yaml(source)
        elif isinstance(source, (str, os.PathLike)):
            text = os.fspath(source)
        else:
            raise TypeError("moe_ep config must be a YAML path, YAML text or a dict, "
                            "got %s" % type(source).__name__)
        out = ctypes.POINTER(_abi.Config)()
        st = self._lib.config_from_yaml(text.encode(), ctypes.byref(out))
        self._lib.check(st, "config_from_yaml")
        self._ptr = out
        c = out.contents
        self.backend = _abi.BACKENDS[c.backend]
        self.mode = _abi.MODES[c.mode]
        self.num_experts = c.num_experts
        self.hidden = c.hidden
        self.top_k = c.top_k
        self.max_tokens_per_rank = c.max_tokens_per_rank
        self.dispatch_dtype = _abi.DISPATCH_DTYPES[c.dispatch_dtype]
        self.fp8_scale = _abi.FP8_SCALES[c.fp8_scale]
        self.double_buffer = bool(c.double_buffer)
        self.transport = _abi.TRANSPORTS[c.transport]
        # A library older than the field returns a smaller struct: unset.
        self.ranks_per_node = c.ranks_per_node if _abi.has_field(c, "ranks_per_node") else 0
        self.bootstrap_address = c.bootstrap_address.decode()
        self.bootstrap_timeout_ms = c.bootstrap_timeout_ms
        self.bootstrap_token_env = c.bootstrap_token_env.decode()
        self.kernel_timeout_ms = c.kernel_timeout_ms
        self.log_level = _abi.LOG_LEVELS[c.log_level]

    def set_bootstrap_address(self, address):
        """Sets bootstrap.address after the YAML and the MOE_EP_* overrides
        (the struct's field, as an engine that fills the config itself
        sets it; group_create checks it like every other)."""
        raw = address.encode()
        if len(raw) >= _abi.ADDRESS_MAX:
            raise ValueError("moe_ep config: bootstrap.address '%s' is %d bytes; it must be "
                             "shorter than %d" % (address, len(raw), _abi.ADDRESS_MAX))
        self._ptr.contents.bootstrap_address = raw
        self.bootstrap_address = address

    # Keys pin() sets: the struct's int fields, and `mode` by name.
    _PINNABLE = ("mode", "num_experts", "hidden", "top_k", "max_tokens_per_rank")

    def pin(self, **keys):
        """Sets these keys after the YAML and the MOE_EP_* overrides, as
        set_bootstrap_address does: for a caller whose values must not be
        changed by the environment (group_create still checks them)."""
        c = self._ptr.contents
        for key, value in keys.items():
            if key not in self._PINNABLE:
                raise ValueError("moe_ep config: pin(%s=%r): only %s can be pinned"
                                 % (key, value, ", ".join(self._PINNABLE)))
            if key == "mode":
                if value not in _abi.MODES:
                    raise ValueError("moe_ep config: pin(mode=%r): mode is one of %s"
                                     % (value, ", ".join(_abi.MODES)))
                c.mode = _abi.MODES.index(value)
            else:
                setattr(c, key, int(value))
            setattr(self, key, value if key == "mode" else int(value))

    @property
    def fp8(self):
        return self.dispatch_dtype == "fp8_e4m3"

    def buffer_size_hint(self, world_size):
        """Bytes of communication buffers one rank holds for this config."""
        n = ctypes.c_uint64()
        st = self._lib.buffer_size_hint(self._ptr, int(world_size), ctypes.byref(n))
        self._lib.check(st, "buffer_size_hint")
        return n.value

    def __del__(self):
        ptr = getattr(self, "_ptr", None)
        if ptr:
            self._lib.config_free(ptr)
            self._ptr = None

    def __repr__(self):
        keys = ("backend", "mode", "num_experts", "hidden", "top_k", "max_tokens_per_rank",
                "dispatch_dtype", "fp8_scale", "double_buffer", "transport",
                "ranks_per_node", "bootstrap_address")
        return "moe_ep.Config(%s)" % ", ".join("%s=%r" % (k, getattr(self, k)) for k in keys)
