"""What a Buffer's ranks agree on, without ranks: the host rank 0
publishes (MOE_EP_BOOTSTRAP_HOST, MASTER_ADDR, else torch.distributed's
TCPStore host), the address and job token over an mpi4py-style `comm`,
and the overflow of a worst-case receive, learnt by every rank."""
import ipaddress
import os
import socket
import types

import pytest
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

import moe_ep.deep_ep._agree as agree
import moe_ep.deep_ep._normal as normal
from moe_ep.deep_ep import Buffer
from fake_comm import FakeComm
from spawn import free_ports, run_ranks


@pytest.fixture(autouse=True)
def no_host_variables(monkeypatch):
    for name in ("MOE_EP_BOOTSTRAP_HOST", "MASTER_ADDR", "MOE_EP_BOOTSTRAP_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MOE_EP_RANK", "0")
    monkeypatch.setenv("MOE_EP_WORLD_SIZE", "2")


def test_bootstrap_host(monkeypatch):
    """MOE_EP_BOOTSTRAP_HOST, else rank 0's own address on the route toward
    MASTER_ADDR, else 127.0.0.1."""
    monkeypatch.setattr(agree, "store_host", lambda: None)
    assert agree.bootstrap_host() == "127.0.0.1"
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    assert agree.bootstrap_host() == "127.0.0.1"
    # A host name that resolves to loopback here (Debian maps its own name
    # to 127.0.1.1) is published as the name, which other hosts resolve.
    name = socket.gethostname()
    monkeypatch.setenv("MASTER_ADDR", name)
    got = agree.bootstrap_host()
    assert got == name or not ipaddress.ip_address(got).is_loopback, got
    monkeypatch.setenv("MOE_EP_BOOTSTRAP_HOST", "10.9.8.7")
    assert agree.bootstrap_host() == "10.9.8.7"


def test_store_host_is_the_tcp_init_method(monkeypatch):
    """Without MASTER_ADDR (vLLM and SGLang initialise with tcp://host:port
    and export none), the default store's TCPStore host, found through the
    PrefixStore torch wraps it in, is what the route is taken toward."""
    port = free_ports(1)[0]
    store = dist.TCPStore("127.0.0.2", port, 1, True)  # all of 127/8 is this host
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    for wrapped in (store, dist.PrefixStore("default_pg", dist.PrefixStore("inner", store))):
        monkeypatch.setattr(distributed_c10d, "_get_default_store", lambda: wrapped)
        assert agree.store_host() == "127.0.0.2"
    monkeypatch.setattr(distributed_c10d, "_get_default_store", lambda: dist.HashStore())
    assert agree.store_host() is None
    # The published host comes from the store's: a routable name stays
    # routable (here: the route toward an address of another network).
    monkeypatch.setattr(agree, "store_host", lambda: "10.9.8.6")
    assert not agree.is_loopback(agree.bootstrap_host())


class _Picks:
    """randrange's stand-in: the given indices in turn."""

    def __init__(self, picks):
        self.picks = list(picks)

    def randrange(self, n):
        i = self.picks.pop(0)
        assert 0 <= i < n, (i, n)
        return i


def test_free_port_is_outside_the_ephemeral_range():
    """The port rank 0 publishes is one the kernel never hands a
    connection's local end (bind(0) picks from that range, where an
    outgoing connection could take the port before the group listens),
    and one nothing is bound to: a held port is passed over."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low, high = (int(v) for v in f.read().split()[:2])
    ranges = agree._port_ranges()
    if not ranges:
        pytest.skip("no room outside the ephemeral range %d-%d" % (low, high))
    for _ in range(50):
        port = agree.free_port()
        assert port < low or port > high, (port, low, high)
        assert not 29400 <= port < 32768, port  # rendezvous defaults, NodePorts
    a, b = ranges[0]
    held = socket.socket()
    try:
        for port in range(a, b - 1):
            try:
                held.bind(("", port))
                break
            except OSError:
                continue
        else:
            pytest.skip("no free port in %d-%d" % (a, b))
        held.listen(1)
        got = agree.free_port(_Picks([port - a, port - a] + [i - a for i in range(port + 1, b)]))
        assert got != port and a <= got < b, (got, port)
    finally:
        held.close()
    with socket.socket() as s:
        s.bind(("", got))  # free indeed


def _ipv6_loopback():
    """Whether this machine can bind IPv6's loopback (containers often
    cannot)."""
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_ipv6_hosts_are_published_in_brackets(monkeypatch):
    """An IPv6 literal is published as "[addr]:port" (the library splits
    "host:port" at the last colon only inside brackets), and rank 0's own
    address on the route toward an IPv6 MASTER_ADDR is taken in that
    family, where an IPv4 socket could not reach it at all."""
    assert agree.address_of("fd00::1", 29001) == "[fd00::1]:29001"
    assert agree.address_of("[fd00::1]", 29001) == "[fd00::1]:29001"
    assert agree.address_of("10.0.0.1", 29001) == "10.0.0.1:29001"
    assert agree.address_of("node-3", 29001) == "node-3:29001"
    if not _ipv6_loopback():
        pytest.skip("no IPv6 loopback here")
    monkeypatch.setattr(agree, "store_host", lambda: None)
    monkeypatch.setenv("MASTER_ADDR", "::1")
    assert agree.bootstrap_host() == "::1"


def test_free_port_checks_the_published_hosts_family():
    """A port bound in IPv6 is passed over for an IPv6 host and for a name
    (which may resolve to either family), not for an IPv4 address."""
    if not _ipv6_loopback():
        pytest.skip("no IPv6 loopback here")
    ranges = agree._port_ranges()
    if not ranges:
        pytest.skip("no room outside the ephemeral range")
    a, b = ranges[0]
    held = socket.socket(socket.AF_INET6)
    held.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    try:
        for port in range(a, b - 1):
            try:
                held.bind(("::", port))
            except OSError:
                continue
            if agree._bindable(port, [socket.AF_INET]):
                break
            held.close()
            held = socket.socket(socket.AF_INET6)
            held.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        else:
            pytest.skip("no port in %d-%d free in IPv4 and bindable in IPv6" % (a, b))
        held.listen(1)
        rest = [i - a for i in range(port + 1, b)]
        for host in ("::1", "node-3", None):
            got = agree.free_port(_Picks([port - a] + rest), host=host)
            assert got != port, (host, got)
        assert agree.free_port(_Picks([port - a]), host="127.0.0.1") == port
    finally:
        held.close()


def test_comm_agrees_address_and_token(monkeypatch):
    """With comm= (no torch group), rank 0's free port and a job token drawn
    on rank 0 reach every rank, as over a torch group."""
    monkeypatch.delenv("MOE_EP_JOB_TOKEN", raising=False)
    b = Buffer(None, comm=FakeComm(1, [["10.1.1.1:4242", None, None]]))
    assert b._agree(True, None) == ("10.1.1.1:4242", None)
    b.comm = FakeComm(1, [(None, "f" * 32, None)])
    b._agree_token(types.SimpleNamespace(bootstrap_token_env="MOE_EP_JOB_TOKEN"))
    assert os.environ["MOE_EP_JOB_TOKEN"] == "f" * 32
    monkeypatch.delenv("MOE_EP_JOB_TOKEN")
    b = Buffer(None, comm=FakeComm(0, [[None, None, None]]))
    address, _ = b._agree(True, None)
    host, port = address.rsplit(":", 1)
    assert host == "127.0.0.1" and 0 < int(port) < 65536


# A CUDA group's surface _receive_fits uses: nothing recorded.
GROUP = types.SimpleNamespace(_poll_fatal=lambda: None)


def test_config_failure_rides_in_the_token_round(monkeypatch):
    """A rank whose environment makes its group's config fail still takes
    the token round, carrying the failure: it raises its own exception, its
    peers a ValueError naming it, and none waits for a round it skipped."""
    monkeypatch.delenv("MOE_EP_JOB_TOKEN", raising=False)
    own = ValueError("Buffer: MOE_EP_MODE=high_throughput would make ...")
    comm = FakeComm(1, [(None, "f" * 32, None)])
    b = Buffer(None, comm=comm)
    with pytest.raises(ValueError, match="MOE_EP_MODE=high_throughput"):
        b._agree_token(None, own)
    assert len(comm.sent) == 1 and "MOE_EP_MODE" in comm.sent[0][2]
    b.comm = FakeComm(1, [(None, "f" * 32, "ValueError: bad key")])
    with pytest.raises(ValueError, match=r"rank 0 could not build its group's config \(ValueError: "
                                         r"bad key\); every rank raises"):
        b._agree_token(types.SimpleNamespace(bootstrap_token_env="MOE_EP_JOB_TOKEN"))
    assert "MOE_EP_JOB_TOKEN" not in os.environ


def test_every_rank_takes_the_address_round():
    """A rank that wants no address (its own MOE_EP_BOOTSTRAP_ADDRESS, say)
    still takes the round its peers take."""
    comm = FakeComm(1, [[None, None, None]])
    b = Buffer(None, comm=comm)
    assert b._agree(False, None) == (None, None)
    assert len(comm.sent) == 1


def receive(rows_over):
    """A CUDA-like worst-case result: no count, ids -1 past the receive."""
    idx = torch.full((8, 2), -1, dtype=torch.int32)
    idx[:4 + rows_over] = 0
    return types.SimpleNamespace(num_recv_tokens=None, recv_topk_idx=idx)


def test_worst_case_overflow_raises_on_every_rank(monkeypatch):
    """A receive past num_worst_tokens raises on every rank, naming the
    ranks that overflowed, so that no rank goes on to a combine its peers
    skip; while the stream is captured nothing is read."""
    monkeypatch.setattr(normal, "_capturing", lambda: False)
    b = Buffer(None, comm=FakeComm(0, [True]))  # rank 1 overflowed, this rank did not
    with pytest.raises(ValueError, match="rank 1 received more than num_worst_tokens=4 tokens "
                                         r"\(this rank: within it\)"):
        normal._receive_fits(b, GROUP, receive(0), 4, 8)
    b = Buffer(None, comm=FakeComm(0, [False]))
    normal._receive_fits(b, GROUP, receive(0), 4, 8)
    with pytest.raises(ValueError, match="rank 0 received more"):
        normal._receive_fits(b, GROUP, receive(1), 4, 8)
    # A host group's count decides alike.
    normal._receive_fits(b, GROUP, types.SimpleNamespace(num_recv_tokens=4), 4, 8)
    # Captured: no host read, no collective (the result has nothing to read).
    monkeypatch.setattr(normal, "_capturing", lambda: True)
    comm = FakeComm(0, [True])
    b = Buffer(None, comm=comm)
    normal._receive_fits(b, GROUP, types.SimpleNamespace(num_recv_tokens=None), 4, 8)
    assert comm.sent == []


def test_channel_rounds_over_gloo(tmp_path):
    """Real processes over torch.distributed (gloo): gather and max agree
    on every rank, and a round a peer skips raises moe_ep.TimeoutError
    naming the rank once the channel's bound passed
    (workers/agree_worker.py)."""
    ok, report = run_ranks(2, "agree_worker.py", args=[str(tmp_path)], timeout=300)
    assert ok, report
