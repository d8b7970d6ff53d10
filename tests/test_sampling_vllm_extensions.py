"""vLLM's sampling extensions: `min_tokens`, `min_p` and `logit_bias`, each against its
definition, then through the engine, with and without a grammar or speculation.

min_tokens keeps the end and stop tokens out until that many tokens exist; min_p drops, after
temperature, every token below min_p times the likeliest's probability; logit_bias is added to
the raw logits before anything else, greedy rows included. A row with none of them draws
exactly what it drew before, whatever shares its batch.
"""

from __future__ import annotations

import pytest
import torch

import llmengine
from llmengine import Constraint, Engine, SamplingParams
from llmengine.generation import generate_tokens
from llmengine.runner.sampler import NO_TOKEN_ALLOWED
from llmengine.sampling import candidate_distribution, sample_tokens, suppressed_tokens
from llmengine.speculative.verify import can_speculate, verify_drafts

NEWLINE, COMMA = 200, 13  # the embedded tokenizer's "\n" and ","


@pytest.fixture(scope="module")
def romeo(tokenizer) -> list[int]:
    """A prompt whose greedy continuation starts with a newline and has a comma at token 6."""
    return tokenizer.encode("ROMEO:")


def engine_for(model: llmengine.Llama, **options) -> Engine:
    return Engine(model, num_blocks=64, block_size=4, **options)


def finishing(engine: Engine, prompt: list[int], params: SamplingParams) -> tuple[list[int], str]:
    """One request's output and why it finished."""
    request_id = engine.add_request(prompt, params)
    while engine.has_unfinished():
        engine.step()
    record = engine.release(request_id)
    return record.output_token_ids, record.finish_reason


# -- the parameters ------------------------------------------------------------------------


def test_logit_bias_is_kept_as_sorted_pairs_from_a_mapping_or_pairs() -> None:
    from_mapping = SamplingParams(logit_bias={9: -1, 3: 100})
    from_pairs = SamplingParams(logit_bias=[(3, 100.0), (9, -1.0)])
    assert from_mapping.logit_bias == ((3, 100.0), (9, -1.0))
    assert from_mapping == from_pairs and hash(from_mapping) == hash(from_pairs)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"min_tokens": 17}, r"min_tokens must be an integer in \[0, max_tokens=16\]"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 1.0}, "min_tokens"),
        ({"min_p": 1.5}, r"min_p must be a number in \[0, 1\]"),
        ({"min_p": float("nan")}, "min_p"),
        ({"logit_bias": {5: 100.5}}, r"logit_bias of token 5 must be a number in \[-100, 100\]"),
        ({"logit_bias": {5: float("inf")}}, "logit_bias of token 5"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias keys must be token ids"),
        ({"logit_bias": {"5": 1.0}}, "logit_bias keys must be token ids"),
        ({"logit_bias": {True: 1.0}}, "logit_bias keys must be token ids"),
        ({"logit_bias": [(5, 1.0), (5, 2.0)]}, r"more than once: \[5\]"),
        ({"logit_bias": [(5, 1.0, 2.0)]}, "logit_bias keys"),
        ({"logit_bias": 5}, "logit_bias must map token ids"),
    ],
)
def test_out_of_range_extensions_are_refused(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**fields)


def test_min_tokens_may_equal_max_tokens() -> None:
    assert SamplingParams(max_tokens=4, min_tokens=4).min_tokens == 4


def test_suppressed_tokens_are_the_stop_and_end_tokens_until_min_tokens() -> None:
    params = SamplingParams(min_tokens=3, stop_token_ids=(7, 5000))
    assert suppressed_tokens(params, 2, (0,), 100) == [0, 7]  # 5000 has no logit
    assert suppressed_tokens(params, 3, (0,), 100) == []
    assert suppressed_tokens(SamplingParams(), 0, (0,), 100) == []


# -- min_p: the distribution ---------------------------------------------------------------


def test_min_p_keeps_exactly_the_tokens_at_least_min_p_times_the_likeliest() -> None:
    torch.manual_seed(0)
    logits = torch.randn(64)
    params = SamplingParams(temperature=0.7, min_p=0.1)
    tokens, probs = candidate_distribution(logits, params)
    full = torch.softmax(logits / 0.7, dim=-1)
    expected = full >= 0.1 * full.max()
    kept = torch.zeros(64, dtype=torch.bool)
    kept[tokens[probs > 0]] = True
    assert torch.equal(kept, expected)
    assert 1 < int(expected.sum()) < 64  # the cut keeps some and drops some
    dense = torch.zeros(64)
    dense[tokens] = probs
    assert torch.allclose(dense, torch.where(expected, full, 0) / full[expected].sum())


def test_top_p_renormalises_over_what_min_p_keeps() -> None:
    # p = (0.5, 0.3, 0.2, 0.0...): min_p 0.5 drops 0.2, then 0.5 / 0.8 < top_p 0.7 keeps both.
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2, 1e-9]))
    tokens, probs = candidate_distribution(
        logits, SamplingParams(temperature=1.0, min_p=0.5, top_p=0.7)
    )
    assert tokens[probs > 0].tolist() == [0, 1]
    assert probs[probs > 0].tolist() == pytest.approx([0.625, 0.375])


def test_min_p_near_one_samples_the_greedy_text(model, romeo) -> None:
    greedy = engine_for(model).generate([romeo], SamplingParams(max_tokens=24))[0]
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=5, min_p=0.999)
    assert engine_for(model).generate([romeo], params)[0] == greedy
    unbounded = SamplingParams(max_tokens=24, temperature=1.0, seed=5)
    assert engine_for(model).generate([romeo], unbounded)[0] != greedy  # the test can fail


# -- logit_bias ----------------------------------------------------------------------------


def test_logit_bias_is_added_before_the_greedy_argmax() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, 1.0]])
    assert sample_tokens(logits, [SamplingParams(logit_bias={2: 1.6})], [None]) == [2]
    assert sample_tokens(logits, [SamplingParams(logit_bias={2: 1.4})], [None]) == [0]
    assert torch.equal(logits, torch.tensor([[2.0, -1.0, 0.5, 1.0]]))  # the input is kept


def test_plus_100_forces_a_token_and_minus_100_bans_one(model, romeo) -> None:
    plain = engine_for(model).generate([romeo], SamplingParams(max_tokens=12))[0]
    assert plain[0] == NEWLINE
    forced = SamplingParams(max_tokens=12, logit_bias={1000: 100})
    assert engine_for(model).generate([romeo], forced)[0] == [1000] * 12
    banned = engine_for(model).generate(
        [romeo], SamplingParams(max_tokens=12, logit_bias={NEWLINE: -100})
    )[0]
    assert NEWLINE not in banned and banned != plain


def test_a_logit_bias_id_outside_the_vocabulary_is_refused_by_name(model, romeo) -> None:
    engine = engine_for(model)
    vocab = model.config.vocab_size
    with pytest.raises(ValueError, match=rf"logit_bias token ids outside .*\[{vocab}, 5000\]"):
        engine.add_request(romeo, SamplingParams(logit_bias={3: 1.0, vocab: 2.0, 5000: -1.0}))
    assert not engine.has_unfinished() and engine.num_free_blocks == 64
    with pytest.raises(ValueError, match="5000"):
        generate_tokens(model, romeo, SamplingParams(logit_bias={5000: 1.0}))


# -- min_tokens ----------------------------------------------------------------------------


def test_min_tokens_holds_back_the_end_token_then_lets_it_end(model, romeo) -> None:
    engine = engine_for(model)
    engine.eos_token_ids = (NEWLINE,)  # the greedy text's first token
    assert finishing(engine, romeo, SamplingParams(max_tokens=40)) == ([NEWLINE], "eos")
    output, reason = finishing(engine, romeo, SamplingParams(max_tokens=40, min_tokens=5))
    assert NEWLINE not in output[:5] and len(output) > 5
    assert output[-1] == NEWLINE and reason == "eos"


def test_min_tokens_holds_back_the_stop_tokens_then_lets_them_stop(model, romeo) -> None:
    engine = engine_for(model)
    stop = SamplingParams(max_tokens=40, stop_token_ids=(COMMA,))
    early, reason = finishing(engine, romeo, stop)
    assert reason == "stop" and len(early) == 6
    params = SamplingParams(max_tokens=40, stop_token_ids=(COMMA,), min_tokens=8)
    output, reason = finishing(engine, romeo, params)
    assert COMMA not in output[:8] and output[-1] == COMMA and reason == "stop"


def test_min_tokens_equal_to_max_tokens_never_ends_early(model, romeo) -> None:
    engine = engine_for(model)
    engine.eos_token_ids = (NEWLINE,)
    output, reason = finishing(engine, romeo, SamplingParams(max_tokens=10, min_tokens=10))
    assert len(output) == 10 and NEWLINE not in output and reason == "length"


def test_the_engine_draws_what_the_reference_loop_draws(model, romeo) -> None:
    """Every extension at once, sampled: the engine's tokens are the plain loop's."""
    params = SamplingParams(
        max_tokens=16, min_tokens=6, temperature=0.9, seed=11, min_p=0.05,
        stop_token_ids=(COMMA,), logit_bias={NEWLINE: -5.0, 260: 2.0},
    )  # fmt: skip
    engine = engine_for(model)
    engine.eos_token_ids = (NEWLINE,)
    expected = generate_tokens(model, romeo, params, eos_token_ids=(NEWLINE,))
    assert finishing(engine, romeo, params)[0] == expected


def test_a_grammar_complete_before_min_tokens_fails_its_request_alone(
    model, tokenizer, romeo
) -> None:
    engine = engine_for(model, tokenizer=tokenizer)
    other = SamplingParams(max_tokens=8)
    alone = engine_for(model).generate([romeo], other)[0]
    choice = Constraint.choice(["Yes"])
    finished = engine.generate([romeo], SamplingParams(max_tokens=30, constraint=choice))[0]
    held = engine.add_request(
        romeo, SamplingParams(max_tokens=30, min_tokens=20, constraint=choice)
    )
    spared = engine.add_request(romeo, other)
    failed: dict[int, str] = {}
    while engine.has_unfinished():
        failed.update(engine.step().failed)
    assert failed == {held: NO_TOKEN_ALLOWED}
    assert engine.release(held).output_token_ids == finished[:-1]  # all but the end token
    assert engine.release(spared).output_token_ids == alone


# -- batches: no row's parameters change another row's tokens ------------------------------


def test_plain_rows_draw_their_lone_tokens_beside_rows_with_extensions(model, tokenizer) -> None:
    texts = ["ROMEO:", "KING HENRY:\nMy lord", "First Citizen:\n", "JULIET:\nO Romeo"]
    prompts = [tokenizer.encode(text) for text in texts]
    plain = [
        SamplingParams(max_tokens=14),
        SamplingParams(max_tokens=14, temperature=0.8, seed=3),
    ]
    extended = [
        SamplingParams(max_tokens=14, logit_bias={NEWLINE: -100, 1000: 8.0}),
        SamplingParams(max_tokens=14, temperature=0.8, seed=3, min_p=0.2, min_tokens=10),
    ]
    rows = [*plain, *extended]
    lone = [
        engine_for(model).generate([prompt], params)[0]
        for prompt, params in zip(prompts, rows, strict=True)
    ]
    batched = engine_for(model).generate(prompts, rows)
    assert batched == lone
    # The extended rows did change their own text: without their extensions they differ.
    assert engine_for(model).generate(prompts[2:], plain) != batched[2:]


# -- speculation ---------------------------------------------------------------------------


def test_a_request_is_not_drafted_while_min_tokens_masks_its_end() -> None:
    params = SamplingParams(min_tokens=3)
    assert not can_speculate(params) and not can_speculate(params, 2)
    assert can_speculate(params, 3)
    assert can_speculate(SamplingParams(min_p=0.3, temperature=1.0, logit_bias={1: 2.0}))


def test_greedy_verification_judges_drafts_by_the_biased_argmax() -> None:
    logits = torch.tensor([[0.0, 5.0, 4.0], [5.0, 0.0, 4.0]])
    biased = SamplingParams(logit_bias={2: 2.0})
    assert verify_drafts(logits, [1], SamplingParams(), None) == [1, 0]
    assert verify_drafts(logits, [1], biased, None) == [2]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=40, min_tokens=12, stop_token_ids=(COMMA,)),
        SamplingParams(max_tokens=40, logit_bias={NEWLINE: -100, 260: 3.0}),
    ],
)
def test_speculation_keeps_the_greedy_text_of_the_plain_sampler(model, tokenizer, params) -> None:
    prompts = [tokenizer.encode(text) for text in ["ROMEO:", "First Citizen:\n", "JULIET:"]]
    expected = engine_for(model).generate(prompts, params)
    speculating = engine_for(model, speculative="ngram", num_speculative_tokens=3)
    ids = speculating.add_requests(prompts, params)
    drafted = 0
    while speculating.has_unfinished():
        drafted += speculating.step().num_draft_tokens
    assert drafted > 0
    assert [speculating.release(i).output_token_ids for i in ids] == expected
