"""moe_ep.deep_ep.Buffer: the DeepEP V1 `deep_ep.Buffer` surface that
vLLM's deepep_* backends and SGLang's DeepEP dispatcher call, over moe-ep
groups: a low-latency group for low_latency_dispatch / combine (only on a
Buffer made with low_latency_mode=True, as in DeepEP) and a
high-throughput group for the normal-mode get_dispatch_layout / dispatch /
combine (on any Buffer: SGLang's `auto` mode prefills and decodes through
one low-latency Buffer).

Each group is created by the first call of its mode (collective, as that
call is on every rank). Its `moe_ep:` configuration is the constructor's
`moe_ep_config` dict, then, for the keys that dict leaves out, what the
first call shows: num_experts, hidden, top_k, max_tokens_per_rank (LL:
num_max_dispatch_tokens_per_rank; HT: the largest first batch over the
Buffer's torch.distributed group, rounded up to a power of two, at least
1024, or num_worst_tokens / world_size when the dispatch that creates the
group passes it), dispatch_dtype and fp8_scale (LL: use_fp8, use_ue8m0).
MOE_EP_<KEY> environment variables override any key (the library applies
them) except those the Buffer pins (_pin: each group's mode, the
low-latency group's max_tokens_per_rank). A normal-mode cap the Buffer
derived grows when a later layer call's batch exceeds it (_normal: the
group is closed and created again); a given one never does.

Bootstrap ports: with a torch.distributed group (or an mpi4py `comm`) and
no configured address, rank 0 picks a free port for each group and the
group learns it (_agree). A configured `bootstrap.address` serves the
Buffer's first group; its second group (both modes on one Buffer) takes
the next port.
"""
import functools
import os
import threading
import weakref

import torch

from .. import _library
from .. import errors as moe_ep_errors
from ..group import Group
from .._rank_named import name_rank_in
from . import _agree as agreement
from . import _low_latency, _normal, _pin
from .config import Config
from .event import capture
from ._refuse import refuse as _refuse


# moe_ep_config sections whose keys apply to one mode's group only.
_MODE_SECTIONS = ("low_latency", "high_throughput")


# The normal-mode (high-throughput) group's max_tokens_per_rank alone:
# MOE_EP_MAX_TOKENS_PER_RANK sets it too, but is read by the library for
# every group (the Buffer pins the low-latency group's, _pin).
_HT_TOKENS_ENV = agreement.HT_TOKENS_ENV


def _ht_tokens_from_env():
    v = os.environ.get(_HT_TOKENS_ENV)
    if v is None or v == "":
        return None
    try:
        n = int(v)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError("Buffer: %s=%r must be a positive integer (the normal-mode group's "
                         "max_tokens_per_rank)" % (_HT_TOKENS_ENV, v))
    return n


def _launcher_rank():
    """Whether the launcher's MOE_EP_RANK / MOE_EP_WORLD_SIZE are set."""
    return bool(os.environ.get("MOE_EP_RANK") and os.environ.get("MOE_EP_WORLD_SIZE"))


def _env_rank_world():
    """(rank, world size) from MOE_EP_RANK / MOE_EP_WORLD_SIZE (the
    launcher's), else from an initialised torch.distributed, else None."""
    rank, world = os.environ.get("MOE_EP_RANK"), os.environ.get("MOE_EP_WORLD_SIZE")
    if rank and world:
        try:
            return int(rank), int(world)
        except ValueError:
            raise ValueError("Buffer: MOE_EP_RANK=%r and MOE_EP_WORLD_SIZE=%r must be integers "
                             "(this process's rank and the number of ranks)"
                             % (rank, world)) from None
    if _torch_world_group() is not None:
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return None


def _torch_world_group():
    """torch.distributed's default group when it is initialised, else None."""
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.group.WORLD
    return None


class _StaticWithLibrary:
    """A static method, as DeepEP's (engines call it on the class, before
    any Buffer exists), that called on a Buffer uses that Buffer's
    library=: fn(library_or_None, *args)."""

    def __init__(self, fn):
        self.fn = fn
        self.__doc__ = fn.__doc__

    def __get__(self, obj, owner=None):
        return functools.partial(self.fn, getattr(obj, "_library", None))


def _low_latency_rdma_size_hint(library, num_max_dispatch_tokens_per_rank, hidden, num_ranks,
                                num_experts):
    """Bytes one rank's moe-ep LL buffers take for these maxima (bf16 and
    fp8 rows fit the same buffers; top_k: the config default). The values
    given are kept whatever MOE_EP_<KEY> overrides say (_pin), and a
    Buffer's library= is used when called on that Buffer."""
    return _pin.ll_size_hint(_library.resolve(library), num_max_dispatch_tokens_per_rank,
                             hidden, num_ranks, num_experts)


def _next_port(address):
    """host:port+1: the second group's address when one is configured."""
    host, _, port = address.rpartition(":")
    if not port.isdigit() or int(port) >= 65535:
        raise ValueError("Buffer: bootstrap.address=%s serves the Buffer's first group and the "
                         "next port its second; that needs a port below 65535" % address)
    return "%s:%d" % (host, int(port) + 1)


def _close_all(groups):
    """Closes every group in order, each even if closing an earlier one
    raised; the first error is raised after the last close."""
    first = None
    for g in groups:
        try:
            g.close()
        except BaseException as e:  # noqa: B902 - re-raised below
            if first is None:
                first = e
    if first is not None:
        raise first


class Buffer(_low_latency.LowLatencyMixin, _normal.NormalMixin):
    """DeepEP V1-compatible communication buffer over moe-ep."""

    num_sms = 20

    def __init__(self, group=None, num_nvl_bytes=0, num_rdma_bytes=0, low_latency_mode=False,
                 num_qps_per_rank=24, allow_nvlink_for_low_latency_mode=True,
                 allow_mnnvl=False, explicitly_destroy=False, enable_shrink=False, comm=None,
                 *, use_fabric=False, moe_ep_config=None, library=None):
        """Positional arguments in DeepEP's order. num_nvl_bytes,
        num_rdma_bytes and num_qps_per_rank size DeepEP's own buffers and
        queues; moe-ep allocates exactly what its config needs
        (Group.info().bytes_allocated), so they are recorded only.
        allow_mnnvl and use_fabric permit DeepEP to use a multi-node NVLink
        domain and fabric memory handles; moe-ep's peers are whatever NCCL
        reaches by NVLink, so they are recorded only as well."""
        if not allow_nvlink_for_low_latency_mode:
            _refuse("Buffer", "allow_nvlink_for_low_latency_mode", False,
                    "its LL path uses NVLink within a node; force the network path with "
                    "moe_ep_config={'transport': 'gin'}")
        if enable_shrink:
            _refuse("Buffer", "enable_shrink", True, "groups cannot drop ranks")
        if moe_ep_config is not None and not isinstance(moe_ep_config, dict):
            raise TypeError("Buffer: moe_ep_config must be a dict for the moe_ep: section, got %s"
                            % type(moe_ep_config).__name__)
        for section in _MODE_SECTIONS:
            value = (moe_ep_config or {}).get(section, {})
            if not isinstance(value, dict) or "mode" in value:
                raise TypeError("Buffer: moe_ep_config['%s'] must be a dict of the keys that "
                                "apply to the %s group only (no 'mode'), got %r"
                                % (section, section, value))
        self.group = group
        self.comm = comm
        if group is not None:
            self.rank, self.group_size = group.rank(), group.size()
        elif comm is not None:
            self.rank, self.group_size = comm.Get_rank(), comm.Get_size()
        else:
            found = _env_rank_world()
            if found is None:
                # DeepEP raises here too ("Either 'group' or 'comm' must be
                # provided"): every later default (the normal-mode layout,
                # the groups' world size) needs the rank count.
                raise ValueError(
                    "Buffer: group=None and comm=None, and neither MOE_EP_RANK / "
                    "MOE_EP_WORLD_SIZE nor an initialised torch.distributed give this "
                    "process's rank and world size; pass group= (a torch.distributed group) "
                    "or comm= (an mpi4py communicator)")
            self.rank, self.group_size = found
        # Whom the ranks agree through (the bootstrap port, the job token,
        # the normal-mode cap): the engine's group or comm, else, where the
        # rank came from an initialised torch.distributed rather than the
        # launcher's variables, its default group (with nothing to agree
        # through, every rank would take the library's default address and
        # its own cap).
        self._default_group = None
        if group is None and comm is None and not _launcher_rank():
            self._default_group = _torch_world_group()
        self.num_nvl_bytes = num_nvl_bytes
        self.num_rdma_bytes = num_rdma_bytes
        self.low_latency_mode = low_latency_mode
        self.num_qps_per_rank = num_qps_per_rank
        self.allow_mnnvl = allow_mnnvl
        self.use_fabric = use_fabric
        self.explicitly_destroy = explicitly_destroy
        self.enable_shrink = False
        self._user_config = dict(moe_ep_config or {})
        self._library = library
        self._ll_ep = None  # the moe_ep.Groups, created by each mode's first call
        self._ht_ep = None
        # Held from "no group yet" to the group set (_group_for): two threads'
        # first calls would otherwise both create one, two collective
        # group_creates on one address. Re-entrant: _ht_grow holds it from
        # dropping the normal-mode group to creating its successor.
        self._create = threading.RLock()
        # Made here, not at the first LL call: two micro-batch threads'
        # first calls would each make one and lose a turn.
        self._zero_copy = _low_latency.CombineBuffers()
        self._destroyed = False
        # The normal-mode group's growth (_normal): whether its cap was
        # derived (and may grow), the keys it was created from, whether its
        # address was agreed, its NormalHandles whose combine has not run,
        # and whether a normal-mode call of it was captured in a CUDA graph.
        self._ht_grows = False
        self._ht_derived = None
        self._ht_address_agreed = False
        self._ht_pending = weakref.WeakSet()
        self._layout_by_thread = {}  # NormalMixin._layout_put: per thread
        self._ht_captured = False
        # Normal-mode groups replaced while a combine of theirs was still to
        # run: (group, its NormalHandles still to combine), oldest first.
        self._ht_retired = []

    # ---- class side ------------------------------------------------------

    @staticmethod
    def set_num_sms(new_num_sms):
        """SMs for normal-mode kernels (DeepEP: even). Written to
        Buffer.num_sms, as DeepEP's staticmethod does, whether called on
        the class, a subclass or an instance (vLLM calls it on its Buffer),
        and read back through get_dispatch_config. Applied to a
        high-throughput group at its next dispatch without a config (a
        config's num_sms wins, as in DeepEP); LL kernels size their grid
        themselves, as in DeepEP (moe_ep.Group.set_num_sms bounds them)."""
        if new_num_sms % 2 != 0:
            raise ValueError("set_num_sms: new_num_sms=%d must be even" % new_num_sms)
        Buffer.num_sms = new_num_sms

    @staticmethod
    def capture():
        return capture()

    @staticmethod
    def get_dispatch_config(num_ranks):
        return Config(Buffer.num_sms)

    @staticmethod
    def get_combine_config(num_ranks):
        return Config(Buffer.num_sms)

    # Buffer.get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank,
    # hidden, num_ranks, num_experts), as DeepEP's static method.
    get_low_latency_rdma_size_hint = _StaticWithLibrary(_low_latency_rdma_size_hint)

    # ---- lifecycle -------------------------------------------------------

    def _mode_config(self, mode):
        """moe_ep_config as it applies to `mode`: its common keys, then the
        keys of its "low_latency" or "high_throughput" section, a nested
        section (bootstrap, timeouts) merged key by key, so a mode that sets
        bootstrap.timeout_ms keeps the common bootstrap.address; then, for
        high_throughput, MOE_EP_HT_MAX_TOKENS_PER_RANK."""
        cfg = {k: v for k, v in self._user_config.items() if k not in _MODE_SECTIONS}
        for key, value in self._user_config.get(mode, {}).items():
            if isinstance(value, dict) and isinstance(cfg.get(key), dict):
                cfg[key] = {**cfg[key], **value}
            else:
                cfg[key] = value
        if mode == "high_throughput":
            tokens = _ht_tokens_from_env()
            if tokens is not None:
                cfg["max_tokens_per_rank"] = tokens
        return cfg

    def _mode_sets_address(self, mode):
        """Whether `mode`'s own section names its bootstrap address, and it
        stands (MOE_EP_BOOTSTRAP_ADDRESS overrides every group's)."""
        if os.environ.get("MOE_EP_BOOTSTRAP_ADDRESS"):
            return False
        boot = self._user_config.get(mode, {}).get("bootstrap")
        return isinstance(boot, dict) and "address" in boot

    def _ht_given_tokens(self, user=None):
        """The normal-mode cap given to this rank, or None when the Buffer
        derives it: MOE_EP_MAX_TOKENS_PER_RANK (the library applies it over
        the rest), else moe_ep_config's or MOE_EP_HT_MAX_TOKENS_PER_RANK
        (`user`: _mode_config("high_throughput"))."""
        env = os.environ.get(agreement.TOKENS_ENV)
        if env:
            try:
                return int(env)
            except ValueError:
                return env  # the library refuses it, naming the variable
        if user is None:
            user = self._mode_config("high_throughput")
        return user.get("max_tokens_per_rank")

    def _group_for(self, mode, derived, keep_address=None):
        """The group of `mode` ("low_latency" or "high_throughput"), created
        on first use from `derived` (keys the first call shows).
        keep_address: the address of the group this one replaces, when it
        was configured rather than agreed (the normal-mode group grown)."""
        if self._destroyed:
            raise RuntimeError("Buffer: destroy() was called; create a new Buffer")
        attr = "_ll_ep" if mode == "low_latency" else "_ht_ep"
        g = getattr(self, attr)
        if g is not None:
            return g
        with self._create:
            g = getattr(self, attr)  # another thread's first call may have made it meanwhile
            if g is None:
                g = self._create_group(mode, attr, derived, keep_address)
        return g

    def _create_group(self, mode, attr, derived, keep_address):
        """_group_for's creation (in self._create)."""
        second = self._ll_ep is not None or self._ht_ep is not None
        cfg, agreed = self._config_for(mode, derived)
        # Resolved once: both groups use the same opened library.
        lib = self._library = _library.resolve(self._library)
        # What the environment makes of the config may differ by rank:
        # a failure here rides in the token round, which every rank
        # takes, so every rank raises instead of its peers waiting.
        try:
            config, failure = _pin.group_config(cfg, lib, mode), None
        except (ValueError, moe_ep_errors.Error) as e:
            config, failure = None, e
        self._agree_token(config, failure)
        if keep_address is not None and not agreed:
            config.set_bootstrap_address(keep_address)
        elif second and not agreed and not self._mode_sets_address(mode):
            # A shared address (moe_ep_config's common keys,
            # MOE_EP_BOOTSTRAP_ADDRESS or the default) serves the first
            # group; the port after it serves the second, on every rank
            # alike. An address in the mode's own section is its own.
            config.set_bootstrap_address(_next_port(config.bootstrap_address))
        rank = self.rank if self.rank >= 0 else None
        world = self.group_size if self.group_size >= 0 else None
        device = torch.cuda.current_device() if torch.cuda.is_available() else None
        g = Group(config, rank=rank, world_size=world,
                  device=device if self._wants_cuda() else None, library=lib)
        # explicitly_destroy: destroy() is the one collective teardown
        # (DeepEP's rule); a Buffer dropped on one rank leaves its
        # groups allocated rather than wait in GC for peers.
        g.close_at_gc = not self.explicitly_destroy
        self.rank, self.group_size = g.rank, g.world_size
        if mode == "high_throughput":
            self._ht_address_agreed = agreed
            if keep_address is None:  # the first normal-mode group, not a grown one
                self._ht_made(derived)
            if g.backend == "nccl":
                want = int(self.get_dispatch_config(self.group_size).num_sms)
                g.set_num_sms(want)
                self._ht_num_sms = want
        # Published last: another thread's call finds it only once it is set up.
        setattr(self, attr, g)
        return g

    def _check_live(self, entry):
        """Entries that may not reach a group (the torch layout, the
        buffer check) refuse a destroyed Buffer as those that do."""
        if self._destroyed:
            raise RuntimeError("%s: destroy() was called; create a new Buffer" % entry)

    def _live_group(self, mode, entry):
        """The group of `mode` a call on a handle needs: it exists once a
        dispatch of that mode made it, until destroy()."""
        g = self._ll_ep if mode == "low_latency" else self._ht_ep
        if g is None:
            raise RuntimeError(
                "%s: this Buffer has no %s group (%s); the handle must come from this "
                "Buffer's %s" % (entry, mode, "destroy() was called" if self._destroyed else
                                 "no dispatch of that mode ran on it yet",
                                 "low_latency_dispatch" if mode == "low_latency" else "dispatch"))
        return g

    def _config_for(self, mode, derived):
        """(the moe_ep: section of mode's group, whether its address was
        agreed over the torch.distributed group)."""
        user = self._mode_config(mode)
        cfg = dict(derived)
        cfg.update(user)
        cfg["mode"] = mode
        boot = dict(user.get("bootstrap", {}))
        want_address = "address" not in boot and not os.environ.get("MOE_EP_BOOTSTRAP_ADDRESS")
        ht = mode == "high_throughput"
        tokens = cfg.get("max_tokens_per_rank") if ht and "max_tokens_per_rank" not in user \
            else None
        given = self._ht_given_tokens(user) if ht else None
        address, tokens = self._agree(want_address, tokens, given, ht)
        if tokens is not None:
            cfg["max_tokens_per_rank"] = tokens
        if address is not None:
            boot["address"] = address
            cfg["bootstrap"] = boot
        return cfg, address is not None

    def _channel(self):
        """The rounds over the engine's group or comm, each bounded by the
        Buffer's bootstrap.timeout_ms (_channel_timeout_s)."""
        group = self.group
        if group is None and self.comm is None:
            group = self._default_group
        return agreement.channel(group, self.comm, self._channel_timeout_s())

    def _channel_timeout_s(self):
        """MOE_EP_BOOTSTRAP_TIMEOUT_MS where set (it overrides the
        configuration, as in the library), else the largest
        bootstrap.timeout_ms of moe_ep_config's common and per-mode
        sections, else the library's default (None)."""
        env = os.environ.get("MOE_EP_BOOTSTRAP_TIMEOUT_MS")
        values = [env] if env else []
        if not values:
            for section in (self._user_config, self._user_config.get("low_latency"),
                            self._user_config.get("high_throughput")):
                boot = section.get("bootstrap") if isinstance(section, dict) else None
                if isinstance(boot, dict) and boot.get("timeout_ms") is not None:
                    values.append(boot["timeout_ms"])
        try:
            return max(float(v) for v in values) / 1000.0 if values else None
        except (TypeError, ValueError):
            return None  # the library refuses the value, with its sentence, at group creation

    def _agree(self, want_address, tokens, given=None, check_given=False):
        """(rank 0's address, the ranks' largest token cap): _agree.group_keys
        over the Buffer's torch group or comm."""
        return agreement.group_keys(self._channel(), want_address, tokens, given, check_given)

    def _agree_token(self, config, failure=None):
        """The job token of config.bootstrap_token_env: _agree.job_token
        (config None: this rank's failure to build it, which every rank then
        raises)."""
        name = config.bootstrap_token_env if config is not None else None
        agreement.job_token(self._channel(), name, failure)

    def _wants_cuda(self):
        backend = os.environ.get("MOE_EP_BACKEND") or self._user_config.get("backend", "auto")
        return backend == "nccl" or (backend == "auto" and torch.cuda.is_available())

    @property
    def moe_ep_group(self):
        """The moe_ep.Group of the Buffer's mode (None before its first call)."""
        return self._ll_ep if self.low_latency_mode else self._ht_ep

    @property
    def moe_ep_normal_group(self):
        """The high-throughput moe_ep.Group of normal-mode calls (None
        before the first one)."""
        return self._ht_ep

    def destroy(self):
        """Releases the moe-ep groups (collective): the low-latency group, the
        normal-mode group and any it replaced that still waited for a
        combine, each closed even if closing an earlier one raises; the
        Buffer is unusable afterwards."""
        self._destroyed = True
        groups = [g for g in (self._ll_ep, self._ht_ep) if g is not None]
        groups += [g for g, _ in self._ht_retired]
        self._ll_ep = self._ht_ep = None
        self._ht_retired = []
        self._layouts_take_all()
        self._ht_pending = weakref.WeakSet()
        _close_all(groups)

    def __del__(self):
        if not getattr(self, "explicitly_destroy", True):
            try:
                self.destroy()
            except Exception:
                pass

    @staticmethod
    def is_sm90_compiled():
        """moe-ep's kernels are built for sm_90."""
        return True

    def get_comm_stream(self):
        """moe-ep runs every call on the caller's current stream."""
        return torch.cuda.current_stream()

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


name_rank_in(Buffer, lambda b: b.rank if b.rank >= 0 else None)
