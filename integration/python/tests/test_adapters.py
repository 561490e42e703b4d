"""The engine adapters (moe_ep.vllm, moe_ep.sglang) on the host backend:
2 ranks with every case, 4 ranks with the overlapped ones."""
from spawn import run_ranks


def test_adapters_two_ranks():
    ok, report = run_ranks(2, "adapters_worker.py", ["full"])
    assert ok, report


def test_adapters_four_ranks():
    ok, report = run_ranks(4, "adapters_worker.py", ["short"])
    assert ok, report


def test_sglang_engine_class_two_ranks():
    """engine_class() on a stand-in of SGLang's BaseDispatcher: hooks,
    SGLang's output format, values."""
    ok, report = run_ranks(2, "sglang_engine_worker.py")
    assert ok, report
