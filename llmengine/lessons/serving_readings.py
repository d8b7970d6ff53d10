"""Lesson 20's wall-clock measurements, read out as sentences computed from them.

A server's timings change from run to run and from machine to machine, so the lesson never
writes what one run showed into its prose: these functions say it, and they choose the
numbers and the comparison words from the measurements they are given. The prose beside
them keeps to the mechanism, which holds on any machine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import pairwise
from statistics import median
from typing import Any

from llmengine.bench.http_client import HttpRun

# A wave of first tokens starts where the next first token comes more than this share of a
# request's generating time after the one before: inside a wave first tokens are a few steps
# apart, and between waves a whole budget of steps, one request's generating time.
WAVE_GAP_SHARE = 0.5
# A median gap between chunks shorter than this is no engine step: the chunks reached the
# client bunched together, because the client fell behind the stream.
BUNCHED_MS = 0.5

Summary = Mapping[str, Any]  # one run as `run_summary` gives it


def arrow(values: Sequence[float], spec: str) -> str:
    """The values in order, formatted by `spec` and joined by arrows: `147 → 286 → 514`."""
    return " → ".join(format(value, spec) for value in values)


def stream_reading(arrivals: Sequence[float]) -> str:
    """The first chunk's wait against the gaps between the later ones, for one stream whose
    chunks arrived `arrivals` seconds after the request was sent (at least two chunks)."""
    if len(arrivals) < 2:
        raise ValueError(f"a stream of {len(arrivals)} chunks has no gaps to compare")
    first_ms = 1e3 * arrivals[0]
    gaps_ms = [1e3 * (later - earlier) for earlier, later in pairwise(arrivals)]
    if first_ms > max(gaps_ms):
        comparison = "longer than any gap after it"
    else:
        comparison = f"and one later gap, {max(gaps_ms):.1f} ms, is longer still"
    return (
        f"In this run the first chunk arrives {first_ms:.1f} ms after the request is sent, "
        f"{comparison}; the gaps between later chunks have a median of "
        f"{median(gaps_ms):.1f} ms."
    )


def waves(ttfts: Sequence[float], gap: float) -> list[int]:
    """The sizes of the groups that the sorted times to first token fall into: a new group
    starts wherever a time is more than `gap` after the one before it."""
    ordered = sorted(ttfts)
    sizes = [1] if ordered else []
    for earlier, later in pairwise(ordered):
        if later - earlier > gap:
            sizes.append(1)
        else:
            sizes[-1] += 1
    return sizes


def waves_reading(runs: Mapping[int, HttpRun]) -> str:
    """The waves of first tokens each run of `runs` (by its slots) came in, a wave ending where
    no first token follows within `WAVE_GAP_SHARE` of the run's median generating time (from
    a request's first chunk to its last)."""
    parts = []
    for slots, run in runs.items():
        generating = median(record.e2e - record.ttft for record in run.records)
        sizes = waves([record.ttft for record in run.records], WAVE_GAP_SHARE * generating)
        of = ", ".join(str(size) for size in sizes)
        noun = "wave" if len(sizes) == 1 else "waves"
        parts.append(f"{len(sizes)} {noun} with {slots} slots (of {of} requests)")
    return (
        f"In this run the first tokens come in {' and '.join(parts)}, a new wave starting "
        f"where a first token comes more than {WAVE_GAP_SHARE:.0%} of a request's generating "
        "time (its first chunk to its last, at the median) after the one before it."
    )


def slots_reading(few: Summary, many: Summary, slots: tuple[int, int]) -> str:
    """Two runs of one burst, summaries `few` and `many` of servers with `slots` slots: their
    times to first token, the median gap between chunks (one engine step, unless the chunks
    reached the client bunched) and the throughput."""
    few_gap, many_gap = few["itl_ms"]["p50"], many["itl_ms"]["p50"]
    rows = slots[1] / slots[0]
    if min(few_gap, many_gap) < BUNCHED_MS:
        steps = (
            f"The median gap between two chunks is {many_gap:.1f} ms with {slots[1]} slots "
            f"and {few_gap:.1f} ms with {slots[0]}: a gap that short is no engine step, the "
            "chunks reached the client bunched, so this run does not time the steps."
        )
    else:
        if many_gap < few_gap:
            compared = f"shorter, though it carries {rows:g} times as many rows"
        else:
            longer = "less than" if many_gap < rows * few_gap else "at least"
            compared = f"{longer} {rows:g} times as long, for {rows:g} times as many rows"
        steps = (
            f"The median gap between two chunks, one engine step, is {many_gap:.1f} ms with "
            f"{slots[1]} slots against {few_gap:.1f} ms with {slots[0]}: {compared}."
        )
    return (
        f"In this run the median time to first token is {few['ttft_ms']['p50']:.0f} ms with "
        f"{slots[0]} slots and {many['ttft_ms']['p50']:.0f} ms with {slots[1]}. {steps} "
        f"The {slots[1]}-slot server serves "
        f"{many['output_token_throughput'] / few['output_token_throughput']:.2f} times the "
        f"tokens per second of the {slots[0]}-slot one."
    )


def series(curve: Sequence[Summary], read: Callable[[Summary], float], spec: str, unit: str) -> str:
    """One quantity over a sweep: the offered rates' values joined by arrows, then the value
    with every request sent at once (a summary whose `request_rate` is None) beside them."""
    offered = [read(summary) for summary in curve if summary["request_rate"] is not None]
    at_once = "".join(
        f" ({read(summary):{spec}}{unit} all at once)"
        for summary in curve
        if summary["request_rate"] is None
    )
    return f"{arrow(offered, spec)}{unit}{at_once}"


def sweep_reading(curve: Sequence[Summary]) -> str:
    """What a rate sweep showed, from its summaries in rising offered rate: how the throughput,
    the time per output token and the time to first token moved as the offered rate rose."""
    offered = [summary for summary in curve if summary["request_rate"] is not None]
    rates = [summary["request_rate"] for summary in offered]
    tokens = [summary["output_token_throughput"] for summary in offered]
    gains = [later / earlier - 1 for earlier, later in pairwise(tokens)]
    tpot = [summary["tpot_ms"]["p50"] for summary in offered]
    ttft = [summary["ttft_ms"]["p50"] for summary in offered]
    doubling = [i for i in range(len(ttft) - 1) if ttft[i + 1] > 2 * ttft[i]]
    if all(later < earlier for earlier, later in pairwise(gains)):
        trend = "each step up buys less than the one before"
    else:
        trend = "the gains do not shrink steadily"
    losses = [i for i, gain in enumerate(gains) if gain < 0]
    if losses:
        more, fewer = rates[losses[0] + 1], rates[losses[0]]
        trend += f"; offering {more:g} requests per second instead of {fewer:g} loses throughput"
    if doubling:
        low, high = rates[doubling[0]], rates[doubling[0] + 1]
        knee = f"it first more than doubles between {low:g} and {high:g} requests per second"
    else:
        knee = "it never doubles from one offered rate to the next"
    falls = [i for i in range(len(ttft) - 1) if ttft[i + 1] < ttft[i]]
    if falls:
        # Waiting should only grow with the offered rate; a fall says one rate's run met a
        # busier machine than the next one's.
        low, high = rates[falls[0]], rates[falls[0] + 1]
        knee += f", and it falls from {low:g} to {high:g} requests per second"
    moves = "rises" if tpot[-1] > tpot[0] else "falls"
    changes = ", ".join(f"{gain:+.0%}" for gain in gains)

    def throughput(summary: Summary) -> float:
        return summary["output_token_throughput"]

    sentences = [
        f"In this run, as the offered rate goes {arrow(rates, 'g')} requests per second, the "
        f"tokens per second go {series(curve, throughput, '.0f', '')}.",
        f"From one rate to the next they change by {changes}: {trend}.",
        f"The server completes {offered[0]['request_throughput']:.2f} requests per second "
        f"when {rates[0]:g} are offered and {offered[-1]['request_throughput']:.2f} when "
        f"{rates[-1]:g} are.",
        f"The median time per output token goes "
        f"{series(curve, lambda s: s['tpot_ms']['p50'], '.1f', ' ms')}: from the lowest rate "
        f"to the highest it {moves} by {abs(tpot[-1] / tpot[0] - 1):.0%}.",
        f"The median time to first token goes "
        f"{series(curve, lambda s: s['ttft_ms']['p50'], '.0f', ' ms')}: {knee}.",
    ]
    return " ".join(sentences)
