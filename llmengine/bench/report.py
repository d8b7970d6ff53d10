"""How `llmengine bench` prints a pool sweep: one summary per pool, as JSON, CSV or a table.

The summary's keys are the contract's JSON fields; the table and the CSV are views of the
same dictionaries, so the three formats can never disagree about a number.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from typing import Any

from llmengine.bench.batchbench import PoolResult


def pool_summary(result: PoolResult, *, same_text: bool) -> dict[str, Any]:
    """One pool as the JSON object `llmengine bench --format json` prints."""
    timing = result.timing
    latencies = result.latencies_iterations
    return {
        "pool_blocks": result.pool_blocks,
        "iterations": timing.iterations,
        "tokens": timing.total_tokens,
        "occupancy": timing.occupancy,
        "preemptions": timing.preemptions,
        "evictions_per_request": timing.preemptions_per_request,
        "forward_tokens": timing.total_forward_tokens,
        "recomputed_tokens": timing.total_recomputed_tokens,
        "recompute_fraction": timing.recompute_fraction,
        "tokens_per_eviction": timing.tokens_per_eviction,
        "preemption_latency_penalty": timing.preemption_latency_penalty,
        "mean_latency_iterations": sum(latencies) / len(latencies),
        "latencies_iterations": latencies,
        "reservation_waste": timing.reservation_waste,
        "fragmentation_waste": timing.fragmentation_waste,
        "same_text": same_text,
        "swap_blocks": timing.num_swap_blocks,
        "swapped_out": timing.swap_outs,
        "swapped_in": timing.swap_ins,
        "recompute_preemptions": timing.recompute_preemptions,
        "blocks_swapped_out": timing.total_blocks_swapped_out,
        "blocks_swapped_in": timing.total_blocks_swapped_in,
        "bytes_swapped": timing.bytes_swapped,
    }


def sweep_summary(results: Sequence[PoolResult]) -> list[dict[str, Any]]:
    """Every pool's summary; `same_text` says every pool generated the first pool's tokens."""
    same_text = all(result.outputs == results[0].outputs for result in results)
    return [pool_summary(result, same_text=same_text) for result in results]


def ratio_text(value: float | None) -> str:
    """A ratio as `1.23x`, or `n/a` where there is none."""
    return "n/a" if value is None else f"{value:.2f}x"


def _number(value: float | None, digits: int) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


# (header, summary key, how to print it), in table order.
TABLE_COLUMNS: list[tuple[str, str, Any]] = [
    ("pool", "pool_blocks", str),
    ("iterations", "iterations", str),
    ("occupancy", "occupancy", lambda v: f"{v:.3f}"),
    ("preempted", "preemptions", str),
    ("evict/req", "evictions_per_request", lambda v: f"{v:.2f}"),
    ("forward", "forward_tokens", str),
    ("recomputed", "recomputed_tokens", str),
    ("recompute", "recompute_fraction", lambda v: f"{v:.1%}"),
    ("tok/evict", "tokens_per_eviction", lambda v: _number(v, 1)),
    ("victim lat", "preemption_latency_penalty", ratio_text),
    ("mean lat", "mean_latency_iterations", lambda v: f"{v:.1f}"),
    ("max lat", "latencies_iterations", lambda v: str(max(v))),
]

# Shown after TABLE_COLUMNS only when a pool had a swap space, so a sweep under recompute
# prints the table it always printed.
SWAP_COLUMNS: list[tuple[str, str, Any]] = [
    ("swapped", "swapped_out", str),
    ("by recompute", "recompute_preemptions", str),
    ("blocks out", "blocks_swapped_out", str),
    ("blocks in", "blocks_swapped_in", str),
    ("MiB moved", "bytes_swapped", lambda v: f"{v / 2**20:.2f}"),
]


def format_table(summaries: Sequence[dict[str, Any]]) -> str:
    """The sweep as an aligned text table, one row per pool, numbers right-aligned.

    The swap columns follow when any pool had a swap space.
    """
    columns = TABLE_COLUMNS
    if any(summary.get("swap_blocks") for summary in summaries):
        columns = TABLE_COLUMNS + SWAP_COLUMNS
    cells = [[header for header, _, _ in columns]]
    cells += [[show(summary[key]) for _, key, show in columns] for summary in summaries]
    lines = aligned_lines(cells)
    if summaries:
        same = all(summary["same_text"] for summary in summaries)
        lines.append(f"same text in every pool: {'yes' if same else 'NO'}")
    return "\n".join(lines)


def format_csv(summaries: Sequence[dict[str, Any]]) -> str:
    """The sweep as CSV with the JSON's fields; latencies joined by spaces, None left empty."""
    return csv_text(
        [
            {
                key: " ".join(map(str, value)) if isinstance(value, list) else value
                for key, value in summary.items()
            }
            for summary in summaries
        ]
    )


def aligned_lines(cells: Sequence[Sequence[str]]) -> list[str]:
    """Rows of cells as text lines, two spaces apart, each column right-aligned to its widest."""
    widths = [max(len(row[column]) for row in cells) for column in range(len(cells[0]))]
    return [
        "  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True))
        for row in cells
    ]


def csv_text(rows: Sequence[dict[str, Any]]) -> str:
    """Flat rows as CSV: every row's keys are columns, in the order first seen; None empty."""
    buffer = io.StringIO()
    if rows:
        fields = list(dict.fromkeys(key for row in rows for key in row))
        writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return buffer.getvalue()
