"""Fixtures many test files share: the embedded model and its tokenizer, one per module."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

import llmengine


@pytest.fixture(scope="module")
def model() -> llmengine.Llama:
    """The embedded model; module-scoped, as each file loaded its own before."""
    return llmengine.load_model()


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """The embedded model's tokenizer."""
    return llmengine.load_tokenizer()


@pytest.fixture(autouse=True)
def exercise_answers_unprinted(request: pytest.FixtureRequest) -> Iterator[None]:
    """In `test_exercises_NN.py`, every right answer a checker compares with must not be shown
    by lesson NN before its exercises (`test_book.printed_answer`): an exercise that asks for a
    number the lesson printed teaches nothing. Only exact answers are looked for: one checked
    within a tolerance is an estimate, often made from a nearby number the lesson shows on
    purpose (lesson 19's operators at 4 rows from its count at 16), which a measured count
    can equal by chance."""
    lesson = re.fullmatch(r"test_exercises_(\d\d)", request.module.__name__.rpartition(".")[2])
    if lesson is None:
        yield
        return
    from test_book import LESSONS, cells_of, printed_answer

    from llmengine.lessons.exercises import recording_answers

    with recording_answers() as seen:
        yield
    (notebook,) = [path for path in LESSONS if path.name.startswith(lesson.group(1))]
    cells = cells_of(notebook)
    shown = {
        f"{what} = {expected!r}": printed_answer(cells, expected)
        for what, expected, tolerance in seen
        if tolerance == 0
    }
    assert {what: at for what, at in shown.items() if at} == {}, f"answers shown in {notebook.name}"
