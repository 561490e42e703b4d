"""How the DeepEP-compatible Buffer builds each mode's moe_ep: section from
moe_ep_config, without ranks: common keys, then the mode's own section, a
nested section merged key by key; the second group's address; the keys
the Buffer pins against MOE_EP_* overrides; the token caps."""
import types

import pytest
import torch
import torch.distributed

import moe_ep
import moe_ep.deep_ep.buffer as buffer_module
from moe_ep.deep_ep import Buffer, Config
from moe_ep.deep_ep._low_latency import LowLatencyHandle
from moe_ep.deep_ep._normal import NormalHandle
from spawn import library_path


@pytest.fixture(autouse=True)
def two_ranks(monkeypatch):
    """Rank 0 of 2 by the launcher's variables (a Buffer needs a rank and
    world size), and none of the overrides these tests set themselves."""
    monkeypatch.setenv("MOE_EP_RANK", "0")
    monkeypatch.setenv("MOE_EP_WORLD_SIZE", "2")
    for name in ("MOE_EP_MODE", "MOE_EP_MAX_TOKENS_PER_RANK", "MOE_EP_HT_MAX_TOKENS_PER_RANK",
                 "MOE_EP_BOOTSTRAP_ADDRESS"):
        monkeypatch.delenv(name, raising=False)


def test_mode_section_merges_nested_keys_into_the_common_ones():
    b = Buffer(None, moe_ep_config={
        "bootstrap": {"address": "10.1.2.3:29500", "timeout_ms": 60000},
        "timeouts": {"kernel_ms": 30000},
        "high_throughput": {"bootstrap": {"timeout_ms": 5000}, "max_tokens_per_rank": 1024}})
    ht = b._mode_config("high_throughput")
    assert ht["bootstrap"] == {"address": "10.1.2.3:29500", "timeout_ms": 5000}
    assert ht["timeouts"] == {"kernel_ms": 30000}
    assert ht["max_tokens_per_rank"] == 1024
    ll = b._mode_config("low_latency")
    assert ll["bootstrap"] == {"address": "10.1.2.3:29500", "timeout_ms": 60000}
    assert "max_tokens_per_rank" not in ll


class _FakeGroup:
    """Stands in for moe_ep.Group: records the config it was given."""
    made = []

    def __init__(self, config, **kw):
        self.config, self.rank, self.world_size, self.backend = config, 0, 2, "host"
        _FakeGroup.made.append(config)


@pytest.mark.parametrize("case", ["own", "shared", "own_under_env"])
def test_second_group_address(monkeypatch, case):
    """A mode's own address is used as given; a shared one (the common keys,
    or MOE_EP_BOOTSTRAP_ADDRESS, which overrides every group's) serves the
    first group and the port after it the second."""
    _FakeGroup.made = []
    monkeypatch.setattr(buffer_module, "Group", _FakeGroup)
    monkeypatch.delenv("MOE_EP_BOOTSTRAP_ADDRESS", raising=False)
    own = {"backend": "host",
           "low_latency": {"bootstrap": {"address": "127.0.0.1:4000"}},
           "high_throughput": {"bootstrap": {"address": "127.0.0.1:5000"}}}
    if case == "own":
        cfg, want = own, ["127.0.0.1:4000", "127.0.0.1:5000"]
    elif case == "shared":
        cfg = {"backend": "host", "bootstrap": {"address": "127.0.0.1:4000"}}
        want = ["127.0.0.1:4000", "127.0.0.1:4001"]
    else:
        monkeypatch.setenv("MOE_EP_BOOTSTRAP_ADDRESS", "127.0.0.1:6000")
        cfg, want = own, ["127.0.0.1:6000", "127.0.0.1:6001"]
    b = Buffer(None, moe_ep_config=cfg)
    keys = {"num_experts": 8, "hidden": 256, "top_k": 2, "max_tokens_per_rank": 8}
    b._group_for("low_latency", keys)
    b._group_for("high_throughput", keys)
    assert [c.bootstrap_address for c in _FakeGroup.made] == want


def test_ht_token_cap_from_its_own_variable(monkeypatch):
    """MOE_EP_HT_MAX_TOKENS_PER_RANK sizes the normal-mode group alone (the
    low-latency group keeps num_max_dispatch_tokens_per_rank), over
    moe_ep_config; a value that is not a positive integer is refused, named."""
    monkeypatch.setenv("MOE_EP_HT_MAX_TOKENS_PER_RANK", "16384")
    b = Buffer(None, moe_ep_config={"high_throughput": {"max_tokens_per_rank": 1024}})
    assert b._mode_config("high_throughput")["max_tokens_per_rank"] == 16384
    assert "max_tokens_per_rank" not in b._mode_config("low_latency")
    monkeypatch.setenv("MOE_EP_HT_MAX_TOKENS_PER_RANK", "lots")
    with pytest.raises(ValueError, match="MOE_EP_HT_MAX_TOKENS_PER_RANK='lots' must be a "
                                         "positive integer"):
        b._mode_config("high_throughput")


@pytest.mark.parametrize("batch,worst,want", [(5, 0, 1024), (3000, 0, 4096), (5, 5000, 2500),
                                              (5, 1000, 500), (5, 1001, 501), (3000, 2000, 3000)])
def test_ht_token_cap_from_the_first_call(monkeypatch, batch, worst, want):
    """The first normal-mode call's batch, rounded up to a power of two (at
    least 1024); with num_worst_tokens, ceil(num_worst_tokens / world_size)
    (so the library's rows are num_worst_tokens: no host check), or the
    batch when that is larger."""
    _FakeGroup.made = []
    monkeypatch.setattr(buffer_module, "Group", _FakeGroup)
    monkeypatch.delenv("MOE_EP_HT_MAX_TOKENS_PER_RANK", raising=False)
    b = Buffer(None, moe_ep_config={"backend": "host"})
    b.group_size = 2
    b._ht_group("dispatch", 8, 256, torch.zeros((batch, 2), dtype=torch.int64), worst)
    assert _FakeGroup.made[-1].max_tokens_per_rank == want


class _OneGroup:
    def __init__(self, rank, size):
        self._rank, self._size = rank, size

    def rank(self):
        return self._rank

    def size(self):
        return self._size


@pytest.mark.parametrize("given,want", [
    ([None, None], 4096), ([8192, 8192], None),
    ([None, 8192], "rank 0 none, rank 1 8192"), ([4096, 8192], "rank 0 4096, rank 1 8192")])
def test_ranks_agree_on_the_normal_mode_cap(monkeypatch, given, want):
    """The derived caps' largest serves every rank; caps given to ranks
    (moe_ep_config, MOE_EP_HT_MAX_TOKENS_PER_RANK) must be alike, and every
    rank raises naming each rank's when they are not."""
    derived = [1024, 4096] if given[0] is None else [None, None]

    def gather(out, mine, group=None):
        for r in range(2):
            out[r] = [None, derived[r], given[r]]
    monkeypatch.setattr(torch.distributed, "all_gather_object", gather)
    # A backend the channel has no tensor rounds for: it gathers objects.
    monkeypatch.setattr(torch.distributed, "get_backend", lambda group=None: "custom")
    monkeypatch.setattr(torch.distributed, "get_backend_config", lambda group=None: "xpu:custom",
                        raising=False)
    for rank in range(2):
        b = Buffer(None)
        b.group = _OneGroup(rank, 2)
        if isinstance(want, str):
            with pytest.raises(ValueError, match=want):
                b._agree(False, derived[rank], given[rank], True)
        else:
            assert b._agree(False, derived[rank], given[rank], True) == (None, want)


class _SmsGroup:
    backend = "nccl"

    def __init__(self):
        self.calls = []

    def set_num_sms(self, n):
        self.calls.append(n)


def test_ht_follows_set_num_sms_and_config(monkeypatch):
    """A normal dispatch applies config.num_sms, else the class's
    set_num_sms value, whenever it differs from the group's (DeepEP sizes
    every call so); unchanged, nothing is called."""
    monkeypatch.setattr(Buffer, "num_sms", 20)
    b = Buffer(None)
    g = _SmsGroup()
    b._ht_num_sms = 20
    b._ht_sms(g, None)
    Buffer.set_num_sms(24)
    b._ht_sms(g, None)
    b._ht_sms(g, None)
    b._ht_sms(g, Config(32))
    b._ht_sms(g, Config(32))
    assert g.calls == [24, 32]


def test_a_buffer_needs_ranks(monkeypatch):
    """Without group, comm, MOE_EP_RANK / MOE_EP_WORLD_SIZE or an initialised
    torch.distributed the constructor raises (as DeepEP's), naming what is
    missing, instead of guessing shapes at the first call."""
    monkeypatch.delenv("MOE_EP_RANK")
    monkeypatch.delenv("MOE_EP_WORLD_SIZE")
    assert not torch.distributed.is_initialized()
    with pytest.raises(ValueError, match="group=None and comm=None, and neither MOE_EP_RANK"):
        Buffer(None)
    monkeypatch.setenv("MOE_EP_RANK", "one")
    monkeypatch.setenv("MOE_EP_WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="MOE_EP_RANK='one' and MOE_EP_WORLD_SIZE='2' must be"):
        Buffer(None)


def test_set_num_sms_writes_buffer_num_sms(monkeypatch):
    """DeepEP's staticmethod: the value lands on Buffer.num_sms whether the
    class, a subclass or an instance is called, and get_dispatch_config
    reads it."""
    monkeypatch.setattr(Buffer, "num_sms", 20)

    class Engine(Buffer):
        pass

    Engine.set_num_sms(12)
    assert Buffer.num_sms == 12 and Buffer.get_dispatch_config(2).num_sms == 12
    Engine(None).set_num_sms(14)
    assert Buffer.num_sms == 14 and Engine.get_combine_config(2).num_sms == 14


def test_overrides_keep_the_low_latency_group(monkeypatch):
    """MOE_EP_MAX_TOKENS_PER_RANK (the library's, meant for prefill) sets the
    normal-mode group's cap and leaves the low-latency group's
    num_max_dispatch_tokens_per_rank and mode; MOE_EP_MODE naming the other
    mode raises, naming the variable."""
    _FakeGroup.made = []
    monkeypatch.setattr(buffer_module, "Group", _FakeGroup)
    monkeypatch.setenv("MOE_EP_MAX_TOKENS_PER_RANK", "8192")
    b = Buffer(None, moe_ep_config={"backend": "host", "bootstrap": {"address": "127.0.0.1:4000"}})
    keys = {"num_experts": 8, "hidden": 256, "top_k": 2, "max_tokens_per_rank": 8}
    b._group_for("low_latency", keys)
    b._group_for("high_throughput", keys)
    ll, ht = _FakeGroup.made
    assert (ll.mode, ll.max_tokens_per_rank) == ("low_latency", 8)
    assert (ht.mode, ht.max_tokens_per_rank) == ("high_throughput", 8192)
    for mode, other in (("low_latency", "HIGH_THROUGHPUT"), ("high_throughput", "low_latency")):
        monkeypatch.setenv("MOE_EP_MODE", other)
        with pytest.raises(ValueError, match="MOE_EP_MODE=%s would make the Buffer's %s group"
                                             % (other, mode)):
            Buffer(None, moe_ep_config={"backend": "host"})._group_for(mode, keys)


def test_rdma_size_hint_ignores_overrides_and_takes_the_buffers_library(monkeypatch):
    """The hint is a static method, as DeepEP's (engines call it on the
    class); overrides of its keys change neither the number nor make it
    raise; called on a Buffer, it asks that Buffer's library."""
    args = (128, 7168, 8, 256)
    plain = Buffer.get_low_latency_rdma_size_hint(*args)
    assert plain > 0
    monkeypatch.setenv("MOE_EP_MAX_TOKENS_PER_RANK", "8192")
    monkeypatch.setenv("MOE_EP_HIDDEN", "2048")
    assert Buffer.get_low_latency_rdma_size_hint(*args) == plain
    monkeypatch.setenv("MOE_EP_MODE", "high_throughput")
    assert Buffer.get_low_latency_rdma_size_hint(*args) == plain

    lib = moe_ep.Library(library_path())
    asked = []
    real = lib.buffer_size_hint
    lib.buffer_size_hint = lambda *a: asked.append(a) or real(*a)
    assert Buffer(None, library=lib).get_low_latency_rdma_size_hint(*args) == plain
    assert len(asked) == 1


def test_calls_without_a_group_say_so():
    """A handle's call on a Buffer without that mode's group (destroyed, or
    never dispatched) raises RuntimeError naming the entry."""
    b = Buffer(None)
    ll = LowLatencyHandle(None, types.SimpleNamespace(topk_idx=torch.zeros((2, 2))), 8, 256, 8)
    with pytest.raises(RuntimeError, match="get_next_low_latency_combine_buffer: this Buffer "
                                           "has no low_latency group"):
        b.get_next_low_latency_combine_buffer(ll)
    with pytest.raises(RuntimeError, match="low_latency_combine: this Buffer has no low_latency"):
        b.low_latency_combine(torch.zeros(1), torch.zeros((2, 2)), None, ll)
    nh = NormalHandle(None, torch.zeros((2, 2)), None, None, 0)
    b.destroy()
    with pytest.raises(RuntimeError, match=r"combine: this Buffer has no high_throughput group "
                                           r"\(destroy\(\) was called\)"):
        b.combine(torch.zeros((2, 8), dtype=torch.bfloat16), nh)


def test_pre_quantised_x_is_checked():
    """(x_fp8, scales): each a tensor, scales one row per token."""
    b = Buffer(None)
    q = torch.zeros((2, 256), dtype=torch.uint8)
    with pytest.raises(TypeError, match=r"x\[1\] \(scales\) must be a torch.Tensor, got NoneType"):
        b.dispatch((q, None))
    with pytest.raises(NotImplementedError, match=r"scales are \[num_tokens, hidden/128\] float32"):
        b.dispatch((q, torch.ones((2, 3))))
