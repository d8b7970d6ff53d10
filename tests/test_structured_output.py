"""Constrained decoding in the engine: every kind of constraint gives output that matches it,
through preemption, swap, prefix caching, chunked prefill, n > 1, seeds and aborts, and
requests without a constraint are untouched."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import jsonschema
import pytest
from hf_llama import save_random_llama

import llmengine
from llmengine import Constraint, Engine, SamplingParams
from llmengine.structured.grammar import GrammarCompiler

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "mood": {"enum": ["merry", "sad", "wroth"]},
        "friends": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2},
    },
    "required": ["name", "age", "mood", "friends"],
    "additionalProperties": False,
}
PLAY = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 24},
        "acts": {"type": "integer", "minimum": 1, "maximum": 5},
        "tragic": {"type": "boolean"},
    },
    "required": ["title", "acts", "tragic"],
    "additionalProperties": False,
}
PATTERN = r"(Good|Ill) (morrow|night), [A-Z][a-z]{2,9}\."
LARK = 'start: "My lord, " NAME "!"\nNAME: /[A-Z][a-z]{1,8}/'
CHOICES = ["yes", "no", "perchance"]
BUDGET = 120  # enough for every constraint above to close


def text_of(tokenizer, tokens: list[int]) -> str:
    return tokenizer.decode(tokens, skip_special_tokens=True)


def check_matches(constraint: Constraint, text: str) -> None:
    """Fail unless `text` is in the constraint's language."""
    if constraint.kind == "json_schema":
        jsonschema.validate(json.loads(text), json.loads(constraint.source))
    elif constraint.kind == "json_object":
        assert isinstance(json.loads(text), dict)
    elif constraint.kind == "regex":
        assert re.fullmatch(constraint.source, text), text
    elif constraint.kind == "choice":
        assert text in json.loads(constraint.source)
    else:
        assert re.fullmatch(r"My lord, [A-Z][a-z]{1,8}!", text), text


CONSTRAINTS = [
    Constraint.json_schema(PERSON),
    Constraint.json_schema(PLAY),
    Constraint.regex(PATTERN),
    Constraint.choice(CHOICES),
    Constraint.grammar(LARK),
]


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    speakers = ["ROMEO:\n", "KING HENRY:\n", "First Citizen:\n", "JULIET:\nO ", "HAMLET:\nTo be"]
    return [tokenizer.encode(text) for text in speakers]


def run(
    engine: Engine,
    prompts: list[list[int]],
    params: list[SamplingParams],
    evicted: list[int] | None = None,
) -> list[list[int]]:
    """Every request's tokens; `evicted` (when given) collects the preemptions' victims."""
    ids = engine.add_requests(prompts, params)
    while engine.has_unfinished():
        outcome = engine.step()
        engine.check_integrity()
        if evicted is not None:
            evicted.extend(outcome.evicted)
    return [engine.release(request_id).output_token_ids for request_id in ids]


def test_each_kind_of_constraint_gives_output_in_its_language(model, tokenizer, prompts) -> None:
    engine = Engine(model, num_blocks=64, tokenizer=tokenizer)
    for constraint in CONSTRAINTS:
        params = SamplingParams(max_tokens=BUDGET, constraint=constraint)
        for tokens in run(engine, prompts, [params] * len(prompts)):
            assert tokens[-1] in model.config.eos_token_ids  # the grammar closed, then ended
            check_matches(constraint, text_of(tokenizer, tokens))
    grammars = engine.runner.sampler.grammars
    assert grammars.num_masks > 0 and grammars.mask_seconds > 0


def test_any_json_object_lets_the_model_write_one_key_for_ever(model, tokenizer, prompts) -> None:
    """`json_object` allows any key, and a model that never saw JSON never closes one: each
    greedy output runs to its budget inside its first key, which is still a JSON string
    (no raw newline or quote), as closing it shows."""
    engine = Engine(model, num_blocks=64, tokenizer=tokenizer)
    params = SamplingParams(max_tokens=BUDGET, constraint=Constraint.json_object())
    for tokens in run(engine, prompts, [params] * len(prompts)):
        assert len(tokens) == BUDGET
        text = text_of(tokenizer, tokens)
        assert text.startswith('{"') and "\n" not in text
        closed = json.loads(text + '":0}')
        assert len(closed) == 1 and len(next(iter(closed))) > 100


def test_the_mask_allows_exactly_the_grammars_next_tokens(model, tokenizer) -> None:
    engine = Engine(model, num_blocks=8, tokenizer=tokenizer)
    engine.runner.sampler.grammars.add(7, SamplingParams(constraint=Constraint.choice(CHOICES)))
    allowed = engine.runner.sampler.grammars.allowed([3, 7])
    assert allowed.shape == (2, model.config.vocab_size)
    assert allowed[0].all()  # an unconstrained row keeps every token
    texts = [tokenizer.decode([token]) for token in allowed[1].nonzero().flatten().tolist()]
    assert texts and all(any(o.startswith(t) for o in CHOICES) for t in texts)
    assert {"y", "n", "p"} <= {text[0] for text in texts}
    assert engine.runner.sampler.grammars.allowed([3]) is None


def test_requests_without_a_constraint_are_unchanged(model, tokenizer, prompts) -> None:
    plain = SamplingParams(max_tokens=24)
    seeded = SamplingParams(max_tokens=24, temperature=0.8, top_p=0.9, seed=5)
    alone = Engine(model, num_blocks=64).generate(prompts, [plain, seeded] * 2 + [plain])
    engine = Engine(model, num_blocks=64, tokenizer=tokenizer)
    mixed = [plain, seeded] * 2 + [plain]
    constrained = [SamplingParams(max_tokens=40, constraint=c) for c in CONSTRAINTS]
    outputs = run(engine, prompts + prompts, mixed + constrained)
    assert outputs[: len(prompts)] == alone


def test_preemption_swap_caching_and_chunking_do_not_change_constrained_output(
    model, tokenizer, prompts
) -> None:
    params = [
        SamplingParams(max_tokens=60, constraint=constraint, temperature=t, seed=s)
        for constraint in CONSTRAINTS
        for t, s in ((0.0, None), (0.9, 11))
    ]
    batch = [prompts[i % len(prompts)] for i in range(len(params))]
    small = {"num_slots": 10, "block_size": 4, "tokenizer": tokenizer}
    roomy = run(Engine(model, num_blocks=256, **small), batch, params)
    for options, preempts in (
        ({"num_blocks": 24, "preemption": "recompute"}, True),
        ({"num_blocks": 24, "preemption": "swap", "swap_blocks": 64}, True),
        ({"num_blocks": 96, "enable_prefix_caching": True, "max_num_batched_tokens": 16}, False),
    ):
        evicted: list[int] = []
        assert run(Engine(model, **small, **options), batch, params, evicted) == roomy, options
        assert bool(evicted) == preempts
    closed = 0
    for param, tokens in zip(params, roomy, strict=True):
        if tokens[-1] in model.config.eos_token_ids:
            closed += 1
            check_matches(param.constraint, text_of(tokenizer, tokens))
    assert closed >= len(params) // 2


def test_n_samples_each_follow_their_own_matcher(model, tokenizer, prompts) -> None:
    engine = Engine(model, num_blocks=128, num_slots=8, tokenizer=tokenizer)
    constraint = Constraint.json_schema(PERSON)
    params = [
        SamplingParams(max_tokens=BUDGET, temperature=1.0, seed=seed, constraint=constraint)
        for seed in range(6)
    ]
    outputs = run(engine, [prompts[0]] * 6, params)
    assert len({tuple(tokens) for tokens in outputs}) > 1
    for tokens in outputs:
        check_matches(constraint, text_of(tokenizer, tokens))
    again = run(engine, [prompts[0]], [params[3]])
    assert again == [outputs[3]]


def test_an_aborted_request_lets_go_of_its_matcher(model, tokenizer, prompts) -> None:
    engine = Engine(model, num_blocks=64, tokenizer=tokenizer)
    params = SamplingParams(max_tokens=BUDGET, constraint=Constraint.json_schema(PERSON))
    request_id = engine.add_request(prompts[0], params)
    engine.step()
    engine.step()
    assert engine.runner.sampler.grammars.is_constrained(request_id)
    engine.abort(request_id)
    assert not engine.has_unfinished()
    # The next decision names the requests done since the last, and the runner lets go.
    engine.add_request(prompts[1], SamplingParams(max_tokens=1))
    engine.step()
    assert not engine.runner.sampler.grammars.is_constrained(request_id)


def test_a_constraint_that_does_not_compile_is_refused_before_anything_is_queued(
    model, tokenizer, prompts
) -> None:
    engine = Engine(model, num_blocks=64, tokenizer=tokenizer)
    bad = {
        "regex": (Constraint.regex("[a-"), "unclosed character class"),
        "ref": (Constraint.json_schema({"$ref": "#/nowhere"}), "/nowhere"),
        "type": (Constraint.json_schema({"type": "nope"}), "nope"),
        "grammar": (Constraint.grammar("start: missing_rule"), "missing_rule"),
    }
    for constraint, named in bad.values():
        with pytest.raises(ValueError, match="does not compile|is refused") as refused:
            engine.add_request(prompts[0], SamplingParams(constraint=constraint))
        assert named in str(refused.value)
    assert not engine.has_unfinished()
    engine.check_integrity()


def test_each_distinct_constraint_is_compiled_once(model, tokenizer, prompts) -> None:
    engine = Engine(model, num_blocks=64, tokenizer=tokenizer)
    same = [Constraint.json_schema(PERSON), Constraint.json_schema(dict(PERSON))]
    run(engine, prompts[:2], [SamplingParams(max_tokens=BUDGET, constraint=c) for c in same])
    assert engine.runner.sampler.grammars.compiler.num_compiled == 1


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Constraint("xml", "<a/>"), "kind"),
        (lambda: Constraint.json_schema("{not json"), "not valid JSON"),
        (lambda: Constraint.json_schema("[1, 2]"), "is an object"),
        (lambda: Constraint.choice([]), "non-empty list"),
        (lambda: Constraint.choice("yes"), "not one string"),
        (lambda: Constraint.choice(["yes", ""]), "non-empty string"),
        (lambda: Constraint.regex(""), "empty"),
        (lambda: Constraint.grammar("x" * 100_001), "at most"),
        (lambda: SamplingParams(constraint={"type": "object"}), "must be a Constraint"),
        (
            lambda: SamplingParams(constraint=Constraint.json_object(), ignore_eos=True),
            "ignore_eos",
        ),
    ],
)
def test_malformed_constraints_are_refused_with_a_reason(build, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


def test_an_engine_without_a_tokenizer_refuses_a_constraint(model, prompts) -> None:
    engine = Engine(model, num_blocks=16)
    params = SamplingParams(constraint=Constraint.json_object())
    with pytest.raises(ValueError, match="tokenizer"):
        engine.add_request(prompts[0], params)
    assert not engine.has_unfinished()


def test_a_model_without_an_end_token_refuses_a_constraint(tokenizer) -> None:
    with pytest.raises(ValueError, match="end-of-sequence"):
        GrammarCompiler(tokenizer, 2048, ())


def test_a_held_out_random_model_is_held_to_the_grammar(tmp_path: Path, tokenizer) -> None:
    """A random Llama has no preference the grammar could agree with: every token is forced
    into the language by the mask alone."""
    save_random_llama(tmp_path, seed=4, vocab_size=2048, bos_token_id=0, eos_token_id=0)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(llmengine.embedded_model_path() / name, tmp_path / name)
    model = llmengine.load_model(tmp_path)
    engine = Engine(model, num_blocks=64, tokenizer=llmengine.load_tokenizer(tmp_path))
    prompt = tokenizer.encode("ROMEO:\n")
    for constraint in (Constraint.json_schema(PLAY), Constraint.regex(PATTERN)):
        params = SamplingParams(max_tokens=BUDGET, constraint=constraint, temperature=0.7, seed=1)
        tokens = run(engine, [prompt], [params])[0]
        check_matches(constraint, text_of(tokenizer, tokens))


def test_generate_takes_each_kind_of_constraint_from_its_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from llmengine.cli import main

    schema_file = tmp_path / "play.json"
    schema_file.write_text(json.dumps(PLAY))
    grammar_file = tmp_path / "greeting.lark"
    grammar_file.write_text(LARK)
    argv = ["generate", "--prompt", "ROMEO:", "--max-tokens", str(BUDGET), "--kernels", "eager"]
    for flags, constraint in (
        (["--json-schema", f"@{schema_file}"], Constraint.json_schema(PLAY)),
        (["--json-schema", json.dumps(PERSON)], Constraint.json_schema(PERSON)),
        (["--regex", PATTERN], Constraint.regex(PATTERN)),
        (
            ["--choice", "yes", "--choice", "no", "--choice", "perchance"],
            Constraint.choice(CHOICES),
        ),
        (["--grammar", f"@{grammar_file}"], Constraint.grammar(LARK)),
    ):
        assert main([*argv, *flags]) == 0
        check_matches(constraint, capsys.readouterr().out.removesuffix("\n"))
    assert main([*argv, "--json-object"]) == 0
    assert capsys.readouterr().out.startswith('{"')
    assert main([*argv, "--regex", "[a-"]) == 2
    err = capsys.readouterr().err
    assert "regular expression does not compile" in err and len(err.splitlines()) == 1
