"""A peer that does not make a collective call (host backend, 2 ranks):
rank 0's call raises moe_ep.TimeoutError (or PeerFailedError where the
peer is gone) naming rank 0 and the rank it waited for, instead of
hanging; every later call on the failed group raises again; the Buffer or
Group is then destroyed on both ranks and both processes exit 0.

Scenarios, each on a group of its own (timeouts.kernel_ms short, the
bootstrap's bound generous):
  buffer_skip:  DeepEP Buffer; after a round trip, rank 1 skips the next
                low_latency_dispatch (alive, idle) until rank 0 gave up.
  group_skip:   moe_ep.Group (prepare / dispatch directly); rank 1 makes
                the group and never dispatches until rank 0 gave up.
  buffer_leave: Buffer; after a round trip rank 1 destroys its Buffer
                instead of dispatching; rank 0 dispatches with
                return_recv_hook=True and runs the hook.
  buffer_dies:  Buffer; after a round trip rank 1's process exits without
                destroying anything (last: rank 1 ends there).

The ranks order their steps through marker files in argv[1], never by
sleeping: no check depends on how long anything takes. A call that has
not returned after HANG_S is reported as a hang (rank, expected, got) and
the process ends."""
import os
import re
import sys
import threading
import time

import numpy as np
import torch

import common
import moe_ep
import oracle
from common import RANK, WORLD, bits, bf16_tensor, fail, same
from moe_ep.deep_ep import Buffer

FOLDER = sys.argv[1]
P = oracle.Problem(WORLD, num_experts=4 * WORLD, hidden=256, top_k=4, max_tokens=16)
KERNEL_MS = 5000   # the bound rank 0's wait runs into
HANG_S = 240       # only to turn a hang into a report; never a measurement
PEER = 1 - RANK


def config(port_index, **keys):
    """A host-backend section with a short data-path bound (the bootstrap
    keeps common's generous one: it bounds group creation on a loaded
    machine)."""
    c = common.config(port_index, **keys)
    c["timeouts"] = {"kernel_ms": KERNEL_MS}
    return c


def log(text):
    print("rank %d: %s" % (RANK, text), flush=True)


# ---- out-of-band order ------------------------------------------------------

def mark(name):
    with open(os.path.join(FOLDER, name), "w") as f:
        f.write("rank %d\n" % RANK)


def await_mark(name):
    path = os.path.join(FOLDER, name)
    deadline = time.monotonic() + HANG_S
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            fail(name, "-", "want the peer's marker %r, got none after %d s" % (name, HANG_S))
            common.finish()
        time.sleep(0.01)


def bounded(what, fn):
    """fn() on a second thread; returns ("ok", value) or ("raised", exc).
    A call still running after HANG_S is a hang: reported, and the process
    ends (the stuck thread cannot be freed)."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - returned to the caller
            box["exc"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(HANG_S)
    if t.is_alive():
        fail(what, "-", "want it to return or raise; got still running after %d s" % HANG_S)
        common.finish()
    return ("raised", box["exc"]) if "exc" in box else ("ok", box.get("value"))


def names_ranks(e):
    """The message names this rank and the peer it waited for."""
    text = str(e)
    return all(re.search(r"\brank %d\b" % r, text) for r in (RANK, PEER))


def expect_failure(what, fn, classes):
    """fn() must raise one of `classes` whose message names rank 0 and
    rank 1; returns the exception (or None after reporting)."""
    want = " or ".join("moe_ep.%s" % c.__name__ for c in classes)
    kind, got = bounded(what, fn)
    if kind == "ok":
        fail(what, "-", "want %s naming rank %d and rank %d; got a return (%r)"
             % (want, RANK, PEER, type(got).__name__))
        return None
    if not isinstance(got, classes):
        fail(what, "-", "want %s; got %s(%r)" % (want, type(got).__name__, str(got)))
        return None
    if not names_ranks(got):
        fail(what, "-", "want a message naming rank %d and rank %d; got %r" % (RANK, PEER, str(got)))
    log("%s raised %s: %s" % (what, type(got).__name__, got))
    return got


def expect_again(what, first, fn):
    """A later call on the failed group raises the first failure's class
    with its sentence."""
    kind, got = bounded(what, fn)
    if kind == "ok":
        fail(what, "-", "want %s again (the group failed); got a return"
             % type(first).__name__)
        return
    if type(got) is not type(first):
        fail(what, "-", "want %s again; got %s(%r)" % (type(first).__name__, type(got).__name__,
                                                       str(got)))
        return
    # The library's first failure's sentence, whatever entry reports it now.
    if str(first) not in str(got):
        fail(what, "-", "want the first failure's sentence %r in it; got %r"
             % (str(first), str(got)))
        return
    log("%s raised %s again: %s" % (what, type(got).__name__, got))


def expect_returns(what, fn):
    kind, got = bounded(what, fn)
    if kind == "raised":
        fail(what, "-", "want it to return; got %s(%r)" % (type(got).__name__, str(got)))


# ---- inputs -----------------------------------------------------------------

def inputs(seed):
    every = oracle.all_inputs(P, seed)
    inp = every[RANK]
    return every, bf16_tensor(inp["x"]), torch.from_numpy(inp["topk_idx"]), \
        torch.from_numpy(inp["weights"])


def make_buffer(port_index):
    return Buffer(None, low_latency_mode=True, explicitly_destroy=True,
                  moe_ep_config=config(port_index))


def round_trip(buf, seed):
    """One LL dispatch and combine on both ranks (creates the Buffer's
    group on the first); the receive count against the oracle."""
    every, x, idx, w = inputs(seed)
    recv_x, recv_count, handle, _, _ = buf.low_latency_dispatch(x, idx, P.max_tokens,
                                                                P.num_experts, use_fp8=False)
    same("round trip recv_count", seed, bits(recv_count),
         np.array([len(r) for r in oracle.ll_dispatch(P, every, RANK)], np.int32))
    buf.low_latency_combine(recv_x, idx, w, handle)


def rank0_after_failure(scenario, buf, first, seed):
    """Rank 0's later calls on the failed Buffer raise the same error."""
    _, x, idx, w = inputs(seed)
    expect_again(scenario + ": a later low_latency_dispatch", first,
                 lambda: buf.low_latency_dispatch(x, idx, P.max_tokens, P.num_experts,
                                                  use_fp8=False))
    expect_again(scenario + ": poll_error", first, lambda: buf.moe_ep_group.poll_error())


def while_rank1_skips(scenario, doing, rank0):
    """rank0() on rank 0, while rank 1 skips the call (`doing`) until
    rank 0's marker says it gave up."""
    if RANK == 0:
        rank0()
        mark(scenario)
    else:
        log("%s: %s until rank 0 gave up" % (scenario, doing))
        await_mark(scenario)


# ---- scenarios --------------------------------------------------------------

def buffer_skip():
    s = "buffer_skip"
    buf = make_buffer(0)
    round_trip(buf, 1)

    def rank0():
        _, x, idx, _ = inputs(2)
        first = expect_failure(s + ": low_latency_dispatch rank 1 skips",
                               lambda: buf.low_latency_dispatch(x, idx, P.max_tokens,
                                                                P.num_experts, use_fp8=False),
                               (moe_ep.TimeoutError,))
        if first is not None:
            rank0_after_failure(s, buf, first, 3)
    while_rank1_skips(s, "skipping the dispatch", rank0)
    expect_returns(s + ": destroy", buf.destroy)


def group_skip():
    s = "group_skip"
    g = moe_ep.Group(config(1, num_experts=P.num_experts, hidden=P.hidden, top_k=P.top_k,
                            max_tokens_per_rank=P.max_tokens))
    g.close_at_gc = False  # closed below on every rank

    def rank0():
        _, x, idx, w = inputs(4)
        h = g.prepare(idx)
        first = expect_failure(s + ": Group.dispatch rank 1 skips", lambda: g.dispatch(h, x),
                               (moe_ep.TimeoutError,))
        if first is not None:
            expect_again(s + ": a later Group.prepare", first, lambda: g.prepare(idx))
            expect_again(s + ": Group.dispatch again on the handle", first,
                         lambda: g.dispatch(h, x))
            y = torch.zeros((g.num_local_experts, WORLD * P.max_tokens, P.hidden),
                            dtype=torch.bfloat16)
            expect_again(s + ": Group.combine", first, lambda: g.combine(h, y, topk_weights=w))
            expect_again(s + ": Group.poll_error", first, g.poll_error)
        h.free()
    while_rank1_skips(s, "never dispatching", rank0)
    expect_returns(s + ": Group.close", g.close)


def buffer_leave():
    """Rank 1 leaves (destroys its Buffer) where it should dispatch; its
    collective teardown then waits for rank 0, which is in the dispatch:
    rank 0's wait ends in TimeoutError (rank 1 alive) or, had rank 1's
    teardown given up first, PeerFailedError (rank 1 left); both name the
    ranks."""
    s = "buffer_leave"
    buf = make_buffer(2)
    round_trip(buf, 5)
    if RANK == 0:
        _, x, idx, _ = inputs(6)

        def dispatch_and_receive():
            _, _, _, _, hook = buf.low_latency_dispatch(x, idx, P.max_tokens, P.num_experts,
                                                        use_fp8=False, return_recv_hook=True)
            hook()
        first = expect_failure(s + ": low_latency_dispatch and its hook, rank 1 left",
                               dispatch_and_receive,
                               (moe_ep.TimeoutError, moe_ep.PeerFailedError))
        if first is not None:
            rank0_after_failure(s, buf, first, 7)
    else:
        log("%s: destroying the Buffer instead of dispatching" % s)
    expect_returns(s + ": destroy", buf.destroy)


def buffer_dies():
    """Rank 1's process ends without destroying its Buffer, once rank 0's
    round trip is complete (so rank 0's combine needs nothing more)."""
    s = "buffer_dies"
    buf = make_buffer(3)
    round_trip(buf, 8)
    if RANK == 1:
        await_mark(s + "_round_trip")
        log("%s: exiting without destroying the Buffer" % s)
        common.finish()
    mark(s + "_round_trip")
    _, x, idx, _ = inputs(9)
    first = expect_failure(s + ": low_latency_dispatch, rank 1 exited",
                           lambda: buf.low_latency_dispatch(x, idx, P.max_tokens,
                                                            P.num_experts, use_fp8=False),
                           (moe_ep.TimeoutError, moe_ep.PeerFailedError))
    if first is not None:
        rank0_after_failure(s, buf, first, 10)
    expect_returns(s + ": destroy", buf.destroy)


def main():
    if WORLD != 2:
        fail("world", "-", "want 2 ranks; got %d" % WORLD)
        common.finish()
    for scenario in (buffer_skip, group_skip, buffer_leave, buffer_dies):
        log("%s: start" % scenario.__name__)
        scenario()
        log("%s: done" % scenario.__name__)
    common.finish()


if __name__ == "__main__":
    main()
