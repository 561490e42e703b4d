"""Makes the package (integration/python) and the tests' helpers
importable when pytest runs from any folder; one_rank_group for tests
that run one real rank in this process."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
for p in (os.path.dirname(HERE), HERE):
    if p not in sys.path:
        sys.path.insert(0, p)


@pytest.fixture
def one_rank_group(monkeypatch):
    """make(**keys): a moe_ep.Group of one real rank on the host backend in
    this process, from the config keys, on a free loopback port (whatever
    MOE_EP_BOOTSTRAP_ADDRESS says); closed after the test."""
    import moe_ep
    from spawn import free_ports
    monkeypatch.delenv("MOE_EP_BOOTSTRAP_ADDRESS", raising=False)
    groups = []

    def make(**keys):
        cfg = dict(keys, backend="host",
                   bootstrap={"address": "127.0.0.1:%d" % free_ports(1)[0]})
        groups.append(moe_ep.Group(cfg, rank=0, world_size=1))
        return groups[-1]
    yield make
    for g in groups:
        g.close()
