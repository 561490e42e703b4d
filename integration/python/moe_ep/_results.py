"""What dispatch returns."""


class DispatchResult:
    """Dispatch outputs. Low latency: recv_x, recv_scales (None without
    fp8), recv_count. High throughput adds recv_topk_idx,
    recv_topk_weights and num_recv_tokens (rows of recv_x that are valid;
    recv_x and the recv_topk_* tensors are views of that many rows) and
    keeps the full-capacity tensors in `buffers`."""

    __slots__ = ("recv_x", "recv_scales", "recv_count", "recv_topk_idx",
                 "recv_topk_weights", "num_recv_tokens", "buffers")

    def __init__(self, recv_x, recv_scales, recv_count, recv_topk_idx=None,
                 recv_topk_weights=None, num_recv_tokens=None, buffers=None):
        self.recv_x = recv_x
        self.recv_scales = recv_scales
        self.recv_count = recv_count
        self.recv_topk_idx = recv_topk_idx
        self.recv_topk_weights = recv_topk_weights
        self.num_recv_tokens = num_recv_tokens
        self.buffers = buffers

    def __repr__(self):
        # A deferred HT dispatch's rows are set when its hook runs.
        def shape(t):
            return "pending" if t is None else tuple(t.shape)
        return "DispatchResult(recv_x=%s, recv_count=%s, num_recv_tokens=%s)" % (
            shape(self.recv_x), shape(self.recv_count), self.num_recv_tokens)
