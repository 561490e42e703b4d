"""A DeepEP-compatible Buffer's normal-mode group whose token cap the
Buffer derived grows when a later batch exceeds it (real processes on the
host backend, values against the oracle); the agreement's pieces in this
process: the device a torch group all-reduces on, the largest batch over
comm=, and what is never agreed."""
import types

import pytest
import torch

import moe_ep.deep_ep._agree as agree
import moe_ep.deep_ep._normal as normal
from moe_ep.deep_ep import Buffer
from fake_comm import FakeComm
from spawn import run_ranks


def test_derived_cap_grows_two_ranks():
    ok, report = run_ranks(2, "deep_ep_grow_worker.py", timeout=180)
    assert ok, report


@pytest.fixture(autouse=True)
def rank_zero_of_two(monkeypatch):
    monkeypatch.setenv("MOE_EP_RANK", "0")
    monkeypatch.setenv("MOE_EP_WORLD_SIZE", "2")
    for name in ("MOE_EP_MAX_TOKENS_PER_RANK", "MOE_EP_HT_MAX_TOKENS_PER_RANK"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("backend,want", [
    ("gloo", "cpu"), ("nccl", "cuda"), ("mpi", "cpu"), ("cpu:gloo,cuda:nccl", "cpu"),
    ("cuda:nccl", "cuda"), ("hccl", None)])
def test_reduce_device(backend, want):
    """A torch group all-reduces on CPU where its backend has one, on the
    current CUDA device for nccl alone, and gathers for any other."""
    assert agree.reduce_device(backend) == want


class OneGroup:
    def rank(self):
        return 0

    def size(self):
        return 2


def test_channel_max(monkeypatch):
    """comm=: the largest of allgather's values; a gloo torch group (or
    torch 2's "undefined" one whose config has a CPU backend): one
    all_reduce (MAX) of a 1-element int64 CPU tensor, started asynchronously
    (its wait is bounded); another backend: a gather."""
    assert agree.Channel(None, FakeComm(1, [4096])).max(7) == 4096
    dist = torch.distributed
    reduced = []

    class Done:  # a collective started with async_op=True that has completed
        def is_completed(self):
            return True

        def wait(self):
            return True

    def all_reduce(t, op=None, group=None, async_op=False):
        reduced.append((tuple(t.shape), t.dtype, t.device.type, op, async_op))
        t.fill_(max(int(t.item()), 3000))
        return Done() if async_op else None
    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
    ch = agree.Channel(OneGroup(), None)
    assert ch.max(12) == 3000 and ch.max(5000) == 5000
    assert reduced == [((1,), torch.int64, "cpu", dist.ReduceOp.MAX, True)] * 2

    # torch 2: a group made without naming its backend is "undefined" to
    # get_backend, and its config maps devices.
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "undefined")
    monkeypatch.setattr(dist, "get_backend_config", lambda group=None: "cpu:gloo,cuda:nccl",
                        raising=False)
    assert ch.max(1) == 3000 and len(reduced) == 3

    def gather(out, obj, group=None):
        out[:] = [obj, 9]
    monkeypatch.setattr(dist, "all_gather_object", gather)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "custom")
    monkeypatch.setattr(dist, "get_backend_config", lambda group=None: "xpu:custom")
    assert ch.max(4) == 9 and len(reduced) == 3


class CappedGroup:
    def __init__(self, cap):
        self.config = types.SimpleNamespace(max_tokens_per_rank=cap)


def growable(comm, cap=1024):
    b = Buffer(None, comm=comm)
    b._ht_ep = CappedGroup(cap)
    b._ht_grows = True
    return b


def test_what_agrees_nothing(monkeypatch):
    """A given cap, a Buffer with neither group nor comm, and a captured
    stream keep the group and run no collective; within the cap the group
    is kept after one."""
    idx = torch.zeros((5000, 2), dtype=torch.int64)
    comm = FakeComm(0, [9000])
    b = growable(comm)
    b._ht_grows = False  # a given cap
    g = b._ht_ep
    assert b._ht_fit("dispatch", idx) is g and comm.sent == []
    b = growable(None, 1024)  # MOE_EP_RANK / MOE_EP_WORLD_SIZE only: no channel
    assert b._channel() is None and b._ht_fit("dispatch", idx) is b._ht_ep
    monkeypatch.setattr(normal, "_capturing", lambda: True)
    b = growable(comm)
    assert b._ht_fit("dispatch", idx) is b._ht_ep and comm.sent == []
    monkeypatch.setattr(normal, "_capturing", lambda: False)
    comm = FakeComm(0, [900])
    b = growable(comm)
    assert b._ht_fit("dispatch", idx[:1000]) is b._ht_ep and comm.sent == [1000]


def test_growth_refused_on_every_rank(monkeypatch):
    """A peer that captured a normal-mode call in a CUDA graph makes this
    rank refuse too, naming it, and nothing is closed or retired (a held
    dispatch alone retires the group instead: deep_ep_grow_worker.py)."""
    monkeypatch.setattr(normal, "_capturing", lambda: False)

    class Gathers(FakeComm):
        def allgather(self, obj):
            self.sent.append(obj)
            return [obj, 3000] if len(self.sent) == 1 else [obj, (3000, 2, True, None)]
    b = growable(Gathers(0, [None]))
    with pytest.raises(RuntimeError, match=r"dispatch: topk_idx has 3000 tokens on rank 1 \(this "
                                           r"rank: 10\), above the normal-mode group's "
                                           r"max_tokens_per_rank=1024.*but rank 1 captured "
                                           r"normal-mode calls.*'max_tokens_per_rank': 4096"):
        b._ht_fit("dispatch", torch.zeros((10, 2), dtype=torch.int64))
    assert isinstance(b._ht_ep, CappedGroup) and b._ht_retired == []


def test_given_caps(monkeypatch):
    """MOE_EP_MAX_TOKENS_PER_RANK (the library's, which wins),
    MOE_EP_HT_MAX_TOKENS_PER_RANK and moe_ep_config give the cap; only a
    Buffer given none derives (and grows) it."""
    assert Buffer(None)._ht_given_tokens() is None
    assert Buffer(None, moe_ep_config={"max_tokens_per_rank": 512})._ht_given_tokens() == 512
    monkeypatch.setenv("MOE_EP_HT_MAX_TOKENS_PER_RANK", "2048")
    assert Buffer(None)._ht_given_tokens() == 2048
    monkeypatch.setenv("MOE_EP_MAX_TOKENS_PER_RANK", "8192")
    assert Buffer(None)._ht_given_tokens() == 8192
