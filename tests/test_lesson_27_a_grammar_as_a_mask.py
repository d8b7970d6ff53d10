"""Lesson 27: the committed notebook and reports say what the lesson claims (the schema's
output validates and ends on the end token, every mask of the steps table allows the token
kept), and its helpers follow, replay, draw and time what the lesson says they do."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from matplotlib.figure import Figure
from report_tables import report_rows

import llmengine
from llmengine import Constraint, Engine, SamplingParams
from llmengine.lessons.exercises import embedded_model
from llmengine.lessons.grammar_mask import (
    PERSON_SCHEMA,
    PROMPT,
    accepted_counts,
    compile_ms,
    first_mask,
    follow,
    grammars_like,
    masks_along,
    plot_masks,
    step_rows,
    time_masks,
    time_steps,
)

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "lessons" / "27-a-grammar-as-a-mask.ipynb"
TOKENIZER = llmengine.load_tokenizer()
SCHEMA = Constraint.json_schema(PERSON_SCHEMA)


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(embedded_model("eager"), num_blocks=64, tokenizer=TOKENIZER)


def test_only_the_closed_schema_gives_a_valid_finished_value() -> None:
    rows = {row[0]: row for row in report_rows("grammar-mask-outputs")}
    assert rows["the person schema"][2:5] == ["eos", "yes", "yes"]
    others = [row for name, row in rows.items() if name != "the person schema"]
    assert len(others) == 4 and all(row[4] == "no" for row in others)


def test_the_steps_table_counts_the_vocabulary_share() -> None:
    rows = report_rows("grammar-mask-steps")
    assert [int(row[0]) for row in rows] == list(range(len(rows)))
    vocab = embedded_model("eager").config.vocab_size
    for row in rows:
        assert float(row[3].rstrip("%")) == pytest.approx(100 * int(row[2]) / vocab, abs=0.006)
    assert rows[-1][4] == "`<eos>`" and int(rows[-1][2]) == 1


def test_the_agreement_report_sorts_every_step_once() -> None:
    """The three kinds of step partition the output: their counts and the nats they give up
    add up to the row of all steps, and no step keeps a token above the model's favourite."""
    *kinds, total = report_rows("grammar-mask-agreement")
    assert [row[0] for row in kinds] == [
        "one token allowed", "several allowed, in the name", "several allowed, elsewhere"
    ]  # fmt: skip
    assert sum(int(row[1]) for row in kinds) == int(total[1])
    assert sum(int(row[2]) for row in kinds) == int(total[2])
    assert sum(float(row[5]) for row in kinds) == pytest.approx(float(total[5]), abs=0.15)
    assert all(float(row[5]) >= 0 for row in [*kinds, total])


def test_follow_is_the_engines_output_and_unmasked_greedy_agrees_everywhere(engine) -> None:
    prompt = TOKENIZER.encode(PROMPT)
    plain = follow(engine, prompt, SamplingParams(max_tokens=12))
    assert plain.tokens == engine.generate([prompt], SamplingParams(max_tokens=12))[0]
    assert plain.agreements == len(plain.tokens) == len(plain.logprobs) == 12
    assert plain.logprobs == plain.favourite_logprobs
    constrained = follow(engine, prompt, SamplingParams(max_tokens=120, constraint=SCHEMA))
    assert constrained.finish_reason == "eos" and not engine.has_unfinished()
    text = TOKENIZER.decode(constrained.tokens, skip_special_tokens=True)
    jsonschema.validate(json.loads(text), PERSON_SCHEMA)
    assert constrained.agreements < len(constrained.tokens)
    pairs = zip(constrained.logprobs, constrained.favourite_logprobs, strict=True)
    assert all(kept <= favourite + 1e-6 for kept, favourite in pairs)


def test_each_mask_allows_its_token_and_the_last_only_the_end(engine) -> None:
    prompt = TOKENIZER.encode(PROMPT)
    choice = Constraint.choice(["yes", "no", "perchance"])
    followed = follow(engine, prompt, SamplingParams(max_tokens=20, constraint=choice))
    masks = masks_along(grammars_like(engine), choice, followed.tokens)
    assert masks.shape == (len(followed.tokens), engine.model.config.vocab_size)
    assert all(masks[step, token] for step, token in enumerate(followed.tokens))
    assert masks[-1].nonzero().flatten().tolist() == list(engine.eos_token_ids)
    assert masks[0].equal(first_mask(grammars_like(engine), choice))
    counts = masks.sum(dim=1).tolist()
    accepted = accepted_counts(grammars_like(engine), choice, followed.tokens)
    assert all(a >= c for a, c in zip(accepted, counts, strict=True))
    rows = step_rows(followed, masks, TOKENIZER, engine.eos_token_ids)
    assert [row[2] for row in rows] == counts
    assert rows[0][1] == "(nothing yet)" and rows[-1][4] == "`<eos>`"
    assert rows[-1][1] == f"`{TOKENIZER.decode(followed.tokens[:-1])}`"


def test_the_figure_marks_every_allowed_token(engine) -> None:
    prompt = TOKENIZER.encode(PROMPT)
    regex = Constraint.regex(r"[0-3][0-9]/[01][0-9]")
    followed = follow(engine, prompt, SamplingParams(max_tokens=10, constraint=regex))
    masks = masks_along(grammars_like(engine), regex, followed.tokens)
    fig = plot_masks(masks, followed, "a date")
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    allowed, kept, _ = fig.axes[0].collections
    assert len(allowed.get_offsets()) == int(masks.sum())
    assert len(kept.get_offsets()) == len(followed.tokens)
    assert len(fig.axes[1].patches) == len(followed.tokens)


def test_the_timers_count_one_mask_per_constrained_token(engine) -> None:
    prompts = [TOKENIZER.encode(p) for p in (PROMPT, "JULIET:\n")]
    plain = time_steps(engine, prompts, SamplingParams(max_tokens=6))
    assert plain.num_masks == 0 and plain.mask_us_per_row == 0.0
    assert plain.steps == 5 and plain.step_ms > 0  # the first step, the prefill, is left out
    masked = time_steps(engine, prompts, SamplingParams(max_tokens=6, constraint=SCHEMA))
    assert masked.num_masks == 2 * 6 and masked.mask_seconds > 0
    assert not engine.has_unfinished()
    choice = Constraint.choice(["yes", "no"])
    tokens = follow(engine, prompts[0], SamplingParams(max_tokens=9, constraint=choice)).tokens
    grammars = grammars_like(engine)
    assert time_masks(grammars, choice, tokens, repeats=2) > 0
    assert grammars.num_masks == 2 * len(tokens)
    assert compile_ms(engine, SCHEMA) > 0


def test_the_notebook_ran_and_ends_with_its_exercises() -> None:
    cells = json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]
    code = [cell for cell in cells if cell["cell_type"] == "code"]
    assert all(cell.get("execution_count") or not cell["source"] for cell in code)
    errors = [o for c in code for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert errors == []
    assert "lesson_27" in "".join(code[-1]["source"])
    assert (ROOT / "figures" / "grammar-mask-steps.png").is_file()
