"""Lesson 27's exercises: the mask a constraint puts on the embedded model's vocabulary.

The checkers ask the engine's own grammar code (`RequestGrammars`, the matchers the sampler
uses) and run the embedded model greedily where an answer is a constraint or a count over
its output; nothing is timed.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

import llmengine
from llmengine.engine import Engine
from llmengine.lessons.exercises import Verdict, check_value, check_with, embedded_model
from llmengine.lessons.grammar_mask import (
    PERSON_SCHEMA,
    PROMPT,
    accepted_counts,
    first_mask,
    follow,
    grammars_like,
)
from llmengine.params import SamplingParams
from llmengine.structured.constraint import Constraint

OPTIONS = ("ROMEO", "JULIET", "NURSE")
TIME = re.compile(r"([01][0-9]|2[0-3]):[0-5][0-9]")
NOT_TIMES = ("24:00", "29:15", "23:60", "12:75", "7:05", "07:5", "07-05", "12:30:00", "ab:cd",
             "")  # fmt: skip


@functools.cache
def _engine() -> Engine:
    return Engine(embedded_model("eager"), num_blocks=64, tokenizer=llmengine.load_tokenizer())


def first_step_allowed(options: Sequence[str] = OPTIONS) -> int:
    """The tokens the mask of `Constraint.choice(options)` allows before anything is written."""
    engine = _engine()
    return int(first_mask(grammars_like(engine), Constraint.choice(list(options))).sum())


def check_first_step_allowed(answer: int | None, options: Sequence[str] = OPTIONS) -> Verdict:
    """Exercise 1: how many tokens the first mask of a choice allows."""
    what = f"the tokens allowed at the first step of choice({list(options)})"
    if answer is None:
        return check_value(None, None, what=what)
    return check_value(
        answer,
        first_step_allowed(options),
        what=what,
        explain="Every token whose text begins one of the options, whole options included; "
        "the end token only once an option is complete.",
    )


def greedy_under(pattern: str, max_tokens: int = 16) -> str:
    """The embedded model's greedy answer to the lesson's prompt under `Constraint.regex`,
    without the end token."""
    engine = _engine()
    params = SamplingParams(max_tokens=max_tokens, constraint=Constraint.regex(pattern))
    tokens = engine.generate([engine.tokenizer.encode(PROMPT)], params)[0]
    return engine.tokenizer.decode(tokens, skip_special_tokens=True)


def judge_time_regex(pattern: str) -> tuple[bool, str]:
    """Right when the model's greedy answer under `pattern` is a time HH:MM on a 24-hour
    clock, and the pattern itself (read by Python's `re`, whose syntax agrees with
    llguidance's here) matches every minute of the day and none of a list of near misses."""
    try:
        compiled = re.compile(pattern)
        answer = greedy_under(pattern)
    except (re.error, ValueError) as error:
        return False, f"The pattern does not compile: {str(error).splitlines()[0]}"
    if not TIME.fullmatch(answer):
        return False, f"Under it the model writes {answer!r}, which is not a time HH:MM."
    times = [f"{hour:02d}:{minute:02d}" for hour in range(24) for minute in range(60)]
    missed = [time for time in times if not compiled.fullmatch(time)]
    if missed:
        return False, f"The model writes {answer!r}, but the pattern refuses {missed[0]!r}."
    let_through = [text for text in NOT_TIMES if compiled.fullmatch(text)]
    if let_through:
        return (
            False,
            f"The model writes {answer!r}, but the pattern also allows {let_through[0]!r}.",
        )
    return True, f"The model writes {answer!r}, and the pattern allows exactly the times HH:MM."


def check_time_regex(answer: str | None) -> Verdict:
    """Exercise 2: a regular expression that makes the model answer with a time HH:MM."""
    return check_with(answer, judge_time_regex, what="a regex for a time HH:MM")


def grammar_forced_steps(schema: dict | None = None, max_tokens: int = 120) -> int:
    """Steps of the model's greedy output under `schema` (the lesson's by default) at which the
    grammar alone accepts exactly one token, the end token included: the steps a mask that
    allowed every accepted token, not only the tokenizer's own spelling of forced text, would
    still force."""
    engine = _engine()
    constraint = Constraint.json_schema(schema or PERSON_SCHEMA)
    followed = follow(
        engine,
        engine.tokenizer.encode(PROMPT),
        SamplingParams(max_tokens=max_tokens, constraint=constraint),
    )
    return accepted_counts(grammars_like(engine), constraint, followed.tokens).count(1)


def check_grammar_forced_steps(answer: int | None) -> Verdict:
    """Exercise 3: at how many steps of the lesson's schema output the grammar alone, not the
    tokenizer's spelling, leaves one token."""
    what = "the steps of the schema's output at which the grammar accepts exactly one token"
    if answer is None:
        return check_value(None, None, what=what)
    return check_value(
        answer,
        grammar_forced_steps(),
        what=what,
        explain="The steps the mask forces, less those where it forces only the tokenizer's "
        "spelling: there the grammar accepts every token that spells a beginning of the forced "
        "text.",
    )
