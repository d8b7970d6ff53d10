"""Rows of `make peers`: one measurement per engine and round, medians, ratios, table cells.

Every measurement keeps the machine's 1-minute load average from when it started, because
the machine is shared: a row with a high load is a row to distrust, and the report shows it.
A peer that failed has rows too, with its reason instead of a number.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from llmengine.bench.report import ratio_text

BASELINE = "llama.cpp"
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16")


@dataclass(frozen=True, slots=True)
class Measurement:
    """One engine, one workload, one round. `tokens_per_s` is None when it failed (`error`)."""

    model: str
    workload: str
    engine: str
    tokens_per_s: float | None
    load: float = 0.0
    error: str | None = None
    extra: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Row:
    """The rounds of one (model, workload, engine): median tok/s, every round's load."""

    model: str
    workload: str
    engine: str
    tokens_per_s: float | None
    loads: tuple[float, ...]
    error: str | None
    extra: dict[str, float]

    @property
    def key(self) -> tuple[str, str]:
        return self.model, self.workload


def current_load() -> float:
    """The 1-minute load average now."""
    return os.getloadavg()[0]


def failed(model: str, workload: str, engine: str, error: str) -> Measurement:
    return Measurement(model, workload, engine, None, current_load(), error)


def aggregate(measurements: Sequence[Measurement]) -> list[Row]:
    """One row per (model, workload, engine), in first-seen order; medians of the rounds that
    ran, the error of the first that did not when none ran."""
    groups: dict[tuple[str, str, str], list[Measurement]] = {}
    for m in measurements:
        groups.setdefault((m.model, m.workload, m.engine), []).append(m)
    rows = []
    for (model, workload, engine), group in groups.items():
        ran = [m for m in group if m.tokens_per_s is not None]
        errors = [m.error for m in group if m.error]
        speed = statistics.median(m.tokens_per_s for m in ran) if ran else None
        keys = dict.fromkeys(key for m in ran for key in m.extra)
        extra = {
            key: statistics.median(m.extra[key] for m in ran if key in m.extra) for key in keys
        }
        error = None if ran else (errors[0] if errors else "no round ran")
        rows.append(Row(model, workload, engine, speed, tuple(m.load for m in group), error, extra))
    return rows


def ratio_to_baseline(row: Row, rows: Sequence[Row], baseline: str = BASELINE) -> float | None:
    """`row`'s tok/s over the baseline engine's on the same model and workload, if both ran."""
    for other in rows:
        if other.key == row.key and other.engine == baseline:
            if other.tokens_per_s and row.tokens_per_s is not None:
                return row.tokens_per_s / other.tokens_per_s
            return None
    return None


def _loads(row: Row) -> str:
    return " / ".join(f"{load:.1f}" for load in row.loads)


def _speed(row: Row, most: int = 160) -> str:
    """tok/s with one decimal, or `failed: <reason>` cut to `most` characters."""
    if row.tokens_per_s is not None:
        return f"{row.tokens_per_s:.1f}"
    reason = row.error or ""
    return "failed: " + (reason if len(reason) <= most else reason[: most - 3] + "...")


def throughput_cells(
    rows: Sequence[Row], extra_columns: Sequence[tuple[str, str]] = ()
) -> tuple[list[str], list[list[str]]]:
    """Headers and cells: model, workload, engine, tok/s, ratio to llama.cpp, extras, load per
    round. `extra_columns` are (header, key of `Row.extra`) pairs, printed with one decimal."""
    table = []
    for row in rows:
        extras = [f"{row.extra[key]:.1f}" if key in row.extra else "" for _, key in extra_columns]
        ratio = ratio_text(ratio_to_baseline(row, rows))
        table.append(
            [row.model, row.workload, row.engine, _speed(row), ratio, *extras, _loads(row)]
        )
    headers = ["model", "workload", "engine", "tok/s", f"x {BASELINE}"]
    headers += [header for header, _ in extra_columns] + ["load (1 min, per round)"]
    return headers, table


def parse_lscpu(text: str) -> tuple[str, list[str]]:
    """The processor's model name and which of ISA_FLAGS it has, from `lscpu`'s output."""
    name, flags = "unknown", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Model name":
            name = value.strip()
        elif key.strip() == "Flags":
            flags = set(value.split())
    return name, [flag for flag in ISA_FLAGS if flag in flags]


def agreement(reference: Sequence[Sequence[int]], other: Sequence[Sequence[int]]) -> str:
    """`agree (n/n)` when every sequence is the same, else where the first difference is."""
    if len(reference) != len(other):
        return f"differ: {len(other)} outputs for {len(reference)} prompts"
    for index, (a, b) in enumerate(zip(reference, other, strict=True)):
        position = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        if position is None and len(a) != len(b):
            position = min(len(a), len(b))
        if position is not None:
            return f"differ: prompt {index} from token {position}"
    return f"agree ({len(reference)}/{len(reference)})"
