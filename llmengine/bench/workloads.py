"""Workloads for batchbench: which requests come, with what prompts and budgets, and when.

A workload is a list of `RequestSpec`s in request order; results are reported in that order.
Prompts are seeded token ids, so a workload is the same on every machine and for any model
with a large enough vocabulary. Every builder is greedy with `ignore_eos=True`, so a request
always runs its whole budget and the token count of a run is known before it starts.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from llmengine.sampling import SamplingParams


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of a workload.

    `arrival` is in the unit of the clock the workload runs under: iterations (forwards) for
    the iteration clock, seconds for the wall clock. 0 means before the first forward.
    """

    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    arrival: float = 0.0

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError("a request needs at least one prompt token")
        if not math.isfinite(self.arrival) or self.arrival < 0:
            raise ValueError(f"arrival must be a finite time >= 0, got {self.arrival}")


def _budget(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def _prompt(rng: random.Random, length: int, vocab_size: int) -> tuple[int, ...]:
    return tuple(rng.randrange(vocab_size) for _ in range(length))


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")


def _check_range(name: str, bounds: tuple[int, int]) -> None:
    low, high = bounds
    if not 1 <= low <= high:
        raise ValueError(f"{name} must be (low, high) with 1 <= low <= high, got {bounds}")


def uniform_burst(
    n: int, prompt_len: int, max_tokens: int, *, vocab_size: int, seed: int = 0
) -> list[RequestSpec]:
    """The seeds' shape: `n` requests arriving together, same prompt length, same budget."""
    _check_positive(n=n, prompt_len=prompt_len, max_tokens=max_tokens, vocab_size=vocab_size)
    rng = random.Random(seed)
    params = _budget(max_tokens)
    return [RequestSpec(_prompt(rng, prompt_len, vocab_size), params) for _ in range(n)]


def mixed_workload(
    n: int,
    *,
    prompt_lens: tuple[int, int],
    budgets: tuple[int, int],
    vocab_size: int,
    seed: int = 0,
) -> list[RequestSpec]:
    """`n` requests arriving together, prompt lengths and budgets drawn uniformly (inclusive)."""
    _check_positive(n=n, vocab_size=vocab_size)
    _check_range("prompt_lens", prompt_lens)
    _check_range("budgets", budgets)
    rng = random.Random(seed)
    specs = []
    for _ in range(n):
        prompt = _prompt(rng, rng.randint(*prompt_lens), vocab_size)
        specs.append(RequestSpec(prompt, _budget(rng.randint(*budgets))))
    return specs


def with_arrivals(workload: Sequence[RequestSpec], arrivals: Sequence[float]) -> list[RequestSpec]:
    """The same requests, the i-th arriving at `arrivals[i]` (in the clock's unit)."""
    if len(arrivals) != len(workload):
        raise ValueError(f"{len(workload)} requests but {len(arrivals)} arrival times")
    return [
        replace(spec, arrival=float(time)) for spec, time in zip(workload, arrivals, strict=True)
    ]


def with_budgets(workload: Sequence[RequestSpec], budgets: Sequence[int]) -> list[RequestSpec]:
    """The same requests, the i-th allowed `budgets[i]` tokens.

    The Day-29 shape is built this way: a burst in which one request wants far more tokens
    than the others.
    """
    if len(budgets) != len(workload):
        raise ValueError(f"{len(workload)} requests but {len(budgets)} budgets")
    return [
        replace(spec, params=replace(spec.params, max_tokens=budget))
        for spec, budget in zip(workload, budgets, strict=True)
    ]


def staggered(workload: Sequence[RequestSpec], interval: float) -> list[RequestSpec]:
    """Request i arrives at i * interval: a steady trickle instead of a burst."""
    return with_arrivals(workload, [i * interval for i in range(len(workload))])


def poisson_arrivals(
    workload: Sequence[RequestSpec], rate: float, *, seed: int = 0
) -> list[RequestSpec]:
    """Arrivals of a Poisson process with `rate` requests per unit time, the first at 0."""
    if not rate > 0:
        raise ValueError(f"rate must be positive, got {rate}")
    rng = random.Random(seed)
    times, now = [], 0.0
    for _ in workload:
        times.append(now)
        now += rng.expovariate(rate)
    return with_arrivals(workload, times)
