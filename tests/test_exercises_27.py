"""Lesson 27's exercises: each checker right on the answer worked out here by another route
(the vocabulary searched by hand for prefixes of the options; every token tried against an
llguidance matcher at every step), wrong on another (the mask's own count among them),
unanswered on None."""

from __future__ import annotations

import llmengine
from llmengine import Constraint, Engine, SamplingParams
from llmengine.lessons.exercises import embedded_model
from llmengine.lessons.exercises.lesson_27 import (
    OPTIONS,
    check_first_step_allowed,
    check_grammar_forced_steps,
    check_time_regex,
    first_step_allowed,
)
from llmengine.lessons.grammar_mask import PERSON_SCHEMA, PROMPT
from llmengine.structured.grammar import GrammarCompiler

TOKENIZER = llmengine.load_tokenizer()
VOCAB = embedded_model("eager").config.vocab_size


def prefixes_of(options: tuple[str, ...]) -> int:
    """Tokens whose text is a non-empty beginning of one of the options."""
    texts = [TOKENIZER.decode([token]) for token in range(VOCAB)]
    return sum(bool(text) and any(o.startswith(text) for o in options) for text in texts)


def test_first_step_allowed() -> None:
    right = prefixes_of(OPTIONS)
    assert check_first_step_allowed(right).right is True
    assert check_first_step_allowed(right + 1).right is False
    assert check_first_step_allowed(None).right is None
    assert first_step_allowed(("yes", "no", "perchance")) == prefixes_of(("yes", "no", "perchance"))


def test_time_regex() -> None:
    assert check_time_regex(r"([01][0-9]|2[0-3]):[0-5][0-9]").right is True
    assert check_time_regex(r"([01]\d|2[0-3]):[0-5]\d").right is True
    assert check_time_regex(r"[0-9]{2}:[0-9]{2}").right is False  # lets 24:00 through
    assert check_time_regex(r"[01][0-9]:[0-5][0-9]").right is False  # no evening
    assert check_time_regex(r"[0-9]{2}-[0-9]{2}").right is False  # the model writes a dash
    assert check_time_regex(r"(").right is False
    assert check_time_regex(None).right is None


def test_grammar_forced_steps() -> None:
    constraint = Constraint.json_schema(PERSON_SCHEMA)
    engine = Engine(embedded_model("eager"), num_blocks=64, tokenizer=TOKENIZER)
    params = SamplingParams(max_tokens=120, constraint=constraint)
    tokens = engine.generate([TOKENIZER.encode(PROMPT)], params)[0]
    matcher = GrammarCompiler(TOKENIZER, VOCAB, engine.eos_token_ids).matcher(constraint)
    right = mask_forced = 0
    for token in tokens:
        # the grammar alone: every token it accepts, the end token once it is complete
        accepted = sum(matcher.validate_tokens([t]) == 1 for t in range(VOCAB))
        right += accepted + matcher.is_accepting() == 1
        # the mask also forces the tokenizer's spelling of forced characters (compute_ff_tokens)
        mask_forced += bool(matcher.compute_ff_tokens()) or accepted + matcher.is_accepting() == 1
        assert matcher.consume_token(token)
    assert 0 < right < mask_forced < len(tokens)
    assert check_grammar_forced_steps(right).right is True
    assert check_grammar_forced_steps(mask_forced).right is False  # the count the lesson prints
    assert check_grammar_forced_steps(right - 1).right is False
    assert check_grammar_forced_steps(None).right is None
