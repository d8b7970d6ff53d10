"""Lesson 22's wall-clock tables: the medians of repeated runs per budget, and the sentences
the lesson prints from them.

A budget's runs are summarised field by field (`chunked_prefill.StallSummary`): the median
and the lowest and highest value over the repeats, so that a table can show both the number
and how far the repeats spread. The sentences choose their words from the numbers, so that
what the lesson says stays true of what it measured on whichever machine ran it.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from itertools import pairwise

from llmengine.bench.batchbench import WorkloadRun
from llmengine.lessons.chunked_prefill import StallSummary
from llmengine.lessons.chunked_prefill_figures import budget_label

Spread = tuple[float, float, float]  # (median, lowest, highest) over the repeats
BudgetMedians = dict[str, Spread]  # one per StallSummary field

STALL_FIELDS = ("worst_gap_s", "p99_gap_s", "median_gap_s", "long_ttft_s", "tokens_per_s")
STALL_HEADERS = [
    "max_num_batched_tokens",
    "worst gap (ms)",
    "p99 gap (ms)",
    "median gap (ms)",
    "long prompt's TTFT (ms)",
    "TTFT, lowest-highest",
    "tokens/s",
    "tokens/s, lowest-highest",
]
STALL_FORMATS = ["", ".1f", ".1f", ".1f", ".1f", "", ".0f", ""]


def medians(summaries: Sequence[StallSummary]) -> BudgetMedians:
    """Each field's median over the repeated runs, with the lowest and highest of them."""
    values = {field: [getattr(s, field) for s in summaries] for field in STALL_FIELDS}
    return {f: (statistics.median(v), min(v), max(v)) for f, v in values.items()}


def _range(low: float, high: float, scale: float = 1.0) -> str:
    return f"{scale * low:.0f}-{scale * high:.0f}"


def stall_rows(results: Mapping[int | None, BudgetMedians]) -> list[list[object]]:
    """One row per budget under `STALL_HEADERS`: gaps and TTFT in ms, throughput in tokens/s."""
    return [
        [
            budget_label(budget),
            1e3 * m["worst_gap_s"][0],
            1e3 * m["p99_gap_s"][0],
            1e3 * m["median_gap_s"][0],
            1e3 * m["long_ttft_s"][0],
            _range(*m["long_ttft_s"][1:], scale=1e3),
            m["tokens_per_s"][0],
            _range(*m["tokens_per_s"][1:]),
        ]
        for budget, m in results.items()
    ]


def ratio(results: Mapping[int | None, BudgetMedians], budget: int, field: str) -> float:
    """A budgeted run's median of `field` over the unbudgeted run's."""
    return results[budget][field][0] / results[None][field][0]


def step_durations(run: WorkloadRun) -> list[float]:
    """Seconds each forward of a wall-clock run lasted, from the clock time after each."""
    ends = run.times
    return [later - earlier for earlier, later in zip([0.0, *ends[:-1]], ends, strict=True)]


def chunking_cost_sentence(
    alone_ttft_s: Mapping[int | None, float],
    chunks: Mapping[int | None, int],
    decode_step_s: float,
) -> str:
    """What chunking cost the long prompt alone on an idle engine, in words chosen by the data.

    For each budget: the median TTFT over the unchunked one's, and the seconds each chunk
    after the first added, set against `decode_step_s` (a decode-only step of the run with
    the short requests): an extra chunk is a whole extra step, so that is the scale to read
    it on. Whether the TTFT grew as the chunks multiplied is stated as measured.
    """
    unchunked = alone_ttft_s[None]
    parts = [f"In this run, on an idle engine, one prefill took {1e3 * unchunked:.1f} ms."]
    for budget, ttft in alone_ttft_s.items():
        if budget is None:
            continue
        extra = (ttft - unchunked) / (chunks[budget] - 1)
        parts.append(
            f"At a budget of {budget}, {chunks[budget]} chunks took {ttft / unchunked:.2f}x "
            f"that: {1e3 * extra:+.1f} ms for each chunk after the first, "
            f"{extra / decode_step_s:.1f} times a decode-only step."
        )
    by_chunks = sorted(alone_ttft_s, key=lambda budget: chunks[budget])
    ttfts = [alone_ttft_s[budget] for budget in by_chunks]
    grows = all(earlier < later for earlier, later in pairwise(ttfts))
    parts.append(
        f"(A decode-only step beside the short requests took {1e3 * decode_step_s:.2f} ms.) "
        f"The TTFT {'grew' if grows else 'did not grow'} with every step up in the count of "
        "chunks."
    )
    return " ".join(parts)
