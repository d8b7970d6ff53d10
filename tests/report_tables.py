"""Read a committed lesson table, `reports/NAME.md`: the one parser every test uses."""

from __future__ import annotations

import re
from pathlib import Path

REPORTS = Path(__file__).resolve().parent.parent / "reports"
UNESCAPED_PIPE = re.compile(r"(?<!\\)\|")  # a cell's own "|" is written "\|"


def _cells(name: str) -> tuple[list[str], list[list[str]]]:
    """The header and the body rows of the Markdown pipe table `reports/NAME.md`."""
    lines = (REPORTS / f"{name}.md").read_text(encoding="utf-8").strip().splitlines()
    cells = [
        [cell.strip().replace("\\|", "|") for cell in UNESCAPED_PIPE.split(line.strip()[1:-1])]
        for line in lines
    ]
    return cells[0], cells[2:]


def report_rows(name: str) -> list[list[str]]:
    """The body rows, each a list of cells in column order."""
    return _cells(name)[1]


def read_report_table(name: str) -> list[dict[str, str]]:
    """The body rows, each a dict keyed by the column headers."""
    headers, rows = _cells(name)
    return [dict(zip(headers, row, strict=True)) for row in rows]
