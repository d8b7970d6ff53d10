"""The peers report (`make peers`) as tables and a figure, for the script and for lesson 25.

`scripts/peers.py` renders its rows here; lesson 25 reads the committed
`reports/wallclock/peers.md` back (`read_report`) and draws the same figure from it, labelled
with the machine the report names, without building or running any peer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from llmengine.bench.peers.results import Row, throughput_cells
from llmengine.lessons.artifacts import markdown_table, use_lesson_style

MACHINE_LINE = "processor (lscpu)"
# The header lines besides the processor that tell two machines apart: what the vector units
# can do, and how busy the machine was.
MACHINE_DETAILS = ("ISA flags", "load average")


def throughput_table(rows: Sequence[Row], extra_columns: Sequence[tuple[str, str]] = ()) -> str:
    """`results.throughput_cells` as a Markdown table."""
    headers, cells = throughput_cells(rows, extra_columns)
    return markdown_table(cells, headers)


@dataclass(frozen=True, slots=True)
class ReportRow:
    """One row of a throughput table read back from the report: tok/s is None if it failed."""

    model: str
    workload: str
    engine: str
    tokens_per_s: float | None


def read_report(path: str | Path) -> tuple[str, list[ReportRow]]:
    """The machine named in the report's header (the processor, then its ISA flags and load
    average where the header gives them), and every row of its throughput tables."""
    machine, details, rows = "unknown machine", [], []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if cells[0] == MACHINE_LINE and len(cells) > 1:
            machine = cells[1]
        elif cells[0].startswith(MACHINE_DETAILS) and len(cells) > 1:
            details.append(f"{cells[0]}: {cells[1]}")
        elif len(cells) >= 5 and cells[3] not in ("tok/s", "") and not set(cells[3]) <= {"-"}:
            speed = None if cells[3].startswith("failed") else float(cells[3])
            rows.append(ReportRow(cells[0], cells[1], cells[2], speed))
    return (f"{machine} ({'; '.join(details)})" if details else machine), rows


def plot_peers(rows: Sequence[Row | ReportRow], title: str) -> Figure:
    """Grouped bars of tok/s (log scale), one group per model and workload, one bar per engine;
    a failed or missing engine leaves its bar out."""
    use_lesson_style()
    keys = list(dict.fromkeys((row.model, row.workload) for row in rows))
    engines = list(dict.fromkeys(row.engine for row in rows))
    by = {(row.model, row.workload, row.engine): row.tokens_per_s for row in rows}
    fig, ax = plt.subplots(figsize=(min(16.0, max(6.4, 0.3 * len(keys) * len(engines))), 4.4))
    width = 0.8 / max(len(engines), 1)
    for e, engine in enumerate(engines):
        xs = [k + (e - (len(engines) - 1) / 2) * width for k in range(len(keys))]
        ys = [by.get((*key, engine)) or 0.0 for key in keys]
        ax.bar(xs, ys, width, label=engine)
    ax.set_xticks(range(len(keys)), [f"{m}\n{w}" for m, w in keys], rotation=60, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("generated tokens / s")
    ax.set_title(title, fontsize=9)
    ax.legend()
    return fig
