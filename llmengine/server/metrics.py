"""The server's Prometheus metrics, in a registry of its own.

Each app gets a private `CollectorRegistry`, so several servers in one process (tests, a
lesson) never share or collide on a metric. The engine thread is the only writer: it sets
the gauges after every command and step and counts tokens as they are produced, and
prometheus-client's metrics are safe to read from the HTTP side while it does.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# Seconds: from a few milliseconds (the tiny model on a CPU) to a minute (a queue).
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class ServerMetrics:
    """Gauges of the engine's state, counters of its work, histograms of its latency."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests_running = Gauge(
            "llmengine_requests_running", "Requests holding a slot in the engine", registry=r
        )
        self.requests_waiting = Gauge(
            "llmengine_requests_waiting",
            "Requests queued for a slot (new or preempted by recompute)",
            registry=r,
        )
        self.requests_swapped = Gauge(
            "llmengine_requests_swapped", "Requests whose K/V is in the host swap space", registry=r
        )
        self.kv_blocks_free = Gauge(
            "llmengine_kv_blocks_free", "KV blocks free in the device pool", registry=r
        )
        self.kv_blocks_total = Gauge(
            "llmengine_kv_blocks_total", "KV blocks in the device pool", registry=r
        )
        self.preemptions = Counter(
            "llmengine_preemptions", "Requests evicted (by recompute or swap)", registry=r
        )
        self.prompt_tokens = Counter(
            "llmengine_prompt_tokens", "Prompt tokens of requests added", registry=r
        )
        self.generation_tokens = Counter(
            "llmengine_generation_tokens", "Tokens generated", registry=r
        )
        self.forward_tokens = Counter(
            "llmengine_forward_tokens", "Positions the engine's forwards computed", registry=r
        )
        self.prefix_cache_hit_tokens = Counter(
            "llmengine_prefix_cache_hit_tokens",
            "Prompt positions taken from the prefix cache instead of computed",
            registry=r,
        )
        self.spec_decode_draft_tokens = Counter(
            "llmengine_spec_decode_draft_tokens",
            "Tokens a speculative proposer guessed and a forward checked",
            registry=r,
        )
        self.spec_decode_accepted_tokens = Counter(
            "llmengine_spec_decode_accepted_tokens",
            "Guessed tokens the model agreed with and kept",
            registry=r,
        )
        self.forward_steps = Counter(
            "llmengine_forward_steps",
            "Engine steps by how their forward ran: the decode graph, or eager and why",
            ["forward"],
            registry=r,
        )
        self.requests_finished = Counter(
            "llmengine_requests_finished",
            "Engine requests that ended, by how",
            ["reason"],
            registry=r,
        )
        self.time_to_first_token = Histogram(
            "llmengine_time_to_first_token_seconds",
            "Seconds from a request's arrival at the engine to its first token",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.inter_token_latency = Histogram(
            "llmengine_inter_token_latency_seconds",
            "Seconds between consecutive tokens of one request",
            buckets=ITL_BUCKETS,
            registry=r,
        )

    def render(self) -> bytes:
        """Every metric in the Prometheus text format."""
        return generate_latest(self.registry)
