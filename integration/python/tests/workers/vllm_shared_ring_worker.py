"""One low-latency group, several MoE layers: two vLLM prepare/finalize
objects and an SGLang dispatcher take turns (as a model's layers do) and
share the group's two receive-buffer sets: dispatch i fills the buffers of
dispatch i-2 whichever object made either, two sets in all; a receive stays
intact over the next dispatch (valid until the dispatch after next). Every
receive and combine is checked against the oracle; then two micro-batches
in flight per layer, their hooks on a second thread. The group's ring is
made once when threads ask for it at the same time.
argv: [full|short]"""
import sys
import threading

import common
import moe_ep
import moe_ep.sglang
import moe_ep.vllm
import oracle
from adapters_worker import CombineInput, TopKOutput, check_combine, vllm_ll_overlapped
from common import RANK, fail
from ll_worker import P, check_dispatch, expert_outputs, torch_inputs
from moe_ep._overlap import group_recv_ring

FULL = sys.argv[1:] == ["full"]


def ring_made_once(g):
    """Eight threads ask for the group's ring at once: one ring."""
    start = threading.Barrier(8)
    got = []

    def ask():
        start.wait()
        got.append(group_recv_ring(g))
    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if len(got) != 8 or any(r is not got[0] for r in got) or group_recv_ring(g) is not got[0]:
        fail("group_recv_ring", "-", "%d threads got %d distinct rings"
             % (len(got), len({id(r) for r in got})))


class VllmLayer:
    def __init__(self, g, name):
        self.pf, self.name = moe_ep.vllm.PrepareAndFinalize(g), name

    def dispatch(self, x, idx, w):
        a1q, _, meta, _, _ = self.pf.prepare(x, w, idx, P.num_experts, None, False, None)
        return a1q, meta.expert_num_tokens

    def combine(self, y, x, idx, w):
        out = x.new_empty(x.shape)
        self.pf.finalize(out, y, w, idx, False, None)
        return out


class SglangLayer:
    def __init__(self, g, name):
        self.d, self.name = moe_ep.sglang.Dispatcher(g), name

    def dispatch(self, x, idx, w):
        self.o = self.d.dispatch(hidden_states=x, topk_output=TopKOutput(w, idx))
        return self.o.hidden_states, self.o.masked_m

    def combine(self, y, x, idx, w):
        return self.d.combine(combine_input=CombineInput(y, self.o.topk_ids, self.o.topk_weights))


def layers_take_turns(g, order, seed):
    pointers = []
    previous = None
    for i, layer in enumerate(order):
        s = seed + i
        inputs = oracle.all_inputs(P, s)
        x, idx, w = torch_inputs(inputs[RANK])
        a1q, count = layer.dispatch(x, idx, w)
        pointers.append((a1q.data_ptr(), count.data_ptr()))
        if previous is not None:  # the last receive is intact after this dispatch
            check_dispatch(previous[0], previous[1],
                           moe_ep.DispatchResult(previous[2], None, previous[3]), P.hidden)
        check_dispatch(s, inputs, moe_ep.DispatchResult(a1q, None, count), P.hidden)
        out = layer.combine(expert_outputs(g, a1q), x, idx, w)
        check_combine("%s combine (step %d)" % (layer.name, i), s, out, inputs[RANK])
        previous = (s, inputs, a1q, count)
    bad = [i for i in range(1, len(pointers))
           if (pointers[i] == pointers[i - 1]) or (i >= 2 and pointers[i] != pointers[i - 2])]
    if bad:
        i = bad[0]
        fail("shared receive buffers", seed,
             "layers %s: %d distinct (recv_x, recv_count) pointers, want 2; first at step %d "
             "(%s): got %s, want those of step %d, %s"
             % ([l.name for l in order], len(set(pointers)), i, order[i].name, pointers[i],
                i - 2, pointers[i - 2] if i >= 2 else "(another set than step 0's)"))


def two_in_flight(layer, seed):
    """vLLM's dual-batch overlap on one layer, then the next layer."""
    vllm_ll_overlapped(layer.pf, seed, "%s overlapped combine" % layer.name)


def main():
    with moe_ep.Group(common.config(0, num_experts=P.num_experts, hidden=P.hidden,
                                    top_k=P.top_k, max_tokens_per_rank=P.max_tokens)) as g:
        ring_made_once(g)
        a, b, s = VllmLayer(g, "vllm A"), VllmLayer(g, "vllm B"), SglangLayer(g, "sglang")
        if FULL:
            layers_take_turns(g, [a, b, a, b, b, a, s, a, b, s, s, b], 701)
        else:
            layers_take_turns(g, [a, b, b, a, s, a], 701)
        for i, layer in enumerate((a, b) if FULL else (a,)):
            two_in_flight(layer, 731 + 2 * i)
        layers_take_turns(g, [b, a, s], 741)  # the sets still alternate after all that
    common.finish()


if __name__ == "__main__":
    main()
