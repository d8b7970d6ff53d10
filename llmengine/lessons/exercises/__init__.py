"""Exercises: a question in the lesson, the learner's answer, and a check that says right or
wrong.

Each lesson ends with two or three exercises a learner can do in minutes on the embedded
model: change a knob or predict a number, then run. `llmengine.lessons.exercises.lesson_NN`
holds that lesson's checking functions; each computes the true answer itself (by running the
engine, or from the lesson's own functions), never from a typed-in constant, and returns a
`Verdict`, which a notebook displays as one line. An exercise left unanswered (`None`) is not
wrong: the lessons run in CI with every answer blank.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmengine.speed.prepare import PreparedLlama


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of one check: `right` is None while the exercise is unanswered."""

    right: bool | None
    message: str

    def __bool__(self) -> bool:
        return bool(self.right)

    def _repr_markdown_(self) -> str:
        mark = {True: "**Right.**", False: "**Not yet.**", None: "*Unanswered.*"}[self.right]
        return f"{mark} {self.message}"

    def __repr__(self) -> str:
        label = {True: "right", False: "wrong", None: "unanswered"}[self.right]
        return f"{label}: {self.message}"


_RECORDERS: list[list[tuple[str, Any, float]]] = []


@contextlib.contextmanager
def recording_answers() -> Iterator[list[tuple[str, Any, float]]]:
    """Collect `(what, expected, tolerance)` for every answer `check_value` compares while the
    block runs.

    The book's tests use it to look for each right answer in the lesson's printed output: an
    exercise must ask for something the reader works out, not something the lesson showed.
    """
    seen: list[tuple[str, Any, float]] = []
    _RECORDERS.append(seen)
    try:
        yield seen
    finally:
        _RECORDERS.remove(seen)


def check_value(
    answer: Any,
    expected: Any,
    *,
    what: str,
    tolerance: float = 0.0,
    explain: str = "",
) -> Verdict:
    """Compare an answer with the value the lesson's code computes.

    Numbers match within `tolerance` (relative: 0.1 accepts 10% either way); anything else
    must be equal. `what` names the quantity in the message; `explain` says why the right
    answer is what it is, shown once the answer is right.
    """
    if answer is None:
        return Verdict(None, f"set your answer for {what} and run the cell again.")
    for seen in _RECORDERS:
        seen.append((what, expected, tolerance))
    if _is_number(answer) and _is_number(expected):
        close = math.isclose(answer, expected, rel_tol=tolerance, abs_tol=0.0)
        right = answer == expected if tolerance == 0 else close
    else:
        right = answer == expected
    if right:
        return Verdict(True, f"{what} is {expected!r}. {explain}".strip())
    if _is_number(answer) and _is_number(expected):
        hint = "higher" if expected > answer else "lower"
        return Verdict(False, f"{what} is not {answer!r}: the right answer is {hint}. Try again.")
    return Verdict(False, f"{what} is not {answer!r}. Try again.")


def check_with(answer: Any, judge: Callable[[Any], tuple[bool, str]], *, what: str) -> Verdict:
    """Check an answer that is not one value (a choice of knob, a list): `judge` runs it and
    returns whether it does what was asked, and what it did."""
    if answer is None:
        return Verdict(None, f"set your answer for {what} and run the cell again.")
    right, observed = judge(answer)
    return Verdict(right, observed if right else f"{observed} Try again.")


@functools.cache
def embedded_model(kernels: str = "measured") -> PreparedLlama:
    """The embedded model the checkers run, loaded once per process for each `kernels`
    (`"eager"` skips timing the kernels, for checkers that only count)."""
    from llmengine.runner.loading import load_model

    return load_model(kernels=kernels)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
