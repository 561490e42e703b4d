"""DeepEP's Config (the normal-mode tuning object engines pass around).
moe-ep's kernels size their own chunks, so it carries the values only."""


class Config:
    def __init__(self, num_sms=20, num_max_nvl_chunked_send_tokens=6,
                 num_max_nvl_chunked_recv_tokens=256, num_max_rdma_chunked_send_tokens=6,
                 num_max_rdma_chunked_recv_tokens=256):
        self.num_sms = num_sms
        self.num_max_nvl_chunked_send_tokens = num_max_nvl_chunked_send_tokens
        self.num_max_nvl_chunked_recv_tokens = num_max_nvl_chunked_recv_tokens
        self.num_max_rdma_chunked_send_tokens = num_max_rdma_chunked_send_tokens
        self.num_max_rdma_chunked_recv_tokens = num_max_rdma_chunked_recv_tokens

    def get_nvl_buffer_size_hint(self, hidden_bytes, num_ranks):
        """Engines size num_nvl_bytes with this; moe-ep allocates what its
        own config needs and does not use that number, so 0 is enough."""
        return 0

    def get_rdma_buffer_size_hint(self, hidden_bytes, num_ranks):
        return 0
