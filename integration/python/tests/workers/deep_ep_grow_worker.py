"""The normal-mode group of a DeepEP-compatible Buffer on a gloo group when
a later batch exceeds the token cap the Buffer derived from its first,
small batch (SGLang's warm-up prefill, then a large chunk on one rank):
the ranks agree on the largest batch (one all-reduce per layer call) and
grow the group, and dispatch and combine match the oracle; a handle of the
replaced group is refused by name; a dispatch whose combine has not run
when the group grows keeps the replaced group open for that combine,
until the next agreement; over comm= (mpi4py's allgather) with a
configured address, which the grown group keeps (another port of its host
while the replaced one waits for a combine); a
given cap (moe_ep_config) never grows, agrees nothing, and a batch above
it is refused as before."""
import numpy as np
import torch
import torch.distributed as dist

import common
import moe_ep
import oracle
from common import RANK, WORLD, bits, bf16_tensor, same, fail, expect_raises
from moe_ep.deep_ep import Buffer

P = oracle.Problem(WORLD, num_experts=4 * WORLD, hidden=128, top_k=4, max_tokens=16)
HOST = {"backend": "host", "bootstrap": {"timeout_ms": 60000}, "timeouts": {"kernel_ms": 60000}}

# Collectives over the torch group, counted (the agreement's cost).
calls = {"all_reduce": 0, "all_gather": 0, "all_gather_object": 0}


def _counted(name):
    real = getattr(dist, name)

    def call(*args, **kwargs):
        calls[name] += 1
        return real(*args, **kwargs)
    setattr(dist, name, call)


def counting():
    for name in calls:
        calls[name] = 0
    return calls


def inputs_for(seed, tokens):
    """Every rank's inputs, rank r with tokens[r] tokens, and this rank's
    as tensors."""
    inputs = [oracle.make_inputs(P, seed, r, num_tokens=tokens[r]) for r in range(WORLD)]
    inp = inputs[RANK]
    return inputs, bf16_tensor(inp["x"]), torch.from_numpy(inp["topk_idx"]), \
        torch.from_numpy(inp["weights"])


def tokens_on(rank, n, others=5):
    return [n if r == rank else others + r for r in range(WORLD)]


def dispatch(buf, seed, tokens, layout=True):
    """get_dispatch_layout (unless layout=False) and dispatch, the receive
    checked against the oracle; returns (inputs, recv_x, handle)."""
    inputs, x, idx, w = inputs_for(seed, tokens)
    if layout:
        buf.get_dispatch_layout(idx, P.num_experts)
    extra = {} if buf.moe_ep_normal_group is not None or layout else {
        "num_tokens_per_expert": torch.zeros(P.num_experts, dtype=torch.int32)}
    recv_x, recv_idx, recv_w, _, handle, _ = buf.dispatch(x, topk_idx=idx, topk_weights=w,
                                                          **extra)
    src, want_idx, want_w, _ = oracle.ht_dispatch(P, inputs, RANK)
    rows = np.stack([inputs[s]["x"][t] for s, t in src]) if src else \
        np.zeros((0, P.hidden), np.uint16)
    same("recv_x %s" % (tokens,), seed, bits(recv_x), rows)
    same("recv_topk_idx %s" % (tokens,), seed, recv_idx.numpy(), want_idx.astype(np.int64))
    same("recv_topk_weights %s" % (tokens,), seed, recv_w.numpy(), want_w)
    return inputs, recv_x, handle


def combine(buf, seed, inputs, recv_x, handle):
    y = (recv_x.float() * float(oracle.ht_partial_scale(RANK))).to(torch.bfloat16)
    out, _, _ = buf.combine(y, handle)
    same("combine", seed, bits(out), oracle.ht_combine(P, inputs[RANK]))


def roundtrip(buf, seed, tokens, layout=True):
    inputs, recv_x, handle = dispatch(buf, seed, tokens, layout)
    combine(buf, seed, inputs, recv_x, handle)
    return handle


def cap_of(buf):
    return buf.moe_ep_normal_group.config.max_tokens_per_rank


def want_cap(what, buf, cap):
    if cap_of(buf) != cap:
        fail(what, "-", "max_tokens_per_rank %d, want %d" % (cap_of(buf), cap))


def derived_cap_grows(group):
    buf = Buffer(group, explicitly_destroy=True, moe_ep_config=HOST)
    roundtrip(buf, 1, tokens_on(0, 8))  # the warm-up: the Buffer derives 1024
    want_cap("warm-up cap", buf, 1024)

    # Within the cap: one all-reduce per layer call, none for a cached
    # dispatch or a combine.
    n = counting()
    old = roundtrip(buf, 2, tokens_on(1, 9))
    if n != {"all_reduce": 1, "all_gather": 0, "all_gather_object": 0}:
        fail("collectives of a layout + dispatch + combine", 2, repr(n))
    n = counting()
    inputs, recv_x, handle = dispatch(buf, 3, tokens_on(0, 4), layout=False)
    buf.dispatch(bf16_tensor(inputs[RANK]["x"]), handle=handle)
    combine(buf, 3, inputs, recv_x, handle)
    if n != {"all_reduce": 1, "all_gather": 0, "all_gather_object": 0}:
        fail("collectives of a dispatch, a cached dispatch and a combine", 3, repr(n))

    # 1500 tokens on the last rank only: get_dispatch_layout grows the
    # group on every rank, the dispatch reuses its handle.
    first = buf.moe_ep_normal_group
    roundtrip(buf, 4, tokens_on(WORLD - 1, 1500))
    want_cap("grown by get_dispatch_layout", buf, 2048)
    if buf.moe_ep_normal_group is first or first._g is not None:
        fail("grown group", 4, "the first group is still the Buffer's, or still open")
    expect_raises("cached dispatch of the replaced group", RuntimeError,
                  "handle comes from the normal-mode group this Buffer replaced",
                  lambda: buf.dispatch(bf16_tensor(np.zeros((len(old.topk_idx), P.hidden),
                                                            np.uint16)), handle=old))
    expect_raises("combine of the replaced group", RuntimeError,
                  "handle comes from the normal-mode group this Buffer replaced",
                  lambda: buf.combine(torch.zeros((0, P.hidden), dtype=torch.bfloat16), old))

    # A dispatch without get_dispatch_layout grows it too (rank 0: 3000).
    roundtrip(buf, 5, tokens_on(0, 3000), layout=False)
    want_cap("grown by dispatch", buf, 4096)

    retired_grows(buf)
    buf.destroy()


def retired_grows(buf):
    """Two-batch overlap: micro-batch A's dispatch has not been combined
    when micro-batch B outgrows the cap. Every rank grows anyway: the old
    group is retired, A's combine still runs on it (against the oracle),
    a cached dispatch of A's handle is refused, and the first agreement
    after A's combine closes the retired group on every rank."""
    inputs_a, recv_a, handle_a = dispatch(buf, 6, tokens_on(0, 6))
    kept = buf.moe_ep_normal_group
    inputs_b, recv_b, handle_b = dispatch(buf, 7, tokens_on(0, 5000))
    want_cap("grown with a combine pending", buf, 8192)
    if buf.moe_ep_normal_group is kept or kept._g is None:
        fail("retired group", 7, "the group was not replaced, or was closed before its combine")
    expect_raises("cached dispatch of a retired group", RuntimeError,
                  "a replaced group runs only the combines of the dispatches it had made",
                  lambda: buf.dispatch(bf16_tensor(inputs_a[RANK]["x"]), handle=handle_a))
    combine(buf, 6, inputs_a, recv_a, handle_a)  # on the retired group
    if kept._g is None:
        fail("retired group", 6, "closed by its own combine, before any agreement")
    combine(buf, 7, inputs_b, recv_b, handle_b)
    roundtrip(buf, 8, tokens_on(1, 7))  # the next agreement closes it
    if kept._g is not None:
        fail("retired group", 8, "still open after every rank combined its last dispatch")
    want_cap("after the retired group closed", buf, 8192)
    expect_raises("combine of a closed retired group", RuntimeError,
                  "handle comes from the normal-mode group this Buffer replaced",
                  lambda: buf.combine(torch.zeros((0, P.hidden), dtype=torch.bfloat16), handle_a))


def comm_grows(group):
    """comm= and a configured address: the grown group keeps the address."""
    buf = Buffer(None, comm=common.GlooComm(group), explicitly_destroy=True,
                 moe_ep_config=common.config(1))
    roundtrip(buf, 11, tokens_on(0, 4))
    address = buf.moe_ep_normal_group.config.bootstrap_address
    roundtrip(buf, 12, tokens_on(WORLD - 1, 1100))
    want_cap("grown over comm=", buf, 2048)
    if buf.moe_ep_normal_group.config.bootstrap_address != address:
        fail("grown group's address", 12, "%s, want the configured %s"
             % (buf.moe_ep_normal_group.config.bootstrap_address, address))
    # Grown while a combine is pending: the retired group still holds
    # the configured address, so the new one takes rank 0's spare port on
    # the configured host.
    inputs_a, recv_a, handle_a = dispatch(buf, 13, tokens_on(0, 6))
    roundtrip(buf, 14, tokens_on(0, 3000))
    want_cap("grown over comm= with a combine pending", buf, 4096)
    grown = buf.moe_ep_normal_group.config.bootstrap_address
    if grown == address or grown.rpartition(":")[0] != address.rpartition(":")[0]:
        fail("address of a group grown past a retired one", 14,
             "%s, want another port on the host of %s" % (grown, address))
    combine(buf, 13, inputs_a, recv_a, handle_a)
    buf.destroy()  # closes the retired group too


def given_cap_stays(group):
    """moe_ep_config's cap: no agreement, no growth; the batch above it is
    refused by the library on its rank, and its peer's call names it."""
    buf = Buffer(group, explicitly_destroy=True, moe_ep_config=common.config(
        2, high_throughput={"max_tokens_per_rank": 1024}))
    roundtrip(buf, 21, tokens_on(0, 4))
    n = counting()
    roundtrip(buf, 22, tokens_on(0, 7))
    if n != {"all_reduce": 0, "all_gather": 0, "all_gather_object": 0}:
        fail("collectives with a given cap", 22, repr(n))
    _, _, idx, _ = inputs_for(23, tokens_on(WORLD - 1, 1500))
    if RANK == WORLD - 1:
        expect_raises("batch above the given cap", moe_ep.InvalidArgumentError,
                      "get_dispatch_layout: topk_idx.shape[0]=1500 must be in "
                      "[0, max_tokens_per_rank=1024]",
                      lambda: buf.get_dispatch_layout(idx, P.num_experts))
    else:
        expect_raises("peer of a batch above the given cap", moe_ep.InvalidArgumentError,
                      "rank %d refused its own prepare of this layer call" % (WORLD - 1),
                      lambda: buf.get_dispatch_layout(idx, P.num_experts))
    want_cap("given cap", buf, 1024)
    roundtrip(buf, 24, tokens_on(0, 1024))  # still usable
    buf.destroy()


def main():
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % common.PORTS[0],
                            rank=RANK, world_size=WORLD)
    group = dist.new_group(list(range(WORLD)))
    for name in calls:
        _counted(name)
    derived_cap_grows(group)
    comm_grows(group)
    given_cap_stays(group)
    dist.destroy_process_group()
    common.finish()


if __name__ == "__main__":
    main()
