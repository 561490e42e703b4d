"""A peer that does not make a collective call, as real processes on the
host backend (workers/peer_absent_worker.py): rank 0's low-latency
dispatch, through the DeepEP Buffer and through moe_ep.Group, raises
moe_ep.TimeoutError (or PeerFailedError when the peer left or died) naming
rank 0 and rank 1 within the configured timeouts.kernel_ms instead of
hanging, every later call on the failed group raises again, and both ranks
destroy their Buffer or Group and exit 0. The ranks order their steps
through files, so nothing checked depends on timing; the process deadline
only turns a hang into a report."""
from spawn import run_ranks


def test_peer_absent_from_collective_two_ranks(tmp_path):
    ok, report = run_ranks(2, "peer_absent_worker.py", args=[str(tmp_path)], ports=4,
                           timeout=600)
    assert ok, report
