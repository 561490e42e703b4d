"""Low-latency mode on the host backend, 2 and 4 ranks as real processes."""
from spawn import run_ranks


def test_ll_two_ranks():
    ok, report = run_ranks(2, "ll_worker.py", ["full"], ports=5)
    assert ok, report


def test_ll_four_ranks():
    ok, report = run_ranks(4, "ll_worker.py", ["short"])
    assert ok, report
