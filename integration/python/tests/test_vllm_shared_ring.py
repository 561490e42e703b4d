"""The LL receive buffers are the group's: vLLM prepare/finalize objects
(one per MoE layer) and an SGLang dispatcher on one group share its two
sets, with oracle-exact receives and combines when the layers take turns;
2 ranks with every case, 4 ranks with fewer steps."""
from spawn import run_ranks


def test_vllm_shared_ring_two_ranks():
    ok, report = run_ranks(2, "vllm_shared_ring_worker.py", ["full"])
    assert ok, report


def test_vllm_shared_ring_four_ranks():
    ok, report = run_ranks(4, "vllm_shared_ring_worker.py", ["short"])
    assert ok, report
