"""The vLLM adapter's quant_configs that dispatch bf16 and quantise the
received rows (per tensor, per token, other block widths), on the host
backend: 2 ranks with every case and the refusals, 4 ranks with some."""
from spawn import run_ranks


def test_vllm_quant_after_receive_two_ranks():
    ok, report = run_ranks(2, "vllm_quant_worker.py", ["full"])
    assert ok, report


def test_vllm_quant_after_receive_four_ranks():
    ok, report = run_ranks(4, "vllm_quant_worker.py", ["short"])
    assert ok, report
