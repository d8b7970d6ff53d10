"""What `make peers` measures: the models, the workloads, the threads, where things go."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from llmengine.bench.decode_step import HELD_OUT_SHAPE, SHAPE_100M
from llmengine.bench.workloads import RequestSpec, mixed_workload, poisson_arrivals, uniform_burst

# The checkout this package is installed from (editable): llmengine/bench/peers/plan.py.
REPOSITORY = Path(__file__).resolve().parents[3]
EMBEDDED = "embedded"
RANDOM_25M = "25M"
RANDOM_100M = "100M"
MODELS = (EMBEDDED, RANDOM_25M, RANDOM_100M)
RANDOM_SHAPES: dict[str, dict[str, Any]] = {RANDOM_25M: HELD_OUT_SHAPE, RANDOM_100M: SHAPE_100M}

# Offline decode: B sequences at once, each a PROMPT_LEN-token prompt and DECODE_TOKENS new
# tokens (llama-batched-bench's PP, TG and B). tok/s is generated tokens over the whole call.
DECODE_BATCHES = (1, 8, 32)
QUICK_DECODE_BATCHES = (1, 8)
PROMPT_LEN, DECODE_TOKENS, QUICK_DECODE_TOKENS = 32, 64, 24
MIXED_REQUESTS, QUICK_MIXED_REQUESTS = 32, 8
HTTP_REQUESTS, QUICK_HTTP_REQUESTS = 48, 16
HTTP_SLOTS = 16  # sequences each server runs at once
HTTP_BLOCKS = 512  # llmengine serve's KV pool for the HTTP rows, 16-token blocks
PROMPT_LENS, BUDGETS = (8, 64), (8, 128)
POISSON_RATES = (32.0, 8.0)
CONTEXT_PER_SEQUENCE = 256  # >= the longest prompt plus the longest budget, in every workload
GREEDY_PROMPTS, GREEDY_TOKENS = 4, 16


def cache_dir() -> Path:
    """Where builds, venvs and converted weights live between runs (`.cache/` is ignored)."""
    return Path(os.environ.get("LLMENGINE_PEERS_CACHE", REPOSITORY / ".cache" / "peers"))


def decode_workload(batch: int, tokens: int, vocab_size: int) -> list[RequestSpec]:
    """`batch` sequences started together: llama-batched-bench's shape, as requests."""
    return uniform_burst(batch, PROMPT_LEN, tokens, vocab_size=vocab_size, seed=batch)


def mixed_burst(n: int, vocab_size: int) -> list[RequestSpec]:
    """`n` requests at once, prompts of 8-64 token ids, budgets of 8-128 tokens, seeded."""
    return mixed_workload(n, prompt_lens=PROMPT_LENS, budgets=BUDGETS, vocab_size=vocab_size)


def http_workloads(n: int, vocab_size: int, rates: tuple[float, ...]) -> dict[str, list]:
    """The mixed requests all at once, then as Poisson arrivals at each rate (per second)."""
    burst = mixed_burst(n, vocab_size)
    named = {"all at once": burst}
    for rate in rates:
        named[f"Poisson {rate:g}/s"] = poisson_arrivals(burst, rate, seed=1)
    return named


def thread_env(threads: int) -> dict[str, str]:
    """The environment every peer process gets: `threads` OpenMP/MKL threads, no more."""
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[name] = str(threads)
    return env
