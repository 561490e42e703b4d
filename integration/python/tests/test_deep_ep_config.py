"""How the DeepEP-compatible Buffer builds each mode's moe_ep: section from
moe_ep_config, without ranks: common keys, then the mode's own section, a
nested section merged key by key; the second group's address."""
import pytest

import moe_ep.deep_ep.buffer as buffer_module
from moe_ep.deep_ep import Buffer


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
