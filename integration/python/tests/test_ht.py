"""High-throughput mode on the host backend, 2 and 4 ranks."""
from spawn import run_ranks


def test_ht_two_ranks():
    ok, report = run_ranks(2, "ht_worker.py")
    assert ok, report


def test_ht_four_ranks():
    ok, report = run_ranks(4, "ht_worker.py")
    assert ok, report
