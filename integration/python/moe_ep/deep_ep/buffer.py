"""moe_ep.deep_ep.Buffer: the DeepEP V1 `deep_ep.Buffer` surface that
vLLM's deepep_* backends and SGLang's DeepEP dispatcher call, over one
moe-ep group per Buffer (low-latency or high-throughput mode).

The group is created on the Buffer's first operation (collective, as the
first operation is on every rank). Its `moe_ep:` configuration is the
constructor's `moe_ep_config` dict, then, for the keys that dict leaves
out, what the first call shows: num_experts, hidden, top_k,
max_tokens_per_rank (LL: num_max_dispatch_tokens_per_rank; HT: the first
batch's token count rounded up to a power of two, at least 1024),
dispatch_dtype and fp8_scale (LL: use_fp8, use_ue8m0). MOE_EP_<KEY>
environment variables override any key (the library applies them).
"""
import os
import socket

import torch

from .. import _library
from ..config import Config as MoeEpConfig
from ..group import Group
from . import _low_latency, _normal
from .config import Config
from .event import capture
from ._refuse import refuse as _refuse


class Buffer(_low_latency.LowLatencyMixin, _normal.NormalMixin):
    """DeepEP V1-compatible communication buffer over moe-ep."""

    num_sms = 20

    def __init__(self, group=None, num_nvl_bytes=0, num_rdma_bytes=0, low_latency_mode=False,
                 *, num_qps_per_rank=24, allow_nvlink_for_low_latency_mode=True,
                 allow_mnnvl=False, use_fabric=False, explicitly_destroy=False,
                 enable_shrink=False, comm=None, moe_ep_config=None, library=None):
        """num_nvl_bytes, num_rdma_bytes and num_qps_per_rank size DeepEP's
        own buffers and queues; moe-ep allocates exactly what its config
        needs (Group.info().bytes_allocated), so they are recorded only."""
        if not allow_nvlink_for_low_latency_mode:
            _refuse("Buffer", "allow_nvlink_for_low_latency_mode", False,
                    "its LL path uses NVLink within a node; force the network path with "
                    "moe_ep_config={'transport': 'gin'}")
        if allow_mnnvl:
            _refuse("Buffer", "allow_mnnvl", True, "multi-node NVLink domains are not supported")
        if use_fabric:
            _refuse("Buffer", "use_fabric", True, "fabric memory handles are not used")
        if enable_shrink:
            _refuse("Buffer", "enable_shrink", True, "groups cannot drop ranks")
        if moe_ep_config is not None and not isinstance(moe_ep_config, dict):
            raise TypeError("Buffer: moe_ep_config must be a dict for the moe_ep: section, got %s"
                            % type(moe_ep_config).__name__)
        self.group = group
        self.comm = comm
        if group is not None:
            self.rank, self.group_size = group.rank(), group.size()
        elif comm is not None:
            self.rank, self.group_size = comm.Get_rank(), comm.Get_size()
        else:
            self.rank = int(os.environ.get("MOE_EP_RANK", "-1"))
            self.group_size = int(os.environ.get("MOE_EP_WORLD_SIZE", "-1"))
        self.num_nvl_bytes = num_nvl_bytes
        self.num_rdma_bytes = num_rdma_bytes
        self.low_latency_mode = low_latency_mode
        self.num_qps_per_rank = num_qps_per_rank
        self.explicitly_destroy = explicitly_destroy
        self._user_config = dict(moe_ep_config or {})
        self._library = library
        self._ep = None  # the moe_ep.Group, created on first use
        self._destroyed = False

    # ---- class side ------------------------------------------------------

    @classmethod
    def set_num_sms(cls, new_num_sms):
        """SMs for normal-mode kernels (DeepEP: even). Applied to
        high-throughput groups created afterwards; LL kernels size their
        grid themselves, as in DeepEP (moe_ep.Group.set_num_sms bounds them)."""
        if new_num_sms % 2 != 0:
            raise ValueError("set_num_sms: new_num_sms=%d must be even" % new_num_sms)
        cls.num_sms = new_num_sms

    @staticmethod
    def capture():
        return capture()

    @staticmethod
    def get_dispatch_config(num_ranks):
        return Config(Buffer.num_sms)

    @staticmethod
    def get_combine_config(num_ranks):
        return Config(Buffer.num_sms)

    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks,
                                       num_experts):
        """Bytes one rank's moe-ep LL buffers take for these maxima (bf16 and
        fp8 rows fit the same buffers; top_k: the config default)."""
        cfg = MoeEpConfig({"mode": "low_latency", "num_experts": int(num_experts),
                           "hidden": int(hidden),
                           "max_tokens_per_rank": int(num_max_dispatch_tokens_per_rank)},
                          _library.load())
        return cfg.buffer_size_hint(num_ranks)

    # ---- lifecycle -------------------------------------------------------

    def _config_for(self, derived):
        cfg = dict(derived)
        cfg.update(self._user_config)
        cfg["mode"] = "low_latency" if self.low_latency_mode else "high_throughput"
        if "bootstrap" not in self._user_config or "address" not in self._user_config["bootstrap"]:
            address = self._agreed_address()
            if address is not None:
                cfg["bootstrap"] = dict(self._user_config.get("bootstrap", {}), address=address)
        return cfg

    def _agreed_address(self):
        """With a torch.distributed group and no configured address, rank 0
        picks a free port and the group learns it, so every Buffer gets its
        own bootstrap port without configuration."""
        if self.group is None or os.environ.get("MOE_EP_BOOTSTRAP_ADDRESS"):
            return None
        import torch.distributed as dist
        box = [None]
        if self.group.rank() == 0:
            host = os.environ.get("MASTER_ADDR", "127.0.0.1")
            with socket.socket() as s:
                s.bind(("", 0))
                box[0] = "%s:%d" % (host, s.getsockname()[1])
        get_global = getattr(dist, "get_global_rank", None) or \
            dist.distributed_c10d._get_global_rank
        dist.broadcast_object_list(box, src=get_global(self.group, 0), group=self.group)
        return box[0]

    def _group_for(self, derived):
        if self._destroyed:
            raise RuntimeError("Buffer: destroy() was called; create a new Buffer")
        if self._ep is None:
            rank = self.rank if self.rank >= 0 else None
            world = self.group_size if self.group_size >= 0 else None
            device = torch.cuda.current_device() if torch.cuda.is_available() else None
            self._ep = Group(self._config_for(derived), rank=rank, world_size=world,
                             device=device if self._wants_cuda() else None,
                             library=self._library)
            self.rank, self.group_size = self._ep.rank, self._ep.world_size
            if not self.low_latency_mode and self._ep.backend == "nccl":
                self._ep.set_num_sms(Buffer.num_sms)
        return self._ep

    def _wants_cuda(self):
        backend = self._user_config.get("backend", os.environ.get("MOE_EP_BACKEND", "auto"))
        return backend == "nccl" or (backend == "auto" and torch.cuda.is_available())

    @property
    def moe_ep_group(self):
        """The moe_ep.Group underneath (None before the first operation)."""
        return self._ep

    def destroy(self):
        """Releases the moe-ep group (collective)."""
        if self._ep is not None:
            self._ep.close()
            self._ep = None
        self._destroyed = True

    def __del__(self):
        if not getattr(self, "explicitly_destroy", True):
            try:
                self.destroy()
            except Exception:
                pass

    def get_local_device_id(self):
        return torch.cuda.current_device()

    def get_num_rdma_ranks(self):
        return 1

    def get_rdma_rank(self):
        return 0

    def get_root_rdma_rank(self, global_rank):
        return 0

    def get_local_buffer_tensor(self, *args, **kwargs):
        _refuse("get_local_buffer_tensor", "buffer", "local", "the communication buffers "
                "belong to the library and are not exposed as tensors")

