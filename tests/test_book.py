"""The lessons read as one edited book: checked over every notebook's cells, nothing executed.

- no sentence narrates the code's history or names an issue the reader cannot see;
- the diary the seeds come from is named at most once a lesson ("diary", "Week N");
- tables render: none is printed as monospace pipes (`show_table` displays them as Markdown);
- plotting code longer than a screenful lives in `llmengine/lessons/`, not in the reading flow;
- every lesson ends with its exercises, checked by `llmengine.lessons.exercises.lesson_NN`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

LESSONS = sorted((Path(__file__).resolve().parent.parent / "lessons").glob("*.ipynb"))
HISTORY = re.compile(
    r"\b(until now|as before|no longer|used to|landed|previously|was measured|now does|"
    r"issue \d+|lesson \d+ removed)\b",
    re.IGNORECASE,
)
DIARY = re.compile(r"\bdiary\b|\bWeek \d+", re.IGNORECASE)
PRINTED_TABLE_RULE = re.compile(r"^\|[ :|-]+\|$", re.MULTILINE)
PLOTTING = re.compile(r"\bplt\.|\.plot\(|\bax\.|subplots\(")
MAX_PLOTTING_LINES = 20


@dataclass(frozen=True)
class Cell:
    index: int
    kind: str
    source: str
    printed: str  # the text the cell printed (stream outputs)


def cells_of(path: Path) -> list[Cell]:
    notebook = json.loads(path.read_text(encoding="utf-8"))
    return [
        Cell(
            index,
            cell["cell_type"],
            "".join(cell["source"]),
            "".join(
                "".join(output.get("text", ""))
                for output in cell.get("outputs", [])
                if output.get("output_type") == "stream"
            ),
        )
        for index, cell in enumerate(notebook["cells"])
    ]


def history_phrases(cells: list[Cell]) -> list[str]:
    return [
        f"[{cell.index}] {match.group(0)!r}"
        for cell in cells
        if cell.kind == "markdown"
        for match in HISTORY.finditer(cell.source)
    ]


def diary_mentions(cells: list[Cell]) -> list[str]:
    return [
        f"[{cell.index}] {match.group(0)!r}"
        for cell in cells
        if cell.kind == "markdown"
        for match in DIARY.finditer(cell.source)
    ]


def printed_tables(cells: list[Cell]) -> list[int]:
    return [cell.index for cell in cells if PRINTED_TABLE_RULE.search(cell.printed)]


def long_plotting_cells(cells: list[Cell]) -> list[str]:
    return [
        f"[{cell.index}] {cell.source.count(chr(10)) + 1} lines"
        for cell in cells
        if cell.kind == "code"
        and PLOTTING.search(cell.source)
        and cell.source.count("\n") + 1 > MAX_PLOTTING_LINES
    ]


def exercises_module(path: Path) -> str:
    return f"llmengine.lessons.exercises.lesson_{path.name[:2]}"


def ends_with_exercises(cells: list[Cell], module: str) -> bool:
    """A `## Exercises` heading, and after it only exercises cells that use the lesson's
    checking module."""
    headings = [c.index for c in cells if c.kind == "markdown" and c.source.startswith("## Exer")]
    if not headings:
        return False
    after = cells[headings[-1] + 1 :]
    return any(module in cell.source for cell in after if cell.kind == "code")


@pytest.mark.parametrize("path", LESSONS, ids=lambda path: path.stem[:2])
def test_no_sentence_narrates_history(path: Path) -> None:
    assert history_phrases(cells_of(path)) == []


@pytest.mark.parametrize("path", LESSONS, ids=lambda path: path.stem[:2])
def test_the_diary_is_named_once_at_most(path: Path) -> None:
    assert len(diary_mentions(cells_of(path))) <= 1, diary_mentions(cells_of(path))


@pytest.mark.parametrize("path", LESSONS, ids=lambda path: path.stem[:2])
def test_tables_render_as_markdown(path: Path) -> None:
    assert printed_tables(cells_of(path)) == [], "cells printing a Markdown table"


@pytest.mark.parametrize("path", LESSONS, ids=lambda path: path.stem[:2])
def test_plotting_code_lives_in_the_helpers(path: Path) -> None:
    assert long_plotting_cells(cells_of(path)) == []


@pytest.mark.parametrize("path", LESSONS, ids=lambda path: path.stem[:2])
def test_each_lesson_ends_with_its_exercises(path: Path) -> None:
    assert ends_with_exercises(cells_of(path), exercises_module(path))


def test_the_checks_catch_what_they_look_for() -> None:
    """Each check on a made-up notebook that breaks it, and on one that does not."""
    bad = [
        Cell(0, "markdown", "Until now the engine was measured slower (issue 13).", ""),
        Cell(1, "markdown", "Day 33 of the diary, and Week 8's.", ""),
        Cell(2, "code", "print(table)", "| a | b |\n| --- | --: |\n| x | 1 |\n"),
        Cell(3, "code", "fig, ax = plt.subplots()\n" + "ax.plot([1])\n" * 25, ""),
    ]
    assert len(history_phrases(bad)) == 3
    assert len(diary_mentions(bad)) == 2
    assert printed_tables(bad) == [2]
    assert long_plotting_cells(bad) == ["[3] 27 lines"]
    assert not ends_with_exercises(bad, "llmengine.lessons.exercises.lesson_99")
    good = [
        Cell(0, "markdown", "The engine computes each position once.", ""),
        Cell(1, "code", "show_table(table)", ""),
        Cell(2, "markdown", "## Exercises\n1. Predict.", ""),
        Cell(3, "code", "from llmengine.lessons.exercises.lesson_99 import check_1", ""),
    ]
    assert history_phrases(good) == diary_mentions(good) == printed_tables(good) == []
    assert ends_with_exercises(good, "llmengine.lessons.exercises.lesson_99")
