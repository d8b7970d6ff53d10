"""Lesson 22's readings of a run: a long prompt arriving among decodes, chunked or not.

Everything here is read from what a run recorded (the engine's `IterationOutcome`s and the
clock, or the HTTP client's `RequestRecord`s), never from the engine's insides, so the lesson
and its test compute the same numbers the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, groupby, pairwise

from llmengine.bench.batchbench import WorkloadRun
from llmengine.bench.http_client import HttpRun
from llmengine.bench.timing import percentile
from llmengine.bench.workloads import RequestSpec, uniform_burst, with_arrivals


def long_prompt_arrives(
    vocab_size: int,
    arrival: float,
    *,
    num_short: int = 4,
    short_prompt: int = 8,
    short_budget: int = 64,
    long_prompt: int = 384,
    long_budget: int = 64,
    seed: int = 22,
) -> list[RequestSpec]:
    """`num_short` short requests arriving at 0, then one long prompt arriving at `arrival`.

    The long prompt is the workload's last request. Arrivals are in the unit of the clock
    the workload runs under (iterations, or seconds on the wall clock).
    """
    short = uniform_burst(num_short, short_prompt, short_budget, vocab_size=vocab_size, seed=seed)
    long = uniform_burst(1, long_prompt, long_budget, vocab_size=vocab_size, seed=seed + 1)
    return with_arrivals(short + long, [0.0] * num_short + [arrival])


def token_times(run: WorkloadRun) -> list[list[float]]:
    """The clock time of every generated token, per request in workload order."""
    index = {request_id: i for i, request_id in enumerate(run.request_ids)}
    times: list[list[float]] = [[] for _ in run.request_ids]
    for outcome, now in zip(run.outcomes, run.times, strict=True):
        for request_id in outcome.tokens:
            times[index[request_id]].append(now)
    return times


def first_token_iteration(run: WorkloadRun, index: int) -> int:
    """The forward (1-based) that gave the workload's `index`-th request its first token."""
    request_id = run.request_ids[index]
    for number, outcome in enumerate(run.outcomes, start=1):
        if request_id in outcome.tokens:
            return number
    raise ValueError(f"request {index} never got a token")


def prefill_steps(run: WorkloadRun, index: int) -> list[int]:
    """The forwards (0-based) that computed the request's prefill, up to its first token."""
    request_id = run.request_ids[index]
    last = first_token_iteration(run, index)
    return [
        number
        for number, outcome in enumerate(run.outcomes[:last])
        if request_id in outcome.row_positions
    ]


def prefill_chunks(run: WorkloadRun, index: int) -> list[int]:
    """The positions each of the request's prefill rows computed: its chunks, in order."""
    request_id = run.request_ids[index]
    return [run.outcomes[number].row_positions[request_id] for number in prefill_steps(run, index)]


def describe_chunks(chunks: Sequence[int]) -> str:
    """Chunk sizes with repeats folded: [28, 28, 28, 20] -> "28 x3 + 20"."""
    parts = []
    for size, group in groupby(chunks):
        count = len(list(group))
        parts.append(f"{size} x{count}" if count > 1 else str(size))
    return " + ".join(parts)


def kv_positions_gathered(chunks: Sequence[int]) -> int:
    """Cached K/V positions a chunked prefill reads: each chunk attends to every position up
    to its own end, so it reads again what the earlier chunks wrote. One chunk reads n."""
    return sum(accumulate(chunks))


def padded_attention_scores(run: WorkloadRun) -> list[int]:
    """Per forward, the query-key scores a padded-batch attention computes, per head and layer.

    A padded-batch attention lays a step's rows out as one batch (the engine's
    `GatheredAttention` groups the rows instead, so that none is padded to another's length):
    every row gets as many query slots as the longest row has new positions, and every query
    is scored against as many keys as the longest row holds after the step (masked or not). So
    a step costs rows x longest new x longest end, and a long prefill next to short decodes pays
    its length for every decode row too. A request's K/V after a step is the sum of the
    positions its rows computed, which holds only while nobody is preempted or served from a
    prefix cache; such runs are refused.
    """
    kv: dict[int, int] = {}
    scores = []
    for outcome in run.outcomes:
        if outcome.evicted or outcome.cached_tokens:
            raise ValueError("a run with preemption or cache hits: K/V is not a sum of rows")
        for request_id, positions in outcome.row_positions.items():
            kv[request_id] = kv.get(request_id, 0) + positions
        rows = outcome.row_positions
        scores.append(len(rows) * max(rows.values()) * max(kv[r] for r in rows))
    return scores


def prefill_attention_scores(run: WorkloadRun, index: int) -> int:
    """`padded_attention_scores` summed over the forwards that carried the request's prefill."""
    scores = padded_attention_scores(run)
    return sum(scores[number] for number in prefill_steps(run, index))


@dataclass(frozen=True, slots=True)
class StallSummary:
    """What the requests already decoding felt, and what the long prompt waited, in seconds.

    The gaps are every inter-token latency of the short requests, pooled.
    """

    worst_gap_s: float
    p99_gap_s: float
    median_gap_s: float
    long_ttft_s: float
    tokens_per_s: float


def stall_summary(
    gaps: Sequence[float], long_ttft_s: float, tokens: int, duration_s: float
) -> StallSummary:
    """Summarise the short requests' gaps, the long prompt's TTFT and the run's throughput."""
    return StallSummary(
        worst_gap_s=max(gaps),
        p99_gap_s=percentile(gaps, 99),
        median_gap_s=percentile(gaps, 50),
        long_ttft_s=long_ttft_s,
        tokens_per_s=tokens / duration_s,
    )


def engine_stall_summary(run: WorkloadRun, long_index: int) -> StallSummary:
    """`stall_summary` of an engine run timed on the wall clock; every other request is short."""
    times = token_times(run)
    gaps = [
        later - earlier
        for index, series in enumerate(times)
        if index != long_index
        for earlier, later in pairwise(series)
    ]
    ttft = run.timing().time_to_first_token_s[run.request_ids[long_index]]
    return stall_summary(gaps, ttft, sum(map(len, times)), run.times[-1])


def http_stall_summary(run: HttpRun, long_index: int) -> StallSummary:
    """`stall_summary` of a run over HTTP, as the client saw it; every other request is short.

    Raises ValueError if any request failed: a summary of the ones that got through would
    describe some other workload.
    """
    failed = [record.error for record in run.records if not record.ok]
    if failed:
        raise ValueError(f"{len(failed)} requests failed, the first: {failed[0]}")
    gaps = [
        gap for index, record in enumerate(run.records) if index != long_index for gap in record.itl
    ]
    ttft = run.records[long_index].ttft
    assert ttft is not None  # an ok record has its first token
    tokens = sum(record.output_tokens for record in run.records)
    return stall_summary(gaps, ttft, tokens, run.duration)
