"""How the DeepEP-compatible Buffer builds each mode's moe_ep: section from
moe_ep_config, without ranks: common keys, then the mode's own section, a
nested section merged key by key; the second group's address."""
import ipaddress
import socket

import pytest
import torch
import torch.distributed

import moe_ep.deep_ep.buffer as buffer_module
from moe_ep.deep_ep import Buffer, Config


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
                                              (5, 1000, 1024)])
def test_ht_token_cap_from_the_first_call(monkeypatch, batch, worst, want):
    """The first normal-mode call's batch, rounded up to a power of two (at
    least 1024), or num_worst_tokens / world_size when that is larger."""
    _FakeGroup.made = []
    monkeypatch.setattr(buffer_module, "Group", _FakeGroup)
    monkeypatch.delenv("MOE_EP_HT_MAX_TOKENS_PER_RANK", raising=False)
    b = Buffer(None, moe_ep_config={"backend": "host"})
    b.group_size = 2
    b._ht_group("dispatch", 8, 256, torch.zeros((batch, 2), dtype=torch.int64), worst)
    assert _FakeGroup.made[-1].max_tokens_per_rank == want


def test_bootstrap_host(monkeypatch):
    """The host rank 0 publishes with its port: MOE_EP_BOOTSTRAP_HOST, else
    its own address on the route toward MASTER_ADDR, else 127.0.0.1."""
    monkeypatch.delenv("MOE_EP_BOOTSTRAP_HOST", raising=False)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    assert buffer_module._bootstrap_host() == "127.0.0.1"
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    assert buffer_module._bootstrap_host() == "127.0.0.1"
    # A host name that resolves to loopback here (Debian maps its own name
    # to 127.0.1.1) is published as the name, which other hosts resolve.
    name = socket.gethostname()
    monkeypatch.setenv("MASTER_ADDR", name)
    got = buffer_module._bootstrap_host()
    assert got == name or not ipaddress.ip_address(got).is_loopback, got
    monkeypatch.setenv("MOE_EP_BOOTSTRAP_HOST", "10.9.8.7")
    assert buffer_module._bootstrap_host() == "10.9.8.7"


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
