"""How long one thread waits for a lock another thread holds while it runs
the library (a receive, a dispatch) before it gives up with
moe_ep.TimeoutError: longer than the library's own bounds let that call
run, so a wait past it means the holder is stuck, not slow."""


def wait_bound_s(group):
    """How long a thread may wait for another thread's hook, plus slack: the
    longest the library's own bounds let a receive run. An LL receive waits
    at most timeouts.kernel_ms for its kernel; an HT receive on the nccl
    backend also learns its row count on the host, within
    bootstrap.timeout_ms plus four kernel_ms."""
    c = group.config
    return (c.bootstrap_timeout_ms + 4.0 * c.kernel_timeout_ms) / 1000.0 + 5.0


def bound_words(bound_s):
    """The bound as a failure message states it: seconds, and where they come from."""
    return "%.0f s (bootstrap.timeout_ms plus four timeouts.kernel_ms, plus 5 s)" % bound_s
