"""The lessons read as one edited book: checked over every notebook's cells, nothing executed.

- no sentence narrates the code's history or names an issue the reader cannot see;
- the build diary the seeds come from ("diary", "Week N", "Day N") is named in lesson 01 at
  most once and nowhere else: a workload is named by what it is;
- tables render: none is printed as monospace pipes (`show_table` displays them as Markdown);
- plotting code longer than a screenful lives in `llmengine/lessons/`, not in the reading flow,
  and no code cell runs past MAX_STATEMENTS statements: the prose speaks between the parts;
- a lesson that writes wall-clock numbers shows the machine they belong to (`show_machine`);
- no scoreboard: no table with a target or met/missed column, no MISSED, but what the number
  teaches;
- every lesson ends with its exercises, checked by `llmengine.lessons.exercises.lesson_NN`, and
  no exercise's answer is printed before it (`printed_answer`, which `tests/conftest.py` applies
  to every answer the exercise tests check).
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from llmengine.lessons.artifacts import MACHINE_PREFIX

LESSONS = sorted((Path(__file__).resolve().parent.parent / "lessons").glob("*.ipynb"))
HISTORY = re.compile(
    r"\b(until now|as before|no longer|used to|landed|previously|was measured|now does|"
    r"issue \d+|lesson \d+ removed)\b",
    re.IGNORECASE,
)
DIARY = re.compile(r"\b[Dd]iary\b|\bWeeks? \d+|\bDays?[- ]\d+")
DIARY_LESSON = "01"
PRINTED_TABLE_RULE = re.compile(r"^\|[ :|-]+\|$", re.MULTILINE)
PLOTTING = re.compile(r"\bplt\.|\.plot\(|\bax\.|subplots\(")
MAX_PLOTTING_LINES = 20
MAX_STATEMENTS = 25
SCOREBOARD_HEADER = re.compile(
    r"^(targets?\b.*|met\??|missed|met or missed|verdict)$", re.IGNORECASE
)
SCOREBOARD_WORD = re.compile(r"\bMISSED\b")
NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?(?![\w])")


@dataclass(frozen=True)
class Cell:
    index: int
    kind: str
    source: str
    printed: str  # the text the cell printed (stream outputs)
    displayed: str = ""  # what it displayed: Markdown or plain text of its results

    @property
    def shown(self) -> str:
        return self.printed + "\n" + self.displayed


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
            "\n".join(
                "".join(output.get("data", {}).get(kind, ""))
                for output in cell.get("outputs", [])
                for kind in ("text/markdown", "text/plain")
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
    """Where the diary is named: in prose, and in what the cells print or display."""
    return [
        f"[{cell.index}] {match.group(0)!r}"
        for cell in cells
        for text in ((cell.source if cell.kind == "markdown" else ""), cell.shown)
        for match in DIARY.finditer(text)
    ]


def statements(source: str) -> int:
    """Statements in a code cell, nested ones included (IPython's `%` and `!` lines left out)."""
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    return sum(isinstance(node, ast.stmt) for node in ast.walk(ast.parse("\n".join(lines))))


def long_cells(cells: list[Cell]) -> list[str]:
    return [
        f"[{cell.index}] {count} statements"
        for cell in cells
        if cell.kind == "code" and (count := statements(cell.source)) > MAX_STATEMENTS
    ]


def writes_wallclock(cells: list[Cell]) -> bool:
    return any(cell.kind == "code" and "wallclock=True" in cell.source for cell in cells)


def shows_machine(cells: list[Cell]) -> bool:
    return any(MACHINE_PREFIX in cell.shown for cell in cells)


def scoreboards(cells: list[Cell]) -> list[str]:
    """Tables with a target or met/missed column, and MISSED anywhere shown."""
    found = []
    for cell in cells:
        text = cell.source if cell.kind == "markdown" else cell.shown
        lines = text.splitlines()
        for header, rule in zip(lines, lines[1:], strict=False):
            if header.startswith("|") and PRINTED_TABLE_RULE.fullmatch(rule.strip()):
                names = [name.strip().strip("*") for name in header.strip("|").split("|")]
                found += [
                    f"[{cell.index}] column {n!r}" for n in names if SCOREBOARD_HEADER.match(n)
                ]
        found += [f"[{cell.index}] {m.group(0)!r}" for m in SCOREBOARD_WORD.finditer(cell.shown)]
    return found


def exercises_heading(cells: list[Cell]) -> int | None:
    """The index of the lesson's last `## Exercises` heading, None without one."""
    headings = [c.index for c in cells if c.kind == "markdown" and c.source.startswith("## Exer")]
    return headings[-1] if headings else None


def before_exercises(cells: list[Cell]) -> list[Cell]:
    heading = exercises_heading(cells)
    return [cell for cell in cells if heading is None or cell.index < heading]


def printed_answer(cells: list[Cell], answer: Any) -> list[int]:
    """The cells before the exercises that show `answer`: a whole number of three digits or
    more, a fraction to the precision it is printed with (three significant digits at least),
    or a string of twelve characters or more. Smaller values turn up in any table by chance,
    so they are left to the reader's eye."""
    if isinstance(answer, str):
        needle = answer.strip()
        return [c.index for c in before_exercises(cells) if len(needle) >= 12 and needle in c.shown]
    if isinstance(answer, bool) or not isinstance(answer, int | float):
        return []
    if isinstance(answer, int) and abs(answer) < 100:
        return []
    hits = []
    for cell in before_exercises(cells):
        for match in NUMBER.finditer(cell.shown):
            text = match.group(0).replace(",", "")
            digits = len(text.lstrip("-0.").replace(".", ""))
            decimals = len(text.partition(".")[2])
            if isinstance(answer, float) and (decimals == 0 or digits < 3):
                continue
            if round(answer, decimals) == float(text):
                hits.append(cell.index)
                break
    return hits


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
    heading = exercises_heading(cells)
    if heading is None:
        return False
    after = cells[heading + 1 :]
    return any(module in cell.source for cell in after if cell.kind == "code")


@pytest.mark.parametrize("path", LESSONS, ids=lambda path: path.stem[:2])
def test_no_sentence_narrates_history(path: Path) -> None:
    assert history_phrases(cells_of(path)) == []


@pytest.mark.parametrize("path", LESSONS, ids=lambda path: path.stem[:2])
def test_the_diary_is_named_in_lesson_01_at_most_once(path: Path) -> None:
    allowed = 1 if path.name.startswith(DIARY_LESSON) else 0
    assert len(diary_mentions(cells_of(path))) <= allowed, diary_mentions(cells_of(path))


@pytest.mark.parametrize("path", LESSONS, ids=lambda path: path.stem[:2])
def test_tables_render_as_markdown(path: Path) -> None:
    assert printed_tables(cells_of(path)) == [], "cells printing a Markdown table"


@pytest.mark.parametrize("path", LESSONS, ids=lambda path: path.stem[:2])
def test_plotting_code_lives_in_the_helpers(path: Path) -> None:
    assert long_plotting_cells(cells_of(path)) == []


@pytest.mark.parametrize("path", LESSONS, ids=lambda path: path.stem[:2])
def test_no_code_cell_runs_on(path: Path) -> None:
    assert long_cells(cells_of(path)) == []


@pytest.mark.parametrize("path", LESSONS, ids=lambda path: path.stem[:2])
def test_wallclock_numbers_name_their_machine(path: Path) -> None:
    cells = cells_of(path)
    assert shows_machine(cells) or not writes_wallclock(cells), "no show_machine() output"


@pytest.mark.parametrize("path", LESSONS, ids=lambda path: path.stem[:2])
def test_no_scoreboard(path: Path) -> None:
    assert scoreboards(cells_of(path)) == []


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
        Cell(4, "code", "show_table(t, 'step', wallclock=True)", "", "| workload | tok/s |\n"),
        Cell(5, "code", "x = 1", "The Day-34 burst and its 21 tokens: 133 steps, 2.71 ms\n"),
        Cell(
            6,
            "code",
            "",
            "",
            "| row | target: at least | met? |\n| --- | --: | --- |\n| 1 | 2 | MISSED |",
        ),
        Cell(7, "markdown", "## Exercises\n1. How many steps?", ""),
    ]
    assert len(history_phrases(bad)) == 3
    assert len(diary_mentions(bad)) == 4
    assert printed_tables(bad) == [2]
    assert long_plotting_cells(bad) == ["[3] 27 lines"]
    assert long_cells(bad) == ["[3] 26 statements"]
    assert writes_wallclock(bad) and not shows_machine(bad)
    assert scoreboards(bad) == [
        "[6] column 'target: at least'",
        "[6] column 'met?'",
        "[6] 'MISSED'",
    ]
    assert printed_answer(bad, 133) == printed_answer(bad, 2.7123) == [5]
    assert printed_answer(bad, "burst and its 21 tokens") == [5]
    assert printed_answer(bad, 21) == printed_answer(bad, 2.72) == printed_answer(bad, 21.0) == []
    assert not ends_with_exercises(bad, "llmengine.lessons.exercises.lesson_99")
    good = [
        Cell(0, "markdown", "The engine computes each position once, a day 01 to 31.", ""),
        Cell(1, "code", "show_table(table, 'step', wallclock=True)", ""),
        Cell(2, "code", "show_machine()", "", f"{MACHINE_PREFIX}a processor"),
        Cell(3, "markdown", "## Exercises\n1. Predict.", ""),
        Cell(4, "code", "from llmengine.lessons.exercises.lesson_99 import check_1", ""),
    ]
    assert history_phrases(good) == diary_mentions(good) == printed_tables(good) == []
    assert long_cells(good) == scoreboards(good) == printed_answer(good, 999) == []
    assert shows_machine(good)
    assert ends_with_exercises(good, "llmengine.lessons.exercises.lesson_99")
