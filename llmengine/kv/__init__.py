"""The KV cache: blocks and block tables (integers), prefix-cache keys and the caching pool,
and the tensors that hold K/V, paged or one region per sequence."""
